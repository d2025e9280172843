// The hybrid split controller (ft/hybrid_controller.hpp) on simulated steps: each side's time
// follows a linear model, and the CPU's result reaches the stream a fixed handoff time after its
// task ends, as on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ft/hybrid.hpp"
#include "ft/hybrid_controller.hpp"
#include "ft/slot_sim.hpp"
#include "ft/trace.hpp"

namespace {

struct Machine {
    double gpu_per_expert, cpu_per_expert, handoff;  // seconds
    double wait = 1e-6;  // the stream's wait for a result already there
    // What one step of M misses fetching F gives the controller, and the step's time.
    struct Step {
        double t_gpu, t_span, t_task, time;
    };
    Step step(int64_t M, int64_t F) const {
        Step s;
        s.t_gpu = double(F) * gpu_per_expert;
        s.t_task = double(M - F) * cpu_per_expert;
        const double cpu_latency = s.t_task + handoff;
        s.t_span = std::max(s.t_gpu, cpu_latency) + wait;  // the wait follows the GPU share
        s.time = s.t_span;
        return s;
    }
    double best_time(int64_t M) const {
        double best = 1e30;
        for (int64_t F = 0; F <= M; ++F) best = std::min(best, step(M, F).time);
        return best;
    }
};

// Steps of M misses (M cycling through `ms`) from the controller's current split. Over the last
// `measured` steps: the mean step time against the mean of the best split, the steps that left the
// CPU idle and the experts fetched; and the F of the last step.
struct RunResult {
    double ratio_to_best;
    int cpu_idle_steps;
    int64_t fetched, last_fetch;
};
RunResult run_steps(ft::HybridController &c, const Machine &m, const std::vector<int64_t> &ms, int steps, int measured) {
    double time = 0.0, best = 0.0;
    RunResult r{0.0, 0, 0, 0};
    for (int i = 0; i < steps; ++i) {
        const int64_t M = ms[size_t(i) % ms.size()];
        const int64_t F = ft::hybrid_fetch_count(M, ft::fraction_to_q16(c.sent()));
        const Machine::Step s = m.step(M, F);
        c.observe(s.t_gpu, s.t_span, s.t_task, uint64_t(M - F), M);
        r.last_fetch = F;
        if (i >= steps - measured) {
            time += s.time;
            best += m.best_time(M);
            r.cpu_idle_steps += F == M;
            r.fetched += F;
        }
    }
    r.ratio_to_best = time / best;
    return r;
}

// Runs `steps` steps of M misses; returns the F of the last one.
int64_t converge(ft::HybridController &c, const Machine &m, int64_t M, int steps) {
    return run_steps(c, m, {M}, steps, 1).last_fetch;
}

TEST(HybridController, CpuLatencyIsTheStreamsSpanWhereItWaited) {
    ft::HybridController c(0.5, true);
    // A step whose CPU result was there before the GPU share ended (its wait took 2 us): with no
    // handoff learnt yet the latency is the task's, at most the span.
    EXPECT_NEAR(c.cpu_latency(200e-6, 202e-6, 100e-6), 100e-6, 1e-12);
    // Waited: the span (task 100 us + 40 us of handoff) is the latency.
    EXPECT_NEAR(c.cpu_latency(80e-6, 140e-6, 100e-6), 140e-6, 1e-12);
    // Not waited: task plus the handoff learnt above, at most the span.
    EXPECT_NEAR(c.cpu_latency(200e-6, 202e-6, 100e-6), 140e-6, 1e-12);
    EXPECT_NEAR(c.cpu_latency(120e-6, 122e-6, 100e-6), 122e-6, 1e-12);
    // Later waited steps move the handoff estimate by the smoothing gain, not at once.
    EXPECT_NEAR(c.cpu_latency(80e-6, 200e-6, 100e-6), 200e-6, 1e-12);
    const double later = c.cpu_latency(500e-6, 502e-6, 100e-6) - 100e-6;
    EXPECT_GT(later, 40e-6);
    EXPECT_LT(later, 100e-6);
}

// Without a span (a wait mechanism with a cost of its own) the latency is the task.
TEST(HybridController, NoSpanMeansTheTask) {
    ft::HybridController c(0.5, true);
    EXPECT_NEAR(c.cpu_latency(80e-6, 142e-6, 100e-6), 142e-6, 1e-12);  // learns 42 us of handoff
    EXPECT_DOUBLE_EQ(c.cpu_latency(80e-6, -1.0, 100e-6), 100e-6);
    EXPECT_DOUBLE_EQ(c.cpu_latency(200e-6, -1.0, 100e-6), 100e-6);
}

// 4 misses, the GPU 100 us per expert, the CPU 60 us per expert plus 80 us of handoff: fetching 2
// takes max(200, 120 + 80) = 200 us, fetching 1 takes 260 us. Balanced on the task alone (1
// fetched: 100 against 180 us looks best) the split would fetch 1.
TEST(HybridController, BalancesTheCpuLatencyNotItsTask) {
    const Machine m{100e-6, 60e-6, 80e-6};
    for (const double start : {0.05, 0.5, 0.95}) {
        ft::HybridController c(start, true);
        const int64_t F = converge(c, m, 4, 400);
        EXPECT_EQ(F, 2) << "from " << start;
        EXPECT_DOUBLE_EQ(m.step(4, F).time, m.best_time(4));
    }
}

// With no handoff cost the controller finds the best integer split at every miss count.
TEST(HybridController, FindsTheBestSplitForEachMissCount) {
    const Machine m{100e-6, 55e-6, 0.0};
    for (int64_t M = 2; M <= 8; ++M) {
        ft::HybridController c(0.5, true);
        const int64_t F = converge(c, m, M, 400);
        EXPECT_LE(m.step(M, F).time, m.best_time(M) * 1.0001) << "M " << M << " F " << F;
    }
}

// A CPU ten times slower per expert than the fetch (a contended or small CPU): every miss goes to
// the GPU, but for rare probe steps that give the CPU one expert, so it stays measured.
TEST(HybridController, SlowCpuLeavesEveryMissToTheGpu) {
    const Machine m{100e-6, 1000e-6, 80e-6};
    for (const double start : {0.05, 0.5, 0.95}) {
        ft::HybridController c(start, true);
        const RunResult r = run_steps(c, m, {3}, 3000, 2000);
        EXPECT_LT(r.ratio_to_best, 1.02) << "from " << start;
        EXPECT_GE(r.cpu_idle_steps, 1980) << "from " << start;
        EXPECT_LT(r.cpu_idle_steps, 2000) << "from " << start << ": the CPU is never probed";
    }
}

// A slow bus (or a busy GPU): every miss goes to the CPU, with rare probe fetches.
TEST(HybridController, SlowGpuLeavesEveryMissToTheCpu) {
    const Machine m{2000e-6, 50e-6, 20e-6};
    ft::HybridController c(0.5, true);
    const int64_t fetched = run_steps(c, m, {4}, 3000, 2000).fetched;
    EXPECT_GE(fetched, 1) << "the GPU is never probed";
    EXPECT_LE(fetched, 20);
}

// The distinct misses of each call of a Qwen3-shaped Zipf decode trace (24 layers, 128 experts,
// top-8, s = 1) under the LRU slot cache of a quarter of the experts (the admission's simulation).
std::vector<int64_t> trace_miss_counts() {
    ft::ZipfTraceSpec spec;
    spec.layers = 24, spec.experts = 128, spec.top_k = 8, spec.steps = 200, spec.seed = 7;
    const ft::CacheSim lru = ft::simulate_slot_cache(ft::make_zipf_trace(spec), 24 * 32, {});
    return {lru.call_misses.begin(), lru.call_misses.end()};
}

// Miss counts that vary from step to step (cycling through 1..5, and those of a decode trace): the
// mean step time stays near the best split's on each machine.
TEST(HybridController, VaryingMissCounts) {
    const std::vector<int64_t> cycle{3, 1, 4, 2, 5, 3, 2, 1, 4, 3}, trace = trace_miss_counts();
    // The CPU side 10x, 2.5x and 0.6x the GPU's time per expert (plus its handoff), and the GPU
    // side 40x the CPU's.
    const Machine machines[] = {{100e-6, 1000e-6, 80e-6}, {100e-6, 250e-6, 30e-6}, {100e-6, 60e-6, 30e-6},
                                {2000e-6, 50e-6, 20e-6}};
    for (const std::vector<int64_t> *ms : {&cycle, &trace})
        for (const Machine &m : machines) {
            ft::HybridController c(0.5, true);
            EXPECT_LT(run_steps(c, m, *ms, 4800, 3000).ratio_to_best, 1.07)
                << (ms == &cycle ? "cycle" : "trace") << ", CPU " << m.cpu_per_expert;
        }
}

// A CPU that was slow and then is not (the contention ended): a probe notices, and the split
// returns to the balanced one within the longest probe wait.
TEST(HybridController, ReturnsToTheCpuWhenItSpeedsUp) {
    const Machine slow{100e-6, 1000e-6, 80e-6}, fast{100e-6, 60e-6, 80e-6};
    ft::HybridController c(0.5, true);
    converge(c, slow, 4, 1000);
    EXPECT_EQ(ft::hybrid_fetch_count(4, ft::fraction_to_q16(c.sent())), 4);
    // At most 512 one-sided steps to the next probe, then the usual convergence.
    const RunResult r = run_steps(c, fast, {4}, 1200, 200);
    EXPECT_EQ(r.cpu_idle_steps, 0);
    EXPECT_LT(r.ratio_to_best, 1.01);
}

TEST(HybridController, FixedFractionDoesNotMove) {
    const Machine m{100e-6, 60e-6, 80e-6};
    ft::HybridController c(0.3, false);
    converge(c, m, 4, 50);
    EXPECT_DOUBLE_EQ(c.sent(), 0.3);
}

}  // namespace
