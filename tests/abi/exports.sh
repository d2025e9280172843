#!/bin/sh
# libfreetoken.so exports the ft_* API and nothing else (no C++, oneDNN or CUDA symbols).
set -eu
lib=$1
all=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sed 's/@.*//')
[ -n "$all" ] || { echo "no exported symbols found in $lib"; exit 1; }
bad=$(printf '%s\n' "$all" | grep -v '^ft_' || true)
if [ -n "$bad" ]; then
  echo "symbols outside ft_* exported by $lib:"
  printf '%s\n' "$bad" | head -20
  exit 1
fi
for sym in ft_engine_create ft_model_load ft_session_create ft_decode ft_route ft_status_string; do
  printf '%s\n' "$all" | grep -qx "$sym" || { echo "missing export $sym"; exit 1; }
done
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
case "$soname" in
  libfreetoken.so.[0-9]*) ;;
  *) echo "unexpected SONAME '$soname'"; exit 1 ;;
esac
echo "$(printf '%s\n' "$all" | wc -l) exported symbols, all ft_*; SONAME $soname"
