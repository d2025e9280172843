// CUDA-graph replays of the admission calls with new ids against eager calls and the mirror, and
// the frequency policy on the device against the mirror. Skips where no CUDA device is usable.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <random>
#include <string>
#include <vector>

#include "slotcache_gpu_check.hpp"

namespace {

using namespace slotcache_gpu;

// A captured sequence of admissions (four layers per replay) replayed with new ids gives what the
// same calls give eagerly on a second device cache, and what the mirror gives.
void run_graph(bool hybrid, ft::SlotPolicy policy = {}) {
    SlotCacheShape s = shape(4, 64, 128, 64);
    s.policy = policy;
    constexpr int kLayers = 4, kIds = 48;
    HostSlotCache mirror(s);
    DeviceCache graph_cache(mirror), eager_cache(mirror);
    ASSERT_TRUE(graph_cache.ok() && eager_cache.ok());
    DeviceArray<int32_t> g_ids(kLayers * kIds), g_out(kLayers * kIds), e_ids(kLayers * kIds), e_out(kLayers * kIds);
    HybridFetch fetch[kLayers];
    for (int l = 0; l < kLayers; ++l) {
        fetch[l].fraction_q16 = l == 3 ? 0 : ft::fraction_to_q16(0.2 + 0.2 * l);
        fetch[l].max_fetch = 2;
        fetch[l].order = l == 1 ? FetchOrder::LowestId : FetchOrder::Recency;
    }
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto enqueue = [&](const DeviceCache &c, const DeviceArray<int32_t> &in, const DeviceArray<int32_t> &out) {
        for (int l = 0; l < kLayers; ++l) {
            const cudaError_t e =
                hybrid ? ft::cuda::launch_admit_hybrid(c.state(), l, in.get() + l * kIds, out.get() + l * kIds, kIds,
                                                       fetch[l], stream)
                       : ft::cuda::launch_admit_lru(c.state(), l, in.get() + l * kIds, out.get() + l * kIds, kIds, stream);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    };

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t captured = enqueue(graph_cache, g_ids, g_out);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(captured);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    std::mt19937 rng(hybrid ? 31 : 30);
    for (int rep = 0; rep < 60; ++rep) {
        std::vector<int32_t> ids(kLayers * kIds);
        for (auto &id : ids) {
            id = std::uniform_int_distribution<int32_t>(0, rep % 2 ? 15 : 63)(rng);
            if (hybrid && std::uniform_int_distribution<int>(0, 9)(rng) == 0) id = -1;
        }
        std::vector<int32_t> want = ids;
        for (int l = 0; l < kLayers; ++l) {
            int32_t *p = want.data() + l * kIds;
            if (hybrid) ft::admit_hybrid(mirror.state(), l, p, p, kIds, fetch[l]);
            else ft::admit_lru(mirror.state(), l, p, p, kIds);
        }
        CUDA_OK(g_ids.upload(ids));
        CUDA_OK(e_ids.upload(ids));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(enqueue(eager_cache, e_ids, e_out));
        CUDA_OK(cudaStreamSynchronize(stream));
        std::vector<int32_t> from_graph(ids.size()), from_eager(ids.size());
        CUDA_OK(g_out.download(from_graph));
        CUDA_OK(e_out.download(from_eager));
        ASSERT_EQ(from_eager, want) << "eager, replay " << rep << ": " << first_route_difference(ids, want, from_eager);
        ASSERT_EQ(from_graph, want) << "graph, replay " << rep << ": " << first_route_difference(ids, want, from_graph);
        ASSERT_TRUE(graph_cache.matches(mirror)) << "graph replay " << rep;
        ASSERT_TRUE(eager_cache.matches(mirror)) << "eager call " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
}

TEST(SlotCacheGpu, LruGraphReplaysEqualEagerCalls) {
    SKIP_WITHOUT_GPU();
    run_graph(false);
}

TEST(SlotCacheGpu, HybridGraphReplaysEqualEagerCalls) {
    SKIP_WITHOUT_GPU();
    run_graph(true);
}

// ---- Frequency policy -----------------------------------------------------------------------------

TEST(SlotCacheGpu, FrequencyGraphReplaysEqualEagerCalls) {
    SKIP_WITHOUT_GPU();
    run_graph(false, {ft::SlotPolicyKind::Frequency, 6});
    if (HasFatalFailure()) return;
    run_graph(true, {ft::SlotPolicyKind::Frequency, 40});
}

// Every random shape (register and global-memory paths, S = E up to S = L * E), LRU-style and
// hybrid admission, with half-lives from one call (bonuses vanish fast) to thousands.
TEST(SlotCacheGpu, FrequencyMatchesMirrorOverRandomSteps) {
    SKIP_WITHOUT_GPU();
    uint32_t seed = 300;
    const int64_t half_lives[] = {1, 3, 17, 200, 5000};
    for (const auto &c : random_cases()) {
        for (bool hybrid : {false, true}) {
            const SlotCacheShape s = with_frequency(c.shape, half_lives[seed % 5]);
            SCOPED_TRACE(describe(s) + (hybrid ? " hybrid" : " lru") + " frequency h=" + std::to_string(s.policy.half_life));
            run_random(s, hybrid, c.steps, seed++);
            if (HasFatalFailure()) return;
        }
    }
}

// Decode-sized calls on large caches (the threshold path, its fallback rounds, the global-memory
// path at S = 65536), then priorities beyond the packing limit, which only the general path orders.
TEST(SlotCacheGpu, FrequencyDecodeRunsAndHugePrioritiesMatchTheMirror) {
    SKIP_WITHOUT_GPU();
    const SlotCacheShape cases[] = {with_frequency(shape(64, 256, 8192, 64), 64 * 16),
                                    with_frequency(shape(512, 256, 65536, 64), 7)};
    DeviceArray<int32_t> d_ids(64), d_out(64);
    uint32_t seed = 1900;
    for (const SlotCacheShape &sh : cases) {
        for (bool hybrid : {false, true}) {
            SCOPED_TRACE(describe(sh) + (hybrid ? " hybrid" : " lru"));
            std::mt19937 rng(seed++);
            HostSlotCache mirror(sh);
            DeviceCache device(mirror);
            ASSERT_TRUE(device.ok());
            for (int call = 0; call < 200; ++call) {
                ft::test::Step step;
                step.hybrid = hybrid;
                step.layer = call % 8;  // few layers: experts come back and build up priority
                step.ids = controlled_ids(mirror.state(), step.layer, 56, 1 + call % 16, 64, rng);
                step.fetch = fetch_rule(0.415 + 0.1 * (call % 4), call % 5, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, device, d_ids, d_out, step, call % 2 == 0)) << "call " << call;
            }
            // Priorities past 2^(63 - slot bits): the packed paths refuse them, the general path runs.
            const SlotCacheState &st = mirror.state();
            for (int32_t s = 0; s < st.shape.slots; s += 3)
                if (st.id_of_slot[s] >= 0) st.priority[s] = st.expert_priority[st.id_of_slot[s]] = (int64_t{1} << 58) + s % 7;
            DeviceCache crafted(mirror);
            ASSERT_TRUE(crafted.ok());
            for (int call = 0; call < 40; ++call) {
                ft::test::Step step;
                step.hybrid = hybrid;
                step.layer = call % 8;
                step.ids = controlled_ids(mirror.state(), step.layer, 8, 1 + call % 6, 16, rng);
                step.fetch = fetch_rule(0.5, 0, FetchOrder::Recency);
                ASSERT_TRUE(same_call(mirror, crafted, d_ids, d_out, step, false)) << "huge priorities, call " << call;
            }
        }
    }
}
}  // namespace
