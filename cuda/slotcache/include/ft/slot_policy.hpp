// Slot cache replacement policies (docs/formulas.md, "Slot cache policies"): which slot a miss
// evicts. Integer-only and header-only so the host mirror, the simulators and the device kernel
// compute bit-identical priorities.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FT_SLOT_POLICY_HD __host__ __device__
#else
#define FT_SLOT_POLICY_HD
#endif

namespace ft {

enum class SlotPolicyKind : int32_t {
    Lru = 0,        // evict the least recently used slot
    Frequency = 1,  // evict the slot with the lowest decayed-frequency priority
};

struct SlotPolicy {
    SlotPolicyKind kind = SlotPolicyKind::Lru;
    // Frequency: half-life of an access's weight, in admission calls (one call per layer and
    // decode step, so L calls per token). Must be >= 1.
    int64_t half_life = 1;
};

// ft_session_params' default half-life, in decode steps: at or above LRU on every simulated trace,
// with and without temporal locality (docs/formulas.md, "Slot cache policies").
inline constexpr int32_t kDefaultHalfLifeSteps = 8;

// Priorities are in 1/256 of an admission call.
inline constexpr int kPriorityShift = 8;

// Weight of a second access at distance d (priority units) on top of the larger priority:
// h * 2^(-d/h) with 2^(-x) interpolated linearly between powers of two, h = half-life in priority
// units. Exact at d = 0 (h) and decreasing to 0.
FT_SLOT_POLICY_HD inline int64_t frequency_bonus(int64_t d, int64_t h) {
    const int64_t n = d / h;
    if (n >= 62) return 0;
    return (h - (d % h) / 2) >> n;
}

// Priority after an access at admission step `step`: max(p, T) + bonus(|p - T|), T = step << 8;
// p = 0 (the reset value) means never accessed and gives T.
// Order-equivalent to a decayed access count sum_i 2^(-(now - t_i)/h) (to the interpolation):
// the priority of that sum is h log2(sum 2^(t_i/h)), and combining two terms adds
// h log2(1 + 2^(-d/h)) to the larger, which the bonus approximates. A slot never accessed again
// keeps its priority, so comparing priorities compares decayed counts at any later time.
FT_SLOT_POLICY_HD inline int64_t frequency_priority(int64_t p, int64_t step, int64_t half_life) {
    const int64_t t = step << kPriorityShift;
    if (p <= 0) return t;
    const int64_t h = half_life << kPriorityShift;
    const int64_t d = p > t ? p - t : t - p;
    return (p > t ? p : t) + frequency_bonus(d, h);
}


}  // namespace ft
