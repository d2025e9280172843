// With a GPU: the expert banks of loaded and of built models are page-locked and mapped for the
// engine's device as the CUDA runtime sees them (cudaPointerGetAttributes, cudaHostGetFlags on
// the first and last byte of every bank of every layer), pinned_bytes counts exactly those bytes,
// and an engine kept off the GPU registers nothing. Through the C++ objects behind the handles:
// the C API does not expose bank memory. Skips without a usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "freetoken.h"
#include "ft/model.hpp"
#include "ft/session.hpp"
#include "ft/synth.hpp"
#include "scratch_dir.hpp"

namespace {

using ft::test::ScratchDir;

ft_engine_params engine_params(int32_t device) {
    ft_engine_params p;
    std::memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.device = device;
    p.cpu_threads = 2;
    p.pin_threads = false;  // tests share the machine with other tests
    return p;
}

// Page-locked host memory mapped into the device address space, per the CUDA runtime.
bool page_locked(const void *p) {
    cudaPointerAttributes a{};
    unsigned int flags = 0;
    const bool ok = cudaPointerGetAttributes(&a, p) == cudaSuccess &&
                    cudaHostGetFlags(&flags, const_cast<void *>(p)) == cudaSuccess;
    cudaGetLastError();  // a pageable pointer leaves an error behind
    return ok && a.type == cudaMemoryTypeHost && (flags & cudaHostAllocMapped);
}

// Every bank of every layer registered (registered == true) or none of them.
void expect_banks(const ft::LoadedModel &m, bool registered) {
    const ft::ExpertBanks &banks = m.model().banks();
    uint64_t total = 0;
    for (int32_t l = 0; l < m.model().spec().num_layers; ++l)
        for (int b = 0; b < banks.num_banks(); ++b) {
            const uint8_t *base = banks.layer_base(b, l);
            const size_t bytes = banks.row_bytes(b) * banks.num_experts();
            EXPECT_EQ(page_locked(base), registered) << "layer " << l << " bank " << b << " first byte";
            EXPECT_EQ(page_locked(base + bytes - 1), registered) << "layer " << l << " bank " << b << " last byte";
            total += bytes;
        }
    EXPECT_GT(total, 0u);
    EXPECT_EQ(m.pinned_bytes(), registered ? total : 0u);
}

bool have_gpu(const ft::Engine &engine) { return engine.device() >= 0; }

TEST(GpuPinnedBanks, LoadedModelBanksAreRegisteredWithCuda) {
    ft::Engine engine(engine_params(FT_DEVICE_AUTO));
    if (!have_gpu(engine)) GTEST_SKIP() << "no usable GPU";
    ScratchDir dir;
    ft::synth::Spec s;
    s.num_layers = 3;
    s.num_experts = 8;
    s.hidden = 256;
    s.intermediate = 128;
    ft::synth::write_checkpoint(dir.path(), s);
    ft_model_load_params lp;
    std::memset(&lp, 0, sizeof lp);
    lp.struct_size = sizeof lp;
    const auto model = ft::LoadedModel::load(engine, dir.path(), lp);
    expect_banks(*model, true);

    ft::Engine cpu_only(engine_params(FT_DEVICE_NONE));
    const auto unpinned = ft::LoadedModel::load(cpu_only, dir.path(), lp);
    expect_banks(*unpinned, false);
}

TEST(GpuPinnedBanks, BuiltModelBanksAreRegisteredWithCuda) {
    ft::Engine engine(engine_params(FT_DEVICE_AUTO));
    if (!have_gpu(engine)) GTEST_SKIP() << "no usable GPU";
    ft::ModelSpec s;
    s.num_layers = 2;
    s.num_experts = 4;
    s.top_k = 2;
    s.hidden = 128;
    s.intermediate = 64;
    s.format = ft::Format::bf16;
    s.routing.num_experts = s.num_experts;
    s.routing.top_k = s.top_k;
    ft::LoadedModel model(engine, std::make_unique<ft::Model>(s));
    std::vector<uint16_t> w(size_t(s.hidden) * s.intermediate, 0x3c00);  // bf16 1/128
    for (int32_t l = 0; l < s.num_layers; ++l)
        for (int32_t e = 0; e < s.num_experts; ++e)
            for (int32_t proj : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN})
                model.set_expert(l, e, proj, w.data(), w.size() * sizeof(uint16_t));
    expect_banks(model, false);  // pinned by finalize
    model.finalize();
    expect_banks(model, true);
}

}  // namespace
