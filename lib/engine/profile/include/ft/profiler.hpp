// The bandwidth profiler (docs/formulas.md, "Bandwidth profile"): measures this machine's memory read bandwidth, pinned
// host<->device copies and the production CPU expert kernels, and returns them as a Profile in
// schema v4. Lives in its own target (ft_profiler) so ft_profile stays free of CPU and CUDA code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "freetoken.h"
#include "ft/formats.hpp"
#include "ft/profile.hpp"

namespace ft {

namespace cpu {
class ThreadPool;
}

// The canonical geometry a format is measured at (docs/formulas.md; q4_0 takes gemma-4-26B's).
struct ProfileGeometry {
    int32_t hidden = 0, intermediate = 0, top_k = 0;
    int32_t activation = FT_ACT_SILU;
    float swiglu_limit = 0.0f;  // finite > 0: clamped (mxfp4's SwiGLU, ds_fp4's SiLU)
};
ProfileGeometry profile_geometry(Format f);

// Fills `bytes` of bank `bank` (a bank_schema name of `f`) as the profiler fills its synthetic
// experts, split over the pool: random codes that are all valid, scales that keep the weights
// small and finite (GGUF blocks: each block's fp16 d and dmin positive, normal, in [2^-13, 2^-6)),
// biases zero. The bytes depend only on (f, bank, bytes, seed).
void fill_synthetic_bank(cpu::ThreadPool &pool, Format f, const std::string &bank, uint8_t *p, size_t bytes, uint64_t seed);

// Synthetic experts of `expert_bytes` each in a window of `window` bytes: at least 2 top_k (so
// consecutive steps share none), at most 128, or as many as span 4 x `llc` (the last-level
// cache) when 128 do not, up to 1024.
int64_t window_experts(size_t window, size_t expert_bytes, int64_t top_k, size_t llc);

// Runs the measurements `p` asks for (fields already validated against their struct_size by the
// caller; they are range-checked here). FT_ERR_INVALID_ARGUMENT for bad fields,
// FT_ERR_NO_DEVICE for an explicit device that is not usable, FT_ERR_CANCELLED when the
// progress callback returns false, FT_ERR_DEVICE / FT_ERR_OUT_OF_MEMORY from the measurements.
Profile measure_profile(const ft_profile_params &p);

}  // namespace ft
