// The EP C API (freetoken_ep.h) on a one-rank group (NCCL with a single GPU) against the host
// reference. Skips without a GPU or without NCCL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "ep_cuda_sim_step.cuh"

namespace {

using namespace ep_cuda_test;

// ---- the C API on a one-rank group (NCCL with a single GPU) -----------------------------------

struct CExpert {
    const int32_t *phy2log;
    const float *a, *b;
};

void c_expert(const ft_ep_expert_batch *batch, void *stream, void *user) {
    const CExpert *e = static_cast<const CExpert *>(user);
    epc::ExpertBatch b;
    b.slots = batch->slots;
    b.hidden = batch->hidden;
    b.max_rows = batch->max_rows;
    b.offset = batch->offset;
    b.x = batch->x;
    b.y = batch->y;
    ft::test::toy_expert(e->phy2log, e->a, e->b)(b, static_cast<cudaStream_t>(stream));
}

TEST(EpCudaCApi, OneRankGroupMatchesHost) {
    REQUIRE_GPU();
    std::string why;
    if (!epc::NcclTransport::available(&why)) GTEST_SKIP() << why;
    const Case c{1, 256, 40, WireDtype::Fp8Fp32, false, 51};
    Rng rng(c.seed);
    const Placement p = contiguous_placement(16, 1);
    std::vector<RankInput> in = make_inputs(c, p, rng);
    const Experts ex = make_experts(rng, p.num_experts);
    const std::vector<HostRank> h = host_pipeline(p, in, c.H, c.dtype, ex);
    DeviceArray<int32_t> ids(in[0].ids), phy2log(p.phy2log);
    DeviceArray<float> w(in[0].weights), a(ex.a), b(ex.b);
    DeviceArray<uint16_t> x(in[0].x), out(in[0].x.size());
    CExpert ce{phy2log.ptr, a.ptr, b.ptr};
    for (int32_t mode : {FT_EP_MODE_THROUGHPUT, FT_EP_MODE_LATENCY}) {
        ft_ep_params prm;
        ft_ep_params_init(&prm);
        prm.num_experts = 16;
        prm.top_k = kTopK;
        prm.hidden = c.H;
        prm.max_tokens = 64;
        prm.mode = mode;
        ft_ep_group *g = nullptr;
        char err[256];
        const int32_t dev = 0;
        ASSERT_EQ(ft_ep_group_bootstrap_local(1, &dev, &prm, &g, err, sizeof err), FT_OK) << err;
        ft_ep_group_info info;
        info.struct_size = sizeof info;
        ASSERT_EQ(ft_ep_group_info_get(g, &info), FT_OK);
        EXPECT_EQ(info.ranks, 1);
        EXPECT_EQ(info.slots_per_rank, 16);
        std::vector<int32_t> map(16);
        size_t n = 0;
        ASSERT_EQ(ft_ep_group_get_placement(g, map.data(), map.size(), &n), FT_OK);
        EXPECT_EQ(n, 16u);
        EXPECT_EQ(map, p.phy2log);
        EXPECT_EQ(ft_ep_group_set_placement(g, map.data(), 3), FT_ERR_INVALID_ARGUMENT);
        EXPECT_STRNE(ft_ep_group_last_error(g), "");
        ASSERT_EQ(ft_ep_group_set_placement(g, map.data(), map.size()), FT_OK);

        ASSERT_EQ(ft_ep_forward(g, ids.ptr, w.ptr, x.ptr, in[0].tokens, c_expert, &ce, out.ptr, nullptr), FT_OK)
            << ft_ep_group_last_error(g);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(out.download(in[0].x.size()) == h[0].out) << "forward, mode " << mode;

        cudaMemset(out.ptr, 0, in[0].x.size() * 2);
        ft_ep_expert_batch batch;
        batch.struct_size = sizeof batch;
        ASSERT_EQ(ft_ep_dispatch(g, ids.ptr, w.ptr, x.ptr, in[0].tokens, nullptr, &batch), FT_OK) << ft_ep_group_last_error(g);
        c_expert(&batch, nullptr, &ce);
        ASSERT_EQ(ft_ep_combine(g, out.ptr, nullptr), FT_OK) << ft_ep_group_last_error(g);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(out.download(in[0].x.size()) == h[0].out) << "dispatch + combine, mode " << mode;
        EXPECT_EQ(ft_ep_dispatch(g, ids.ptr, w.ptr, x.ptr, 65, nullptr, nullptr), FT_ERR_INVALID_ARGUMENT);
        ft_ep_group_free(g);
    }
    ft_ep_group_free(nullptr);
}
}  // namespace
