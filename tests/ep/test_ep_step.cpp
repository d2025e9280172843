// A whole EP step on the CPU: R ranks in one process, each working only from its own tokens and
// what it receives through the memcpy transport double (count all-gather, chunked dispatch,
// expert compute per local expert, local reduction, chunked combine, ordered sum at the source).
// Checks: value-encoded tokens arrive exactly once where they should, each expert gets exactly its
// rows, the output equals a single-device MoE within the FP8 (or bf16) tolerance, and it is
// bit-identical across chunk counts and chunk arrival orders.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "ep_traces.hpp"
#include "ft/common.hpp"
#include "ft/ep.hpp"

namespace {

using namespace ft::ep;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
using ft::test::MemcpyTransport;
using ft::test::Rng;

// A tiny expert that still mixes channels (so a payload shifted by one channel is caught):
// y[h] = bf16(a_e x[h] + b_e x[h+1 mod H]).
struct Experts {
    std::vector<float> a, b;
    uint16_t out(int32_t e, const float *x, int64_t h, int64_t H) const {
        return f32_to_bf16(a[e] * x[h] + b[e] * x[(h + 1) % H]);
    }
};

struct RankInput {
    int64_t tokens = 0;
    std::vector<int32_t> ids;    // [T, K]
    std::vector<float> weights;  // [T, K]
    std::vector<uint16_t> x;     // [T, H] bf16
};

struct StepOptions {
    WireDtype dtype = WireDtype::Fp8Fp32;
    ChunkPolicy policy;
    double link_bytes_per_s = 25e9;
    bool reverse_chunks = false;  // deliver chunks last to first: arrival order must not matter
};

// What each rank saw, for the checks.
struct StepResult {
    std::vector<std::vector<uint16_t>> out;        // [R][T_r * H]
    std::vector<std::vector<uint8_t>> received;    // [R] records, sources ascending
    std::vector<std::vector<int64_t>> count_from;  // [R][R] records rank d got from s
    std::vector<ExpertRows> rows;                  // [R]
    int32_t chunks = 0;
    int64_t groups = 0;
};

StepResult run_step(const Placement &p, const std::vector<RankInput> &in, int32_t K, int64_t H, const Experts &experts,
                    const StepOptions &opt) {
    const int32_t R = p.num_ranks, S = p.slots_per_rank;
    const RecordLayout RL = record_layout(H, K, opt.dtype);
    MemcpyTransport net(R);
    StepResult res;

    // 1. Layout on every source rank.
    std::vector<DispatchLayout> layout;
    for (int32_t r = 0; r < R; ++r)
        layout.push_back(dispatch_layout(p, in[r].ids.data(), in[r].weights.data(), in[r].tokens, K, r));

    // 2. Count all-gather: every rank learns the whole R x R matrix (the one host sync per layer).
    std::vector<std::vector<int64_t>> matrix(R, std::vector<int64_t>(R * R));
    for (int32_t r = 0; r < R; ++r)
        for (int32_t peer = 0; peer < R; ++peer) {
            net.send(r, peer, layout[r].count.data(), R * sizeof(int64_t));
            net.recv(peer, r, matrix[peer].data() + r * R, R * sizeof(int64_t));
        }
    net.group_end();
    res.count_from.assign(R, std::vector<int64_t>(R));
    std::vector<std::vector<int64_t>> recv_at(R, std::vector<int64_t>(R + 1, 0));  // region of source s
    for (int32_t d = 0; d < R; ++d)
        for (int32_t s = 0; s < R; ++s) {
            res.count_from[d][s] = matrix[d][s * R + d];
            recv_at[d][s + 1] = recv_at[d][s] + res.count_from[d][s];
        }

    // 3. Pack, and the chunk plan each rank derives on its own from its copy of the matrix.
    std::vector<std::vector<uint8_t>> send(R);
    std::vector<ChunkPlan> plan;
    for (int32_t r = 0; r < R; ++r) {
        send[r].resize(RL.bytes * layout[r].offset[R]);
        pack_dispatch(layout[r], in[r].x.data(), H, opt.dtype, send[r].data());
        plan.push_back(plan_chunks(matrix[r], R, RL.bytes, opt.link_bytes_per_s, opt.policy));
        EXPECT_EQ(plan[r].chunks, plan[0].chunks) << "ranks disagree on the chunk count";
    }
    const int32_t C = plan[0].chunks;
    res.chunks = C;

    // 4. Dispatch, one grouped exchange per chunk; self traffic goes through the transport too.
    res.received.resize(R);
    for (int32_t d = 0; d < R; ++d) res.received[d].assign(RL.bytes * recv_at[d][R], 0);
    for (int32_t i = 0; i < C; ++i) {
        const int32_t c = opt.reverse_chunks ? C - 1 - i : i;
        for (int32_t s = 0; s < R; ++s)
            for (int32_t d = 0; d < R; ++d) {
                const int64_t b = plan[s].begin(s, d, c), e = plan[s].end(s, d, c);
                net.send(s, d, send[s].data() + RL.bytes * (layout[s].offset[d] + b), RL.bytes * (e - b));
            }
        for (int32_t d = 0; d < R; ++d)
            for (int32_t s = 0; s < R; ++s) {
                const int64_t b = plan[d].begin(s, d, c), e = plan[d].end(s, d, c);
                net.recv(d, s, res.received[d].data() + RL.bytes * (recv_at[d][s] + b), RL.bytes * (e - b));
            }
        net.group_end();
    }

    // 5. Each rank runs its local experts over their rows (expert-major, as a grouped GEMM would),
    // then reduces each record's routes into one bf16 partial.
    std::vector<std::vector<uint16_t>> partials(R);
    res.rows.resize(R);
    for (int32_t d = 0; d < R; ++d) {
        const int64_t n = recv_at[d][R];
        res.rows[d] = group_by_expert(res.received[d].data(), res.count_from[d].data(), R, RL, K, S);
        const ExpertRows &g = res.rows[d];
        std::vector<float> x(n * H);
        for (int64_t i = 0; i < n; ++i) unpack_payload(res.received[d].data() + RL.bytes * i, RL, H, opt.dtype, x.data() + i * H);
        std::vector<uint16_t> expert_out(n * K * H, 0);
        for (int32_t slot = 0; slot < S; ++slot) {
            const int32_t e = p.phy2log[d * S + slot];
            for (int64_t k = g.offset[slot]; k < g.offset[slot + 1]; ++k)
                for (int64_t h = 0; h < H; ++h)
                    expert_out[(g.record[k] * K + g.route[k]) * H + h] = experts.out(e, x.data() + g.record[k] * H, h, H);
        }
        partials[d].resize(n * H);
        reduce_partials(res.received[d].data(), n, RL, K, H, expert_out.data(), partials[d].data());
    }

    // 6. Combine: partials travel back in the same chunks, then each source sums in rank order.
    std::vector<std::vector<std::vector<uint16_t>>> back(R, std::vector<std::vector<uint16_t>>(R));
    for (int32_t s = 0; s < R; ++s)
        for (int32_t d = 0; d < R; ++d) back[s][d].assign(layout[s].count[d] * H, 0xFFFF);
    for (int32_t i = 0; i < C; ++i) {
        const int32_t c = opt.reverse_chunks ? C - 1 - i : i;
        for (int32_t d = 0; d < R; ++d)
            for (int32_t s = 0; s < R; ++s) {
                const int64_t b = plan[d].begin(s, d, c), e = plan[d].end(s, d, c);
                net.send(d, s, partials[d].data() + (recv_at[d][s] + b) * H, (e - b) * H * 2);
            }
        for (int32_t s = 0; s < R; ++s)
            for (int32_t d = 0; d < R; ++d) {
                const int64_t b = plan[s].begin(s, d, c), e = plan[s].end(s, d, c);
                net.recv(s, d, back[s][d].data() + b * H, (e - b) * H * 2);
            }
        net.group_end();
    }
    res.out.resize(R);
    for (int32_t s = 0; s < R; ++s) {
        std::vector<const uint16_t *> ptr(R);
        for (int32_t d = 0; d < R; ++d) ptr[d] = back[s][d].data();
        res.out[s].resize(in[s].tokens * H);
        combine_at_source(layout[s], ptr.data(), H, res.out[s].data());
    }
    res.groups = net.groups();
    return res;
}

// ---- inputs ----------------------------------------------------------------------------------

Experts make_experts(Rng &rng, int32_t E) {
    Experts x;
    for (int32_t e = 0; e < E; ++e) {
        x.a.push_back(static_cast<float>(rng.uniform() * 2 - 1));
        x.b.push_back(static_cast<float>(rng.uniform() * 2 - 1));
    }
    return x;
}

std::vector<RankInput> make_inputs(Rng &rng, int32_t R, int32_t E, int32_t K, int64_t H, int64_t max_tokens) {
    std::vector<RankInput> in(R);
    for (int32_t r = 0; r < R; ++r) {
        RankInput &ri = in[r];
        ri.tokens = r == 1 ? 0 : rng.below(max_tokens + 1);  // rank 1 has no tokens at all
        ri.ids = ft::test::random_routing(rng, ri.tokens, K, E);
        ri.weights.resize(ri.tokens * K);
        for (float &w : ri.weights) w = static_cast<float>(rng.uniform());
        ri.x.resize(ri.tokens * H);
        for (int64_t t = 0; t < ri.tokens; ++t) {
            // Magnitudes vary per token and per 128-channel block, as activations do.
            for (int64_t h = 0; h < H; ++h) {
                const double mag = std::ldexp(1.0, static_cast<int>((t * 7 + h / 128 * 3) % 11) - 5);
                ri.x[t * H + h] = f32_to_bf16(static_cast<float>((rng.uniform() * 2 - 1) * mag));
            }
        }
    }
    return in;
}

// Single-device MoE in double: out[t] = sum_j w_j expert_{id_j}(x_t), with x_t either the bf16
// input or what the FP8 wire delivers. Also returns the magnitude sum M for tolerances.
void reference(const RankInput &ri, int32_t K, int64_t H, const Experts &ex, bool through_fp8, ScaleFormat fmt,
               std::vector<double> &ref, std::vector<double> &mag, std::vector<double> &fp8_err) {
    ref.assign(ri.tokens * H, 0.0);
    mag.assign(ri.tokens * H, 0.0);
    fp8_err.assign(ri.tokens * H, 0.0);
    std::vector<float> x(H), xq(H);
    std::vector<uint8_t> q(H), scales(fp8_scale_bytes(H, fmt));
    for (int64_t t = 0; t < ri.tokens; ++t) {
        for (int64_t h = 0; h < H; ++h) x[h] = bf16_to_f32(ri.x[t * H + h]);
        quantize_fp8_row(ri.x.data() + t * H, H, fmt, q.data(), scales.data());
        dequantize_fp8_row(q.data(), scales.data(), H, fmt, xq.data());
        const std::vector<float> &v = through_fp8 ? xq : x;
        for (int32_t j = 0; j < K; ++j) {
            const int32_t e = ri.ids[t * K + j];
            if (e < 0) continue;
            const double w = ri.weights[t * K + j], a = ex.a[e], b = ex.b[e];
            for (int64_t h = 0; h < H; ++h) {
                const int64_t h1 = (h + 1) % H;
                ref[t * H + h] += w * (a * v[h] + b * v[h1]);
                mag[t * H + h] += std::fabs(w) * (std::fabs(a * v[h]) + std::fabs(b * v[h1]));
                auto delta = [&](int64_t c) {
                    const double s = fp8_block_scale(scales.data(), c / kWireBlock, fmt);
                    return std::fabs(x[c]) / 16 + s * 0x1p-10 + std::fabs(x[c]) * 0x1p-22;
                };
                fp8_err[t * H + h] += std::fabs(w) * (std::fabs(a) * delta(h) + std::fabs(b) * delta(h1));
            }
        }
    }
}

// Rounding budget of the EP path against a reference fed the same x: the expert output, the
// partial and the final sum are each rounded to bf16 (unit roundoff 2^-8) once per term of M.
constexpr double kBf16Budget = 3.1 * 0x1p-8;

// ---- tests -----------------------------------------------------------------------------------

TEST(EpStep, ValueEncodedTokensArriveExactlyOnceWhereTheyShould) {
    Rng rng(0x5eed0010);
    for (int32_t R = 2; R <= 8; ++R) {
        const int32_t E = 4 * R, K = 4;
        const int64_t H = 256;
        // Planned placement with replicas, so replica choice is exercised too.
        ft::test::TraceSpec spec;
        spec.experts = E;
        spec.top_k = K;
        spec.tokens = 500;
        spec.seed = 50 + R;
        const auto trace = ft::test::routing_trace(spec);
        PlannerInput pin;
        pin.num_experts = E - R;  // the last R "experts" come back as replicas: S = 4
        pin.num_ranks = R;
        pin.replicas = R;
        std::vector<double> coact;
        ft::test::routing_stats(trace, E, K, pin.load, coact);
        pin.load.resize(E - R);
        const Placement p = plan_placement(pin).placement;
        std::vector<RankInput> in = make_inputs(rng, R, E - R, K, H, 300);
        // Channels 0..2 encode (source, token): exact in bf16 and on a bf16 wire.
        for (int32_t s = 0; s < R; ++s)
            for (int64_t t = 0; t < in[s].tokens; ++t) {
                in[s].x[t * H + 0] = f32_to_bf16(static_cast<float>(s));
                in[s].x[t * H + 1] = f32_to_bf16(static_cast<float>(t % 128));
                in[s].x[t * H + 2] = f32_to_bf16(static_cast<float>(t / 128));
            }
        StepOptions opt;
        opt.dtype = WireDtype::Bf16;
        const Experts ex = make_experts(rng, E - R);
        const StepResult res = run_step(p, in, K, H, ex, opt);
        const RecordLayout RL = record_layout(H, K, opt.dtype);

        // Expected per logical expert: the (source, token) of every route naming it.
        std::map<int32_t, std::multiset<std::pair<int32_t, int32_t>>> want, got;
        for (int32_t s = 0; s < R; ++s)
            for (int64_t t = 0; t < in[s].tokens; ++t)
                for (int32_t j = 0; j < K; ++j)
                    if (in[s].ids[t * K + j] >= 0) want[in[s].ids[t * K + j]].insert({s, static_cast<int32_t>(t)});
        for (int32_t d = 0; d < R; ++d) {
            std::set<std::pair<int32_t, int32_t>> seen;
            std::vector<float> x(H);
            const int64_t n = static_cast<int64_t>(res.received[d].size() / RL.bytes);
            for (int64_t i = 0; i < n; ++i) {
                const uint8_t *rec = res.received[d].data() + RL.bytes * i;
                unpack_payload(rec, RL, H, opt.dtype, x.data());
                const int32_t s = static_cast<int32_t>(x[0]), t = static_cast<int32_t>(x[1] + 128 * x[2]);
                const RecordMeta m = read_record_meta(rec, RL, K);
                ASSERT_EQ(m.source, s);
                ASSERT_EQ(m.token, t);
                ASSERT_TRUE(seen.insert({s, t}).second) << "rank " << d << " got (" << s << ", " << t << ") twice";
                // Only ranks holding one of the token's experts get it.
                bool holds = false;
                for (int32_t j = 0; j < K; ++j)
                    for (int32_t slot = 0; slot < p.slots_per_rank; ++slot)
                        holds = holds || in[s].ids[t * K + j] == p.phy2log[d * p.slots_per_rank + slot];
                ASSERT_TRUE(holds);
                ASSERT_GE(m.n, 1);
            }
            const ExpertRows &g = res.rows[d];
            for (int32_t slot = 0; slot < p.slots_per_rank; ++slot)
                for (int64_t k = g.offset[slot]; k < g.offset[slot + 1]; ++k) {
                    const RecordMeta m = read_record_meta(res.received[d].data() + RL.bytes * g.record[k], RL, K);
                    got[p.phy2log[d * p.slots_per_rank + slot]].insert({m.source, m.token});
                }
        }
        ASSERT_EQ(got, want) << "R=" << R;
    }
}

void check_against_reference(const Placement &p, const std::vector<RankInput> &in, int32_t K, int64_t H,
                             const Experts &ex, const StepResult &res, WireDtype dtype) {
    const bool fp8 = dtype != WireDtype::Bf16;
    const ScaleFormat fmt = dtype == WireDtype::Fp8Ue8m0 ? ScaleFormat::Ue8m0 : ScaleFormat::Fp32;
    double dot = 0, sq = 0;
    for (size_t s = 0; s < in.size(); ++s) {
        std::vector<double> ref_q, mag_q, ref_x, mag_x, err;
        reference(in[s], K, H, ex, fp8, fmt, ref_q, mag_q, err);   // what the wire delivered
        reference(in[s], K, H, ex, false, fmt, ref_x, mag_x, err);  // the bf16 input itself
        for (int64_t i = 0; i < in[s].tokens * H; ++i) {
            const double y = bf16_to_f32(res.out[s][i]);
            ASSERT_LE(std::fabs(y - ref_q[i]), kBf16Budget * mag_q[i] + 1e-30)
                << "rank " << s << " token " << i / H << " channel " << i % H;
            if (fp8) {
                ASSERT_LE(std::fabs(y - ref_x[i]), kBf16Budget * mag_q[i] + err[i]) << "rank " << s << " at " << i;
            }
            dot += y * ref_x[i];
            sq += y * y + ref_x[i] * ref_x[i];
        }
    }
    // DeepEP's calc_diff: 1 - cosine-like similarity; its FP8 dispatch gate is 1e-3.
    if (sq > 0) {
        EXPECT_LT(1 - 2 * dot / sq, fp8 ? 1e-3 : 1e-5);
    }
}

TEST(EpStep, EqualsSingleDeviceMoE) {
    Rng rng(0x5eed0011);
    for (int32_t R = 2; R <= 8; ++R)
        for (WireDtype dtype : {WireDtype::Fp8Fp32, WireDtype::Fp8Ue8m0, WireDtype::Bf16}) {
            SCOPED_TRACE(::testing::Message() << "R=" << R << " dtype " << static_cast<int>(dtype));
            const int32_t E = 2 * R * (1 + static_cast<int32_t>(rng.below(3))), K = std::min(6, E);
            const int64_t H = 256;
            // Contiguous placement on even R, a random replicated one (via the planner) on odd R.
            Placement p = contiguous_placement(E, R);
            if (R % 2) {
                PlannerInput pin;
                pin.num_experts = E - R;
                pin.num_ranks = R;
                pin.replicas = R;
                for (int32_t e = 0; e < E - R; ++e) pin.load.push_back(std::floor(rng.uniform() * 100));
                p = plan_placement(pin).placement;
            }
            const std::vector<RankInput> in = make_inputs(rng, R, p.num_experts, K, H, 120);
            const Experts ex = make_experts(rng, p.num_experts);
            StepOptions opt;
            opt.dtype = dtype;
            const StepResult res = run_step(p, in, K, H, ex, opt);
            check_against_reference(p, in, K, H, ex, res, dtype);
        }
}

TEST(EpStep, BitIdenticalAcrossChunkCountsAndArrivalOrder) {
    Rng rng(0x5eed0012);
    for (int32_t R : {2, 3, 5, 8}) {
        const int32_t E = 4 * R, K = 6;
        const int64_t H = 128;
        const Placement p = contiguous_placement(E, R);
        const std::vector<RankInput> in = make_inputs(rng, R, E, K, H, 200);
        const Experts ex = make_experts(rng, E);
        StepOptions opt;
        opt.policy.min_chunk_bytes = 1;  // let max_chunks alone set the count
        opt.link_bytes_per_s = 0;
        opt.policy.max_chunks = 1;
        const StepResult one = run_step(p, in, K, H, ex, opt);
        ASSERT_EQ(one.chunks, 1);
        check_against_reference(p, in, K, H, ex, one, opt.dtype);
        for (int32_t C : {2, 3, 5, 8}) {
            for (bool reverse : {false, true}) {
                opt.policy.max_chunks = C;
                opt.reverse_chunks = reverse;
                const StepResult many = run_step(p, in, K, H, ex, opt);
                ASSERT_EQ(many.chunks, C);
                ASSERT_EQ(many.groups, 1 + 2 * C);  // counts, then C dispatch and C combine groups
                for (int32_t s = 0; s < R; ++s)
                    ASSERT_TRUE(one.out[s] == many.out[s])  // bf16 bits; empty for a rank without tokens
                        << "R=" << R << " C=" << C << " reverse=" << reverse << " rank " << s;
            }
        }
    }
}

TEST(EpStep, TransportRejectsMismatchedSizes) {
    // The double must catch a sender and receiver that disagree, or the step tests prove little.
    MemcpyTransport net(2);
    char a[8] = {}, b[8] = {};
    net.send(0, 1, a, 8);
    net.recv(1, 0, b, 4);
    EXPECT_THROW(net.group_end(), std::runtime_error);
    MemcpyTransport net2(2);
    net2.recv(1, 0, b, 4);
    EXPECT_THROW(net2.group_end(), std::runtime_error);
}

}  // namespace
