// The hybrid split controller (ft/hybrid_controller.hpp).
#include "ft/hybrid_controller.hpp"

#include <algorithm>
#include <cmath>

#include "ft/hybrid.hpp"

namespace ft {

// Moves f towards the split where both sides finish together, from the last eager step's
// measured times: of the step's M distinct misses the GPU fetched and computed F in t_gpu
// (gather + kernels, CUDA events) and the CPU computed M - F in t_cpu (its latency from the
// stream's signal to its result, cpu_latency()), so per unit of misses the rates are
// (F / M) / t_gpu and ((M - F) / M) / t_cpu and the balanced share is their ratio
// f* = r_gpu / (r_gpu + r_cpu). The shares are the realised
// ones, not f itself: F is an integer, and near a step of F(f) the two differ by up to 1 / M
// (at M = 4 a configured 0.4 fetches 1 or 2 experts, a realised 0.25 or 0.5), and an estimate
// from f itself settles on the wrong side of the step. Smoothed and bounded so one noisy step cannot
// swing it; a side that had nothing to do is probed instead of measured.
void HybridController::observe(double t_gpu, double t_span, double t_task, uint64_t cpu_experts, int64_t missing) {
    if (!adaptive_) return;
    const double t_cpu = cpu_latency(t_gpu, t_span, t_task);
    if (missing <= 0) return;  // no misses: nothing to split
    if (cpu_experts == 0) {
        // f fetched every miss: the CPU's rate is unknown. Step f down so the CPU gets work
        // again and is measured; a step without misses costs nothing.
        fraction_ = std::max(kMinFraction, fraction_ - kProbeStep);
        sent_ = fraction_;
        return;
    }
    const double cpu_share = std::min(1.0, double(cpu_experts) / double(missing));
    if (cpu_share >= 1.0) {
        // Nothing fetched (F = 0): the GPU's rate is unknown; probe upwards the same way.
        fraction_ = std::min(kMaxFraction, fraction_ + kProbeStep);
        sent_ = fraction_;
        return;
    }
    if (!(t_gpu > 0.0) || !(t_cpu > 0.0)) return;
    const double gpu_rate = (1.0 - cpu_share) / t_gpu, cpu_rate = cpu_share / t_cpu;
    const double target = gpu_rate / (gpu_rate + cpu_rate);
    fraction_ = std::clamp(fraction_ + kAdaptGain * (target - fraction_), kMinFraction, kMaxFraction);
    // Per-expert times of each side, smoothed the same way, for choosing the integer split.
    const int64_t fetched = missing - int64_t(cpu_experts);
    const double g = t_gpu / double(fetched), c = t_cpu / double(cpu_experts);
    gpu_expert_s_ = gpu_expert_s_ > 0.0 ? gpu_expert_s_ + kAdaptGain * (g - gpu_expert_s_) : g;
    cpu_expert_s_ = cpu_expert_s_ > 0.0 ? cpu_expert_s_ + kAdaptGain * (c - cpu_expert_s_) : c;
    sent_ = snap(fraction_, missing);
}

// Where the wait ended after the GPU share, the CPU was the later side and t_span is its latency;
// what it took beyond the task (the coordinator and workers noticing the signal, the stream
// noticing the done flag) is the handoff sample. Otherwise the latency hid behind the GPU share:
// at most t_span, estimated as the task plus the smoothed handoff. t_span < 0 (not measured):
// the task.
double HybridController::cpu_latency(double t_gpu, double t_span, double t_task) {
    if (t_span < 0.0) return t_task;
    if (!(t_span > t_gpu + kWaitVisibleSeconds)) return std::min(t_span, t_task + handoff_s_);
    const double h = std::max(0.0, t_span - t_task);
    handoff_s_ = handoff_s_ > 0.0 ? handoff_s_ + kAdaptGain * (h - handoff_s_) : h;
    return t_span;
}

// The fraction sent to the device. The admission turns f into F = the integer neighbour of
// f * M (docs/formulas.md, "Hybrid split"), so near a step of F(f) the continuous estimate flips between two splits
// that the linear model rates almost equal -- and the one with fewer fetches is then usually
// faster in fact: the CPU reads DRAM without the gather's competition for part of the step,
// and evicts nothing. So between the two neighbours of fraction * M (each side keeping at
// least one expert, so both stay measured) the larger F is taken only when its predicted
// time, max(F * gpu, (M - F) * cpu) per expert, is kSnapMargin better; then f is sent as the
// middle of that F's interval at this M (fraction_for_fetch). Other M map near the estimate.
double HybridController::snap(double f, int64_t M) const {
    if (M < 2 || !(gpu_expert_s_ > 0.0) || !(cpu_expert_s_ > 0.0)) return f;
    const int64_t lo = std::clamp<int64_t>(int64_t(std::floor(f * double(M))), 1, M - 1);
    const int64_t hi = std::min<int64_t>(lo + 1, M - 1);
    auto time = [&](int64_t F) { return std::max(double(F) * gpu_expert_s_, double(M - F) * cpu_expert_s_); };
    const int64_t F = hi != lo && time(hi) < (1.0 - kSnapMargin) * time(lo) ? hi : lo;
    return fraction_for_fetch(F, M);
}

}  // namespace ft
