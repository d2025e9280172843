// Tests of the CPU module: every GEMV tier against an fp64 reference, the worker pool, and the MoE
// executor against tests/support/moe_reference.hpp (all activations, skipped and duplicate
// routes, shared experts, oneDNN path, determinism across pool sizes, expert dedup).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "moe_reference.hpp"

namespace {

using ft::cpu::Isa;
using ft::test::bf16_to_f64;

constexpr uint16_t kNaNBf16 = 0x7fc0;

std::vector<uint16_t> random_bf16(std::mt19937 &rng, size_t n, float scale) {
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<uint16_t> v(n);
    for (auto &e : v) {
        float f = d(rng);
        if (f == 0.0f) f = scale * 0.5f;  // never zeros
        e = ft::f32_to_bf16(f);
    }
    return v;
}

std::vector<Isa> supported_tiers() {
    std::vector<Isa> tiers;
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16})
        if (int(i) <= int(ft::cpu::cpu_best_isa())) tiers.push_back(i);
    return tiers;
}

// ---- GEMV kernels ----------------------------------------------------------------------------

struct GemvShape {
    int rows, cols, ntok, pad_w, pad_o;
};

// gemv on fresh random data against an fp64 reference, shape by shape; padding between output
// rows must stay untouched.
void check_gemv(ft::cpu::GemvFn gemv, const std::string &label, unsigned seed, const std::vector<GemvShape> &shapes) {
    std::mt19937 rng(seed);
    for (const GemvShape &s : shapes) {
        const size_t ldw = s.cols + s.pad_w, ldo = s.rows + s.pad_o;
        auto w = random_bf16(rng, s.rows * ldw, 1.0f);
        std::vector<std::vector<uint16_t>> xs;
        std::vector<const uint16_t *> xp;
        for (int t = 0; t < s.ntok; ++t) xs.push_back(random_bf16(rng, s.cols, 1.0f));
        for (auto &v : xs) xp.push_back(v.data());
        std::vector<float> out(s.ntok * ldo, std::numeric_limits<float>::quiet_NaN());
        gemv(w.data(), ldw, s.rows, s.cols, xp.data(), s.ntok, out.data(), ldo);
        double max_diff = 0, max_ref = 0;
        for (int t = 0; t < s.ntok; ++t)
            for (int r = 0; r < s.rows; ++r) {
                double ref = 0;
                for (int c = 0; c < s.cols; ++c) ref += bf16_to_f64(w[r * ldw + c]) * bf16_to_f64(xs[t][c]);
                const double got = out[t * ldo + r];
                ASSERT_FALSE(std::isnan(got)) << label << " row " << r << " token " << t << " not written";
                max_diff = std::max(max_diff, std::fabs(got - ref));
                max_ref = std::max(max_ref, std::fabs(ref));
            }
        // fp32 accumulation of products that are exact in fp32: the error grows with the
        // number of terms; 1e-5 * sqrt(cols) relative to the largest output is ample.
        EXPECT_LT(max_diff / (max_ref + 1e-6), 1e-5 * std::sqrt(double(s.cols)) + 1e-6)
            << label << " rows=" << s.rows << " cols=" << s.cols << " ntok=" << s.ntok;
        for (int t = 0; t < s.ntok; ++t)
            for (size_t r = s.rows; r < ldo; ++r) EXPECT_TRUE(std::isnan(out[t * ldo + r]));
    }
}

class GemvTier : public ::testing::TestWithParam<Isa> {};

TEST_P(GemvTier, MatchesFp64Reference) {
    const Isa isa = GetParam();
    if (int(isa) > int(ft::cpu::cpu_best_isa())) GTEST_SKIP() << ft::cpu::isa_name(isa) << " not supported here";
    // Column counts cover exact multiples of 16/32 and every kind of tail; token counts cover
    // the 1..4 register tiles and their combinations.
    check_gemv(ft::cpu::gemv_kernel(isa), ft::cpu::isa_name(isa), 1234 + int(isa),
               {{1, 1, 1, 0, 0}, {3, 7, 2, 1, 0}, {4, 16, 4, 0, 0}, {5, 31, 5, 3, 2}, {8, 32, 1, 0, 0},
                {9, 33, 3, 0, 1}, {17, 100, 7, 5, 0}, {32, 2048, 1, 0, 0}, {37, 777, 8, 11, 3},
                {64, 4113, 6, 0, 0}, {6, 7168, 9, 32, 0}});
}

// The AMX-BF16 kernel: whole 16-row tiles (one, two, an odd count, more than the 128 rows that
// share a packed B chunk), rows past them, K of one step, of several 512-element chunks and not
// a multiple of 32 (the AVX-512-BF16 kernel's), 1..33 tokens (B tiles of up to 16 tokens).
TEST(GemvAmx, MatchesFp64Reference) {
    const ft::cpu::GemvFn gemv = ft::cpu::gemv_kernel_amx();
    if (!gemv) GTEST_SKIP() << "no AMX-BF16 on this CPU (or the OS does not grant the tile state)";
    check_gemv(gemv, "amx", 4321,
               {{16, 32, 2, 0, 0},    {32, 64, 3, 0, 1},    {48, 544, 4, 2, 0},  {17, 2048, 5, 0, 0},
                {131, 1056, 8, 32, 3}, {272, 768, 16, 0, 0}, {40, 7168, 17, 0, 0}, {64, 2880, 33, 8, 0},
                {16, 96, 1, 0, 0},    {33, 100, 6, 0, 0},   {12, 512, 9, 0, 0},  {160, 4096, 12, 0, 2}});
}

INSTANTIATE_TEST_SUITE_P(AllTiers, GemvTier, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16),
                         [](const auto &info) { return std::string(ft::cpu::isa_name(info.param)); });

TEST(Isa, NamesAndCap) {
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16}) {
        Isa back;
        ASSERT_TRUE(ft::cpu::isa_from_name(ft::cpu::isa_name(i), &back));
        EXPECT_EQ(back, i);
    }
    EXPECT_EQ(ft::cpu::capped_isa("scalar"), Isa::scalar);
    EXPECT_EQ(ft::cpu::capped_isa("avx512bf16"), ft::cpu::cpu_best_isa());  // caps only downward
    EXPECT_EQ(ft::cpu::capped_isa("no-such-tier"), ft::cpu::cpu_best_isa());  // ignored with a warning
    EXPECT_EQ(ft::cpu::capped_isa(""), ft::cpu::cpu_best_isa());
    EXPECT_FALSE(ft::cpu::physical_core_cpus().empty());
}

// ---- thread pool -----------------------------------------------------------------------------

TEST(ThreadPool, RunsEveryWorkerAndRethrows) {
    for (bool pin : {false, true}) {
        ft::cpu::ThreadPool pool(3, pin);
        ASSERT_EQ(pool.size(), 3);
        for (int rep = 0; rep < 200; ++rep) {
            std::atomic<int> mask{0};
            pool.run([&](int w, int n) {
                EXPECT_EQ(n, 3);
                mask.fetch_or(1 << w);
            });
            ASSERT_EQ(mask.load(), 7);
        }
        EXPECT_THROW(pool.run([](int w, int) {
            if (w == 1) throw std::runtime_error("boom");
        }),
                     std::runtime_error);
        std::atomic<int> count{0};
        pool.run([&](int, int) { count++; });  // still usable after an exception
        EXPECT_EQ(count.load(), 3);
    }
    ft::cpu::ThreadPool dflt(0, false);
    EXPECT_EQ(dflt.size(), int(ft::cpu::physical_core_cpus().size()));
}

// warm() from another thread while jobs run, and jobs after a warm period ended (the workers
// slept again): every job still runs on every worker exactly once.
TEST(ThreadPool, WarmKeepsJobsExact) {
    ft::cpu::ThreadPool pool(3, false, 0);
    std::atomic<bool> stop{false};
    std::thread warmer([&] {
        while (!stop.load()) {
            pool.warm(std::chrono::microseconds(50));
            std::this_thread::sleep_for(std::chrono::microseconds(30));
        }
    });
    for (int rep = 0; rep < 2000; ++rep) {
        std::atomic<int> count{0}, mask{0};
        pool.run([&](int w, int) {
            count++;
            mask.fetch_or(1 << w);
        });
        ASSERT_EQ(count.load(), 3);
        ASSERT_EQ(mask.load(), 7);
    }
    stop = true;
    warmer.join();
    pool.warm(std::chrono::microseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the period ends; workers sleep
    std::atomic<int> count{0};
    pool.run([&](int, int) { count++; });
    EXPECT_EQ(count.load(), 3);
}

// ---- MoE executor ----------------------------------------------------------------------------

// A random MoE layer: E experts in padded bank rows, plus a shared expert and its gate.
struct Layer {
    int32_t H, I, E, Is;
    size_t gu_row, down_row;  // bytes, padded beyond the expert to check the row stride is used
    std::vector<uint8_t> gate_up, down;
    std::vector<uint16_t> sh_gate, sh_up, sh_down, sh_gate_proj;

    Layer(std::mt19937 &rng, int32_t h, int32_t i, int32_t e, int32_t is) : H(h), I(i), E(e), Is(is) {
        gu_row = size_t(2) * I * H * 2 + 64;
        down_row = size_t(H) * I * 2 + 128;
        gate_up.resize(gu_row * E);
        down.resize(down_row * E);
        // Scales keep the gate/up dot products around 1, where every activation is non-linear.
        const float s_in = std::sqrt(3.0f / H), s_down = std::sqrt(3.0f / I);
        for (int32_t x = 0; x < E; ++x) {
            auto gu = random_bf16(rng, size_t(2) * I * H, s_in);
            auto d = random_bf16(rng, size_t(H) * I, s_down);
            std::memcpy(gate_up.data() + x * gu_row, gu.data(), gu.size() * 2);
            std::memcpy(down.data() + x * down_row, d.data(), d.size() * 2);
        }
        if (Is > 0) {
            sh_gate = random_bf16(rng, size_t(Is) * H, s_in);
            sh_up = random_bf16(rng, size_t(Is) * H, s_in);
            sh_down = random_bf16(rng, size_t(H) * Is, std::sqrt(3.0f / Is));
            sh_gate_proj = random_bf16(rng, H, s_in);
        }
    }
    ft::cpu::ExpertSource source() const {
        ft::cpu::ExpertSource s;
        s.format = ft::Format::bf16;
        s.num_experts = E;
        s.num_banks = 2;
        s.base[0] = gate_up.data();
        s.row_bytes[0] = gu_row;
        s.base[1] = down.data();
        s.row_bytes[1] = down_row;
        return s;
    }
    ft::test::ExpertRef expert(int32_t e) const {
        auto gu = reinterpret_cast<const uint16_t *>(gate_up.data() + e * gu_row);
        return {gu, gu + size_t(I) * H, reinterpret_cast<const uint16_t *>(down.data() + e * down_row), I};
    }
    ft::cpu::SharedExpertView shared(bool gated) const {
        return {sh_gate.data(), sh_up.data(), sh_down.data(), Is, gated ? sh_gate_proj.data() : nullptr};
    }
};

struct Batch {
    int32_t T, K;
    std::vector<uint16_t> x;
    std::vector<int32_t> ids;
    std::vector<float> w;
};

// Random routing with ids outside [0, E) mixed in, a duplicate id in token 0 and, from two tokens
// on, a last token whose routes are all skipped.
Batch random_batch(std::mt19937 &rng, const Layer &L, int32_t T, int32_t K) {
    Batch b{T, K, random_bf16(rng, size_t(T) * L.H, 1.0f), std::vector<int32_t>(T * K), std::vector<float>(T * K)};
    std::uniform_int_distribution<int32_t> id(-2, L.E + 1);
    std::uniform_real_distribution<float> wd(0.05f, 1.0f);
    for (int32_t r = 0; r < T * K; ++r) {
        b.ids[r] = id(rng);
        b.w[r] = wd(rng);
    }
    if (K >= 2) b.ids[1] = b.ids[0] = std::abs(b.ids[0]) % L.E;
    if (T >= 2)
        for (int32_t k = 0; k < K; ++k) b.ids[(T - 1) * K + k] = (k % 2) ? -1 : L.E + k;
    return b;
}

std::vector<uint16_t> run_executor(ft::cpu::MoeExecutor &ex, const Layer &L, const Batch &b,
                                   const ft::cpu::SharedExpertView *shared, ft::cpu::MoeStats *stats = nullptr) {
    std::vector<uint16_t> y(size_t(b.T) * L.H, kNaNBf16);  // poisoned: stale values cannot pass
    auto src = L.source();
    auto st = ex.run(src, shared, b.T, b.x.data(), b.ids.data(), b.w.data(), y.data());
    if (stats) *stats = st;
    return y;
}

std::vector<double> reference(const Layer &L, const Batch &b, const ft::cpu::ActivationSpec &act, bool shared,
                              bool gated) {
    ft::test::ActivationRef a{act.kind, act.alpha, act.limit};
    ft::test::ExpertRef sh{L.sh_gate.data(), L.sh_up.data(), L.sh_down.data(), L.Is};
    return ft::test::moe_reference([&](int32_t e) { return L.expert(e); }, L.E, a, L.H, b.T, b.K, b.x.data(),
                                      b.ids.data(), b.w.data(), shared ? &sh : nullptr,
                                      shared && gated ? L.sh_gate_proj.data() : nullptr);
}

const ft::cpu::ActivationSpec kActivations[] = {
    {FT_ACT_SILU, 1.702f, 7.0f},
    {FT_ACT_GELU, 1.702f, 7.0f},
    {FT_ACT_GELU_TANH, 1.702f, 7.0f},
    {FT_ACT_SWIGLU_CLAMP, 1.702f, 0.75f},  // a small limit so clamping really happens
    {FT_ACT_SWIGLU_CLAMP, 1.702f, std::numeric_limits<float>::infinity()},
};

// All activations, bs 1..16, K up to 8, on sizes that are not multiples of 16 (H) or 32 (I).
TEST(MoeExecutor, MatchesReferenceEveryActivation) {
    std::mt19937 rng(42);
    Layer L(rng, 200, 72, 10, 40);
    ft::cpu::ThreadPool pool(2, false);
    for (const auto &act : kActivations)
        for (int32_t T : {1, 2, 3, 5, 8, 16})
            for (int32_t K : {1, 3, 8}) {
                ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, K, 16, act, L.Is, ft::cpu::cpu_best_isa());
                Batch b = random_batch(rng, L, T, K);
                auto y = run_executor(ex, L, b, nullptr);
                const double err = ft::test::relative_error_bf16(y, reference(L, b, act, false, false));
                EXPECT_LT(err, 1e-2) << "act " << act.kind << " limit " << act.limit << " T=" << T << " K=" << K;
                if (T >= 2) {
                    for (int32_t h = 0; h < L.H; ++h) {
                        ASSERT_EQ(y[size_t(T - 1) * L.H + h], 0) << "skipped token";
                    }
                }
            }
}

TEST(MoeExecutor, SharedExpertWithAndWithoutGate) {
    std::mt19937 rng(7);
    Layer L(rng, 136, 40, 6, 56);
    ft::cpu::ThreadPool pool(2, false);
    for (const auto &act : kActivations)
        for (bool gated : {false, true})
            for (int32_t T : {1, 4, 9}) {
                ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, 4, 9, act, L.Is, ft::cpu::cpu_best_isa());
                Batch b = random_batch(rng, L, T, 4);
                auto sh = L.shared(gated);
                auto y = run_executor(ex, L, b, &sh);
                EXPECT_LT(ft::test::relative_error_bf16(y, reference(L, b, act, true, gated)), 1e-2)
                    << "act " << act.kind << " gated " << gated << " T=" << T;
            }
}

TEST(MoeExecutor, EveryTierMatchesReference) {
    std::mt19937 rng(99);
    Layer L(rng, 264, 104, 8, 48);
    ft::cpu::ThreadPool pool(2, false);
    Batch b = random_batch(rng, L, 6, 8);
    auto sh = L.shared(true);
    const ft::cpu::ActivationSpec act{FT_ACT_SILU, 1.702f, 7.0f};
    auto ref = reference(L, b, act, true, true);
    for (Isa isa : supported_tiers()) {
        ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, 8, 6, act, L.Is, isa);
        EXPECT_LT(ft::test::relative_error_bf16(run_executor(ex, L, b, &sh), ref), 1e-2) << ft::cpu::isa_name(isa);
    }
}

TEST(MoeExecutor, IdenticalAcrossPoolSizes) {
    std::mt19937 rng(5);
    Layer L(rng, 328, 96, 12, 64);
    ft::cpu::ThreadPool p1(1, false), p2(2, false), p3(3, true);
    for (const auto &act : kActivations)
        for (Isa isa : supported_tiers()) {
            Batch b = random_batch(rng, L, 11, 8);
            auto sh = L.shared(true);
            std::vector<uint16_t> first;
            for (ft::cpu::ThreadPool *pool : {&p1, &p2, &p3}) {
                ft::cpu::MoeExecutor ex(*pool, ft::Format::bf16, L.H, L.I, 8, 16, act, L.Is, isa);
                auto y = run_executor(ex, L, b, &sh);
                if (first.empty()) {
                    first = y;
                } else {
                    EXPECT_EQ(y, first) << "pool of " << pool->size() << ", " << ft::cpu::isa_name(isa);
                }
            }
        }
}

TEST(MoeExecutor, OnednnPathMatchesReference) {
    std::mt19937 rng(11);
    Layer L(rng, 200, 72, 4, 40);
    ft::cpu::ThreadPool pool(2, false);
    for (const auto &act : kActivations)
        for (int32_t T : {3, 16}) {
            ft::cpu::MoeTuning tuning;
            tuning.onednn_min_tokens = 2;  // experts with >= 2 routes, and the shared one, use oneDNN
            ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, 4, 16, act, L.Is, ft::cpu::cpu_best_isa(), tuning);
            // Without a oneDNN bf16 matmul (below AVX-512) the path is never chosen and the SIMD
            // kernels must give the same result.
            EXPECT_EQ(ex.onednn_min_tokens(), ft::cpu::onednn_bf16_available() ? 2 : 0);
            Batch b = random_batch(rng, L, T, 4);
            auto sh = L.shared(true);
            auto y = run_executor(ex, L, b, &sh);
            EXPECT_LT(ft::test::relative_error_bf16(y, reference(L, b, act, true, true)), 1e-2)
                << "act " << act.kind << " T=" << T;
        }
}

// The executor groups routes by expert (one group, one pass over its weights); these are its counters.
TEST(MoeExecutor, StatsCountEachDistinctExpertOnce) {
    std::mt19937 rng(3);
    Layer L(rng, 64, 32, 16, 0);
    ft::cpu::ThreadPool pool(2, false);
    ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, 8, 16, {}, 0, ft::cpu::cpu_best_isa());
    for (int rep = 0; rep < 5; ++rep) {
        Batch b = random_batch(rng, L, 16, 8);
        std::set<int32_t> distinct;
        uint64_t valid = 0;
        for (int32_t e : b.ids)
            if (e >= 0 && e < L.E) distinct.insert(e), ++valid;
        ft::cpu::MoeStats st;
        run_executor(ex, L, b, nullptr, &st);
        EXPECT_EQ(st.experts_read, distinct.size());
        EXPECT_EQ(st.bytes_read, distinct.size() * size_t(3) * L.H * L.I * 2);
        EXPECT_EQ(st.routes_computed, valid);
        EXPECT_EQ(st.routes_skipped, b.ids.size() - valid);
    }
}

// A call none of whose routes is the executor's (a hybrid step whose misses were all fetched):
// zeros out (written by the calling thread).
TEST(MoeExecutor, NoRoutesWritesZeros) {
    std::mt19937 rng(4);
    Layer L(rng, 64, 32, 8, 0);
    ft::cpu::ThreadPool pool(2, false);
    ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, 4, 8, {}, 0, ft::cpu::cpu_best_isa());
    Batch b = random_batch(rng, L, 5, 4);
    std::fill(b.ids.begin(), b.ids.end(), -1);
    ft::cpu::MoeStats st;
    const auto y = run_executor(ex, L, b, nullptr, &st);
    EXPECT_EQ(y, std::vector<uint16_t>(y.size(), 0));
    EXPECT_EQ(st.experts_read, 0u);
    EXPECT_EQ(st.routes_skipped, uint64_t(5 * 4));
}

TEST(MoeExecutor, RejectsBadArguments) {
    ft::cpu::ThreadPool pool(1, false);
    auto expect_status = [](auto fn, ft_status st) {
        try {
            fn();
            ADD_FAILURE() << "no error";
        } catch (const ft::Error &e) {
            EXPECT_EQ(e.status(), st) << e.what();
        }
    };
    const Isa isa = ft::cpu::cpu_best_isa();
    expect_status([&] { ft::cpu::MoeExecutor(pool, ft::Format::bf16, 0, 8, 1, 1, {}, 0, isa); }, FT_ERR_INVALID_ARGUMENT);
    expect_status([&] { ft::cpu::MoeExecutor(pool, ft::Format::bf16, 8, -1, 1, 1, {}, 0, isa); }, FT_ERR_INVALID_ARGUMENT);
    expect_status([&] { ft::cpu::MoeExecutor(pool, ft::Format::bf16, 8, 8, 0, 1, {}, 0, isa); }, FT_ERR_INVALID_ARGUMENT);
    expect_status([&] { ft::cpu::MoeExecutor(pool, ft::Format::bf16, 8, 8, 1, 0, {}, 0, isa); }, FT_ERR_INVALID_ARGUMENT);
    expect_status([&] { ft::cpu::MoeExecutor(pool, ft::Format::bf16, 8, 8, 1, 1, {99, 1.f, 1.f}, 0, isa); }, FT_ERR_INVALID_ARGUMENT);
    if (isa != Isa::avx512bf16)
        expect_status([&] { ft::cpu::MoeExecutor(pool, ft::Format::bf16, 8, 8, 1, 1, {}, 0, Isa::avx512bf16); }, FT_ERR_UNSUPPORTED);

    std::mt19937 rng(1);
    Layer L(rng, 32, 16, 2, 0);
    ft::cpu::MoeExecutor ex(pool, ft::Format::bf16, L.H, L.I, 2, 4, {}, 0, isa);
    Batch b = random_batch(rng, L, 4, 2);
    std::vector<uint16_t> x(5 * L.H), y(5 * L.H);
    std::vector<int32_t> ids(10, 0);
    std::vector<float> w(10, 1.f);
    auto src = L.source();
    expect_status([&] { ex.run(src, nullptr, 5, x.data(), ids.data(), w.data(), y.data()); }, FT_ERR_INVALID_ARGUMENT);
    expect_status([&] { ex.run(src, nullptr, -1, x.data(), ids.data(), w.data(), y.data()); }, FT_ERR_INVALID_ARGUMENT);
    auto small = src;
    small.row_bytes[1] = 8;
    expect_status([&] { ex.run(small, nullptr, 1, x.data(), ids.data(), w.data(), y.data()); }, FT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(ex.run(src, nullptr, 0, x.data(), ids.data(), w.data(), y.data()).routes_computed, 0u);
}

TEST(Onednn, MatmulMatchesReference) {
    if (!ft::cpu::onednn_bf16_available())
        GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (below AVX-512 or ONEDNN_MAX_CPU_ISA)";
    std::mt19937 rng(21);
    for (auto [m, n, k] : {std::tuple{1, 33, 70}, std::tuple{5, 64, 128}, std::tuple{17, 19, 300}}) {
        const int64_t ldw = k + 3, ldd = n + 2;
        auto src = random_bf16(rng, size_t(m) * k, 1.f);
        auto w = random_bf16(rng, size_t(n) * ldw, 1.f);
        std::vector<float> dst(size_t(m) * ldd, std::numeric_limits<float>::quiet_NaN());
        ft::cpu::onednn_matmul_bf16(m, n, k, src.data(), k, w.data(), ldw, dst.data(), ldd);
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                double ref = 0;
                for (int c = 0; c < k; ++c) ref += bf16_to_f64(src[i * k + c]) * bf16_to_f64(w[j * ldw + c]);
                EXPECT_NEAR(dst[i * ldd + j], ref, 1e-4 * std::sqrt(double(k)) * 3) << m << "x" << n << "x" << k;
            }
    }
    EXPECT_GE(ft::cpu::onednn_threads(), 1);
}

TEST(Onednn, UnavailableMatmulIsAnErrorNotACrash) {
    if (ft::cpu::onednn_bf16_available()) GTEST_SKIP() << "oneDNN runs bf16 matmuls on this CPU";
    std::vector<uint16_t> a(64, 0x3f80), w(64, 0x3f80);
    std::vector<float> d(1);
    try {
        ft::cpu::onednn_matmul_bf16(1, 1, 64, a.data(), 64, w.data(), 64, d.data(), 1);
        ADD_FAILURE() << "no error";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_UNSUPPORTED) << e.what();
    }
}

}  // namespace
