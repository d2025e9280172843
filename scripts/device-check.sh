#!/usr/bin/env bash
# On the GPU machine: build with CUDA for sm_90 against the carried
# .deps, run every test (the GPU ones run for real there), the GPU tests again under
# compute-sanitizer, ft run per expert format and backend, and the benchmarks. Logs go to $OUT
# (or /tmp/ft-out). Not part of CI. Knobs: FT_BENCHES (benchmark programs), FT_BENCH_FILTER,
# FT_FORMATS, FT_RUN_BACKENDS, FT_RUN_ARGS, FT_NO_SANITIZER=1, FT_CTEST_ARGS.
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
(cd "$build" && ctest --output-on-failure -j 8 -E abi.consumers ${FT_CTEST_ARGS:-}) > "$out/ctest.log" 2>&1
grep -E "tests passed|Failed|\*\*\*|Not Run" "$out/ctest.log" | head -30
echo "== GPU tests, also under compute-sanitizer"
no_timing=$(bash scripts/timing-filter.sh "$build")
for t in "$build"/tests/*/test_gpu "$build"/tests/*/test_*_gpu; do
  [ -x "$t" ] || continue
  "$t" 2>&1 | tail -4
  [ -n "${FT_NO_SANITIZER:-}" ] && continue
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 "$t" --gtest_filter="$no_timing" > "$out/sanitizer-$tool-$(basename "$t").log" 2>&1
    echo "$(basename "$t") $tool: exit $? ($(grep -E 'ERROR SUMMARY' "$out/sanitizer-$tool-$(basename "$t").log" | tail -1))"
  done
done
echo "== ft"
"$build/tools/ft/ft" info
for f in ${FT_FORMATS:-bf16 fp8_block nvfp4 mxfp4 ds_fp4 q4_0}; do
  for b in ${FT_RUN_BACKENDS:-cpu}; do
    echo "-- $f $b"
    "$build/tools/ft/ft" run --format "$f" --backend "$b" --steps 100 --cache-dir /tmp/ftcache ${FT_RUN_ARGS:-} 2>&1 |
      grep -E "H=|decode|bandwidth|gpu |failed|rror"
  done
done
"$build/tools/ft/ft" run --steps 100 --tokens 8 --cache-dir /tmp/ftcache 2>&1 | grep -E "decode|bandwidth"
echo "== bench"
for b in ${FT_BENCHES:-bench_cpu_gemv}; do
  [ -x "$build/bench/$b" ] || { echo "$b: not built"; continue; }
  "$build/bench/$b" --benchmark_filter="${FT_BENCH_FILTER:-.}" 2>&1 | tee "$out/$b.log" | grep -vE "^\*\*\*WARNING"
done
