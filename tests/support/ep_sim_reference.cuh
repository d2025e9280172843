// The host side of the EP GPU checks, shared by the one-GPU test and the multi-GPU program: test
// cases, seeded inputs (uneven token counts, masked and repeated routes, per-block magnitudes,
// optionally (source, token) encoded in channels 0..2), the toy experts, and the whole EP step
// through the scalar reference ft/ep.hpp (what every rank must produce bit for bit).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ep_traces.hpp"
#include "ep_toy_expert.cuh"
#include "ft/common.hpp"
#include "ft/ep.hpp"

namespace ft::test {

using namespace ft::ep;  // the reference is written in the EP module's vocabulary
using ft::bf16_to_f32;
using ft::f32_to_bf16;

struct Case {
    int32_t R;
    int64_t H;
    int64_t T;
    WireDtype dtype;
    bool replicas;
    uint64_t seed;
};

inline std::string name(const Case &c) {
    return ft::cat("R=", c.R, " H=", c.H, " T=", c.T, " dtype=", static_cast<int>(c.dtype), c.replicas ? " replicas" : "");
}

constexpr int32_t kTopK = 8;

struct RankInput {
    int64_t tokens = 0;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    std::vector<uint16_t> x;
};

inline Placement make_placement_for(const Case &c, Rng &rng) {
    const int32_t E = 16 * c.R;
    if (!c.replicas) return contiguous_placement(E, c.R);
    PlannerInput in;
    in.num_experts = E;
    in.num_ranks = c.R;
    in.replicas = c.R;
    for (int32_t e = 0; e < E; ++e) in.load.push_back(1.0 + 100.0 * std::pow(rng.uniform(), 4.0));
    return plan_placement(in).placement;
}

// Rank 1 has no tokens (when R > 2), odd ranks half as many: uneven counts everywhere.
inline std::vector<RankInput> make_inputs(const Case &c, const Placement &p, Rng &rng, bool encode = false) {
    std::vector<RankInput> in(c.R);
    for (int32_t r = 0; r < c.R; ++r) {
        RankInput &ri = in[r];
        ri.tokens = (r == 1 && c.R > 2) ? 0 : (r % 2 ? std::max<int64_t>(c.T / 2, 1) : c.T);
        ri.ids = random_routing(rng, ri.tokens, kTopK, p.num_experts);
        ri.weights.resize(ri.tokens * kTopK);
        for (float &w : ri.weights) w = static_cast<float>(rng.uniform());
        ri.x.resize(ri.tokens * c.H);
        for (int64_t t = 0; t < ri.tokens; ++t)
            for (int64_t h = 0; h < c.H; ++h) {
                const double mag = std::ldexp(1.0, static_cast<int>((t * 7 + h / 128 * 3) % 11) - 5);
                ri.x[t * c.H + h] = f32_to_bf16(static_cast<float>((rng.uniform() * 2 - 1) * mag));
            }
        if (encode)  // (source, token) in channels 0..2, exact in bf16
            for (int64_t t = 0; t < ri.tokens; ++t) {
                ri.x[t * c.H + 0] = f32_to_bf16(static_cast<float>(r));
                ri.x[t * c.H + 1] = f32_to_bf16(static_cast<float>(t % 256));
                ri.x[t * c.H + 2] = f32_to_bf16(static_cast<float>(t / 256));
            }
    }
    return in;
}

struct Experts {
    std::vector<float> a, b;
};

inline Experts make_experts(Rng &rng, int32_t E) {
    Experts x;
    for (int32_t e = 0; e < E; ++e) {
        x.a.push_back(static_cast<float>(rng.uniform() * 2 - 1));
        x.b.push_back(static_cast<float>(rng.uniform() * 2 - 1));
    }
    return x;
}

// ---- the host pipeline (throughput numbering: records of source s from prefix[s]) ------------

struct HostRank {
    DispatchLayout layout;
    std::vector<uint8_t> send;
    std::vector<int64_t> count_from;      // [R]
    std::vector<uint8_t> received;        // records, sources ascending
    ExpertRows rows;
    std::vector<uint16_t> x_rows;         // [rows, H] bf16, expert-major
    std::vector<uint16_t> partials;       // [records, H]
    std::vector<uint16_t> out;            // [T, H]
    int64_t expert_rows = 0;
    double combine_max_error = 0;         // FP8 combine: largest error of the rows this rank encodes
};

// combine: the combine wire (FP8 encodes the partials a rank returns to other sources; each
// source keeps its own rows bf16, ft::ep::combine_at_source_wire).
inline std::vector<HostRank> host_pipeline(const Placement &p, const std::vector<RankInput> &in, int64_t H, WireDtype dtype,
                                    const Experts &ex, WireDtype combine = WireDtype::Bf16) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank, K = kTopK;
    const RecordLayout RL = record_layout(H, K, dtype);
    std::vector<HostRank> h(R);
    for (int32_t r = 0; r < R; ++r) {
        h[r].layout = dispatch_layout(p, in[r].ids.data(), in[r].weights.data(), in[r].tokens, K, r);
        h[r].send.resize(RL.bytes * h[r].layout.offset[R]);
        pack_dispatch(h[r].layout, in[r].x.data(), H, dtype, h[r].send.data());
    }
    std::vector<std::vector<int64_t>> recv_at(R, std::vector<int64_t>(R + 1, 0));
    for (int32_t d = 0; d < R; ++d) {
        HostRank &hd = h[d];
        for (int32_t s = 0; s < R; ++s) {
            const DispatchLayout &L = h[s].layout;
            hd.count_from.push_back(L.count[d]);
            recv_at[d][s + 1] = recv_at[d][s] + L.count[d];
            hd.received.insert(hd.received.end(), h[s].send.begin() + RL.bytes * L.offset[d],
                               h[s].send.begin() + RL.bytes * L.offset[d + 1]);
        }
        const int64_t n = recv_at[d][R];
        hd.rows = group_by_expert(hd.received.data(), hd.count_from.data(), R, RL, K, S);
        const ExpertRows &g = hd.rows;
        hd.expert_rows = g.offset[S];
        hd.x_rows.resize(hd.expert_rows * H);
        std::vector<float> xf(H);
        std::vector<uint16_t> expert_out(n * K * H, 0);
        for (int32_t slot = 0; slot < S; ++slot) {
            const int32_t e = p.phy2log[d * S + slot];
            for (int64_t k = g.offset[slot]; k < g.offset[slot + 1]; ++k) {
                unpack_payload(hd.received.data() + RL.bytes * g.record[k], RL, H, dtype, xf.data());
                uint16_t *xr = hd.x_rows.data() + k * H;
                for (int64_t c = 0; c < H; ++c) xr[c] = f32_to_bf16(xf[c]);
                for (int64_t c = 0; c < H; ++c)
                    expert_out[(g.record[k] * K + g.route[k]) * H + c] =
                        toy_expert_host(ex.a[e], ex.b[e], bf16_to_f32(xr[c]), bf16_to_f32(xr[(c + 1) % H]));
            }
        }
        hd.partials.resize(n * H);
        reduce_partials(hd.received.data(), n, RL, K, H, expert_out.data(), hd.partials.data());
    }
    const size_t crb = combine_row_bytes(H, combine);
    std::vector<std::vector<uint8_t>> cwire(R);
    if (combine != WireDtype::Bf16)
        for (int32_t d = 0; d < R; ++d) {
            cwire[d].resize(crb * recv_at[d][R]);
            for (int32_t s = 0; s < R; ++s)
                for (int64_t i = recv_at[d][s]; s != d && i < recv_at[d][s + 1]; ++i)
                    h[d].combine_max_error = std::max(
                        h[d].combine_max_error,
                        encode_combine_row(h[d].partials.data() + i * H, H, combine, cwire[d].data() + crb * i));
        }
    for (int32_t s = 0; s < R; ++s) {
        std::vector<const uint8_t *> rows(R);
        for (int32_t d = 0; d < R; ++d)
            rows[d] = combine == WireDtype::Bf16 || d == s
                          ? reinterpret_cast<const uint8_t *>(h[d].partials.data() + recv_at[d][s] * H)
                          : cwire[d].data() + crb * recv_at[d][s];
        h[s].out.resize(in[s].tokens * H);
        combine_at_source_wire(h[s].layout, rows.data(), H, combine, h[s].out.data());
    }
    return h;
}


inline int64_t max_expert_rows(const std::vector<HostRank> &h) {
    int64_t m = 1;
    for (const HostRank &r : h) m = std::max(m, r.expert_rows);
    return m;
}

// The single-device MoE in double from the bf16 inputs, against `out` (one rank's EP output):
// |out - ref| <= FP8 error bound (half an e4m3 ulp per element, relative 2^-4, plus the
// subnormal floor) + 4 bf16 roundings (unpacked row, expert output, partial, final sum).
struct MoeCheck {
    int64_t bad = 0;
    double worst = 0;  // largest |out - ref| / tolerance
};

inline MoeCheck check_against_moe(const RankInput &ri, const Experts &ex, int64_t H, WireDtype dtype,
                                  const std::vector<uint16_t> &out) {
    const ScaleFormat fmt = dtype == WireDtype::Fp8Ue8m0 ? ScaleFormat::Ue8m0 : ScaleFormat::Fp32;
    MoeCheck m;
    std::vector<float> x(H);
    std::vector<uint8_t> q(H), scales(fp8_scale_bytes(H, fmt));
    for (int64_t t = 0; t < ri.tokens; ++t) {
        for (int64_t k = 0; k < H; ++k) x[k] = bf16_to_f32(ri.x[t * H + k]);
        quantize_fp8_row(ri.x.data() + t * H, H, fmt, q.data(), scales.data());
        for (int64_t k = 0; k < H; ++k) {
            double ref = 0, mag = 0, err = 0;
            for (int32_t j = 0; j < kTopK; ++j) {
                const int32_t e = ri.ids[t * kTopK + j];
                if (e < 0) continue;
                const int64_t k1 = (k + 1) % H;
                const double w = ri.weights[t * kTopK + j], a = ex.a[e], b = ex.b[e];
                ref += w * (a * x[k] + b * x[k1]);
                mag += std::fabs(w) * (std::fabs(a * x[k]) + std::fabs(b * x[k1]));
                if (dtype != WireDtype::Bf16) {
                    auto delta = [&](int64_t ch) {
                        const double s = fp8_block_scale(scales.data(), ch / kWireBlock, fmt);
                        return std::fabs(x[ch]) / 16 + s * 0x1p-10 + std::fabs(x[ch]) * 0x1p-22;
                    };
                    err += std::fabs(w) * (std::fabs(a) * delta(k) + std::fabs(b) * delta(k1));
                }
            }
            const double tol = 1.02 * err + 4.2 * 0x1p-8 * (mag + err) + 1e-30;
            const double diff = std::fabs(bf16_to_f32(out[t * H + k]) - ref);
            m.worst = std::max(m.worst, diff / tol);
            if (!(diff <= tol)) ++m.bad;
        }
    }
    return m;
}

}  // namespace ft::test
