#!/usr/bin/env bash
# On the GPU machine (with .deps carried): the slot cache's device tests, admission latency
# (bench_admission), where each call's cycles go (bench_admission_trace, the kernel built with its
# phase stamps), and compute-sanitizer on the admission tests (FT_SANITIZERS: default
# "racecheck memcheck", "none" to skip). About 3 minutes; logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/ft-out}; mkdir -p "$out"; deps=$PWD/.deps/root/usr; b=${FT_BUILD_DIR:-/tmp/ftb-adm}
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps" > $out/configure.log 2>&1 || { tail -20 $out/configure.log; exit 1; }
cmake --build $b -j 16 --target test_slotcache_gpu test_slotcache bench_admission bench_admission_trace > $out/build.log 2>&1 || { grep -E "error|FAILED" $out/build.log | head; exit 1; }
$b/tests/slotcache/test_slotcache_gpu 2>&1 | grep -E "^\[  (FAILED|PASSED)|Failure|admission latency" | head -20
$b/tests/slotcache/test_slotcache 2>&1 | tail -1
timeout 60 $b/bench/bench_admission_trace --benchmark_filter='BM_Admission/S:(2048|8192)/misses:8/hybrid:0' --benchmark_format=csv 2>/dev/null | grep -E "^name|BM_" | cut -d, -f1,10-
timeout 60 $b/bench/bench_admission --benchmark_counters_tabular=true 2>&1 | grep BM_ | awk '{print $1, $NF, $(NF-1)}'
for tool in ${FT_SANITIZERS:-racecheck memcheck}; do
  [ "$tool" = none ] && continue
  filter='*'; [ $tool = racecheck ] && filter='*Threshold*:*SharingAThread*:*GraphReplays*'
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $b/tests/slotcache/test_slotcache_gpu --gtest_filter="$filter" > $out/san-$tool.log 2>&1
  echo "$tool exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $out/san-$tool.log | tail -1)"
done
