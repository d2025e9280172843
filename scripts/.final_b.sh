# Final GPU verification, part B (same machine, build kept): memcheck of the new GPU paths, then
# the decode benchmark of every format and the CPU layer benchmark of the GGUF formats on the Xeon.
set -u
deps=$PWD/.deps/root/usr; export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
b=/tmp/fb; t0=$(date +%s)
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $b/tests/backends/test_backends_gpu --gtest_filter='SharedExpertsGpu.*' > $OUT/mc1.log 2>&1; echo "memcheck shared experts rc=$? $(grep 'ERROR SUMMARY' $OUT/mc1.log | tail -1)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $b/tests/experts/test_experts_gpu --gtest_filter='*MatchesReference*' > $OUT/mc2.log 2>&1; echo "memcheck decode rc=$? $(grep 'ERROR SUMMARY' $OUT/mc2.log | tail -1)"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $b/tests/prefill/test_prefill_gpu --gtest_filter='PrefillGpuDequant.*:*q4_k*:*q6_k*:*iq4_xs*' > $OUT/mc3.log 2>&1; echo "memcheck prefill rc=$? $(grep 'ERROR SUMMARY' $OUT/mc3.log | tail -1)"
echo "== bench_experts"; timeout 90 $b/bench/bench_experts --benchmark_counters_tabular=true > $OUT/bench_experts.log 2>&1; grep -E "^decode|device read" $OUT/bench_experts.log | awk '{print $1, $(NF-2), $(NF-1), $NF}'
echo "== bench_cpu_gemv (GGUF formats, bs 1 and 8)"; lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-120
for tier in default avx2; do
  if [ $tier = avx2 ]; then export FT_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2; fi
  timeout 140 $b/bench/bench_cpu_gemv --benchmark_filter='^moe_layer_(q4_0|q8_0|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_xs)/' --budget=120 > $OUT/cpu_$tier.log 2>&1; echo "tier $tier rc=$?"; grep -vE "^\*\*\*|^Run on|^CPU Caches|^  L|^Load|^-+$|^20" $OUT/cpu_$tier.log | tail -40 | cut -c1-200
done
echo "done $(( $(date +%s) - t0 )) s"
