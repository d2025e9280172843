// Device admission kernels against the host mirror, bit for bit: random runs for both algorithms
// over many shapes (bench/bench_admission times the admission calls). Skips where no CUDA device
// is usable.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <random>
#include <string>
#include <vector>

#include "slotcache_gpu_check.hpp"

namespace {

using namespace slotcache_gpu;

TEST(SlotCacheGpu, LruMatchesMirrorOverRandomSteps) {
    SKIP_WITHOUT_GPU();
    uint32_t seed = 100;
    for (const auto &c : random_cases()) {
        SCOPED_TRACE(describe(c.shape));
        run_random(c.shape, false, c.steps, seed++);
        if (HasFatalFailure()) return;
    }
}

TEST(SlotCacheGpu, HybridMatchesMirrorOverRandomSteps) {
    SKIP_WITHOUT_GPU();
    uint32_t seed = 200;
    for (const auto &c : random_cases()) {
        SCOPED_TRACE(describe(c.shape));
        run_random(c.shape, true, c.steps, seed++);
        if (HasFatalFailure()) return;
    }
}
}  // namespace
