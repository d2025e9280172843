// The mirror-against-device checks of slotcache_gpu_check.hpp.
#include "slotcache_gpu_check.hpp"

namespace slotcache_gpu {

std::string first_route_difference(const std::vector<int32_t> &ids, const std::vector<int32_t> &want,
                                   const std::vector<int32_t> &got) {
    for (size_t i = 0; i < want.size(); ++i)
        if (want[i] != got[i])
            return "position " + std::to_string(i) + " (id " + std::to_string(ids[i]) + "): mirror slot " +
                   std::to_string(want[i]) + ", device slot " + std::to_string(got[i]);
    return "";
}

std::string describe(const ft::test::Step &s) {
    std::string out = (s.hybrid ? "hybrid" : "lru");
    out += " layer " + std::to_string(s.layer) + ", " + std::to_string(s.ids.size()) + " ids";
    if (s.hybrid)
        out += ", fraction_q16 " + std::to_string(s.fetch.fraction_q16) + ", max_fetch " +
               std::to_string(s.fetch.max_fetch) + (s.fetch.order == FetchOrder::Recency ? ", recency" : ", lowest_id");
    return out;
}

void run_random(const SlotCacheShape &s, bool hybrid, int steps, uint32_t seed, int32_t max_ids) {
    HostSlotCache mirror(s);
    DeviceCache device(mirror);
    ASSERT_TRUE(device.ok()) << "cudaMalloc of the cache failed";
    DeviceArray<int32_t> d_ids(max_ids), d_out(max_ids);
    ASSERT_NE(d_ids.get(), nullptr);
    std::mt19937 rng(seed);
    for (int i = 0; i < steps; ++i) {
        const ft::test::Step step = ft::test::random_step(rng, s, hybrid, max_ids);
        const auto n = static_cast<int64_t>(step.ids.size());
        std::vector<int32_t> want(step.ids.size()), got(step.ids.size());
        if (hybrid) ft::admit_hybrid(mirror.state(), step.layer, step.ids.data(), want.data(), n, step.fetch);
        else ft::admit_lru(mirror.state(), step.layer, step.ids.data(), want.data(), n);

        CUDA_OK(d_ids.upload(step.ids));
        int32_t *out = (i % 2 == 1) ? d_ids.get() : d_out.get();
        if (hybrid) CUDA_OK(ft::cuda::launch_admit_hybrid(device.state(), step.layer, d_ids.get(), out, n, step.fetch, nullptr));
        else CUDA_OK(ft::cuda::launch_admit_lru(device.state(), step.layer, d_ids.get(), out, n, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));

        ASSERT_EQ(want, got) << describe(s) << ", step " << i << " (" << describe(step) << ", "
                             << (out == d_ids.get() ? "in place" : "separate output")
                             << "): " << first_route_difference(step.ids, want, got);
        ASSERT_TRUE(device.matches(mirror)) << describe(s) << ", step " << i << " (" << describe(step) << ")";
        const std::string call = ft::test::check_call(mirror.state(), step, want);
        ASSERT_TRUE(call.empty()) << describe(s) << ", step " << i << ": mirror broke an invariant: " << call;
    }
}

std::vector<RandomCase> random_cases() {
    return {
        {shape(2, 32, 32, 32), 300},      // S = E: every miss evicts
        {shape(2, 32, 40, 40), 300},      // the original engine's hybrid test shape
        {shape(3, 64, 96, 64), 300},
        {shape(4, 64, 256, 256), 300},    // S = L * E: never evicts once full
        {shape(2, 128, 200, 128), 250},
        {shape(4, 256, 300, 256), 250},
        {shape(3, 256, 768, 256), 200},
        {shape(2, 100, 150, 100), 200},   // E not a power of two, not a multiple of 32
        {shape(36, 256, 8192, 256), 120}, // largest S on the register path
        {shape(33, 256, 8193, 256), 120}, // smallest S on the global-memory path
        {shape(64, 256, 12000, 256), 80},
        {shape(256, 256, 65536, 256), 40},
        {shape(2, 1024, 1500, 1024), 60}, // kMaxAdmissionExperts
    };
}

::testing::AssertionResult same_call(const HostSlotCache &mirror, const DeviceCache &device,
                                     const DeviceArray<int32_t> &d_ids, const DeviceArray<int32_t> &d_out,
                                     const ft::test::Step &step, bool in_place) {
    const auto n = static_cast<int64_t>(step.ids.size());
    std::vector<int32_t> want(step.ids.size()), got(step.ids.size());
    if (step.hybrid) ft::admit_hybrid(mirror.state(), step.layer, step.ids.data(), want.data(), n, step.fetch);
    else ft::admit_lru(mirror.state(), step.layer, step.ids.data(), want.data(), n);
    cudaError_t e = d_ids.upload(step.ids);
    int32_t *out = in_place ? d_ids.get() : d_out.get();
    if (e == cudaSuccess)
        e = step.hybrid ? ft::cuda::launch_admit_hybrid(device.state(), step.layer, d_ids.get(), out, n, step.fetch, nullptr)
                        : ft::cuda::launch_admit_lru(device.state(), step.layer, d_ids.get(), out, n, nullptr);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(got.data(), out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << describe(step) << ": " << cudaGetErrorString(e);
    if (want != got)
        return ::testing::AssertionFailure() << describe(step) << ": " << first_route_difference(step.ids, want, got);
    ::testing::AssertionResult same = device.matches(mirror);
    if (!same) return ::testing::AssertionFailure() << describe(step) << ": " << same.message();
    return ::testing::AssertionSuccess();
}

void craft_state(const HostSlotCache &mirror, std::mt19937 &rng, int32_t distinct_usages, double empty) {
    const SlotCacheState &st = mirror.state();
    const int64_t ids = static_cast<int64_t>(st.shape.layers) * st.shape.experts;
    std::vector<int32_t> flat(static_cast<size_t>(ids));
    for (int64_t i = 0; i < ids; ++i) flat[i] = static_cast<int32_t>(i);
    std::shuffle(flat.begin(), flat.end(), rng);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_int_distribution<int32_t> use(1, distinct_usages);
    for (int32_t s = 0; s < st.shape.slots; ++s) {
        if (s < ids && u(rng) >= empty) {
            st.id_of_slot[s] = flat[s];
            st.slot_for_id[flat[s]] = s;
            st.usage[s] = use(rng);
        }
    }
    *st.step = distinct_usages + 1;
    std::uniform_int_distribution<int64_t> rec(-1, 3);
    for (int64_t i = 0; i < ids; ++i) st.expert_recency[i] = rec(rng);
}

std::vector<int32_t> controlled_ids(const SlotCacheState &st, int32_t layer, int32_t hits, int32_t misses,
                                    int32_t count, std::mt19937 &rng) {
    const int32_t E = st.shape.experts;
    std::vector<int32_t> in, out;
    for (int32_t e = 0; e < E; ++e) (st.slot_for_id[layer * E + e] >= 0 ? in : out).push_back(e);
    std::shuffle(in.begin(), in.end(), rng);
    std::shuffle(out.begin(), out.end(), rng);
    in.resize(std::min<size_t>(in.size(), static_cast<size_t>(hits)));
    out.resize(std::min<size_t>(out.size(), static_cast<size_t>(misses)));
    std::vector<int32_t> distinct = out;
    distinct.insert(distinct.end(), in.begin(), in.end());
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < count && !distinct.empty(); ++i)
        ids.push_back(i < static_cast<int32_t>(distinct.size())
                          ? distinct[i]
                          : distinct[std::uniform_int_distribution<size_t>(0, distinct.size() - 1)(rng)]);
    std::shuffle(ids.begin(), ids.end(), rng);
    return ids;
}

HybridFetch fetch_rule(double fraction, int32_t cap, FetchOrder order) {
    HybridFetch f;
    f.fraction_q16 = ft::fraction_to_q16(fraction);
    f.max_fetch = cap;
    f.order = order;
    return f;
}

SlotCacheShape with_frequency(SlotCacheShape s, int64_t half_life) {
    s.policy = {ft::SlotPolicyKind::Frequency, half_life};
    return s;
}

}  // namespace slotcache_gpu
