#!/usr/bin/env bash
# Sanitizer CI, CPU only, clang (Debian's clang 14):
#  (a) ASan + UBSan build with the fuzz targets: the CPU test suite (ctest -L cpu, ABI consumer
#      checks excluded: they link the library without the sanitizer runtime), then each fuzz
#      target for FT_FUZZ_SECONDS over its seed corpus (written by the fuzz.seeds test) and
#      every file of tests/fuzz/regressions/<target>/;
#  (b) TSan build of the threaded tests only: the worker pool, the MoE executor over pool sizes,
#      the loader's parallel readers (callbacks, cancellation), sessions sharing an engine, a
#      shared model decoded from four threads. (The hybrid coordinator's threads run only with a
#      GPU: tests/handoff.)
# Every phase prints its time. Environment: FT_SAN_DIR (build folder root, default build-san),
# FT_SAN_JOBS (default 2), FT_FUZZ_SECONDS (per target, default 12: about 60 s for the five),
# FT_SAN_CTEST_ARGS (extra ctest arguments, e.g. -E 'Onednn').
set -euo pipefail
cd "$(dirname "$0")/.."

root=${FT_SAN_DIR:-build-san}
jobs=${FT_SAN_JOBS:-2}
per_target=${FT_FUZZ_SECONDS:-12}
export CC=${FT_SAN_CC:-clang} CXX=${FT_SAN_CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "sanitizers: $CXX not found (scripts/setup.sh installs clang)"; exit 1; }

t0=$SECONDS
t_phase=$SECONDS
phase() {
  echo "sanitizers: $1: $((SECONDS - t_phase)) s"
  t_phase=$SECONDS
}

cfg=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g"
     -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DFT_WITH_CUDA=OFF -DFT_BUILD_BENCH=OFF -DFT_BUILD_TOOLS=OFF)
if command -v ccache >/dev/null; then
  cfg+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

# ---- (a) ASan + UBSan ---------------------------------------------------------------------------
asan=$root/asan
cmake -S . -B "$asan" "${cfg[@]}" -DFT_SANITIZE=address,undefined -DFT_FUZZ=ON >/dev/null
nice cmake --build "$asan" -j "$jobs"
phase "ASan+UBSan build"

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# shellcheck disable=SC2086
(cd "$asan" && ctest -L cpu -LE abi -j "$jobs" --output-on-failure ${FT_SAN_CTEST_ARGS:-})
phase "ASan+UBSan CPU tests (and every seed and regression input once)"

for t in safetensors config gguf profile api; do
  work=$asan/fuzz-work/$t
  rm -rf "$work"
  mkdir -p "$work"
  log=$asan/fuzz-work/$t.log
  if ! "$asan/tests/fuzz/fuzz_$t" -max_total_time="$per_target" -timeout=30 -rss_limit_mb=3072 \
       -print_final_stats=1 -dict="tests/fuzz/$t.dict" -artifact_prefix="$asan/fuzz-work/$t-" \
       "$work" "$asan/tests/fuzz/corpus/$t" "tests/fuzz/regressions/$t" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "sanitizers: fuzz_$t found a failure; the input is $asan/fuzz-work/$t-*"
    exit 1
  fi
  echo "sanitizers: fuzz_$t: $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$') executions, no failure"
done
phase "fuzzing (${per_target} s per target)"

# ---- (b) TSan -----------------------------------------------------------------------------------
tsan=$root/tsan
cmake -S . -B "$tsan" "${cfg[@]}" -DFT_SANITIZE=thread >/dev/null
nice cmake --build "$tsan" -j "$jobs" --target test_cpu test_api test_loader
phase "TSan build"

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp"
"$tsan/tests/cpu/test_cpu" --gtest_brief=1 \
  --gtest_filter='ThreadPool.*:MoeExecutor.IdenticalAcrossPoolSizes:QuantMoe.IdenticalAcrossPoolSizesAndDedupCounts'
"$tsan/tests/loader/test_loader" --gtest_brief=1 --gtest_filter='LoadCallbacks.*'
"$tsan/tests/api/test_api" --gtest_brief=1 \
  --gtest_filter='Decode.ConcurrentSessionsShareTheEngine:HostileInputs.SharedModelFromFourThreads:HostileInputs.WorkerCountBoundedByTheMachine'
phase "TSan tests"

echo "sanitizers: all passed in $((SECONDS - t0)) s"
