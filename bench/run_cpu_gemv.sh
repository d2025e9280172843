#!/usr/bin/env bash
# CPU expert kernels against the read bound: the per-format layer benchmarks (bs 1, 2, 8, 32) and
# the bf16 layers, on the best tier this CPU has and capped at AVX2 (FT_CPU_ISA=avx2), each run
# bounded to --budget seconds. Usage: bench/run_cpu_gemv.sh [build dir] [extra bench_cpu_gemv args]
# Output: the Google Benchmark rows and a summary table per run (GB/s, interleaved read bound,
# ratio, bs / bs=1, µs per token), also saved as cpu_gemv_<tier>.txt in the current directory.
set -euo pipefail
build=${1:-build}
shift || true
bench=$build/bench/bench_cpu_gemv
[ -x "$bench" ] || { echo "no $bench: build the bench_cpu_gemv target first" >&2; exit 1; }
filter='^moe_layer_(mxfp4|fp8_block|nvfp4|ds_fp4|q4_0|q8_0|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_xs)/.*bmin:-1|^moe_layer/H:4096'
for tier in default avx2; do
  echo "== tier $tier"
  if [ "$tier" = avx2 ]; then
    FT_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "$bench" --benchmark_filter="$filter" --budget=140 "$@" | tee "cpu_gemv_$tier.txt"
  else
    "$bench" --benchmark_filter="$filter" --budget=140 "$@" | tee "cpu_gemv_$tier.txt"
  fi
done
