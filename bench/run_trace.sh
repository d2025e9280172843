#!/usr/bin/env bash
# The trace table of offload, hybrid and cpu on every geometry (bench_trace), on the GPU machine,
# in about four minutes: a Zipf(1.0) trace and one with temporal locality (repeat 0.5), slot cache
# 25 % of all experts, LRU and the frequency policy, plus the host simulation of the policies.
#   bench/run_trace.sh [BUILD_DIR]        (default: build; needs bench_trace and trace_sim built)
# STEPS / WARMUP (decode steps per run, default 150 / 100) shorten or lengthen every run.
# Writes the table to stdout and to trace-table.md in the current directory.
set -u
build=${1:-build}
steps=${STEPS:-150}
warmup=${WARMUP:-100}
out=trace-table.md
bench=$build/bench/bench_trace
sim=$build/bench/trace_sim
for b in "$bench" "$sim"; do
  [ -x "$b" ] || { echo "run_trace.sh: $b is not built (cmake --build $build --target bench_trace trace_sim)" >&2; exit 1; }
done

{
  echo "# bench_trace: $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  # Each geometry in its own process and time box, so one failure (memory, a checkpoint) does not
  # cost the others.
  for g in qwen3 dsv3 gptoss nvfp4; do
    timeout 75 "$bench" --geometry "$g" --steps "$steps" --warmup "$warmup" --s 1.0 --policy both --methods offload,hybrid,cpu,resident \
      || echo "bench_trace --geometry $g failed or timed out (status $?)"
  done
  # Temporal locality: the policies on the offload path of the Qwen3 geometry.
  timeout 45 "$bench" --geometry qwen3 --steps "$steps" --warmup "$warmup" --s 1.0 --repeat 0.5 \
    --policy both --methods offload || echo "bench_trace (locality) failed or timed out (status $?)"
  echo
  echo "## Host simulation of the policies (trace_sim, 2000 steps)"
  for g in qwen3 dsv3 gptoss; do
    for r in 0 0.3 0.6; do
      timeout 30 "$sim" --geometry "$g" --steps 2000 --repeat "$r" || echo "trace_sim $g repeat $r failed"
    done
  done
} 2>&1 | tee "$out"
