// Models whose MoE layers mix GGUF block formats (a format per matrix and per layer): the banks
// hold each layer's rows at that layer's size, ModelSpec::validate refuses bad mixes, the cpu
// backend computes every layer with its own formats (against the fp64 reference of each layer's
// dequantised weights), and the backend registry offers such models to the GPU backends too.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fresh_seed.hpp"
#include "ft/backend_registry.hpp"
#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/cpu_backend.hpp"
#include "ft/formats.hpp"
#include "ft/model.hpp"
#include "ft/selector.hpp"
#include "moe_reference.hpp"
#include "quant_test_util.hpp"

namespace {

using ft::Format;
using ft::LayerFormats;
using namespace quant_test;

constexpr int32_t kH = 512, kI = 256, kE = 8, kK = 3;

// Layer 0 like a Q4_K_M file (q4_k gate/up, q6_k down), then a uniform layer, then q8_0/q4_0
// both ways round.
const std::vector<LayerFormats> kMix = {
    {Format::q4_k, Format::q6_k}, {Format::q4_k, Format::q4_k}, {Format::q8_0, Format::q4_0}, {Format::q4_0, Format::q8_0}};

ft::ModelSpec mixed_spec(const std::vector<LayerFormats> &mix = kMix) {
    ft::ModelSpec s;
    s.num_layers = int32_t(mix.size());
    s.num_experts = kE;
    s.top_k = kK;
    s.hidden = kH;
    s.intermediate = kI;
    s.format = mix[0].gate_up;
    s.layer_formats = mix;
    s.routing.num_experts = kE;
    s.routing.top_k = kK;
    return s;
}

void expect_refused(const ft::ModelSpec &s, const std::string &needle) {
    try {
        s.validate(false);
        ADD_FAILURE() << "accepted: " << needle;
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(MixedFormats, BanksHoldEachLayersRows) {
    const ft::Model m(mixed_spec());
    const ft::ExpertBanks &b = m.banks();
    EXPECT_FALSE(b.uniform());
    uint64_t total = 0;
    size_t largest[2] = {0, 0};
    for (int32_t l = 0; l < m.spec().num_layers; ++l) {
        const size_t gu = 2 * size_t(kI) * ft::block_row_bytes(kMix[l].gate_up, kH);
        const size_t dn = size_t(kH) * ft::block_row_bytes(kMix[l].down, kI);
        EXPECT_EQ(b.layer_row_bytes(0, l), gu) << l;
        EXPECT_EQ(b.layer_row_bytes(1, l), dn) << l;
        EXPECT_EQ(b.expert_bytes(l), gu + dn) << l;
        EXPECT_EQ(m.spec().layer_expert_bytes(l), gu + dn) << l;
        // Expert e of layer l starts e rows of that layer's size into its allocation.
        EXPECT_EQ(b.row(0, l, 5) - b.layer_base(0, l), ptrdiff_t(5 * gu));
        EXPECT_EQ(b.row(1, l, 7) - b.layer_base(1, l), ptrdiff_t(7 * dn));
        EXPECT_EQ(m.layer_formats(l).gate_up, kMix[l].gate_up);
        EXPECT_EQ(m.layer_formats(l).down, kMix[l].down);
        total += (gu + dn) * kE;
        largest[0] = std::max(largest[0], gu);
        largest[1] = std::max(largest[1], dn);
    }
    EXPECT_EQ(b.total_bytes(), total);
    EXPECT_EQ(m.spec().routed_bytes(), total);
    EXPECT_EQ(b.row_bytes(0), largest[0]);  // the largest over the layers, for slot sizing
    EXPECT_EQ(b.row_bytes(1), largest[1]);
    EXPECT_EQ(m.spec().max_expert_bytes(), largest[0] + largest[1]);
    EXPECT_EQ(b.expert_bytes(), largest[0] + largest[1]);
    EXPECT_TRUE(m.mixed_formats());

    // Uniform models keep one row size everywhere.
    ft::ModelSpec u = mixed_spec({{Format::q4_0, Format::q4_0}, {Format::q4_0, Format::q4_0}});
    const ft::Model mu(u);
    EXPECT_TRUE(mu.banks().uniform());
    EXPECT_FALSE(mu.mixed_formats());
    EXPECT_EQ(mu.banks().total_bytes(), ft::expert_bytes(Format::q4_0, kH, kI) * kE * 2);
    u.layer_formats.clear();
    EXPECT_FALSE(ft::Model(u).mixed_formats());
    EXPECT_EQ(ft::Model(u).banks().total_bytes(), mu.banks().total_bytes());
}

TEST(MixedFormats, ValidateRefusesBadMixes) {
    EXPECT_NO_THROW(mixed_spec().validate(false));
    ft::ModelSpec s = mixed_spec();
    s.layer_formats.pop_back();
    expect_refused(s, "layer_formats");
    s = mixed_spec();
    s.layer_formats[1].down = Format::bf16;
    expect_refused(s, "MoE layer 1 has expert format bf16");
    s = mixed_spec();
    s.layer_formats[2].gate_up = Format::mxfp4;
    expect_refused(s, "MoE layer 2 has expert format mxfp4");
    s = mixed_spec();
    s.layer_formats[3].down = Format(99);
    expect_refused(s, "MoE layer 3 has expert format (unknown)");
    s = mixed_spec();
    s.format = Format::q8_0;
    expect_refused(s, "layer 0's gate_up format (q4_k)");
    // q4_k needs multiples of 256: I = 96 breaks the q4_k matrices (q4_0 alone would take it).
    s = mixed_spec();
    s.intermediate = 96;
    expect_refused(s, "MoE layer 0 (q4_k)");
    // From a checkpoint the same is a format error.
    s = mixed_spec();
    s.layer_formats[0].down = Format::bf16;
    try {
        s.validate(true);
        ADD_FAILURE() << "accepted";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_FORMAT);
    }
}

// Fills every layer of `m` with random valid experts, layer by layer in its own formats, and
// returns the dequantised experts (per layer, a layer of each format: gate/up from one, down
// from the other).
struct MixedLayerRef {
    std::unique_ptr<QLayer> gu, dn;
};

std::vector<MixedLayerRef> fill_model(std::mt19937 &rng, ft::Model &m) {
    std::vector<MixedLayerRef> refs;
    for (int32_t l = 0; l < m.spec().num_layers; ++l) {
        const LayerFormats lf = m.layer_formats(l);
        MixedLayerRef r{std::make_unique<QLayer>(rng, lf.gate_up, kH, kI, kE),
                        std::make_unique<QLayer>(rng, lf.down, kH, kI, kE)};
        ft::ExpertBanks &b = m.banks();
        if (r.gu->banks[0].size() != b.layer_row_bytes(0, l) * kE || r.dn->banks[1].size() != b.layer_row_bytes(1, l) * kE)
            throw std::runtime_error("layer " + std::to_string(l) + ": bank sizes differ from the format's schema");
        std::memcpy(b.layer_base(0, l), r.gu->banks[0].data(), r.gu->banks[0].size());
        std::memcpy(b.layer_base(1, l), r.dn->banks[1].data(), r.dn->banks[1].size());
        refs.push_back(std::move(r));
    }
    return refs;
}

// Every format of kMix quantises each pass's input on the CPU, to Q8_0 (q4_0, q8_0) or Q8_K (the
// K-quants) by the format of that pass's matrix; the reference does the same
// (ft::test::cpu_block_numerics), so what is left is fp32 summation, bf16 rounding and the
// intermediate's steps where the two sides round it differently.
constexpr double kBound = 1.5e-2;

TEST(MixedFormats, CpuBackendComputesEachLayerInItsFormats) {
    std::mt19937 rng(ft::test::fresh_seed("MixedFormats.CpuBackend"));
    ft::Model model(mixed_spec());
    const std::vector<MixedLayerRef> refs = fill_model(rng, model);
    ft::cpu::ThreadPool pool(2, false);
    for (const Isa isa : tiers_here()) {
        ft::BackendContext ctx;
        ctx.pool = &pool;
        ctx.cpu_isa = int(isa);
        ctx.model = &model;
        ctx.params.max_tokens = 32;
        ctx.params.shared_experts = false;
        std::unique_ptr<ft::Backend> be = ft::cpu::make_cpu_backend(ctx);
        for (int32_t T : {1, 5, 32}) {  // 32 tokens over 8 experts: groups large enough to batch
            for (int32_t l = 0; l < model.spec().num_layers; ++l) {
                const Batch b = random_batch(rng, kE, kH, T, kK);
                std::vector<uint16_t> y(size_t(T) * kH, 0x7fc1);  // poisoned
                ft::DecodeCall c;
                c.layer = l;
                c.num_tokens = T;
                c.hidden = b.x.data();
                c.ids = b.ids.data();
                c.weights = b.w.data();
                c.out = y.data();
                ft_session_stats st{};
                be->decode(c, st);
                const QLayer &gu = *refs[l].gu, &dn = *refs[l].dn;
                const std::vector<double> ref = ft::test::moe_reference_f32(
                    [&](int32_t e) { return ft::test::ExpertF32{gu.gate[e].data(), gu.up[e].data(), dn.down[e].data()}; },
                    kE, ft::test::ActivationRef{FT_ACT_SILU, 1.702f, 7.0f}, ft::test::cpu_block_numerics(kMix[l].gate_up, kMix[l].down), kH, kI, T, kK, b.x.data(),
                    b.ids.data(), b.w.data());
                const double err = ft::test::relative_error_bf16(y, ref);
                EXPECT_LT(err, kBound) << "layer " << l << " (" << ft::format_name(kMix[l].gate_up) << "/"
                                     << ft::format_name(kMix[l].down) << ") isa " << ft::cpu::isa_name(isa) << " T=" << T;
                // The bytes read are the layer's own expert bytes per distinct expert.
                EXPECT_EQ(st.cpu_bytes, st.experts_cpu * model.spec().layer_expert_bytes(l));
            }
        }
    }
}

TEST(MixedFormats, ExecutorRefusesFormatsItWasNotMadeFor) {
    std::mt19937 rng(ft::test::fresh_seed("MixedFormats.ExecutorRefuses"));
    ft::cpu::ThreadPool pool(1, false);
    const Isa isa = ft::cpu::cpu_best_isa();
    // Mixing is for block formats only.
    EXPECT_THROW(ft::cpu::MoeExecutor(pool, Format::bf16, kH, kI, kK, 4, {}, 0, isa, {}, {Format::q8_0}), ft::Error);
    EXPECT_THROW(ft::cpu::MoeExecutor(pool, Format::q4_0, kH, kI, kK, 4, {}, 0, isa, {}, {Format::mxfp4}), ft::Error);
    ft::cpu::MoeExecutor ex(pool, Format::q4_0, kH, kI, kK, 4, {}, 0, isa, {}, {Format::q8_0});
    const QLayer q40(rng, Format::q4_0, kH, kI, kE), q6k(rng, Format::q6_k, kH, kI, kE);
    const Batch b = random_batch(rng, kE, kH, 2, kK);
    std::vector<uint16_t> y(2 * kH);
    ft::cpu::ExpertSource src = q40.cpu_source();
    src.down_format = int32_t(Format::q6_k);  // not among the executor's formats
    src.base[1] = q6k.banks[1].data();
    src.row_bytes[1] = q6k.schema[1].row_bytes;
    try {
        ex.run(src, nullptr, 2, b.x.data(), b.ids.data(), b.w.data(), y.data());
        ADD_FAILURE() << "ran q6_k down on an executor made for q4_0 and q8_0";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("q6_k"), std::string::npos) << e.what();
    }
    // Rows smaller than the down format's are refused, not read past.
    src = q40.cpu_source();
    src.down_format = int32_t(Format::q8_0);
    EXPECT_THROW(ex.run(src, nullptr, 2, b.x.data(), b.ids.data(), b.w.data(), y.data()), ft::Error);
}

// The GPU backends run models mixing block formats (each layer and matrix on its own format's
// kernels): their probes accept them like a model of one block format, and `auto` takes the GPU.
TEST(MixedFormats, GpuBackendsAcceptMixedModels) {
    ft::MachineCaps caps;
    caps.gpu = caps.gpu_kernels = true;
    caps.gpu_free_bytes = uint64_t(1) << 40;  // everything fits
    const ft::ModelSpec mixed = mixed_spec();
    ASSERT_TRUE(mixed.mixed_formats());
    ft::ModelSpec q8 = mixed_spec({{Format::q8_0, Format::q8_0}});
    q8.layer_formats.clear();
    for (int32_t id : {FT_BACKEND_GPU, FT_BACKEND_OFFLOAD, FT_BACKEND_HYBRID}) {
        EXPECT_EQ(ft::find_backend(id)->unavailable(caps, mixed), "") << "backend " << id;
        EXPECT_EQ(ft::find_backend(id)->unavailable(caps, q8), "") << "q8_0 has GPU kernels";
        EXPECT_EQ(ft::select_backend(id, caps, mixed).backend, id);
    }
    EXPECT_EQ(ft::find_backend(FT_BACKEND_CPU)->unavailable(caps, mixed), "");
    EXPECT_EQ(ft::select_backend(FT_BACKEND_AUTO, caps, mixed).backend, FT_BACKEND_GPU);
    EXPECT_EQ(ft::select_backend(FT_BACKEND_AUTO, caps, q8).backend, FT_BACKEND_GPU);
    // Without a GPU the mixed model still runs on the cpu backend.
    caps.gpu = false;
    EXPECT_NE(ft::find_backend(FT_BACKEND_GPU)->unavailable(caps, mixed), "");
    EXPECT_EQ(ft::select_backend(FT_BACKEND_AUTO, caps, mixed).backend, FT_BACKEND_CPU);
}

}  // namespace
