#!/usr/bin/env bash
# The trace table of offload, hybrid, cpu and resident on every geometry (bench_trace), on the GPU
# machine, in about four minutes: a Zipf(1.0) trace on every geometry and, on Qwen3-30B-A3B, one
# with temporal locality (repeat 0.5); slot cache 25 % of all experts; LRU and the frequency
# policy; then the host simulation of the policies (trace_sim).
#   bench/run_trace.sh [BUILD_DIR]        (default: build; needs bench_trace and trace_sim built)
# STEPS / WARMUP (decode steps per run, default 120 / 60) shorten or lengthen every run; WAIT=block
# blocks on each token's event instead of polling it (bench_trace --wait).
# Writes the table to stdout and to trace-table.md in the current directory.
set -u
build=${1:-build}
steps=${STEPS:-120}
warmup=${WARMUP:-60}
wait_mode=${WAIT:-spin}
out=trace-table.md
bench=$build/bench/bench_trace
sim=$build/bench/trace_sim
for b in "$bench" "$sim"; do
  [ -x "$b" ] || { echo "run_trace.sh: $b is not built (cmake --build $build --target bench_trace trace_sim)" >&2; exit 1; }
done

run() {  # time box, then bench_trace arguments; one process per geometry so a failure costs only it
  local box=$1
  shift
  timeout "$box" "$bench" --steps "$steps" --warmup "$warmup" --s 1.0 --policy both --wait "$wait_mode" \
    --methods offload,hybrid,cpu,resident,gpu "$@" || echo "bench_trace $* failed or timed out (status $?)"
}

{
  echo "# bench_trace: $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  run 80 --geometry qwen3 --repeat 0,0.5
  run 80 --geometry dsv3
  run 45 --geometry gptoss
  run 30 --geometry nvfp4
  echo
  echo "## Host simulation of the policies (trace_sim, 2000 steps)"
  for g in qwen3 dsv3 gptoss; do
    for r in 0 0.3 0.6; do
      timeout 20 "$sim" --geometry "$g" --steps 2000 --repeat "$r" || echo "trace_sim $g repeat $r failed"
    done
  done
} 2>&1 | tee "$out"
