// libFuzzer target: sequences of public API calls with hostile arguments: ft_model_create with
// any geometry, ft_model_set_expert / set_router_bias / finalize with bad layers, experts, sizes
// and NULLs, session parameters, ft_route with NaN/Inf logits, ft_decode with hostile ids,
// counts, NaN/Inf hidden states and weights, NULL pointers, stats getters.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <limits>

#include "fuzz_util.hpp"

namespace {

// Mostly small valid values, sometimes any int32 (the hostile ones).
int32_t pick(FuzzedDataProvider &in, int32_t lo, int32_t hi) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(lo, hi) : in.ConsumeIntegral<int32_t>();
}

// A width: a small multiple of 32 mostly, sometimes any int32.
int32_t pick_dim(FuzzedDataProvider &in, int32_t max_blocks) {
    return in.ConsumeBool() ? 32 * in.ConsumeIntegralInRange<int32_t>(0, max_blocks) : in.ConsumeIntegral<int32_t>();
}

float pick_float(FuzzedDataProvider &in) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
        case 0: return std::numeric_limits<float>::quiet_NaN();
        case 1: return std::numeric_limits<float>::infinity();
        case 2: return -std::numeric_limits<float>::infinity();
        case 3: return in.ConsumeFloatingPoint<float>();
        default: return in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
    }
}

uint16_t pick_bf16(FuzzedDataProvider &in) {
    if (in.ConsumeBool()) return in.ConsumeIntegral<uint16_t>();  // any bits, NaN/Inf included
    const float f = in.ConsumeFloatingPointInRange<float>(-2.0f, 2.0f);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return static_cast<uint16_t>(b >> 16);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzedDataProvider in(data, size);
    ft_engine *e = ftfuzz::engine();
    char err[512] = "";

    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = pick(in, 0, 3);
    d.num_experts = pick(in, 0, 8);
    d.top_k = pick(in, 0, 4);
    d.hidden_size = pick_dim(in, 4);
    d.intermediate_size = pick_dim(in, 3);
    if (in.ConsumeBool()) d.activation = pick(in, 0, 5);
    if (in.ConsumeBool()) d.routing = pick(in, 0, 6);
    if (in.ConsumeBool()) d.num_groups = pick(in, 0, 4);
    if (in.ConsumeBool()) d.topk_groups = pick(in, 0, 4);
    if (in.ConsumeBool()) d.routed_scaling_factor = pick_float(in);
    if (in.ConsumeBool()) d.swiglu_limit = pick_float(in);
    if (in.ConsumeBool()) d.format = pick(in, 0, 7);
    ft_model *m = nullptr;
    ft_status s = ft_model_create(e, in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : &d, &m, err, sizeof err);
    ftfuzz::check_status(s, err);
    if (s != FT_OK) {
        if (m) std::abort();
        return 0;
    }
    // Only geometries small enough to fill are used further; larger valid ones were mapped, not touched.
    const int64_t H = d.hidden_size, I = d.intermediate_size, E = d.num_experts, L = d.num_layers;
    if (H > 256 || I > 256 || E > 16 || L > 4) {
        ft_model_free(m);
        return 0;
    }
    std::vector<uint16_t> w(static_cast<size_t>(H * I));
    const int fills = in.ConsumeIntegralInRange<int>(0, 3 * static_cast<int>(E * L) + 2);
    for (int i = 0; i < fills && in.remaining_bytes() > 0; ++i) {
        const int32_t layer = pick(in, 0, static_cast<int32_t>(L));
        const int32_t expert = pick(in, 0, static_cast<int32_t>(E));
        const int32_t proj = pick(in, 1, 3);
        for (size_t k = 0; k < 4 && !w.empty(); ++k) w[in.ConsumeIntegralInRange<size_t>(0, w.size() - 1)] = pick_bf16(in);
        size_t nbytes = w.size() * 2;
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0) nbytes = in.ConsumeIntegralInRange<size_t>(0, nbytes);
        const bool null = in.ConsumeIntegralInRange<int>(0, 15) == 0;
        s = ft_model_set_expert(m, layer, expert, proj, null ? nullptr : w.data(), nbytes);
        if (!ft_status_string(s)) std::abort();
    }
    if (in.ConsumeBool()) {
        std::vector<float> bias(static_cast<size_t>(E) + 1);
        for (float &b : bias) b = pick_float(in);
        s = ft_model_set_router_bias(m, pick(in, 0, static_cast<int32_t>(L)), in.ConsumeBool() ? bias.data() : nullptr,
                                     pick(in, 0, static_cast<int32_t>(E) + 1));
        if (!ft_status_string(s)) std::abort();
    }
    s = ft_model_finalize(m);
    if (!ft_status_string(s)) std::abort();
    if (s == FT_OK) {
        ft_session_params sp;
        ft_session_params_init(&sp);
        sp.backend = in.ConsumeBool() ? FT_BACKEND_CPU : pick(in, 0, 5);
        sp.max_tokens = pick(in, 1, 8);
        sp.check_finite = in.ConsumeBool();
        sp.shared_experts = in.ConsumeBool();
        ft_session *ss = nullptr;
        const bool default_params = in.ConsumeIntegralInRange<int>(0, 15) == 0;
        const int32_t max_tokens = default_params ? 256 : sp.max_tokens;  // 256: the documented default
        s = ft_session_create(m, default_params ? nullptr : &sp, &ss, err, sizeof err);
        ftfuzz::check_status(s, err);
        if (s == FT_OK) {
            const int K = d.top_k;
            for (int step = 0; step < 4 && in.remaining_bytes() > 0; ++step) {
                const int32_t layer = pick(in, 0, static_cast<int32_t>(L));
                const int32_t T = pick(in, 1, 8);
                const size_t t = static_cast<size_t>(T > 0 && T <= 8 ? T : 1);  // buffers for what T claims, at most 8
                std::vector<float> logits(t * static_cast<size_t>(E));
                for (float &v : logits) v = in.ConsumeBool() ? pick_float(in) : 0.5f;
                std::vector<int32_t> ids(t * static_cast<size_t>(K));
                std::vector<float> wts(t * static_cast<size_t>(K));
                const int32_t Tc = T > 0 && T <= 8 ? T : (in.ConsumeBool() ? T : 1);
                // A count the buffers do not hold is only passed where it must be rejected: <= 0 for
                // ft_route (which reads num_tokens rows whatever max_tokens is), <= 0 or above
                // max_tokens for ft_decode.
                const bool bad_count = Tc != static_cast<int32_t>(t);
                if (bad_count && Tc > 0 && Tc <= max_tokens) continue;
                s = ft_route(ss, layer, bad_count && Tc > 0 ? static_cast<int32_t>(t) : Tc, in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : logits.data(),
                             ids.data(), wts.data());
                if (!ft_status_string(s)) std::abort();
                for (size_t k = 0; k < ids.size(); ++k) {
                    if (s != FT_OK || in.ConsumeIntegralInRange<int>(0, 7) == 0) ids[k] = pick(in, -2, static_cast<int32_t>(E));
                    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) wts[k] = pick_float(in);
                }
                std::vector<uint16_t> hidden(t * static_cast<size_t>(H)), out(t * static_cast<size_t>(H));
                for (uint16_t &h : hidden) h = pick_bf16(in);
                s = ft_decode(ss, layer, Tc, in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : hidden.data(),
                              ids.data(), wts.data(), out.data());
                if (!ft_status_string(s)) std::abort();
            }
            ft_session_stats st;
            st.struct_size = sizeof st;
            if (ft_session_get_stats(ss, &st) != FT_OK) std::abort();
            ft_session_free(ss);
        } else if (ss) {
            std::abort();
        }
    }
    ft_model_free(m);
    return 0;
}
