// GPU decode expert kernels (ft/cuda_experts.hpp) against the fp64 reference of the layer
// (tests/support/moe_reference.hpp, built from ft::dequant_projection / projection_bias with the
// executor's rounding points) and against the CPU executor, for every format and activation;
// device decoders against the host ones bit for bit; routes with slot -1 never read anything
// (a NaN-filled slot stays out of the outputs); CUDA-graph replays equal eager runs; tokens = 0
// is a no-op; the tensor-core kernels serve every format but the GGUF block formats, which take the
// CUDA-core ones, as do bf16 rows that are not a multiple of 8; a block-format decoder runs experts
// mixing block formats per matrix.
// Skips where no CUDA device is usable.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_experts.hpp"
#include "ft/cuda_numerics.cuh"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "moe_reference.hpp"
#include "random_expert_banks.hpp"

namespace {

using ft::Format;

#define SKIP_WITHOUT_GPU()                                                 \
    do {                                                                   \
        if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
    } while (0)

#define CUDA_OK(expr)                                                                                    \
    do {                                                                                                 \
        const cudaError_t e_ = (expr);                                                                   \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
    } while (0)

// Device buffer that frees itself.
struct DevBuf {
    void *p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t bytes) : n(bytes) {
        if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
    }
    ~DevBuf() {
        if (p) cudaFree(p);
    }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    template <typename T>
    T *as() const {
        return static_cast<T *>(p);
    }
    template <typename T>
    void put(const std::vector<T> &v) const {
        ASSERT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
};

template <typename T>
std::vector<T> get(const DevBuf &b, size_t count) {
    std::vector<T> v(count);
    EXPECT_EQ(cudaMemcpy(v.data(), b.p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

// Random banks of E experts plus one extra slot (index E) of NaN bytes that routes never name.
struct Layer : ft::test::RandomExpertLayer {
    Layer(std::mt19937 &rng, Format fmt, int32_t h, int32_t i, int32_t e) : RandomExpertLayer(rng, fmt, h, i, e, 1) {}
};

// The banks copied to the device (one allocation per bank, E + 1 slots).
struct DeviceLayer {
    std::vector<std::unique_ptr<DevBuf>> bufs;
    ft::cuda::DeviceExperts dx;
    explicit DeviceLayer(const Layer &L) {
        dx.format = L.f;
        dx.hidden = L.H;
        dx.inter = L.I;
        dx.num_banks = int(L.schema.size());
        for (size_t b = 0; b < L.schema.size(); ++b) {
            bufs.push_back(std::make_unique<DevBuf>(L.banks[b].size()));
            bufs.back()->put(L.banks[b]);
            dx.base[b] = bufs.back()->as<uint8_t>();
            dx.row_bytes[b] = L.schema[b].row_bytes;
        }
    }
};

struct Batch {
    int32_t T, K;
    std::vector<uint16_t> x, addend;
    std::vector<int32_t> ids;
    std::vector<float> w;
};

// Ids in [-1, E): duplicates across tokens (E is small), a duplicate inside token 0, and (T >= 2)
// an all-skipped last token.
Batch random_batch(std::mt19937 &rng, int32_t E, int32_t H, int32_t T, int32_t K, bool addend) {
    Batch b{T, K, std::vector<uint16_t>(size_t(T) * H), {}, std::vector<int32_t>(size_t(T) * K), std::vector<float>(size_t(T) * K)};
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f), wd(0.05f, 1.0f);
    for (auto &v : b.x) {
        const float f = xd(rng);
        v = ft::f32_to_bf16(f == 0.0f ? 0.5f : f);
    }
    if (addend) {
        b.addend.resize(size_t(T) * H);
        for (auto &v : b.addend) v = ft::f32_to_bf16(0.1f * xd(rng));
    }
    std::uniform_int_distribution<int32_t> id(-1, E - 1);
    for (int32_t r = 0; r < T * K; ++r) b.ids[r] = id(rng), b.w[r] = wd(rng);
    if (K >= 2) b.ids[1] = b.ids[0] = std::abs(b.ids[0]) % E;
    if (T >= 2)
        for (int32_t k = 0; k < K; ++k) b.ids[size_t(T - 1) * K + k] = -1;
    return b;
}

std::vector<double> reference(const Layer &L, const Batch &b, const ft::cuda::DeviceActivation &act) {
    ft::test::ActivationRef a{act.kind, act.alpha, act.limit};
    ft::test::FormatNumerics fmt;
    if (L.f == Format::ds_fp4) {
        fmt.ds_fp4 = true;
        fmt.ds_limit = act.kind == FT_ACT_SILU && std::isfinite(act.limit) ? act.limit : 0.0;
        fmt.fp8_round_trip = [](const float *x, int64_t K, float *y) { ft::fp8_round_trip_per128(x, K, y); };
    }
    if (format_is_block(L.f)) {  // the integer-dot kernel's activations: Q8_0 or Q8_K, as the CPU's
        const ft::test::FormatNumerics n = ft::test::cpu_block_numerics(L.f);
        fmt.in_round_trip = n.in_round_trip;
        fmt.mid_round_trip = n.mid_round_trip;
    }
    std::vector<double> ref = ft::test::moe_reference_f32([&](int32_t e) { return L.expert(e); }, L.E, a, fmt, L.H,
                                                             L.I, b.T, b.K, b.x.data(), b.ids.data(), b.w.data());
    if (!b.addend.empty())
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += ft::bf16_to_f32(b.addend[i]);
    return ref;
}

std::vector<ft::cuda::DeviceActivation> activations_of(Format f) {
    const float inf = std::numeric_limits<float>::infinity();
    switch (f) {
        case Format::mxfp4: return {{FT_ACT_SWIGLU_CLAMP, 1.702f, 7.0f}, {FT_ACT_SWIGLU_CLAMP, 1.702f, 0.3f}};
        case Format::ds_fp4:
            return {{FT_ACT_SILU, 1.702f, 0.0f}, {FT_ACT_SILU, 1.702f, 0.25f}, {FT_ACT_SILU, 1.702f, inf}};
        case Format::bf16:
            return {{FT_ACT_SILU, 1.702f, 7.0f}, {FT_ACT_GELU, 1.702f, 7.0f}, {FT_ACT_GELU_TANH, 1.702f, 7.0f}};
        default: return {{FT_ACT_SILU, 1.702f, 7.0f}};
    }
}

// Max relative error (vs max |y|) of the GPU layer against the fp64 reference: every format is
// W16A16 / W8A16 / W4A16 on the GPU (exact weights, bf16 activations, fp32 sums) or, for the GGUF
// block formats (the integer-dot kernel: every geometry here fits it), W*A8 with the Q8_0
// activations the reference models (reference()), so the error is the bf16 output rounding
// (2^-9) plus fp32 summation and the bf16 intermediate: 1e-2 is loose.
// Against the CPU executor: 1.5e-2, the block formats 3e-2 (W*A8 on both: where the fp32 summation
// order moves a bf16 intermediate by an ulp, its Q8_0 code can move by a whole step).
double gpu_bound(Format) { return 1e-2; }

double cpu_bound(Format f) { return format_is_block(f) ? 3e-2 : 1.5e-2; }

struct Geometry {
    Format f;
    int32_t H, I;
};
const Geometry kGeometries[] = {
    {Format::bf16, 256, 128},      {Format::bf16, 100, 36},  // 100 x 36: the scalar bf16 path
    {Format::fp8_block, 256, 128}, {Format::nvfp4, 272, 48},  // rows of an odd number of 16-blocks
    {Format::nvfp4, 256, 96},      {Format::mxfp4, 192, 96},  // a partial 128-column tile
    {Format::ds_fp4, 256, 128},    {Format::q4_0, 224, 96},   // odd block count: both alignments
    {Format::mxfp4, 160, 96},  // down: 160 columns, half a 64-column tile of the mma kernel
    {Format::q8_0, 224, 96},       {Format::q2_k, 256, 256},  // GGUF block formats (CUDA-core kernel)
    {Format::q3_k, 512, 256},      {Format::q4_k, 256, 512},
    {Format::q5_k, 256, 256},      {Format::q6_k, 768, 256},
    {Format::iq4_xs, 256, 256},
    // the integer-dot kernel's 16 and 32 lanes per row pair (rows of more than 8 / 16 chunk groups)
    {Format::q4_k, 2304, 768},     {Format::q2_k, 2304, 256},
    {Format::q6_k, 2304, 256},     {Format::q8_0, 1056, 96},
    {Format::iq4_xs, 768, 256},
};

std::string label(const Geometry &g, const ft::cuda::DeviceActivation &a, int32_t T) {
    return ft::cat(ft::format_name(g.f), " H=", g.H, " I=", g.I, " act=", a.kind, " limit=", a.limit, " T=", T);
}

std::vector<double> to_f64(const std::vector<uint16_t> &y) {
    std::vector<double> v(y.size());
    for (size_t i = 0; i < y.size(); ++i) v[i] = ft::bf16_to_f32(y[i]);
    return v;
}

void matches_reference_every_format() {
    ft::cpu::ThreadPool pool(2, false);
    const int32_t K = 4, max_tokens = 64;
    for (const Geometry &geo : kGeometries) {
        std::mt19937 rng(100 + int(geo.f) * 7 + geo.H);
        const Layer L(rng, geo.f, geo.H, geo.I, 6);
        const DeviceLayer D(L);
        for (const auto &act : activations_of(geo.f)) {
            ft::cuda::ExpertDecoder dec(geo.f, L.H, L.I, K, max_tokens, act);
            const ft::cpu::ActivationSpec cact{act.kind, act.alpha, act.limit};
            ft::cpu::MoeExecutor cpu(pool, geo.f, L.H, L.I, K, max_tokens, cact, 0, ft::cpu::cpu_best_isa());
            for (int32_t T : {1, 3, 8, 64}) {
                const Batch b = random_batch(rng, L.E, L.H, T, K, T == 3);
                DevBuf x(b.x.size() * 2), ids(b.ids.size() * 4), w(b.w.size() * 4), y(size_t(T) * L.H * 2),
                    add(b.addend.size() * 2);
                x.put(b.x), ids.put(b.ids), w.put(b.w);
                if (!b.addend.empty()) add.put(b.addend);
                CUDA_OK(cudaMemset(y.p, 0xff, y.n));
                CUDA_OK(dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(),
                                   b.addend.empty() ? nullptr : add.as<uint16_t>(), y.as<uint16_t>(), T, nullptr));
                CUDA_OK(cudaDeviceSynchronize());
                const std::vector<uint16_t> yg = get<uint16_t>(y, size_t(T) * L.H);
                const std::vector<double> ref = reference(L, b, act);
                const double err = ft::test::relative_error_bf16(yg, ref);
                EXPECT_LT(err, gpu_bound(geo.f)) << label(geo, act, T) << " " << dec.kernel_name();
                if (T >= 2)  // all routes skipped, no addend: zeros
                    for (int32_t h = 0; h < L.H && b.addend.empty(); ++h)
                        ASSERT_EQ(yg[size_t(T - 1) * L.H + h], 0) << label(geo, act, T) << " skipped token";

                // The CPU executor (ids outside [0, E) skipped the same way); no addend there.
                if (b.addend.empty()) {
                    std::vector<uint16_t> yc(size_t(T) * L.H);
                    cpu.run(L.cpu_source(), nullptr, T, b.x.data(), b.ids.data(), b.w.data(), yc.data());
                    const double cerr = ft::test::relative_error(to_f64(yg), to_f64(yc));
                    EXPECT_LT(cerr, cpu_bound(geo.f)) << label(geo, act, T) << " vs CPU " << cpu.kernel_name();
                }

                // Same inputs again: bitwise the same output (fixed summation order).
                if (T != 8) continue;
                CUDA_OK(dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(),
                                   b.addend.empty() ? nullptr : add.as<uint16_t>(), y.as<uint16_t>(), T, nullptr));
                CUDA_OK(cudaDeviceSynchronize());
                EXPECT_EQ(get<uint16_t>(y, size_t(T) * L.H), yg) << label(geo, act, T) << " not deterministic";
            }
        }
    }
}

// A misaligned x (staged into the decoder's scratch) and more routes than one grouping pass
// (T * K = 800 > 512 threads) give the reference result too.
void misaligned_input_and_many_routes() {
    const int32_t K = 8, T = 100;
    for (Format f : {Format::bf16, Format::ds_fp4, Format::q4_0}) {
        std::mt19937 rng(7 + int(f));
        const Layer L(rng, f, 256, 128, 40);
        const DeviceLayer D(L);
        const ft::cuda::DeviceActivation act{FT_ACT_SILU, 1.702f, 7.0f};
        ft::cuda::ExpertDecoder dec(f, L.H, L.I, K, T, act);
        const Batch b = random_batch(rng, L.E, L.H, T, K, false);
        DevBuf x(b.x.size() * 2 + 16), ids(b.ids.size() * 4), w(b.w.size() * 4), y(size_t(T) * L.H * 2);
        uint16_t *xm = x.as<uint16_t>() + 1;  // 2-byte aligned only
        CUDA_OK(cudaMemcpy(xm, b.x.data(), b.x.size() * 2, cudaMemcpyHostToDevice));
        ids.put(b.ids), w.put(b.w);
        CUDA_OK(dec.decode(D.dx, xm, ids.as<int32_t>(), w.as<float>(), nullptr, y.as<uint16_t>(), T, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const double err = ft::test::relative_error_bf16(get<uint16_t>(y, size_t(T) * L.H), reference(L, b, act));
        EXPECT_LT(err, gpu_bound(f)) << ft::format_name(f);
    }
}

// Routes with slot -1 read nothing: with every unused slot NaN (0xFF bytes in every bank) and
// the routes naming only other slots, all outputs are finite; a route naming the NaN slot makes
// its token non-finite (so the check can fail).
void skipped_routes_never_read_poisoned_slot() {
    for (const Geometry &geo : kGeometries) {
        std::mt19937 rng(3 + int(geo.f));
        const Layer L(rng, geo.f, geo.H, geo.I, 4);
        const DeviceLayer D(L);
        const int32_t K = 4, T = 8;
        const ft::cuda::DeviceActivation act = activations_of(geo.f)[0];
        ft::cuda::ExpertDecoder dec(geo.f, L.H, L.I, K, T, act);
        Batch b = random_batch(rng, L.E, L.H, T, K, false);
        for (int32_t r = 0; r < T * K; r += 3) b.ids[r] = -1;
        DevBuf x(b.x.size() * 2), ids(b.ids.size() * 4), w(b.w.size() * 4), y(size_t(T) * L.H * 2);
        x.put(b.x), ids.put(b.ids), w.put(b.w);
        CUDA_OK(dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(), nullptr, y.as<uint16_t>(), T, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        for (uint16_t v : get<uint16_t>(y, size_t(T) * L.H))
            ASSERT_TRUE(std::isfinite(ft::bf16_to_f32(v))) << ft::format_name(geo.f) << " NaN slot leaked";
        b.ids[0] = L.E;  // the poisoned slot, in token 0
        ids.put(b.ids);
        CUDA_OK(dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(), nullptr, y.as<uint16_t>(), T, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> yp = get<uint16_t>(y, size_t(T) * L.H);
        bool any_nan = false;
        for (int32_t h = 0; h < L.H; ++h) any_nan |= !std::isfinite(ft::bf16_to_f32(yp[h]));
        EXPECT_TRUE(any_nan) << ft::format_name(geo.f) << ": the poisoned slot did not poison its own route";
        for (size_t i = L.H; i < yp.size(); ++i)
            ASSERT_TRUE(std::isfinite(ft::bf16_to_f32(yp[i]))) << ft::format_name(geo.f) << " NaN leaked across tokens";
    }
}

// decode() captured in a graph and replayed with new x / slots / weights in the same buffers gives
// the bytes of an eager call on those inputs.
void graph_replay_equals_eager() {
    for (Format f : {Format::bf16, Format::mxfp4, Format::ds_fp4}) {
        std::mt19937 rng(11 + int(f));
        const Layer L(rng, f, f == Format::mxfp4 ? 192 : 256, f == Format::mxfp4 ? 96 : 128, 8);
        const DeviceLayer D(L);
        const int32_t K = 4, T = 5;
        const ft::cuda::DeviceActivation act = activations_of(f)[0];
        ft::cuda::ExpertDecoder dec(f, L.H, L.I, K, T, act);
        DevBuf x(size_t(T) * L.H * 2), ids(size_t(T) * K * 4), w(size_t(T) * K * 4), add(size_t(T) * L.H * 2),
            y(size_t(T) * L.H * 2);
        Batch b0 = random_batch(rng, L.E, L.H, T, K, true);
        x.put(b0.x), ids.put(b0.ids), w.put(b0.w), add.put(b0.addend);
        // A blocking stream: it orders after the legacy-stream copies that fill the inputs.
        cudaStream_t s;
        CUDA_OK(cudaStreamCreate(&s));
        CUDA_OK(cudaDeviceSynchronize());
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        const cudaError_t le = dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(), add.as<uint16_t>(),
                                          y.as<uint16_t>(), T, s);
        CUDA_OK(cudaStreamEndCapture(s, &g));
        CUDA_OK(le);
        CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 0; rep < 3; ++rep) {
            const Batch b = random_batch(rng, L.E, L.H, T, K, true);
            x.put(b.x), ids.put(b.ids), w.put(b.w), add.put(b.addend);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaGraphLaunch(ge, s));
            CUDA_OK(cudaStreamSynchronize(s));
            const std::vector<uint16_t> yg = get<uint16_t>(y, size_t(T) * L.H);
            CUDA_OK(cudaMemset(y.p, 0, y.n));
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(), add.as<uint16_t>(),
                               y.as<uint16_t>(), T, s));
            CUDA_OK(cudaStreamSynchronize(s));
            EXPECT_EQ(get<uint16_t>(y, size_t(T) * L.H), yg) << ft::format_name(f) << " replay " << rep;
            EXPECT_LT(ft::test::relative_error_bf16(yg, reference(L, b, act)), gpu_bound(f)) << ft::format_name(f);
        }
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
    }
}

TEST(ExpertDecoderGpu, MatchesReferenceAndCpuEveryFormat) {
    SKIP_WITHOUT_GPU();
    matches_reference_every_format();
}
TEST(ExpertDecoderGpu, MisalignedInputAndManyRoutes) {
    SKIP_WITHOUT_GPU();
    misaligned_input_and_many_routes();
}
TEST(ExpertDecoderGpu, SkippedRoutesNeverReadPoisonedSlot) {
    SKIP_WITHOUT_GPU();
    skipped_routes_never_read_poisoned_slot();
}
TEST(ExpertDecoderGpu, GraphReplayEqualsEager) {
    SKIP_WITHOUT_GPU();
    graph_replay_equals_eager();
}

// Every format runs on the tensor cores except bf16 rows that are not whole 16-byte vectors and
// the GGUF block formats, which take the CUDA-core kernels.
TEST(ExpertDecoderGpu, TensorCoreKernelsAreSelected) {
    SKIP_WITHOUT_GPU();
    const ft::cuda::DeviceActivation act{FT_ACT_SILU, 1.702f, 7.0f};
    for (const Geometry &geo : kGeometries) {
        ft::cuda::ExpertDecoder dec(geo.f, geo.H, geo.I, 4, 4, act);
        const bool simt_block = ft::format_is_block(geo.f);
        const bool mma = !(geo.f == Format::bf16 && (geo.H % 8 != 0 || geo.I % 8 != 0)) && !simt_block;
        EXPECT_EQ(std::string(dec.kernel_name()).find("mma") != std::string::npos, mma)
            << ft::format_name(geo.f) << " H=" << geo.H << ": " << dec.kernel_name();
    }
}

// The decoder's output (T x H bf16) for batch b on layer D, without an addend, into y.
void decode_batch(ft::cuda::ExpertDecoder &dec, const DeviceLayer &D, const Batch &b, int32_t H,
                  std::vector<uint16_t> &y) {
    DevBuf x(b.x.size() * 2), ids(b.ids.size() * 4), w(b.w.size() * 4), out(size_t(b.T) * H * 2);
    x.put(b.x), ids.put(b.ids), w.put(b.w);
    CUDA_OK(cudaMemset(out.p, 0xff, out.n));
    CUDA_OK(dec.decode(D.dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(), nullptr, out.as<uint16_t>(), b.T,
                       nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    y = get<uint16_t>(out, size_t(b.T) * H);
}

// Rows longer than the integer-dot kernel's shared memory takes (K > 8928: gate_up at H = 9216)
// go to the float CUDA-core kernel with bf16 activations; down (K = I) stays on the integer one.
TEST(ExpertDecoderGpu, LongBlockRowsTakeTheFloatKernel) {
    SKIP_WITHOUT_GPU();
    const int32_t H = 9216, I = 256, E = 3, K = 2;
    const ft::cuda::DeviceActivation act{FT_ACT_SILU, 1.702f, 7.0f};
    const ft::test::ActivationRef a{act.kind, act.alpha, act.limit};
    ft::test::FormatNumerics fmt;  // gate_up: bf16 activations; down: the format's Q8_0 or Q8_K
    for (Format f : {Format::q4_0, Format::q4_k, Format::q6_k}) {
        fmt.mid_round_trip = ft::test::cpu_block_numerics(f).mid_round_trip;
        std::mt19937 rng(60 + int(f));
        const Layer L(rng, f, H, I, E);
        const DeviceLayer D(L);
        ft::cuda::ExpertDecoder dec(f, H, I, K, 4, act);
        EXPECT_NE(std::string(dec.kernel_name()).find("simt"), std::string::npos) << dec.kernel_name();
        for (int32_t T : {1, 4}) {
            const Batch b = random_batch(rng, E, H, T, K, false);
            std::vector<uint16_t> y;
            ASSERT_NO_FATAL_FAILURE(decode_batch(dec, D, b, H, y));
            const auto expert = [&](int32_t e) { return L.expert(e); };
            const std::vector<double> ref =
                ft::test::moe_reference_f32(expert, E, a, fmt, H, I, T, K, b.x.data(), b.ids.data(), b.w.data());
            EXPECT_LT(ft::test::relative_error_bf16(y, ref), gpu_bound(f)) << ft::format_name(f) << " T=" << T;
        }
    }
}

// One-token calls whose rows have more than 16 chunk groups take the integer-dot kernel that
// streams rows through per-warp rings (stream_usable: q4_0, q8_0 and q4_k both projections here,
// gate_up K = 8192 and down K = 1280; iq4_xs down only): several passes per row and, on GPUs of
// fewer than 170 SMs, several units per warp, so each warp's ring wraps within a unit and across units.
TEST(ExpertDecoderGpu, StreamedOneTokenRowsMatchReference) {
    SKIP_WITHOUT_GPU();
    const int32_t H = 8192, I = 1280, E = 4, K = 4;
    const ft::cuda::DeviceActivation act{FT_ACT_SILU, 1.702f, 7.0f};
    for (Format f : {Format::q4_0, Format::q8_0, Format::q4_k, Format::iq4_xs}) {
        std::mt19937 rng(80 + int(f));
        const Layer L(rng, f, H, I, E);
        const DeviceLayer D(L);
        ft::cuda::ExpertDecoder dec(f, H, I, K, 4, act);
        for (int32_t T : {1, 2}) {  // 2: the multi-route kernel on the same layer
            const Batch b = random_batch(rng, E, H, T, K, false);
            std::vector<uint16_t> y;
            ASSERT_NO_FATAL_FAILURE(decode_batch(dec, D, b, H, y));
            EXPECT_LT(ft::test::relative_error_bf16(y, reference(L, b, act)), gpu_bound(f))
                << ft::format_name(f) << " T=" << T;
        }
    }
}

TEST(ExpertDecoderGpu, ZeroTokensAndBadArguments) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(5);
    const Layer L(rng, Format::bf16, 64, 32, 2);
    const DeviceLayer D(L);
    ft::cuda::ExpertDecoder dec(Format::bf16, 64, 32, 2, 4, {});
    EXPECT_GT(dec.scratch_bytes(), 0u);
    EXPECT_EQ(std::string(dec.kernel_name()), "bf16-mma") << dec.kernel_name();
    DevBuf y(64 * 2);
    CUDA_OK(cudaMemset(y.p, 0x5a, y.n));
    CUDA_OK(dec.decode(D.dx, nullptr, nullptr, nullptr, nullptr, y.as<uint16_t>(), 0, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    for (uint16_t v : get<uint16_t>(y, 64)) ASSERT_EQ(v, 0x5a5a);
    EXPECT_EQ(dec.decode(D.dx, nullptr, nullptr, nullptr, nullptr, y.as<uint16_t>(), 5, nullptr), cudaErrorInvalidValue);
    ft::cuda::DeviceExperts wrong = D.dx;
    wrong.format = Format::q4_0;
    DevBuf x(64 * 2), ids(2 * 4), w(2 * 4);
    EXPECT_EQ(dec.compute(wrong, x.as<uint16_t>(), ids.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue);
    EXPECT_THROW(ft::cuda::ExpertDecoder(Format::ds_fp4, 100, 128, 2, 4, {}), ft::Error);
    EXPECT_THROW(ft::cuda::ExpertDecoder(Format::bf16, 64, 32, 0, 4, {}), ft::Error);
    EXPECT_THROW(ft::cuda::ExpertDecoder(Format::bf16, 64, 32, 2, 0, {}), ft::Error);
}

// A decoder made for one GGUF block format runs experts whose gate_up and down are in other block
// formats (models mixing them), from slots wider than their rows (slots of a model's largest
// layer): each projection on its own format's kernel (the integer-dot one at these shapes),
// within the bound of the uniform formats of the fp64 reference of that mix. Mixes with a
// non-block format, rows shorter than a format's, or a decoder of a non-block format are refused.
TEST(ExpertDecoderGpu, MixedBlockFormatsPerMatrix) {
    SKIP_WITHOUT_GPU();
    const int32_t H = 256, I = 256, E = 6, K = 3;
    struct Mix {
        Format decoder, gu, dn;
    };
    const Mix mixes[] = {{Format::q4_k, Format::q4_k, Format::q6_k}, {Format::q4_k, Format::q4_0, Format::q8_0},
                         {Format::q8_0, Format::iq4_xs, Format::q4_0}, {Format::q4_0, Format::q2_k, Format::q3_k},
                         {Format::q6_k, Format::q5_k, Format::q5_k}};
    const ft::cuda::DeviceActivation act{FT_ACT_SILU, 1.702f, 7.0f};
    for (const Mix &m : mixes) {
        const std::string name = ft::cat(ft::format_name(m.gu), "/", ft::format_name(m.dn), " on a ",
                                         ft::format_name(m.decoder), " decoder");
        std::mt19937 rng(40 + int(m.gu) * 13 + int(m.dn));
        const Layer A(rng, m.gu, H, I, E), B(rng, m.dn, H, I, E);  // A's gate_up, B's down
        const size_t rb[2] = {A.schema[0].row_bytes, B.schema[1].row_bytes};
        const size_t stride[2] = {rb[0] + 64, rb[1] + 48};  // wider slots, the tail NaN bytes
        std::vector<std::unique_ptr<DevBuf>> bufs;
        ft::cuda::DeviceExperts dx;
        dx.format = m.gu;
        dx.down_format = m.dn == m.gu ? -1 : int32_t(m.dn);
        dx.hidden = H, dx.inter = I, dx.num_banks = 2;
        for (int b = 0; b < 2; ++b) {
            const Layer &src = b == 0 ? A : B;
            std::vector<uint8_t> slots(stride[b] * E, 0xff);
            for (int32_t e = 0; e < E; ++e) std::memcpy(slots.data() + stride[b] * e, src.banks[b].data() + rb[b] * e, rb[b]);
            bufs.push_back(std::make_unique<DevBuf>(slots.size()));
            bufs.back()->put(slots);
            dx.base[b] = bufs.back()->as<uint8_t>();
            dx.row_bytes[b] = stride[b];
        }
        ft::cuda::ExpertDecoder dec(m.decoder, H, I, K, 8, act);
        const ft::test::ActivationRef a{act.kind, act.alpha, act.limit};
        // The integer-dot kernel's activations, each projection in its own format's (Q8_0 or Q8_K).
        const ft::test::FormatNumerics fmt = ft::test::cpu_block_numerics(m.gu, m.dn);
        for (int32_t T : {1, 3, 8}) {
            const Batch b = random_batch(rng, E, H, T, K, false);
            DevBuf x(b.x.size() * 2), ids(b.ids.size() * 4), w(b.w.size() * 4), y(size_t(T) * H * 2);
            x.put(b.x), ids.put(b.ids), w.put(b.w);
            CUDA_OK(cudaMemset(y.p, 0xff, y.n));
            CUDA_OK(dec.decode(dx, x.as<uint16_t>(), ids.as<int32_t>(), w.as<float>(), nullptr, y.as<uint16_t>(), T, nullptr));
            CUDA_OK(cudaDeviceSynchronize());
            const std::vector<double> ref = ft::test::moe_reference_f32(
                [&](int32_t e) {
                    ft::test::ExpertF32 x = A.expert(e);
                    x.down = B.expert(e).down;
                    return x;
                },
                E, a, fmt, H, I, T, K, b.x.data(), b.ids.data(), b.w.data());
            EXPECT_LT(ft::test::relative_error_bf16(get<uint16_t>(y, size_t(T) * H), ref), gpu_bound(m.gu)) << name << " T=" << T;
        }
        DevBuf x(size_t(H) * 2), ids(size_t(K) * 4);
        CUDA_OK(cudaMemset(ids.p, 0, ids.n));
        ft::cuda::DeviceExperts bad = dx;
        bad.down_format = int32_t(Format::bf16);
        EXPECT_EQ(dec.compute(bad, x.as<uint16_t>(), ids.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue) << name;
        bad = dx;
        bad.format = Format::nvfp4;
        EXPECT_EQ(dec.compute(bad, x.as<uint16_t>(), ids.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue) << name;
        bad = dx;
        bad.down_format = 99;
        EXPECT_EQ(dec.compute(bad, x.as<uint16_t>(), ids.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue) << name;
        if (m.gu != m.decoder || m.dn != m.decoder) {
            bad = dx;
            bad.row_bytes[1] = rb[1] - 4;  // slots shorter than the down rows
            EXPECT_EQ(dec.compute(bad, x.as<uint16_t>(), ids.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue) << name;
        }
        ft::cuda::ExpertDecoder bf16(Format::bf16, H, I, K, 8, act);
        EXPECT_EQ(bf16.compute(dx, x.as<uint16_t>(), ids.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue) << name;
        CUDA_OK(cudaDeviceSynchronize());
    }
}

// Bias tables (bf16 gpt-oss) are used only when complete: both tables, bf16 experts, and the
// call's expert ids to index them; anything less is cudaErrorInvalidValue before any launch.
TEST(ExpertDecoderGpu, BiasTablesNeedBothTablesBf16AndExpertIds) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(6);
    const Layer L(rng, Format::bf16, 64, 32, 2);
    const DeviceLayer D(L);
    ft::cuda::ExpertDecoder dec(Format::bf16, 64, 32, 2, 4, {});
    DevBuf x(64 * 2), slots(2 * 4), gu(2 * 64 * 4), dn(2 * 64 * 4);
    for (const DevBuf *b : {&x, &slots, &gu, &dn}) CUDA_OK(cudaMemset(b->p, 0, b->n));
    ft::cuda::DeviceExperts biased = D.dx;
    biased.gate_up_bias = gu.as<float>();
    biased.down_bias = dn.as<float>();
    biased.bias_experts = 2;
    const int32_t *ids = slots.as<int32_t>();  // expert 0 twice
    EXPECT_EQ(dec.compute(biased, x.as<uint16_t>(), slots.as<int32_t>(), 1, nullptr), cudaErrorInvalidValue);
    ft::cuda::DeviceExperts one = biased;
    one.down_bias = nullptr;
    EXPECT_EQ(dec.compute(one, x.as<uint16_t>(), slots.as<int32_t>(), 1, nullptr, ids), cudaErrorInvalidValue);
    ft::cuda::DeviceExperts no_rows = biased;
    no_rows.bias_experts = 0;
    EXPECT_EQ(dec.compute(no_rows, x.as<uint16_t>(), slots.as<int32_t>(), 1, nullptr, ids), cudaErrorInvalidValue);
    CUDA_OK(dec.compute(biased, x.as<uint16_t>(), slots.as<int32_t>(), 1, nullptr, ids));
    CUDA_OK(cudaDeviceSynchronize());

    const Layer Q(rng, Format::q4_0, 64, 32, 2);
    const DeviceLayer DQ(Q);
    ft::cuda::ExpertDecoder qdec(Format::q4_0, 64, 32, 2, 4, {});
    ft::cuda::DeviceExperts qbiased = DQ.dx;
    qbiased.gate_up_bias = gu.as<float>();
    qbiased.down_bias = dn.as<float>();
    qbiased.bias_experts = 2;
    EXPECT_EQ(qdec.compute(qbiased, x.as<uint16_t>(), slots.as<int32_t>(), 1, nullptr, ids), cudaErrorInvalidValue);
}

// ---- device decoders against the host reference, bit for bit -----------------------------------

__global__ void decode_codes_kernel(float *e4m3, float *e8m0, float *e2m1, float *e2m1_mul, float *e4m3x2) {
    const int c = threadIdx.x;  // 256 threads
    e4m3[c] = ft::cuda::e4m3_to_f32(uint8_t(c));
    e8m0[c] = ft::cuda::e8m0_to_f32(uint8_t(c));
    e2m1[c] = ft::cuda::e2m1_to_f32(uint32_t(c) & 15u);
    e2m1_mul[c] = ft::cuda::e2m1_to_f32_mul(uint32_t(c));
    const float2 two = ft::cuda::e4m3x2_to_f32x2(uint16_t(c | ((255 - c) << 8)));
    e4m3x2[2 * c] = two.x;
    e4m3x2[2 * c + 1] = two.y;
}

__global__ void f16_kernel(float *out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;  // 65536 threads
    out[c] = ft::cuda::f16_to_f32(uint16_t(c));
}

__global__ void round_kernel(const float *in, float *e4m3, uint16_t *bf16, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        e4m3[i] = ft::cuda::round_e4m3(in[i]);
        bf16[i] = ft::cuda::f32_to_bf16(in[i]);
    }
}

// One warp per group of 128, the same steps as the decoder's round trip.
__global__ void round_trip_kernel(const float *in, float *out, int groups) {
    const int g = blockIdx.x, lane = threadIdx.x;
    if (g >= groups) return;
    float v[4], amax = 0.0f;
    for (int i = 0; i < 4; ++i) {
        v[i] = in[g * 128 + lane * 4 + i];
        amax = fmaxf(amax, fabsf(v[i]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = ft::cuda::fp8_group_scale(amax);
    for (int i = 0; i < 4; ++i) out[g * 128 + lane * 4 + i] = ft::cuda::fp8_round_trip(v[i], s);
}

bool same_value(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
}

TEST(CudaNumerics, DecodersMatchHostForAllCodes) {
    SKIP_WITHOUT_GPU();
    DevBuf a(256 * 4), b(256 * 4), c(256 * 4), d(256 * 4), e(512 * 4);
    decode_codes_kernel<<<1, 256>>>(a.as<float>(), b.as<float>(), c.as<float>(), d.as<float>(), e.as<float>());
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    const auto e4 = get<float>(a, 256), e8 = get<float>(b, 256), e2 = get<float>(c, 256), e2m = get<float>(d, 256),
               e4x2 = get<float>(e, 512);
    for (int k = 0; k < 256; ++k) {
        EXPECT_TRUE(same_value(e4[k], ft::e4m3_to_f32(uint8_t(k)))) << "e4m3 " << k;
        EXPECT_TRUE(same_value(e8[k], ft::e8m0_to_f32(uint8_t(k)))) << "e8m0 " << k;
        EXPECT_TRUE(same_value(e2[k], ft::e2m1_to_f32(uint8_t(k & 15)))) << "e2m1 " << k;
        EXPECT_TRUE(same_value(e2m[k], ft::e2m1_to_f32(uint8_t(k & 15)))) << "e2m1_mul " << k;
        EXPECT_TRUE(same_value(e4x2[2 * k], ft::e4m3_to_f32(uint8_t(k)))) << "e4m3x2 lo " << k;
        EXPECT_TRUE(same_value(e4x2[2 * k + 1], ft::e4m3_to_f32(uint8_t(255 - k)))) << "e4m3x2 hi " << k;
    }
    // fp16: every code decodes to the value that encodes back to it (subnormals, +-Inf exact).
    DevBuf h(65536 * 4);
    f16_kernel<<<256, 256>>>(h.as<float>());
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    const auto hv = get<float>(h, 65536);
    for (uint32_t c = 0; c < 65536; ++c) {
        const bool nan = (c & 0x7c00u) == 0x7c00u && (c & 0x3ffu) != 0;
        if (nan)
            EXPECT_TRUE(std::isnan(hv[c])) << "f16 " << c;
        else
            EXPECT_EQ(ft::f32_to_f16(hv[c]), uint16_t(c)) << "f16 " << c;
    }
}

TEST(CudaNumerics, RoundingMatchesHost) {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(9);
    std::vector<float> in;
    // Every e4m3 midpoint region: values around each code, plus wide random magnitudes.
    for (int k = 0; k < 256; ++k) {
        const float v = ft::e4m3_to_f32(uint8_t(k));
        if (std::isnan(v)) continue;
        for (float f : {0.999f, 0.9999f, 1.0f, 1.0001f, 1.001f, 1.03125f, 1.0625f, 0.96875f}) in.push_back(v * f);
    }
    std::uniform_real_distribution<float> ex(-14.0f, 10.0f);
    std::uniform_int_distribution<int> sign(0, 1);
    for (int i = 0; i < 100000; ++i) in.push_back(std::exp2(ex(rng)) * (sign(rng) ? 1.0f : -1.0f));
    in.push_back(0.0f), in.push_back(-0.0f), in.push_back(500.0f), in.push_back(-1e30f);
    const int n = int(in.size());
    DevBuf din(n * 4), de(n * 4), db(n * 2);
    din.put(in);
    round_kernel<<<64, 256>>>(din.as<float>(), de.as<float>(), db.as<uint16_t>(), n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    const auto re = get<float>(de, n);
    const auto rb = get<uint16_t>(db, n);
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(same_value(re[i], ft::round_e4m3(in[i]))) << "round_e4m3(" << in[i] << ")";
        ASSERT_EQ(rb[i], ft::f32_to_bf16(in[i])) << "bf16(" << in[i] << ")";
    }

    // The FP8 round trip per 128 on groups of very different scales (including all-zero).
    const int groups = 64;
    std::vector<float> x(groups * 128), yh(groups * 128);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int g = 0; g < groups; ++g) {
        const float scale = g == 0 ? 0.0f : std::exp2(float(g % 40) - 20.0f);
        for (int i = 0; i < 128; ++i) x[g * 128 + i] = float(ft::bf16_to_f32(ft::f32_to_bf16(nd(rng) * scale)));
    }
    ft::fp8_round_trip_per128(x.data(), int64_t(x.size()), yh.data());
    DevBuf dx(x.size() * 4), dy(x.size() * 4);
    dx.put(x);
    round_trip_kernel<<<groups, 32>>>(dx.as<float>(), dy.as<float>(), groups);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    const auto yd = get<float>(dy, x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_value(yd[i], yh[i])) << "round trip " << i << " x=" << x[i];
}

}  // namespace
