// The kernel-level reference check of quant_kernel_case.hpp.
#include "quant_kernel_case.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>

namespace quant_test {

std::vector<const ft::cpu::QuantOps *> variants_here(Format f) {
    std::vector<const ft::cpu::QuantOps *> v;
    std::set<std::string> seen;
    // VNNI: AVX-512-VNNI at tiers >= avx512, AVX-VNNI at the avx2 tier.
    const bool vnni512 = __builtin_cpu_supports("avx512vnni"), vnni256 = ft::cpu::cpu_has_avx_vnni();
    const bool vbmi = ft::cpu::cpu_has_vbmi(), amx = ft::cpu::quant_amx_available(f);
    for (Isa isa : tiers_here())
        for (bool vn : {false, true})
            for (bool vb : {false, true})
                for (bool fast : {false, true})
                for (bool am : {false, true}) {
                    const bool vnni = int(isa) >= int(Isa::avx512) ? vnni512 : vnni256;
                    if ((vn && !vnni) || (vb && !vbmi) || (am && !amx)) continue;
                    const ft::cpu::QuantOps *ops = ft::cpu::quant_ops_variant(f, isa, vn, vb, fast, am);
                    if (seen.insert(ops->kernel).second) v.push_back(ops);
                }
    return v;
}

void expect_every_gguf_tier(Format f, const std::vector<const ft::cpu::QuantOps *> &ops) {
    if (!ft::format_is_block(f) || f == Format::q4_0) return;
    const std::string name = ft::format_name(f);
    auto has = [&](const std::string &suffix) {
        for (const ft::cpu::QuantOps *o : ops) {
            const std::string k = o->kernel;
            if (k.size() >= suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
        }
        return false;
    };
    const int best = int(ft::cpu::cpu_best_isa());
    std::vector<std::string> want{"-scalar"};
    if (best >= int(Isa::avx2)) want.push_back("-avx2");
    if (best >= int(Isa::avx512)) want.push_back("-avx512");
    if (best >= int(Isa::avx512) && __builtin_cpu_supports("avx512vnni")) want.push_back("-avx512vnni");
    for (const std::string &w : want) EXPECT_TRUE(has(w)) << name << ": no kernel " << w << " run on this CPU";
}

Case make_case(std::mt19937 &rng, Format f, int64_t K, int64_t N) {
    Case c{f, K, N, {}, {}, {}};
    std::uniform_int_distribution<int> byte(0, 255);
    auto fill = [&](std::vector<uint8_t> &v, size_t n) {
        v.resize(n);
        for (auto &b : v) b = uint8_t(byte(rng));
    };
    switch (f) {
        case Format::fp8_block: {
            fill(c.data, size_t(N * K));
            for (auto &b : c.data)
                if ((b & 0x7f) == 0x7f) b ^= 1;  // NaN codes only where a test puts them
            c.scale.resize(size_t((N + 127) / 128 * (K / 128)) * 2);
            std::uniform_real_distribution<float> d(0.25f, 2.0f);
            for (size_t i = 0; i < c.scale.size(); i += 2) put_u16(&c.scale[i], ft::f32_to_bf16(d(rng) * (byte(rng) & 1 ? 1 : -1)));
            break;
        }
        case Format::nvfp4: {
            fill(c.data, size_t(N * K / 2));
            std::uniform_int_distribution<int> s(0x01, 0x7e);  // subnormal to 448, both signs
            c.scale.resize(size_t(N * K / 16));
            for (auto &b : c.scale) b = uint8_t(s(rng) | (byte(rng) & 0x80));
            c.global.resize(size_t(N) * 2);
            std::uniform_real_distribution<float> g(0.5f, 2.0f);
            for (int64_t n = 0; n < N; ++n) put_u16(&c.global[n * 2], ft::f32_to_f16(g(rng)));
            break;
        }
        case Format::ds_fp4:
        case Format::mxfp4: {
            fill(c.data, size_t(N * K / 2));
            c.scale.resize(size_t(N * K / 32));
            std::uniform_int_distribution<int> s(117, 137);
            for (auto &b : c.scale) b = byte(rng) % 16 == 0 ? 0 : uint8_t(s(rng));  // code 0 = 2^-127 mixed in
            break;
        }
        case Format::q4_0: {
            fill(c.data, size_t(N * (K / 32) * 18));
            std::uniform_real_distribution<float> d(0.5f, 2.0f);
            for (int64_t i = 0; i < N * (K / 32); ++i) put_u16(&c.data[i * 18], ft::f32_to_f16(d(rng)));
            break;
        }
        default:
            if (ft::format_is_block(f)) {  // random codes and scales, fp16 fields finite
                const size_t rb = ft::block_row_bytes(f, K);
                fill(c.data, size_t(N) * rb);
                for (int64_t n = 0; n < N; ++n) ft::test::fix_block_fp16(f, c.data.data() + n * rb, K, rng);
            }
            break;
    }
    return c;
}

void check(const Case &c, int64_t first, int count, int ntok, std::mt19937 &rng, double bound, float xscale,
           bool dup) {
    std::uniform_real_distribution<float> xd(-xscale, xscale);
    std::vector<std::vector<uint16_t>> x(ntok, std::vector<uint16_t>(c.K));
    // xr: the activation of the format's numerics (the block formats: Q8_0 or Q8_K, exact q * d);
    // xq: int8 per 16 of bf16 x for nvfp4's W4A8 kernel.
    // xq2: the W4A8 x2 activation (two int8 terms per 32) of the "...-w4a8x2..." kernels.
    std::vector<std::vector<double>> xr(ntok, std::vector<double>(c.K)), xq = xr, xq2 = xr;
    for (int t = 0; t < ntok; ++t) {
        std::vector<float> xf(c.K), y(c.K);
        for (int64_t k = 0; k < c.K; ++k) {
            float v = xd(rng);
            x[t][k] = dup && (t & 1) ? x[t - 1][k] : ft::f32_to_bf16(v == 0.0f ? 0.25f * xscale : v);
            xf[k] = ft::bf16_to_f32(x[t][k]);
        }
        if (c.f == Format::ds_fp4) ft::fp8_round_trip_per128(xf.data(), c.K, y.data()), xf = y;
        if (ft::format_is_block(c.f)) {  // Q8_0, or Q8_K for the super-block formats
            xr[t] = ft::test::cpu_block_activation(c.f, xf.data(), c.K);
            for (int64_t k = 0; k < c.K; ++k) xf[k] = float(xr[t][k]);
        } else {
            for (int64_t k = 0; k < c.K; ++k) xr[t][k] = xf[k];
        }
        if (c.f == Format::nvfp4) {
            // nvfp4 W4A8: ft::quantize_int8_per16, stored per block as [8 even, 8 odd].
            std::vector<int8_t> q(c.K);
            std::vector<float> d(c.K / 16);
            ft::quantize_int8_per16(xf.data(), c.K, q.data(), d.data());
            for (int64_t b = 0; b < c.K / 16; ++b)
                for (int i = 0; i < 8; ++i) {
                    xq[t][16 * b + 2 * i] = double(q[16 * b + i]) * double(d[b]);
                    xq[t][16 * b + 2 * i + 1] = double(q[16 * b + 8 + i]) * double(d[b]);
                }
        }
        if (c.f == Format::mxfp4 || c.f == Format::nvfp4 || c.f == Format::ds_fp4) {
            // W4A8 x2: x ~ d (q1 + q2 / 256) per 32 (zero-padded), q1 and d Q8_0, q2 the int8
            // residual (ds_fp4: of the FP8 round trip); within d / 256 (+ the fp32 rounding of
            // x * (1 / d) where q2 clamps).
            const int64_t kp = (c.K + 31) / 32 * 32;
            std::vector<float> xp(kp, 0.0f);
            std::copy(xf.begin(), xf.end(), xp.begin());
            std::vector<int8_t> q(kp), q2(kp);
            std::vector<float> d(kp / 32);
            ft::quantize_q8_0(xp.data(), kp, q.data(), d.data());
            for (int64_t b = 0; b < kp / 32; ++b)
                ft::cpu::detail::mxfp4_residual_q8(xp.data() + 32 * b, q.data() + 32 * b, d[b], q2.data() + 32 * b);
            for (int64_t k = 0; k < c.K; ++k) {
                xq2[t][k] = (double(q[k]) + double(q2[k]) / 256.0) * double(d[k / 32]);
                ASSERT_LE(std::fabs(xq2[t][k] - xf[k]), 1.001 * double(d[k / 32]) / 256.0) << "k=" << k;
            }
        }
    }
    std::vector<std::vector<double>> ref(ntok, std::vector<double>(count)), mag = ref, refq = ref, magq = ref,
                                     refq2 = ref, magq2 = ref;
    for (int j = 0; j < count; ++j) {
        const std::vector<float> w = c.weights(first + j);
        for (int t = 0; t < ntok; ++t)
            for (int64_t k = 0; k < c.K; ++k) {
                ref[t][j] += double(w[k]) * xr[t][k];
                mag[t][j] += std::fabs(double(w[k]) * xr[t][k]);
                refq[t][j] += double(w[k]) * xq[t][k];
                magq[t][j] += std::fabs(double(w[k]) * xq[t][k]);
                refq2[t][j] += double(w[k]) * xq2[t][k];
                magq2[t][j] += std::fabs(double(w[k]) * xq2[t][k]);
            }
    }
    const auto ops_list = variants_here(c.f);
    ASSERT_FALSE(ops_list.empty());
    expect_every_gguf_tier(c.f, ops_list);
    for (const ft::cpu::QuantOps *ops : ops_list) {
        // W4A8 x2 kernels (mxfp4 with VNNI, the e2m1 formats on AVX2 and with AVX-512-VNNI): the
        // two-term activation, up to x2_max_tokens where the kernel has that limit (more: W4A16).
        // nvfp4 "-w4a8" (VNNI): int8 per 16.
        const std::string kname = ops->kernel;
        const bool named_x2 = kname.find("w4a8x2") != std::string::npos;
        const bool x2 = named_x2 && (ops->x2_max_tokens == 0 || ntok <= ops->x2_max_tokens);
        const bool w4a8 = !named_x2 && c.f == Format::nvfp4 && kname.find("w4a8") != std::string::npos;
        const auto &want = x2 ? refq2 : w4a8 ? refq : ref;
        const auto &want_mag = x2 ? magq2 : w4a8 ? magq : mag;
        std::vector<std::vector<uint8_t>> act;
        std::vector<const uint8_t *> ap;
        for (int t = 0; t < ntok; ++t) {
            act.emplace_back(ops->act_bytes(c.K) + 64, 0xcd);  // poisoned slack past the prepared bytes
            ops->prepare(x[t].data(), c.K, act.back().data());
        }
        for (int t = 0; t < ntok; ++t) ap.push_back(act[dup && (t & 1) ? t - 1 : t].data());
        const size_t ldo = size_t(count) + 3;
        std::vector<float> out(ldo * ntok, std::numeric_limits<float>::quiet_NaN());
        ops->gemv(c.m(), first, count, ap.data(), ntok, out.data(), ldo);
        for (int t = 0; t < ntok; ++t) {
            for (int j = 0; j < count; ++j)
                ASSERT_NEAR(out[t * ldo + j], want[t][j], bound * want_mag[t][j] + 1e-30)
                    << ops->kernel << " K=" << c.K << " j=" << j << " t=" << t << " of " << ntok;
            for (size_t j = size_t(count); j < ldo && t + 1 < ntok; ++j) ASSERT_TRUE(std::isnan(out[t * ldo + j])) << "wrote past count";
        }
        if (!ops->dequant) continue;
        // Batched path: dequantise the rows to bf16 (buffer NaN-poisoned, so every element of the
        // padded rows must be written), then the tier's bf16 GEMV over the same prepared
        // activations, then the per-row factor.
        // The path reads the activation's leading bf16 part.
        const size_t cols = ops->dequant_act_bytes(c.K) / 2;
        const size_t ld = cols + 8;
        std::vector<uint16_t> deq(ld * size_t(count), 0x7fc0);
        std::vector<float> rs(size_t(count), std::numeric_limits<float>::quiet_NaN());
        ops->dequant(c.m(), first, count, deq.data(), ld, rs.data());
        std::vector<const uint16_t *> ap16;
        for (auto &a : act) ap16.push_back(reinterpret_cast<const uint16_t *>(a.data()));
        std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
        ft::cpu::gemv_kernel(Isa::avx512bf16)(deq.data(), ld, count, int(cols), ap16.data(), ntok,
                                              out.data(), ldo);
        for (int t = 0; t < ntok; ++t)
            for (int j = 0; j < count; ++j)
                ASSERT_NEAR(out[t * ldo + j] * rs[j], ref[t][j], bound * mag[t][j] + 1e-30)
                    << ops->kernel << " batched K=" << c.K << " j=" << j << " t=" << t;
    }
}

}  // namespace quant_test
