#!/usr/bin/env bash
# On the GPU machine, after scripts/device-gpu.sh FT_SKIP_TESTS=1 built into $FT_BUILD_DIR (or
# any build there): the benchmarks behind the issues' tables, each bounded in time, logs in $OUT.
set -uo pipefail
out=${OUT:-/tmp/ft-out}
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
b=${FT_BUILD_DIR:-/tmp/ftb-gpu}
t0=$(date +%s)
clean() { grep -vE "^\*\*\*WARNING|^Run on|^CPU Caches|^  L[123]|^Load Average|^-+$|^20[0-9][0-9]-" | cut -c1-250; }
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
step "bench_experts legacy vs mma"
timeout 120 "$b/bench/bench_experts" --benchmark_filter='^decode/' --benchmark_counters_tabular=true > "$out/bench_experts.log" 2>&1
clean < "$out/bench_experts.log" | head -40
step "bench_admission"
timeout 60 "$b/bench/bench_admission" --benchmark_counters_tabular=true > "$out/bench_admission.log" 2>&1
clean < "$out/bench_admission.log" | head -20
step "bench_backends --quick"
timeout 240 "$b/bench/bench_backends" --quick --benchmark_counters_tabular=true > "$out/bench_backends.log" 2>&1
clean < "$out/bench_backends.log" | head -60
step "bench_cpu_gemv quant: old (0) vs new (1) kernels"
for p in 0 1; do
  FT_CPU_QUANT_PAIRS=$p timeout 80 "$b/bench/bench_cpu_gemv" --benchmark_filter='stream_read|moe_layer_(fp8_block|nvfp4|ds_fp4|q4_0|mxfp4)/.*bs:1/' \
    > "$out/bench_cpu_quant_$p.log" 2>&1
  echo "-- FT_CPU_QUANT_PAIRS=$p"; grep -E "stream_read|moe_layer" "$out/bench_cpu_quant_$p.log" | awk '{print $1, $6, $7, $8, $NF}'
done
step "bench_ep (one GPU)"
timeout 60 "$b/bench/bench_ep" --benchmark_min_time=0.05 --benchmark_counters_tabular=true > "$out/bench_ep.log" 2>&1
clean < "$out/bench_ep.log" | head -50
step "ft profile"
timeout 60 "$b/tools/ft/ft" profile --seconds 25 --out "$out/benchbw.json" > "$out/profile.log" 2>&1
cat "$out/profile.log" | tail -25
step "done"
