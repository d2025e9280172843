// The synthetic gather plan of the measurements (cuda_gather.hpp).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "ft/cuda_gather.hpp"

namespace ft::cuda {

std::vector<int32_t> synthetic_gather_plan(int64_t experts, int32_t count, uint32_t seed) {
    std::vector<int32_t> sources(static_cast<size_t>(experts));
    std::iota(sources.begin(), sources.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(sources.begin(), sources.end(), rng);
    std::vector<int32_t> host(2 + 2 * static_cast<size_t>(count));
    const int64_t n = count;
    std::memcpy(host.data(), &n, sizeof n);
    for (int32_t i = 0; i < count; ++i) {
        host[2 + static_cast<size_t>(i)] = i;
        host[2 + static_cast<size_t>(count) + static_cast<size_t>(i)] = sources[static_cast<size_t>(i)];
    }
    return host;
}

GatherPlan synthetic_gather_plan_view(const void *device_plan, int32_t count) {
    GatherPlan plan;
    plan.num_indices = static_cast<const int64_t *>(device_plan);
    plan.evict_slots = static_cast<const int32_t *>(device_plan) + 2;
    plan.src_indices = plan.evict_slots + count;
    plan.capacity = count;
    return plan;
}

}  // namespace ft::cuda
