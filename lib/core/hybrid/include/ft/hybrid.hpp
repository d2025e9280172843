// The hybrid split (docs/formulas.md, "Hybrid split"): of M missing experts in a step, fetch F over PCIe and leave M - F
// to the CPU so that both sides finish together. With f the fraction of miss bandwidth PCIe
// supplies (f = pcie / (pcie + cpu)), fetch time grows as F (1 - f) and CPU time as (M - F) f;
// F is the integer neighbour of f M that minimises the slower side (ties to the lower).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FT_HOST_DEVICE __host__ __device__
#else
#define FT_HOST_DEVICE
#endif

namespace ft {

// f in Q16 fixed point, clamped to [0, 65536]; NaN gives 0.
int32_t fraction_to_q16(double fraction);

// A fraction that makes M misses fetch exactly F (0 <= F <= M): the middle of F's interval,
// (F + 1/2) / (M + 1), since the split below moves from F to F + 1 at f = (F + 1) / (M + 1).
// hybrid_fetch_count(M, fraction_to_q16(fraction_for_fetch(F, M))) == F.
double fraction_for_fetch(int64_t fetch, int64_t missing);

FT_HOST_DEVICE inline int64_t hybrid_fetch_count(int64_t missing, int32_t fraction_q16) {
    if (missing <= 0) return 0;
    const int64_t q = fraction_q16 < 0 ? 0 : (fraction_q16 > 65536 ? 65536 : fraction_q16);
    const int64_t lo = (missing * q) >> 16;
    auto cost = [&](int64_t f) {
        const int64_t fetch = f * (65536 - q), cpu = (missing - f) * q;
        return fetch > cpu ? fetch : cpu;
    };
    const int64_t f = cost(lo) <= cost(lo + 1) ? lo : lo + 1;
    return f < missing ? f : missing;
}

// Which of a step's misses are fetched when not all are (docs/formulas.md, "Slot cache": hybrid admission).
enum class FetchOrder : int32_t {
    Recency = 0,   // most recently active first (expert_recency), ties and never-seen by lower id
    LowestId = 1,  // ascending expert id; expert_recency is then left untouched
};

// How the hybrid admission splits a layer's misses between the PCIe fetch and the CPU.
struct HybridFetch {
    int32_t fraction_q16 = 0;  // > 0: fetch hybrid_fetch_count(M, fraction_q16) of M misses
    int32_t max_fetch = 0;     // used when fraction_q16 == 0: fetch at most this many (a fixed cap)
    FetchOrder order = FetchOrder::Recency;
};

// Number of misses fetched out of `missing` under `fetch` (never more than `missing`).
FT_HOST_DEVICE inline int64_t hybrid_fetch_limit(int64_t missing, const HybridFetch &fetch) {
    if (missing <= 0) return 0;
    if (fetch.fraction_q16 > 0) return hybrid_fetch_count(missing, fetch.fraction_q16);
    const int64_t cap = fetch.max_fetch < 0 ? 0 : fetch.max_fetch;
    return cap < missing ? cap : missing;
}

}  // namespace ft
