#!/usr/bin/env bash
# On the GPU machine, from the repository root (with .deps carried): a
# fresh sm_90 build, the GPU tests (those labelled `timing` one at a time), the CPU
# tests, then the benchmarks behind the issues' tables, each bounded in time. About 6 minutes.
# Logs under $OUT; the tables go to stdout.
set -uo pipefail
out=${OUT:-/tmp/ft-out}; mkdir -p "$out"
deps=$PWD/.deps/root/usr
NCCL=$(python3 -c 'import nvidia.nccl as n,os;print(os.path.join(list(n.__path__)[0],"lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:$NCCL:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
b=${FT_BUILD_DIR:-/tmp/ftb-final}; rm -rf $b; t0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
clean() { grep -vE "^\*\*\*WARNING|^Run on|^CPU Caches|^  L[123]|^Load Average|^-+$|^20[0-9][0-9]-|^#|^Running" | cut -c1-260; }
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps" > $out/configure.log 2>&1 || { tail -30 $out/configure.log; exit 1; }
cmake --build $b -j 16 > $out/build.log 2>&1 || { grep -E "error|FAILED" $out/build.log | head -30; exit 1; }
step built
(cd $b && timeout 150 ctest -L gpu -LE timing -E abi.consumers -j 4 --timeout 140 --output-on-failure) > $out/ctest_gpu.log 2>&1
grep -E "tests passed|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run" $out/ctest_gpu.log | head -20
(cd $b && timeout 90 ctest -L timing -j 1 --timeout 80 --output-on-failure) > $out/ctest_lat.log 2>&1
grep -E "tests passed|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|^fixed f|^adaptive from" $out/ctest_lat.log | head -20
(cd $b && timeout 80 ctest -L cpu -E abi.consumers -j 12 --timeout 70) > $out/ctest_cpu.log 2>&1
grep -E "tests passed|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout" $out/ctest_cpu.log | head -10
step tests
timeout 40 $b/bench/bench_experts --benchmark_filter='^decode/' --benchmark_counters_tabular=true 2>&1 | clean | awk '{print $1, $6, $7, $9, $10, $11}' | head -14
timeout 40 $b/bench/bench_admission --benchmark_counters_tabular=true 2>&1 | grep BM_ | awk '{print $1, $NF}'
# Where an admission call's cycles go (FT_ADMISSION_TRACE build): cycles from entry per phase.
timeout 40 $b/bench/bench_admission_trace --benchmark_filter='BM_Admission/S:(2048|8192)/' --benchmark_format=csv 2>/dev/null \
  | grep -E "^name|BM_" | cut -d, -f1,10- > $out/admission_trace.csv; cat $out/admission_trace.csv
timeout 90 $b/bench/bench_prefill --benchmark_counters_tabular=true > $out/bench_prefill.log 2>&1
clean < $out/bench_prefill.log | head -20
step gpu-benches
[ -n "${FT_FINAL_SKIP_BACKENDS:-}" ] || timeout 150 $b/bench/bench_backends --benchmark_filter='offload|hybrid_(allmiss|sweep|adaptive)' --benchmark_counters_tabular=true > $out/bench_backends.log 2>&1
[ -f $out/bench_backends.log ] && clean < $out/bench_backends.log | head -40
step backends
timeout 45 $b/bench/bench_ep --benchmark_filter='WireBytes|/(7168|2048)/(256|128)/(1|64|4096|32768)(/|$)' --benchmark_min_time=0.05 --benchmark_counters_tabular=true > $out/bench_ep.log 2>&1
clean < $out/bench_ep.log | head -40
timeout 40 $b/bench/bench_ep --benchmark_filter='DecodePhaseGraph' --benchmark_min_time=0.05 2>&1 | clean | grep DecodePhase | awk '{print $1, $2, $NF}'
step ep
# Several GPUs (issue 8): correctness with and without peer-to-peer, then the speed table without.
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  timeout 120 $b/bench/bench_ep_multi_gpu --check-only > $out/ep_multi_p2p.log 2>&1; echo "ep_multi_gpu P2P check rc=$?"
  grep -E "FAIL|transport|failure" $out/ep_multi_p2p.log | head -12
  NCCL_P2P_DISABLE=1 timeout 240 $b/bench/bench_ep_multi_gpu ${FT_FINAL_EP_QUICK:+--quick} > $out/ep_multi_nop2p.log 2>&1; echo "ep_multi_gpu no-P2P rc=$?"
  grep -vE "^checked" $out/ep_multi_nop2p.log | head -40
  step ep-multi
fi
[ -n "${FT_FINAL_SKIP_CPU_BENCH:-}" ] && { step done; exit 0; }
# mxfp4 with the benchmark's random e8m0 bytes (products go subnormal, slow on Intel cores) and
# with realistic gpt-oss-like scales (FT_BENCH_MXFP4_SCALE=120); W4A8 (default) and W4A16.
for sc in "" 120; do for v in 1 0; do
  FT_BENCH_MXFP4_SCALE=$sc FT_CPU_MXFP4_W4A8=$v FT_BENCH_WINDOW_MB=4096 timeout 30 $b/bench/bench_cpu_gemv \
    --benchmark_filter='moe_layer_mxfp4.*bs:1/' --benchmark_min_time=0.3 2>&1 | grep -E "moe_layer" | sed "s/^/scale=${sc:-random} /" | cut -c1-230
done; done
FT_BENCH_WINDOW_MB=4096 timeout 60 $b/bench/bench_cpu_gemv --benchmark_filter='stream_read|moe_layer_(fp8_block|nvfp4|ds_fp4|q4_0).*bs:1/' --benchmark_min_time=0.3 2>&1 | grep -E "moe_layer|stream" | cut -c1-220
step done
