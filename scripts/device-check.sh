#!/usr/bin/env bash
# On the GPU machine (see ../shared/DEVICE.md): build with CUDA for sm_90 against the carried
# .deps, run every test (the GPU ones run for real there), ft run, and the CPU GEMV benchmark.
# Logs go to $OUT (or /tmp/ft-out). Not part of CI.
set -uo pipefail
out=${OUT:-/tmp/ft-out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
build=${FT_BUILD_DIR:-/tmp/ftb}
echo "== machine"; nproc; lscpu | grep -E 'Model name|Socket|Core|Thread|L3|NUMA node\(s\)'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null
echo "== build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$deps" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; exit 1; }
echo "== tests"
# pkg-config is not installed there; the consumer check runs in CI.
(cd "$build" && ctest --output-on-failure -j 8 -E abi.consumers) > "$out/ctest.log" 2>&1
grep -E "tests passed|Failed|\*\*\*|Skipped|Not Run" "$out/ctest.log" | head -30
"$build/tests/gpu/test_gpu" 2>&1 | tail -8
echo "== ft"
"$build/tools/ft/ft" info
FT_LOG=info "$build/tools/ft/ft" run --steps 200 --cache-dir /tmp/ftcache 2>&1 | tee "$out/ft-run-bs1.log"
"$build/tools/ft/ft" run --steps 100 --tokens 8 --cache-dir /tmp/ftcache 2>&1 | tee "$out/ft-run-bs8.log"
echo "== bench"
"$build/bench/bench_cpu_gemv" ${FT_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
