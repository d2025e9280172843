// The hybrid backend's split controller (hybrid_controller.cpp; cuda/backends uses it): the share
// of each step's distinct misses the GPU fetches, moved from measured step times towards the
// split where both sides finish together (docs/formulas.md, "Hybrid split"). Host-only arithmetic.
#pragma once

#include <cstdint>

namespace ft {

class HybridController {
public:
    // fraction: the starting share in (0, 1]; adaptive: whether observe() moves it.
    HybridController(double fraction, bool adaptive) : fraction_(fraction), sent_(fraction), adaptive_(adaptive) {}

    double sent() const { return sent_; }  // the fraction the admission uses
    bool adaptive() const { return adaptive_; }

    // One eager step: of its `missing` distinct misses the GPU fetched and computed the rest in
    // t_gpu seconds (its share on the stream), the CPU computed cpu_experts of them in a task of
    // t_task seconds; t_span is the stream's time from the CPU's signal to the end of its wait
    // for the CPU's result (>= t_gpu: the wait follows the GPU share on the stream), or < 0 where
    // the wait has a cost of its own that would read as CPU latency (a host-function node).
    void observe(double t_gpu, double t_span, double t_task, uint64_t cpu_experts, int64_t missing);

    // The CPU side's latency as the stream sees it (signal to result) for one step: t_span where
    // the stream waited for the CPU, else the task plus the smoothed handoff time of the steps
    // that waited (the task alone leaves out the handoff in both directions). Updates that
    // smoothing; called by observe().
    double cpu_latency(double t_gpu, double t_span, double t_task);

private:
    void one_sided(double t_gpu, double t_cpu, int64_t on_cpu, int64_t missing);
    double snap(double f, int64_t M) const;
    static void smooth(double &estimate, double sample, double gain);
    void approach(double target);
    enum class Side { none, gpu, cpu };

    static constexpr double kAdaptGain = 0.1, kProbeStep = 0.02, kMinFraction = 0.02, kMaxFraction = 0.98;
    static constexpr double kSnapMargin = 0.05;
    // One-sided steps before the idle side is probed with one expert: kProbeFirst after a
    // two-sided step that was not a probe, doubling with each probe up to kProbeLast.
    static constexpr int kProbeFirst = 16, kProbeLast = 512;
    // The stream waited for the CPU when its wait ended this much after the GPU share (the wait
    // and the event record take a few microseconds when the result is already there).
    static constexpr double kWaitVisibleSeconds = 5e-6;

    double fraction_;            // the continuous estimate of the balanced fetch share
    double sent_;                // the fraction the admission uses (fraction_ snapped, see snap())
    double gpu_expert_s_ = 0.0;  // smoothed seconds per fetched expert (gather + kernels)
    double cpu_expert_s_ = 0.0;  // smoothed seconds per CPU-computed expert
    double handoff_s_ = 0.0;     // smoothed CPU latency beyond its task, from steps that waited for it
    int probe_wait_ = kProbeFirst;  // one-sided steps in a row before the next probe
    int idle_steps_ = 0;            // one-sided steps since the last probe or two-sided step
    Side probed_ = Side::none;      // the side the last probe gave one expert, until a two-sided step
    bool adaptive_;
};

}  // namespace ft
