// fp64 scalar reference of one MoE layer, shared by the test suites. It follows the executor's
// documented math (bf16 weights and inputs, activation on the gate/up dot products, intermediate
// rounded to bf16 like the kernels store it, route weight on the down output) but computes every
// sum in double, so a kernel is compared against the exact value of the same formula.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "freetoken.h"

namespace ft::test {

inline double bf16_to_f64(uint16_t v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Round to nearest even, as the library's f32 -> bf16 conversion does.
inline uint16_t f32_to_bf16_rne(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

inline double round_to_bf16(double v) { return bf16_to_f64(f32_to_bf16_rne(static_cast<float>(v))); }

struct ActivationRef {
    int32_t kind = FT_ACT_SILU;
    double alpha = 1.702;
    double limit = 7.0;  // +inf: no clamp
};

// act(g) * u in double.
inline double activate_ref(const ActivationRef &a, double g, double u) {
    switch (a.kind) {
        case FT_ACT_GELU: return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))) * u;
        case FT_ACT_GELU_TANH:
            return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
        case FT_ACT_SWIGLU_CLAMP:
            g = std::min(g, a.limit);
            u = std::clamp(u, -a.limit, a.limit);
            return g / (1.0 + std::exp(-a.alpha * g)) * (u + 1.0);
        default: return g / (1.0 + std::exp(-g)) * u;
    }
}

// Weights of one expert: gate [I,H], up [I,H], down [H,I], bf16 row-major.
struct ExpertRef {
    const uint16_t *gate, *up, *down;
    int32_t intermediate;
};

// out[H] (fp64) += scale * down(act(gate x) * (up x)) for one token row x[H].
inline void expert_ref(const ExpertRef &e, const ActivationRef &act, int32_t hidden, const uint16_t *x,
                       double scale, double *out, bool round_intermediate = true) {
    const int32_t I = e.intermediate, H = hidden;
    std::vector<double> inter(I);
    for (int32_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int32_t h = 0; h < H; ++h) {
            const double xv = bf16_to_f64(x[h]);
            g += bf16_to_f64(e.gate[size_t(i) * H + h]) * xv;
            u += bf16_to_f64(e.up[size_t(i) * H + h]) * xv;
        }
        const double v = activate_ref(act, g, u);
        inter[i] = round_intermediate ? round_to_bf16(v) : v;
    }
    for (int32_t h = 0; h < H; ++h) {
        double d = 0;
        for (int32_t i = 0; i < I; ++i) d += bf16_to_f64(e.down[size_t(h) * I + i]) * inter[i];
        out[h] += scale * d;
    }
}

// One MoE layer: out[t,:] = sum_k w[t,k] * expert(ids[t,k])(x[t]) over ids in [0, E), plus the
// shared expert (when given) with weight 1, or sigmoid(shared_gate_proj . x[t]) when that is set.
// expert(e) returns the weights of routed expert e. Returns out [T*H] in fp64.
inline std::vector<double> moe_reference(const std::function<ExpertRef(int32_t)> &expert, int32_t num_experts,
                                         const ActivationRef &act, int32_t hidden, int32_t num_tokens,
                                         int32_t top_k, const uint16_t *x, const int32_t *ids, const float *w,
                                         const ExpertRef *shared = nullptr,
                                         const uint16_t *shared_gate_proj = nullptr) {
    std::vector<double> out(size_t(num_tokens) * hidden, 0.0);
    for (int32_t t = 0; t < num_tokens; ++t) {
        const uint16_t *xt = x + size_t(t) * hidden;
        double *ot = out.data() + size_t(t) * hidden;
        for (int32_t k = 0; k < top_k; ++k) {
            const int32_t e = ids[size_t(t) * top_k + k];
            if (e < 0 || e >= num_experts) continue;
            expert_ref(expert(e), act, hidden, xt, w[size_t(t) * top_k + k], ot);
        }
        if (shared) {
            double scale = 1.0;
            if (shared_gate_proj) {
                double z = 0;
                for (int32_t h = 0; h < hidden; ++h) z += bf16_to_f64(shared_gate_proj[h]) * bf16_to_f64(xt[h]);
                scale = 1.0 / (1.0 + std::exp(-z));
            }
            expert_ref(*shared, act, hidden, xt, scale, ot);
        }
    }
    return out;
}

// max|a - ref| / (max|ref| + 1e-6); NaN in a gives +inf so it can never pass a bound.
template <typename A>
double relative_error(const A &a, const std::vector<double> &ref) {
    double diff = 0, mag = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = std::fabs(double(a[i]) - ref[i]);
        if (std::isnan(d)) return std::numeric_limits<double>::infinity();
        diff = std::max(diff, d);
        mag = std::max(mag, std::fabs(ref[i]));
    }
    return diff / (mag + 1e-6);
}

// Same for a bf16 result.
inline double relative_error_bf16(const std::vector<uint16_t> &a, const std::vector<double> &ref) {
    std::vector<double> v(a.size());
    for (size_t i = 0; i < a.size(); ++i) v[i] = bf16_to_f64(a[i]);
    return relative_error(v, ref);
}

}  // namespace ft::test

namespace ft::test {

// Dequantised weights of one expert (fp32, row-major: gate/up [I,H], down [H,I]) and optional
// per-output biases (mxfp4: gate/up [I], down [H]).
struct ExpertF32 {
    const float *gate, *up, *down;
    const float *bias_gate = nullptr, *bias_up = nullptr, *bias_down = nullptr;
};

// Format numerics the reference reproduces around the fp64 sums (cpu/README.md):
// ds_fp4 = DeepSeek-V4: inputs of both GEMMs FP8-round-tripped per 128 (fp8_round_trip),
// gate/up rounded to bf16, clamp at ds_limit (> 0) before silu(g) * u, and each weighted route
// output rounded to bf16 before the sum.
struct FormatNumerics {
    bool ds_fp4 = false;
    double ds_limit = 0.0;
    std::function<void(const float *, int64_t, float *)> fp8_round_trip;  // ft::fp8_round_trip_per128
    // Kernels that quantise their activations (not ds_fp4): the round trip of the expert input
    // and of the intermediate (e.g. Q8_0 per 32), each where set.
    std::function<void(const float *, int64_t, float *)> in_round_trip, mid_round_trip;
};

inline std::vector<double> moe_reference_f32(const std::function<ExpertF32(int32_t)> &expert, int32_t num_experts,
                                             const ActivationRef &act, const FormatNumerics &fmt, int32_t H,
                                             int32_t I, int32_t T, int32_t K, const uint16_t *x, const int32_t *ids,
                                             const float *w) {
    std::vector<double> out(size_t(T) * H, 0.0);
    std::vector<float> xin(H), xr(H), mid(I), midr(I);
    std::vector<double> o(H);
    for (int32_t t = 0; t < T; ++t) {
        for (int32_t h = 0; h < H; ++h) xin[h] = float(bf16_to_f64(x[size_t(t) * H + h]));
        if (fmt.ds_fp4) fmt.fp8_round_trip(xin.data(), H, xr.data());
        else if (fmt.in_round_trip) fmt.in_round_trip(xin.data(), H, xr.data());
        else xr = xin;
        for (int32_t k = 0; k < K; ++k) {
            const int32_t e = ids[size_t(t) * K + k];
            if (e < 0 || e >= num_experts) continue;
            const ExpertF32 ex = expert(e);
            for (int32_t i = 0; i < I; ++i) {
                double g = 0, u = 0;
                for (int32_t h = 0; h < H; ++h) {
                    g += double(ex.gate[size_t(i) * H + h]) * xr[h];
                    u += double(ex.up[size_t(i) * H + h]) * xr[h];
                }
                if (ex.bias_gate) g += ex.bias_gate[i], u += ex.bias_up[i];
                if (fmt.ds_fp4) {
                    g = round_to_bf16(g), u = round_to_bf16(u);
                    if (fmt.ds_limit > 0) g = std::min(g, fmt.ds_limit), u = std::clamp(u, -fmt.ds_limit, fmt.ds_limit);
                }
                mid[i] = float(round_to_bf16(activate_ref(act, g, u)));
            }
            if (fmt.ds_fp4) fmt.fp8_round_trip(mid.data(), I, midr.data());
            else if (fmt.mid_round_trip) fmt.mid_round_trip(mid.data(), I, midr.data());
            else midr = mid;
            const double wk = w[size_t(t) * K + k];
            for (int32_t h = 0; h < H; ++h) {
                double d = 0;
                for (int32_t i = 0; i < I; ++i) d += double(ex.down[size_t(h) * I + i]) * midr[i];
                if (ex.bias_down) d += ex.bias_down[h];
                out[size_t(t) * H + h] += fmt.ds_fp4 ? round_to_bf16(wk * d) : wk * d;
            }
        }
    }
    return out;
}

}  // namespace ft::test
