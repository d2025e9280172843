#!/usr/bin/env bash
# Proves the README's two commands on a fresh machine: builds a Debian 12 root with mmdebstrap
# (from the mirror this machine's apt uses), copies a clean clone of HEAD into it, and runs
# `bash scripts/run.sh` and `bash scripts/test.sh` there in a chroot, through mmdebstrap's own
# customize hooks (mmdebstrap mounts /proc, /sys and /dev for them and removes the root after).
# Prints both results, keeps the logs in OUTDIR (default: a new folder under /var/tmp), and exits
# non-zero if either command failed. Needs root and mmdebstrap; takes about half an hour on 2 cores.
#   usage: bash scripts/fresh-machine.sh [OUTDIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
command -v mmdebstrap >/dev/null || { echo "fresh-machine: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine: run as root (chroot)" >&2; exit 2; }
out=${1:-$(mktemp -d /var/tmp/ft-fresh.XXXXXX)}
mkdir -p "$out"
work=$(mktemp -d /var/tmp/ft-fresh-clone.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT

# A clean clone: committed files only, as CI sees them.
git clone -q --no-local "$src" "$work/freetoken"
echo "fresh-machine: $(git -C "$work/freetoken" log -1 --format='%h %s' | cut -c1-100)"

# The mirror: the host's deb822 or one-line sources, else Debian's default.
mirror=()
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  [ -s "$f" ] && { mirror=("$f"); break; }
done

# One hook runs both commands with a clean environment and records their exit codes; the next
# copies the logs out. Neither hook fails, so the root is always taken down by mmdebstrap.
run='cd /root/freetoken
for cmd in run test; do
  start=$(date +%s)
  bash scripts/$cmd.sh > /root/$cmd.log 2>&1; rc=$?
  echo "$rc $(( $(date +%s) - start ))" > /root/$cmd.rc
done'
mmdebstrap --variant=apt --mode=root --aptopt='Acquire::Check-Valid-Until "false"' \
  --customize-hook="copy-in $work/freetoken /root" \
  --customize-hook="chroot \"\$1\" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 bash -c '$run'" \
  --customize-hook="copy-out /root/run.log /root/run.rc /root/test.log /root/test.rc $out" \
  bookworm /dev/null "${mirror[@]}" > "$out/mmdebstrap.log" 2>&1 ||
  { tail -20 "$out/mmdebstrap.log"; echo "fresh-machine: mmdebstrap failed (log: $out/mmdebstrap.log)"; exit 1; }

status=0
for cmd in run test; do
  read -r rc secs < "$out/$cmd.rc"
  echo "== bash scripts/$cmd.sh: exit $rc after ${secs} s (log: $out/$cmd.log)"
  tail -n 8 "$out/$cmd.log"
  [ "$rc" -eq 0 ] || status=1
done
[ $status -eq 0 ] && echo "fresh-machine: both README commands passed" || echo "fresh-machine: FAILED"
exit $status
