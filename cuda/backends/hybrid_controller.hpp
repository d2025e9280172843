// The hybrid backend's split controller (hybrid_controller.cpp): the share of each step's
// distinct misses the GPU fetches, moved from measured step times towards the split where both
// sides finish together (docs/formulas.md, "Hybrid split"). Host-only arithmetic.
#pragma once

#include <cstdint>

namespace ft::gpu_backend {

class HybridController {
public:
    // fraction: the starting share in (0, 1]; adaptive: whether observe() moves it.
    HybridController(double fraction, bool adaptive) : fraction_(fraction), sent_(fraction), adaptive_(adaptive) {}

    double sent() const { return sent_; }  // the fraction the admission uses
    bool adaptive() const { return adaptive_; }

    // One eager step: of its `missing` distinct misses the GPU fetched and computed the rest in
    // t_gpu seconds, the CPU computed cpu_experts of them in t_cpu seconds.
    void observe(double t_gpu, double t_cpu, uint64_t cpu_experts, int64_t missing);

private:
    double snap(double f, int64_t M) const;

    static constexpr double kAdaptGain = 0.1, kProbeStep = 0.02, kMinFraction = 0.02, kMaxFraction = 0.98;
    static constexpr double kSnapMargin = 0.05;

    double fraction_;            // the continuous estimate of the balanced fetch share
    double sent_;                // the fraction the admission uses (fraction_ snapped, see snap())
    double gpu_expert_s_ = 0.0;  // smoothed seconds per fetched expert (gather + kernels)
    double cpu_expert_s_ = 0.0;  // smoothed seconds per CPU-computed expert
    bool adaptive_;
};

}  // namespace ft::gpu_backend
