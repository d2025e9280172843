# Final GPU verification, part A: fresh build and the whole ctest suite with the GPU tests for real.
set -u
deps=$PWD/.deps/root/usr; export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
cmake -S . -B /tmp/fb -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=$deps -DFT_BUILD_BENCH=ON > $OUT/cfg.log 2>&1 || { tail -20 $OUT/cfg.log; exit 1; }
cmake --build /tmp/fb -j16 > $OUT/build.log 2>&1 || { grep -E "error|FAILED" $OUT/build.log | head -20; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
cd /tmp/fb && timeout 420 ctest -j12 --timeout 240 -E abi.consumers > $OUT/ctest.log 2>&1
grep -E "tests passed|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout" $OUT/ctest.log | head -30
echo "done $(( $(date +%s) - t0 )) s"
