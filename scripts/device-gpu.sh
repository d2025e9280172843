#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md: carry .deps/root for oneDNN and nlohmann-json): a fresh
# sm_90 build, every test (GPU ones and the Python package's GPU check for real), then the GPU
# benchmarks with short filters, each bounded in time. Logs under $OUT.
# Knobs: FT_KEEP_BUILD=1 (reuse the build folder), FT_BUILD_BENCH=OFF, FT_SKIP_TESTS=1,
# FT_CTEST_ARGS, FT_GPU_BENCHES (default: experts gather admission handoff; "" for none),
# FT_BENCH_MIN_TIME (seconds per benchmark, default 0.1), FT_SANITIZE="test_x_gpu ..." (memcheck),
# FT_PY_BENCH="ARGS" (bench/python/bench_generate.py ARGS).
set -uo pipefail
out=${OUT:-/tmp/ft-out}
mkdir -p "$out"
deps=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
build=${FT_BUILD_DIR:-/tmp/ftb-gpu}
[ -n "${FT_KEEP_BUILD:-}" ] || rm -rf "$build"
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$deps" -DFT_BUILD_BENCH=${FT_BUILD_BENCH:-ON} > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
if [ -z "${FT_SKIP_TESTS:-}" ]; then
  (cd "$build" && ctest -j 12 --timeout 240 -E abi.consumers --output-on-failure ${FT_CTEST_ARGS:-}) > "$out/ctest.log" 2>&1
  grep -E "tests passed|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout" "$out/ctest.log" | head -40
  grep -hE "^(fixed f|adaptive from)" "$out/ctest.log" | head -20
  echo "== tests done at $(( $(date +%s) - t0 )) s"
fi
no_timing=$(bash scripts/timing-filter.sh "$build")
for t in ${FT_SANITIZE:-}; do
  exe=$(ls "$build"/tests/*/"$t" 2>/dev/null | head -1)
  [ -x "$exe" ] || { echo "$t: not built"; continue; }
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$exe" --gtest_filter="$no_timing" > "$out/memcheck-$t.log" 2>&1
  echo "$t memcheck: exit $? ($(grep -E 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1))"
done
mt=${FT_BENCH_MIN_TIME:-0.1}
for b in ${FT_GPU_BENCHES-experts gather admission handoff}; do
  case $b in
    gather) filter='^gather/' ;;
    *) filter='.' ;;
  esac
  echo "== bench_$b"
  timeout 150 "$build/bench/bench_$b" --benchmark_filter="$filter" --benchmark_min_time="$mt" \
    --benchmark_counters_tabular=true > "$out/bench_$b.log" 2>&1
  grep -vE "^\*\*\*WARNING|^Run on|^CPU Caches|^  L[123]|^Load Average|^-+$|^20[0-9][0-9]-" "$out/bench_$b.log" | cut -c1-230 | head -60
done
if [ -n "${FT_PY_BENCH:-}" ]; then
  echo "== bench_generate.py $FT_PY_BENCH"
  FREETOKEN_LIBRARY="$build/lib/engine/api/libfreetoken.so.0" PYTHONUNBUFFERED=1 timeout 400 \
    python3 bench/python/bench_generate.py $FT_PY_BENCH 2>&1 | tee "$out/bench_generate.log" | tail -30
fi
echo "== done at $(( $(date +%s) - t0 )) s"
