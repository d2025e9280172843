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
// swing it. A step that left one side idle goes to one_sided().
void HybridController::observe(double t_gpu, double t_span, double t_task, uint64_t cpu_experts, int64_t missing) {
    if (!adaptive_) return;
    const double t_cpu = cpu_latency(t_gpu, t_span, t_task);
    if (missing <= 0) return;  // no misses: nothing to split
    const int64_t on_cpu = std::min<int64_t>(int64_t(cpu_experts), missing), fetched = missing - on_cpu;
    if (on_cpu == 0 || fetched == 0) {
        one_sided(t_gpu, t_cpu, on_cpu, missing);
        return;
    }
    // Two-sided. The answer to a probe replaces the probed side's stale time and keeps the grown
    // wait; any other such step resets the wait.
    const Side probed = probed_;
    probed_ = Side::none;
    if (probed == Side::none) probe_wait_ = kProbeFirst;
    idle_steps_ = 0;
    if (!(t_gpu > 0.0) || !(t_cpu > 0.0)) return;
    const double cpu_share = double(on_cpu) / double(missing);
    const double gpu_rate = (1.0 - cpu_share) / t_gpu, cpu_rate = cpu_share / t_cpu;
    approach(gpu_rate / (gpu_rate + cpu_rate));
    // Per-expert times of each side, smoothed the same way, for choosing the integer split.
    smooth(gpu_expert_s_, t_gpu / double(fetched), probed == Side::gpu ? 1.0 : kAdaptGain);
    smooth(cpu_expert_s_, t_cpu / double(on_cpu), probed == Side::cpu ? 1.0 : kAdaptGain);
    sent_ = snap(fraction_, missing);
}

// A step where one side had no misses: the busy side's per-expert time is updated, f moves
// towards the balance of the two per-expert times, and the split stays where snap() puts it
// (possibly all on one side), except for a probe step that gives the idle side one expert after
// probe_wait_ one-sided steps in a row. The wait doubles with every probe, up to kProbeLast. Before
// both sides have a time, f steps towards the idle side instead.
void HybridController::one_sided(double t_gpu, double t_cpu, int64_t on_cpu, int64_t missing) {
    const bool cpu_idle = on_cpu == 0;
    if (cpu_idle && t_gpu > 0.0) smooth(gpu_expert_s_, t_gpu / double(missing), kAdaptGain);
    if (!cpu_idle && t_cpu > 0.0) smooth(cpu_expert_s_, t_cpu / double(on_cpu), kAdaptGain);
    if (!(gpu_expert_s_ > 0.0) || !(cpu_expert_s_ > 0.0)) {
        fraction_ = cpu_idle ? std::max(kMinFraction, fraction_ - kProbeStep) : std::min(kMaxFraction, fraction_ + kProbeStep);
        sent_ = fraction_;
        return;
    }
    approach(cpu_expert_s_ / (gpu_expert_s_ + cpu_expert_s_));
    if (++idle_steps_ < probe_wait_ || missing < 2) {
        sent_ = snap(fraction_, missing);
        return;
    }
    idle_steps_ = 0;
    probe_wait_ = std::min(kProbeLast, 2 * probe_wait_);
    probed_ = cpu_idle ? Side::cpu : Side::gpu;
    sent_ = fraction_for_fetch(cpu_idle ? missing - 1 : 1, missing);
}

void HybridController::smooth(double &estimate, double sample, double gain) {
    estimate = estimate > 0.0 ? estimate + gain * (sample - estimate) : sample;
}

// f moves by the smoothing gain towards a balanced share, within [kMinFraction, kMaxFraction].
void HybridController::approach(double target) {
    fraction_ = std::clamp(fraction_ + kAdaptGain * (target - fraction_), kMinFraction, kMaxFraction);
}

// Where the wait ended after the GPU share, the CPU was the later side and t_span is its latency;
// what it took beyond the task (the coordinator and workers noticing the signal, the stream
// noticing the done flag) is the handoff sample. Otherwise the latency hid behind the GPU share:
// at most t_span, estimated as the task plus the smoothed handoff. t_span < 0 (not measured):
// the task.
double HybridController::cpu_latency(double t_gpu, double t_span, double t_task) {
    if (t_span < 0.0) return t_task;
    if (!(t_span > t_gpu + kWaitVisibleSeconds)) return std::min(t_span, t_task + handoff_s_);
    smooth(handoff_s_, std::max(0.0, t_span - t_task), kAdaptGain);
    return t_span;
}

// The fraction sent to the device. The admission turns f into F = the integer neighbour of
// f * M (docs/formulas.md, "Hybrid split"), so near a step of F(f) the continuous estimate flips
// between two splits that the linear model rates almost equal -- and the one with fewer fetches is
// then usually faster in fact: the CPU reads DRAM without the gather's competition for part of the
// step, and evicts nothing. So of the two neighbours of fraction * M in [0, M] the larger F is
// taken only when its predicted time, max(F * gpu, (M - F) * cpu) per expert, is kSnapMargin
// better; then f is sent as the middle of that F's interval at this M (fraction_for_fetch). Other
// M map near the estimate; a one-sided F is sent as below, and one_sided() probes the idle side.
double HybridController::snap(double f, int64_t M) const {
    if (M < 2 || !(gpu_expert_s_ > 0.0) || !(cpu_expert_s_ > 0.0)) return f;
    const int64_t lo = std::clamp<int64_t>(int64_t(std::floor(f * double(M))), 0, M);
    const int64_t hi = std::min<int64_t>(lo + 1, M);
    auto time = [&](int64_t F) { return std::max(double(F) * gpu_expert_s_, double(M - F) * cpu_expert_s_); };
    const int64_t F = hi != lo && time(hi) < (1.0 - kSnapMargin) * time(lo) ? hi : lo;
    // One side idle at this M: the balance of the per-expert times where it lies beyond F's
    // interval, so that larger M leave that side idle as long as the model says so too.
    const double balance = cpu_expert_s_ / (gpu_expert_s_ + cpu_expert_s_);
    if (F == M) return std::max(fraction_for_fetch(F, M), balance);
    if (F == 0) return std::min(fraction_for_fetch(F, M), balance);
    return fraction_for_fetch(F, M);
}

}  // namespace ft
