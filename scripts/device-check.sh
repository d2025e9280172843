#!/usr/bin/env bash
# On the GPU machine (see ../shared/DEVICE.md): build with CUDA for sm_90 against the carried
# .deps, run every test (the GPU ones run for real there), the GPU tests again under
# compute-sanitizer, ft run per expert format, and the CPU benchmark. Logs go to $OUT (or
# /tmp/ft-out). Not part of CI. FT_BENCH_FILTER narrows the benchmark.
set -uo pipefail
out=${OUT:-/tmp/ft-out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
build=${FT_BUILD_DIR:-/tmp/ftb}
echo "== machine"; nproc; lscpu | grep -E 'Model name|Socket|Core|Thread|L3|NUMA node\(s\)'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$deps" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; exit 1; }
echo "== tests"
# pkg-config is not installed there; the consumer check runs in CI.
(cd "$build" && ctest --output-on-failure -j 8 -E abi.consumers) > "$out/ctest.log" 2>&1
grep -E "tests passed|Failed|\*\*\*|Not Run" "$out/ctest.log" | head -30
echo "== GPU tests, also under compute-sanitizer"
for t in "$build"/tests/*/test_gpu "$build"/tests/*/test_slotcache_gpu; do
  [ -x "$t" ] || continue
  "$t" 2>&1 | tail -4
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 "$t" --gtest_filter=-*Latency* > "$out/sanitizer-$tool-$(basename "$t").log" 2>&1
    echo "$(basename "$t") $tool: exit $? ($(grep -E 'ERROR SUMMARY' "$out/sanitizer-$tool-$(basename "$t").log" | tail -1))"
  done
done
echo "== ft"
"$build/tools/ft/ft" info
for f in ${FT_FORMATS:-bf16 fp8_block nvfp4 mxfp4 ds_fp4 q4_0}; do
  echo "-- $f"
  "$build/tools/ft/ft" run --format "$f" --steps 100 --cache-dir /tmp/ftcache 2>&1 | grep -E "H=|decode|bandwidth|failed"
done
"$build/tools/ft/ft" run --steps 100 --tokens 8 --cache-dir /tmp/ftcache 2>&1 | grep -E "decode|bandwidth"
echo "== bench"
"$build/bench/bench_cpu_gemv" --benchmark_filter="${FT_BENCH_FILTER:-.}" 2>&1 | tee "$out/bench.log" | grep -vE "^\*\*\*WARNING"
