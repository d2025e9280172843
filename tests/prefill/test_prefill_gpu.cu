// GPU prefill (ft::cuda::ExpertPrefill) against the fp64 reference of every format: random valid
// banks, skewed routing with an expert that gets no tokens and skipped routes (-1), a NaN-filled
// slot nobody routes to, padded bank rows, with and without an addend; plus the bf16
// dequantisation bit for bit, small chunks, the grouped cuBLAS path, and experts mixing GGUF block
// formats per matrix. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cublas_loader.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_prefill.hpp"
#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "moe_reference.hpp"
#include "random_banks.hpp"

namespace {

using ft::Format;
using ft::cuda::DeviceActivation;
using ft::cuda::DeviceExperts;
using ft::cuda::ExpertPrefill;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

constexpr int kTopK = 8;
constexpr size_t kRowPad = 32;  // bank rows are padded with NaN bytes that must never be read

struct Geometry {
    int32_t H, I;
};

Geometry geometry(Format f) {
    switch (f) {
        case Format::bf16:
            return {200, 120};
        case Format::fp8_block:
            return {256, 128};
        case Format::nvfp4:
            return {256, 176};
        case Format::mxfp4:
            return {192, 160};  // down K = 160: a partial 64-wide transpose tile
        case Format::ds_fp4:
            return {256, 128};
        case Format::q4_0:
        case Format::q8_0:
            return {256, 160};
        default:
            return {512, 256};  // q2_k .. q6_k, iq4_xs: whole 256-element super-blocks
    }
}

DeviceActivation activation(Format f) {
    DeviceActivation a;
    switch (f) {
        case Format::fp8_block:
            a.kind = FT_ACT_GELU;
            break;
        case Format::nvfp4:
            a.kind = FT_ACT_GELU_TANH;
            break;
        case Format::mxfp4:
            a.kind = FT_ACT_SWIGLU_CLAMP;
            break;
        default:
            a.kind = FT_ACT_SILU;
            break;  // ds_fp4: limit 7 clamps
    }
    return a;
}

// Relative bound of max|y - ref| / max|ref| per format (see ft/cuda_prefill.hpp): bf16 output
// rounding (2^-9) and bf16-intermediate ties everywhere; fp8_block and q4_0 also round each
// weight to bf16 (2^-9 relative); ds_fp4 adds the FP8 round trips' boundary cases.
double bound(Format f) {
    switch (f) {
        case Format::fp8_block:
        case Format::q4_0:
        case Format::q8_0:
        case Format::q2_k:
        case Format::q3_k:
        case Format::q4_k:
        case Format::q5_k:
        case Format::q6_k:
        case Format::iq4_xs:
            return 2e-2;
        case Format::ds_fp4:
            return 3e-2;
        default:
            return 1e-2;
    }
}

bool gpu_ready() {
    return ft::cuda::device_count() > 0;
}

// One layer's experts: host banks (E slots, padded rows) and their device copies.
struct Banks {
    Format f;
    int32_t H, I, E;
    std::vector<ft::BankSpec> schema;
    std::vector<std::vector<uint8_t>> host;
    std::vector<uint8_t *> dev;
    size_t row_bytes[8] = {};

    Banks(Format f_, int32_t E_, uint32_t seed) : f(f_), E(E_) {
        const Geometry g = geometry(f);
        H = g.H, I = g.I;
        schema = ft::bank_schema(f, H, I);
        std::mt19937 rng(seed);
        for (size_t b = 0; b < schema.size(); ++b) {
            row_bytes[b] = (schema[b].row_bytes + 15) / 16 * 16 + kRowPad;  // the decode kernels want 16
            host.emplace_back(size_t(E) * row_bytes[b], uint8_t(0xff));
        }
        for (int32_t s = 0; s < E - 1; ++s) {  // slot E-1 stays all 0xFF (NaN in every format)
            uint8_t *r[8];
            for (size_t b = 0; b < schema.size(); ++b) r[b] = host[b].data() + s * row_bytes[b];
            ft::test::fill_random_expert(f, schema, r, H, I, rng);
        }
    }
    ~Banks() {
        for (uint8_t *p : dev) cudaFree(p);
    }
    bool upload() {
        for (auto &v : host) {
            void *p = nullptr;
            if (cudaMalloc(&p, v.size()) != cudaSuccess) return false;
            dev.push_back(static_cast<uint8_t *>(p));
            if (cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice) != cudaSuccess) return false;
        }
        return true;
    }
    DeviceExperts device() const {
        DeviceExperts d;
        d.format = f, d.hidden = H, d.inter = I, d.num_banks = int(schema.size());
        for (size_t b = 0; b < schema.size(); ++b) d.base[b] = dev[b], d.row_bytes[b] = row_bytes[b];
        return d;
    }
    std::vector<const uint8_t *> rows(int32_t slot) const {
        std::vector<const uint8_t *> r;
        for (size_t b = 0; b < schema.size(); ++b) r.push_back(host[b].data() + slot * row_bytes[b]);
        return r;
    }
};

// Zipf-skewed top-K over slots [0, E-2) (E-2 gets no tokens, E-1 is the NaN slot), distinct per
// token, ~10 % of routes skipped (-1).
std::vector<int32_t> skewed_slots(int32_t T, int32_t E, std::mt19937 &rng) {
    const int32_t usable = E - 2;
    std::vector<double> p(usable);
    for (int32_t s = 0; s < usable; ++s) p[s] = 1.0 / (s + 1);
    std::vector<int32_t> slots(size_t(T) * kTopK);
    std::uniform_real_distribution<double> u(0, 1);
    for (int32_t t = 0; t < T; ++t) {
        std::vector<double> q = p;
        for (int k = 0; k < kTopK; ++k) {
            std::discrete_distribution<int32_t> d(q.begin(), q.end());
            const int32_t s = d(rng);
            q[s] = 0;
            slots[size_t(t) * kTopK + k] = u(rng) < 0.1 ? -1 : s;
        }
    }
    return slots;
}

std::vector<uint16_t> random_bf16(size_t n, float scale, std::mt19937 &rng) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<uint16_t> v(n);
    for (auto &x : v) x = ft::test::f32_to_bf16_rne(scale * u(rng));
    return v;
}

// fp64 reference of the layer (tests/support/moe_reference.hpp) + addend.
std::vector<double> reference(const Banks &bk, const DeviceActivation &act, int32_t T, const std::vector<uint16_t> &x,
                              const std::vector<int32_t> &slots, const std::vector<float> &w,
                              const std::vector<uint16_t> *addend) {
    const int32_t H = bk.H, I = bk.I;
    struct Deq {
        std::vector<float> gate, up, down, bg, bu, bd;
        bool bias = false;
    };
    std::map<int32_t, Deq> cache;
    for (int32_t s : slots) {
        if (s < 0 || cache.count(s)) continue;
        Deq &d = cache[s];
        const auto rows = bk.rows(s);
        d.gate.resize(size_t(I) * H), d.up.resize(size_t(I) * H), d.down.resize(size_t(H) * I);
        ft::dequant_projection(bk.f, rows.data(), H, I, FT_PROJ_GATE, d.gate.data());
        ft::dequant_projection(bk.f, rows.data(), H, I, FT_PROJ_UP, d.up.data());
        ft::dequant_projection(bk.f, rows.data(), H, I, FT_PROJ_DOWN, d.down.data());
        d.bg.resize(I), d.bu.resize(I), d.bd.resize(H);
        d.bias = ft::projection_bias(bk.f, rows.data(), H, I, FT_PROJ_GATE, d.bg.data());
        if (d.bias) {
            ft::projection_bias(bk.f, rows.data(), H, I, FT_PROJ_UP, d.bu.data());
            ft::projection_bias(bk.f, rows.data(), H, I, FT_PROJ_DOWN, d.bd.data());
        }
    }
    ft::test::ActivationRef a;
    a.kind = act.kind, a.alpha = act.alpha, a.limit = act.limit;
    ft::test::FormatNumerics fmt;
    fmt.ds_fp4 = bk.f == Format::ds_fp4;
    fmt.ds_limit = act.limit;
    fmt.fp8_round_trip = [](const float *in, int64_t n, float *out) { ft::fp8_round_trip_per128(in, n, out); };
    auto expert = [&](int32_t s) {
        const Deq &d = cache.at(s);
        ft::test::ExpertF32 e{d.gate.data(), d.up.data(), d.down.data()};
        if (d.bias) e.bias_gate = d.bg.data(), e.bias_up = d.bu.data(), e.bias_down = d.bd.data();
        return e;
    };
    std::vector<double> ref =
        ft::test::moe_reference_f32(expert, bk.E, a, fmt, H, I, T, kTopK, x.data(), slots.data(), w.data());
    if (addend)
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += ft::test::bf16_to_f64((*addend)[i]);
    return ref;
}

// Device buffers of one call.
struct Call {
    uint16_t *x = nullptr, *y = nullptr, *addend = nullptr;
    int32_t *slots = nullptr;
    float *w = nullptr;
    ~Call() { cudaFree(x), cudaFree(y), cudaFree(addend), cudaFree(slots), cudaFree(w); }
};

template <typename T>
cudaError_t to_device(T *&dst, const std::vector<T> &src) {
    cudaError_t e = cudaMalloc(&dst, src.size() * sizeof(T));
    if (e != cudaSuccess) return e;
    return cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice);
}

// Runs the layer on the GPU and checks it against the reference; returns the relative error.
void run_case(Format f, int32_t T, int32_t E, bool with_addend, uint32_t seed, double *err_out = nullptr,
              ft::cuda::PrefillTuning tuning = {}) {
    Banks bk(f, E, seed);
    ASSERT_TRUE(bk.upload());
    const DeviceActivation act = activation(f);
    std::mt19937 rng(seed * 7 + 1);
    const std::vector<uint16_t> x = random_bf16(size_t(T) * bk.H, 1.0f, rng);
    const std::vector<int32_t> slots = skewed_slots(T, E, rng);
    std::vector<float> w(slots.size());
    std::uniform_real_distribution<float> uw(0.05f, 1.0f);
    for (float &v : w) v = uw(rng);
    const std::vector<uint16_t> addend = random_bf16(size_t(T) * bk.H, 0.5f, rng);

    Call c;
    CUDA_OK(to_device(c.x, x));
    CUDA_OK(to_device(c.slots, slots));
    CUDA_OK(to_device(c.w, w));
    if (with_addend) CUDA_OK(to_device(c.addend, addend));
    CUDA_OK(cudaMalloc(&c.y, size_t(T) * bk.H * 2));
    CUDA_OK(cudaMemset(c.y, 0xff, size_t(T) * bk.H * 2));  // poisoned: every element must be written

    ExpertPrefill pf(f, bk.H, bk.I, kTopK, 1024, act, tuning);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const ft_status st = pf.run(bk.device(), c.x, c.slots, slots.data(), c.w, c.addend, c.y, T, stream);
    ASSERT_EQ(st, FT_OK) << pf.last_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaStreamDestroy(stream));
    std::vector<uint16_t> y(size_t(T) * bk.H);
    CUDA_OK(cudaMemcpy(y.data(), c.y, y.size() * 2, cudaMemcpyDeviceToHost));

    for (size_t i = 0; i < y.size(); ++i)
        ASSERT_TRUE(std::isfinite(ft::test::bf16_to_f64(y[i]))) << "non-finite output at " << i;
    const std::vector<double> ref = reference(bk, act, T, x, slots, w, with_addend ? &addend : nullptr);
    const double err = ft::test::relative_error_bf16(y, ref);
    EXPECT_LE(err, bound(f)) << ft::format_name(f) << " T=" << T << " E=" << E;
    if (err_out) *err_out = err;
    ::testing::Test::RecordProperty("rel_error", std::to_string(err));

    // The decode path (cuda/experts) on the same layer: the two GPU backends agree within the bound.
    if (T <= 65) {
        ft::cuda::ExpertDecoder dec(f, bk.H, bk.I, kTopK, T, act);
        uint16_t *y2 = nullptr;
        CUDA_OK(cudaMalloc(&y2, y.size() * 2));
        const cudaError_t e = dec.decode(bk.device(), c.x, c.slots, c.w, c.addend, y2, T, nullptr);
        std::vector<uint16_t> yd(y.size());
        if (e == cudaSuccess) CUDA_OK(cudaMemcpy(yd.data(), y2, yd.size() * 2, cudaMemcpyDeviceToHost));
        cudaFree(y2);
        ASSERT_EQ(e, cudaSuccess) << "ExpertDecoder::decode: " << cudaGetErrorString(e);
        std::vector<double> dv(yd.size());
        for (size_t i = 0; i < yd.size(); ++i) dv[i] = ft::test::bf16_to_f64(yd[i]);
        EXPECT_LE(ft::test::relative_error_bf16(y, dv), bound(f)) << "prefill vs decode, " << ft::format_name(f);
    }
}

struct Case {
    Format f;
    int32_t T;
};

class PrefillGpu : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillGpu, MatchesReference) {
    if (!gpu_ready()) GTEST_SKIP() << "no usable GPU";
    if (!ft::cuda::cublas_api()) GTEST_SKIP() << "no cuBLAS: " << ft::cuda::cublas_load_error();
    const Case c = GetParam();
    const int32_t E = c.T <= 65 ? 16 : c.T <= 300 ? 32 : 64;
    run_case(c.f, c.T, E, c.T != 300, uint32_t(int(c.f) * 1000 + c.T));
}

std::vector<Case> all_cases() {
    std::vector<Case> v;
    for (Format f : {Format::bf16, Format::fp8_block, Format::nvfp4, Format::mxfp4, Format::ds_fp4, Format::q4_0})
        for (int32_t T : {65, 300, 1024}) v.push_back({f, T});
    for (Format f : {Format::q8_0, Format::q2_k, Format::q3_k, Format::q4_k, Format::q5_k, Format::q6_k, Format::iq4_xs})
        v.push_back({f, 300});
    return v;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, PrefillGpu, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case> &i) {
                             return std::string(ft::format_name(i.param.f)) + "_T" + std::to_string(i.param.T);
                         });

// Tiny chunks: groups split across chunks (48 rows) and one expert per dequantised chunk.
TEST(PrefillGpuChunks, SmallChunksMatchReference) {
    if (!gpu_ready() || !ft::cuda::cublas_api()) GTEST_SKIP() << "no usable GPU or cuBLAS";
    ft::cuda::PrefillTuning tuning;
    tuning.chunk_rows = 48;
    tuning.dequant_mib = 0;
    for (Format f : {Format::bf16, Format::nvfp4, Format::mxfp4, Format::ds_fp4}) run_case(f, 300, 24, true, 77, nullptr, tuning);
}

TEST(PrefillGpuGrouped, GroupedGemmMatchesReference) {
    if (!gpu_ready() || !ft::cuda::cublas_api()) GTEST_SKIP() << "no usable GPU or cuBLAS";
    if (!ft::cuda::cublas_api()->gemm_grouped_batched_ex) GTEST_SKIP() << "cuBLAS without cublasGemmGroupedBatchedEx";
    ft::cuda::PrefillTuning tuning;
    tuning.grouped = true;
    {
        ExpertPrefill probe(Format::bf16, 64, 64, kTopK, 8, DeviceActivation{}, tuning);
        ASSERT_STREQ(probe.gemm_path(), "grouped");
        ExpertPrefill plain(Format::bf16, 64, 64, kTopK, 8, DeviceActivation{});
        ASSERT_STREQ(plain.gemm_path(), "streams");
    }
    for (Format f : {Format::bf16, Format::mxfp4, Format::q4_0}) run_case(f, 300, 32, true, 91, nullptr, tuning);
}

// launch_dequant_bf16 is the reference dequantisation rounded once to bf16, bit for bit (nvfp4:
// times the fp16 global it leaves out gives the reference's fp32 value exactly).
TEST(PrefillGpuDequant, BitExactAgainstReference) {
    if (!gpu_ready()) GTEST_SKIP() << "no usable GPU";
    for (Format f : {Format::fp8_block, Format::nvfp4, Format::mxfp4, Format::ds_fp4, Format::q4_0, Format::q8_0,
                     Format::q2_k, Format::q3_k, Format::q4_k, Format::q5_k, Format::q6_k, Format::iq4_xs}) {
        Banks bk(f, 6, 5 + int(f));
        ASSERT_TRUE(bk.upload());
        const int32_t H = bk.H, I = bk.I;
        const std::vector<int32_t> slots = {3, 0, 4};
        int32_t *d_slots = nullptr;
        uint16_t *d_out = nullptr;
        const size_t per = size_t(3) * H * I;
        CUDA_OK(to_device(d_slots, slots));
        CUDA_OK(cudaMalloc(&d_out, slots.size() * per * 2));
        CUDA_OK(ft::cuda::launch_dequant_bf16(bk.device(), d_slots, int32_t(slots.size()), d_out, nullptr));
        std::vector<uint16_t> out(slots.size() * per);
        CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
        cudaFree(d_slots), cudaFree(d_out);
        for (size_t j = 0; j < slots.size(); ++j) {
            const auto rows = bk.rows(slots[j]);
            std::vector<float> ref(per);
            ft::dequant_projection(f, rows.data(), H, I, FT_PROJ_GATE, ref.data());
            ft::dequant_projection(f, rows.data(), H, I, FT_PROJ_UP, ref.data() + size_t(I) * H);
            ft::dequant_projection(f, rows.data(), H, I, FT_PROJ_DOWN, ref.data() + size_t(2) * I * H);
            size_t bad = 0;
            for (size_t i = 0; i < per && bad < 5; ++i) {
                const uint16_t got = out[j * per + i];
                bool ok;
                if (f == Format::nvfp4) {
                    // Global of output row (gate_up rows [0, 2I), then down rows [0, H)).
                    const size_t row = i < size_t(2) * I * H ? i / H : size_t(2) * I + (i - size_t(2) * I * H) / I;
                    const uint8_t *gl = row < size_t(2) * I ? rows[2] + row * 2 : rows[5] + (row - 2 * I) * 2;
                    const float g = ft::f16_to_f32(uint16_t(gl[0] | (gl[1] << 8)));
                    ok = float(ft::test::bf16_to_f64(got)) * g == ref[i];
                } else {
                    ok = got == ft::test::f32_to_bf16_rne(ref[i]);
                }
                if (!ok) {
                    ++bad;
                    ADD_FAILURE() << ft::format_name(f) << " expert " << slots[j] << " element " << i << ": got "
                                  << ft::test::bf16_to_f64(got) << ", reference " << ref[i];
                }
            }
        }
    }
}

// A prefill made for one GGUF block format runs experts whose gate_up and down are in other block
// formats (models mixing them): each matrix dequantised by its own format (padded rows, a NaN
// slot nobody routes to), the reference of that mix within the block formats' bound; the decode
// path agrees. Mixes with another kind of format or rows shorter than a format's are refused.
TEST(PrefillGpuMixed, BlockFormatsPerMatrix) {
    if (!gpu_ready() || !ft::cuda::cublas_api()) GTEST_SKIP() << "no usable GPU or cuBLAS";
    struct Mix {
        Format made_for, gu, dn;
    };
    const Mix mixes[] = {{Format::q4_k, Format::q4_k, Format::q6_k},
                         {Format::q6_k, Format::q2_k, Format::iq4_xs},
                         {Format::q4_k, Format::q5_k, Format::q3_k}};  // all {512, 256} (geometry())
    for (const Mix &m : mixes) {
        const std::string name = ft::cat(ft::format_name(m.gu), "/", ft::format_name(m.dn));
        const int32_t E = 12, T = 70;
        Banks A(m.gu, E, 500u + uint32_t(m.gu)), B(m.dn, E, 600u + uint32_t(m.dn));  // A's gate_up, B's down
        ASSERT_TRUE(A.upload() && B.upload());
        ASSERT_EQ(A.H, B.H);
        ASSERT_EQ(A.I, B.I);
        const int32_t H = A.H, I = A.I;
        DeviceExperts d = A.device();
        d.down_format = int32_t(m.dn);
        d.base[1] = B.dev[1];
        d.row_bytes[1] = B.row_bytes[1];
        const DeviceActivation act = activation(m.gu);
        std::mt19937 rng(77u + uint32_t(m.dn));
        const std::vector<uint16_t> x = random_bf16(size_t(T) * H, 1.0f, rng);
        const std::vector<int32_t> slots = skewed_slots(T, E, rng);
        std::vector<float> w(slots.size());
        std::uniform_real_distribution<float> uw(0.05f, 1.0f);
        for (float &v : w) v = uw(rng);
        Call c;
        CUDA_OK(to_device(c.x, x));
        CUDA_OK(to_device(c.slots, slots));
        CUDA_OK(to_device(c.w, w));
        CUDA_OK(cudaMalloc(&c.y, size_t(T) * H * 2));
        CUDA_OK(cudaMemset(c.y, 0xff, size_t(T) * H * 2));
        ExpertPrefill pf(m.made_for, H, I, kTopK, T, act);
        ASSERT_EQ(pf.run(d, c.x, c.slots, slots.data(), c.w, nullptr, c.y, T, nullptr), FT_OK) << name << ": " << pf.last_error();
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> y(size_t(T) * H);
        CUDA_OK(cudaMemcpy(y.data(), c.y, y.size() * 2, cudaMemcpyDeviceToHost));

        // The reference of the mix: gate/up of A's rows, down of B's.
        std::map<int32_t, std::vector<float>> gate, up, down;
        for (int32_t sl : slots) {
            if (sl < 0 || gate.count(sl)) continue;
            const auto ra = A.rows(sl), rb = B.rows(sl);
            gate[sl].resize(size_t(I) * H), up[sl].resize(size_t(I) * H), down[sl].resize(size_t(H) * I);
            ft::dequant_projection(m.gu, ra.data(), H, I, FT_PROJ_GATE, gate[sl].data());
            ft::dequant_projection(m.gu, ra.data(), H, I, FT_PROJ_UP, up[sl].data());
            ft::dequant_projection(m.dn, rb.data(), H, I, FT_PROJ_DOWN, down[sl].data());
        }
        ft::test::ActivationRef a;
        a.kind = act.kind, a.alpha = act.alpha, a.limit = act.limit;
        const std::vector<double> ref = ft::test::moe_reference_f32(
            [&](int32_t sl) { return ft::test::ExpertF32{gate.at(sl).data(), up.at(sl).data(), down.at(sl).data()}; }, E, a,
            ft::test::FormatNumerics{}, H, I, T, kTopK, x.data(), slots.data(), w.data());
        EXPECT_LE(ft::test::relative_error_bf16(y, ref), bound(m.gu)) << name;

        // The decode kernels on the same mixed experts agree.
        ft::cuda::ExpertDecoder dec(m.made_for, H, I, kTopK, T, act);
        CUDA_OK(dec.decode(d, c.x, c.slots, c.w, nullptr, c.y, T, nullptr));
        std::vector<uint16_t> yd(y.size());
        CUDA_OK(cudaMemcpy(yd.data(), c.y, yd.size() * 2, cudaMemcpyDeviceToHost));
        EXPECT_LE(ft::test::relative_error_bf16(yd, ref), bound(m.gu)) << name << " decode";

        DeviceExperts bad = d;
        bad.down_format = int32_t(Format::fp8_block);
        EXPECT_EQ(pf.run(bad, c.x, c.slots, slots.data(), c.w, nullptr, c.y, T, nullptr), FT_ERR_INVALID_ARGUMENT) << name;
        EXPECT_NE(std::string(pf.last_error()).find("fp8_block"), std::string::npos) << pf.last_error();
        bad = d;
        bad.row_bytes[1] = B.schema[1].row_bytes - 2;
        EXPECT_EQ(pf.run(bad, c.x, c.slots, slots.data(), c.w, nullptr, c.y, T, nullptr), FT_ERR_INVALID_ARGUMENT) << name;
        ExpertPrefill other(Format::nvfp4, H, I, kTopK, T, DeviceActivation{});  // not a block format
        EXPECT_EQ(other.run(d, c.x, c.slots, slots.data(), c.w, nullptr, c.y, T, nullptr), FT_ERR_INVALID_ARGUMENT) << name;
        uint16_t *dq = nullptr;
        CUDA_OK(cudaMalloc(&dq, size_t(2) * 3 * H * I * 2));
        DeviceExperts bad_dq = d;
        bad_dq.down_format = int32_t(Format::nvfp4);
        EXPECT_EQ(ft::cuda::launch_dequant_bf16(bad_dq, c.slots, 2, dq, nullptr), cudaErrorInvalidValue) << name;
        cudaFree(dq);
    }
}

// Every route skipped: y is the addend (or zeros), the NaN slot and stale scratch never read.
TEST(PrefillGpuEdge, AllRoutesSkippedAndBadArguments) {
    if (!gpu_ready() || !ft::cuda::cublas_api()) GTEST_SKIP() << "no usable GPU or cuBLAS";
    Banks bk(Format::nvfp4, 4, 3);
    ASSERT_TRUE(bk.upload());
    const int32_t T = 33;
    std::mt19937 rng(1);
    const std::vector<uint16_t> x = random_bf16(size_t(T) * bk.H, 1.0f, rng);
    const std::vector<uint16_t> addend = random_bf16(size_t(T) * bk.H, 1.0f, rng);
    const std::vector<int32_t> slots(size_t(T) * kTopK, -1);
    const std::vector<float> w(slots.size(), 1.0f);
    Call c;
    CUDA_OK(to_device(c.x, x));
    CUDA_OK(to_device(c.slots, slots));
    CUDA_OK(to_device(c.w, w));
    CUDA_OK(to_device(c.addend, addend));
    CUDA_OK(cudaMalloc(&c.y, x.size() * 2));
    ExpertPrefill pf(Format::nvfp4, bk.H, bk.I, kTopK, 64, activation(Format::nvfp4));
    for (const uint16_t *add : {static_cast<const uint16_t *>(c.addend), static_cast<const uint16_t *>(nullptr)}) {
        CUDA_OK(cudaMemset(c.y, 0xff, x.size() * 2));
        ASSERT_EQ(pf.run(bk.device(), c.x, c.slots, slots.data(), c.w, add, c.y, T, nullptr), FT_OK) << pf.last_error();
        std::vector<uint16_t> y(x.size());
        CUDA_OK(cudaMemcpy(y.data(), c.y, y.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], add ? addend[i] : uint16_t(0)) << i;
    }
    EXPECT_EQ(pf.run(bk.device(), c.x, c.slots, slots.data(), c.w, nullptr, c.y, 65, nullptr), FT_ERR_INVALID_ARGUMENT);
    DeviceExperts other = bk.device();
    other.format = Format::ds_fp4;
    EXPECT_EQ(pf.run(other, c.x, c.slots, slots.data(), c.w, nullptr, c.y, T, nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(pf.last_error()), "");
    EXPECT_EQ(pf.run(bk.device(), c.x, c.slots, slots.data(), c.w, nullptr, c.y, 0, nullptr), FT_OK);

    // Expert bias tables (bf16 gpt-oss) are for bf16 experts, and every slot must be a row of them.
    float *tables = nullptr;
    CUDA_OK(cudaMalloc(&tables, size_t(bk.E) * (2 * bk.I + bk.H) * sizeof(float)));
    DeviceExperts biased = bk.device();
    biased.gate_up_bias = tables;
    biased.down_bias = tables + size_t(bk.E) * 2 * bk.I;
    biased.bias_experts = bk.E;
    EXPECT_EQ(pf.run(biased, c.x, c.slots, slots.data(), c.w, nullptr, c.y, T, nullptr), FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(pf.last_error()).find("bias"), std::string::npos) << pf.last_error();
    Banks b16(Format::bf16, 4, 3);
    ASSERT_TRUE(b16.upload());
    ExpertPrefill pf16(Format::bf16, b16.H, b16.I, kTopK, 64, DeviceActivation{});
    const std::vector<uint16_t> x16 = random_bf16(size_t(T) * b16.H, 1.0f, rng);
    Call c16;
    std::vector<int32_t> slots16(size_t(T) * kTopK, -1);
    slots16[1] = 3;  // a slot beyond two table rows
    CUDA_OK(to_device(c16.x, x16));
    CUDA_OK(to_device(c16.slots, slots16));
    CUDA_OK(to_device(c16.w, w));
    CUDA_OK(cudaMalloc(&c16.y, x16.size() * 2));
    DeviceExperts b16_biased = b16.device();
    b16_biased.gate_up_bias = tables;
    b16_biased.down_bias = tables + 2 * size_t(2 * b16.I);
    b16_biased.bias_experts = 2;
    EXPECT_EQ(pf16.run(b16_biased, c16.x, c16.slots, slots16.data(), c16.w, nullptr, c16.y, T, nullptr),
              FT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(pf16.last_error()).find("slot 3"), std::string::npos) << pf16.last_error();
    cudaFree(tables);
}

TEST(PrefillGpuEdge, ConstructorRejectsBadGeometry) {
    if (!gpu_ready() || !ft::cuda::cublas_api()) GTEST_SKIP() << "no usable GPU or cuBLAS";
    auto status_of = [](Format f, int32_t H, int32_t I, int32_t K, int32_t T) {
        try {
            ExpertPrefill pf(f, H, I, K, T, DeviceActivation{});
            return int(FT_OK);
        } catch (const ft::Error &e) {
            return int(e.status());
        }
    };
    EXPECT_EQ(status_of(Format::ds_fp4, 256, 96, 8, 16), FT_ERR_INVALID_ARGUMENT);  // I not a multiple of 128
    EXPECT_EQ(status_of(Format::bf16, 100, 64, 8, 16), FT_ERR_INVALID_ARGUMENT);    // H not a multiple of 8
    EXPECT_EQ(status_of(Format::bf16, 64, 64, 0, 16), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of(Format::bf16, 64, 64, 8, 0), FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of(Format::bf16, 64, 64, 8, 16), FT_OK);
}

}  // namespace
