// Admission kernel internals, part 1 (included only by admission.cu, whose header comment
// describes the algorithm): block constants, phase-stamp macros, warp primitives, the packed keys
// of the fast and threshold paths, the exact keys of the general path, and the shared state.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ft/admission_trace.hpp"
#include "ft/hybrid.hpp"
#include "ft/slotcache_cuda.hpp"

namespace ft::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kRegisterItems = 8;  // slots per thread held in registers: S <= 8192
constexpr int kRound = 32;         // victims chosen per round (one per lane in the merge)
constexpr int kFastVictims = 32;   // fast path: victims per round (one per lane of warp 0)
constexpr int kPickVictims = 32;   // threshold path: at most this many victims per call
constexpr int kPickCandidates = 256;  // threshold path: candidate keys it ranks; more fall back
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kNoUsage = INT64_MAX;  // marks "no key"; a real usage never reaches it
constexpr uint64_t kNoKey = UINT64_MAX;  // fast path: no packed key (above every real one)

// Phase stamps for bench_admission_trace (ft/admission_trace.hpp); no-ops without FT_ADMISSION_TRACE.
#ifdef FT_ADMISSION_TRACE
__device__ long long g_admission_trace[kTraceCalls * kTracePoints];
#define FT_TRACE(sh, point) \
    do { if (threadIdx.x == 0) (sh).trace[point] = clock64(); } while (0)
#define FT_TRACE_PATH(sh, bits) \
    do { if (threadIdx.x == 0) (sh).trace[kTracePath] |= (bits); } while (0)
#else
#define FT_TRACE(sh, point) do { } while (0)
#define FT_TRACE_PATH(sh, bits) do { } while (0)
#endif

static_assert(kWarps == 32, "the merges give one warp list to each lane of warp 0");
static_assert(kThreads >= kMaxAdmissionExperts, "one thread per expert");
static_assert(kFastVictims == 32, "fast path: one victim per lane of warp 0");

// ---- Warp primitives -------------------------------------------------------------------------

// Sum over the warp, in every lane.
__device__ __forceinline__ int32_t warp_sum(int32_t v) {
#if __CUDA_ARCH__ >= 800 && !defined(FT_ADMISSION_NO_REDUX)
    return __reduce_add_sync(kFullMask, v);
#else
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
#endif
}

// Smallest 64-bit key of the warp, in every lane: the minimum high half, then the minimum low half
// among the lanes that hold it -- two REDUX instructions instead of a five-level shuffle tree.
__device__ __forceinline__ uint64_t warp_min(uint64_t v) {
#if __CUDA_ARCH__ >= 800 && !defined(FT_ADMISSION_NO_REDUX)
    const auto hi = static_cast<unsigned>(v >> 32);
    const unsigned min_hi = __reduce_min_sync(kFullMask, hi);
    const unsigned min_lo = __reduce_min_sync(kFullMask, hi == min_hi ? static_cast<unsigned>(v) : 0xffffffffu);
    return (static_cast<uint64_t>(min_hi) << 32) | min_lo;
#else
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const uint64_t other = __shfl_xor_sync(kFullMask, v, offset);
        v = other < v ? other : v;
    }
    return v;
#endif
}

// ---- Fast path: packed keys --------------------------------------------------------------------

// Packing of (key value, slot) into one word, and the check that makes it exact. The key value
// is the slot's usage (LRU) or priority (Frequency); a slot stamped with this step is never a
// victim whatever its key.
struct Packing {
    int64_t step;
    int32_t slots;
    int32_t slot_bits;      // bits of S - 1
    const int64_t *stamps;  // Frequency: the usages (this call's stamps); nullptr for LRU
    int64_t limit;          // key values must lie in [0, limit): step (LRU), 2^(63 - slot_bits)

    __device__ __forceinline__ int32_t slot_of(uint64_t key) const {
        return static_cast<int32_t>(key & ((uint64_t{1} << slot_bits) - 1));
    }
    // Key of slot s with key value v and usage u: kNoKey when not evictable (stamped with this
    // step); `bad` is set for a value outside [0, limit), which the packing cannot order (the
    // general path takes over). LRU: v = u, so a usage above the step is bad.
    __device__ __forceinline__ uint64_t key(int64_t v, int64_t u, int32_t s, bool &bad) const {
        if (u == step) return kNoKey;
        if (v < 0 || v >= limit) {
            bad = true;
            return kNoKey;
        }
        return (static_cast<uint64_t>(v) << slot_bits) | static_cast<uint32_t>(s);
    }
    // The key of slot s read from global memory: `keys` are the policy's key values.
    __device__ __forceinline__ uint64_t key_at(const int64_t *keys, int32_t s, bool &bad) const {
        const int64_t v = keys[s];
        return key(v, stamps ? stamps[s] : v, s, bad);
    }
};

// The policy's key values of the slots: usages (LRU) or priorities (Frequency).
__device__ __forceinline__ const int64_t *victim_keys(const SlotCacheState &st) {
    return st.shape.policy.kind == SlotPolicyKind::Frequency ? st.priority : st.usage;
}

__device__ __forceinline__ Packing packing_for(const SlotCacheState &st, int64_t step) {
    const int32_t S = st.shape.slots;
    const int32_t bits = S > 1 ? 32 - __clz(S - 1) : 0;
    const bool freq = st.shape.policy.kind == SlotPolicyKind::Frequency;
    return Packing{step, S, bits, freq ? st.usage : nullptr, freq ? int64_t((uint64_t{1} << (63 - bits)) - 1) : step};
}

// The keys of thread t's slots, held in registers (S <= kThreads * kItems).
template <int kItems>
struct FastRegisterSlots {
    uint64_t keys[kItems];

    // Issues the loads of thread t's usages at kernel start, so their latency overlaps the active
    // set and the lookups instead of following them (the raw usages live in `keys` until
    // keys_from_prefetch turns them into keys).
    __device__ __forceinline__ void prefetch(const int64_t *usage, int32_t slots, int32_t t) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const int32_t s = j * kThreads + t;
            keys[j] = s < slots ? static_cast<uint64_t>(usage[s]) : 0;
        }
    }
    // Keys from the prefetched usages: a slot stamped by this call's hits (bit set in `hit`)
    // is not evictable; every other usage is checked as load() checks it.
    __device__ __forceinline__ void keys_from_prefetch(const Packing &p, const uint32_t *hit, int32_t t, bool &bad) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const int32_t s = j * kThreads + t;
            const bool stamped = s < p.slots && ((hit[s >> 5] >> (s & 31)) & 1u);
            const auto v = static_cast<int64_t>(keys[j]);
            keys[j] = s < p.slots && !stamped ? p.key(v, p.stamps ? -1 : v, s, bad) : kNoKey;
        }
    }

    // Loads thread t's keys; returns the smallest, `second` gets the next.
    __device__ __forceinline__ uint64_t load(const int64_t *usage, const Packing &p, int32_t t, bool &bad,
                                             uint64_t &second) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const int32_t s = j * kThreads + t;
            keys[j] = s < p.slots ? p.key_at(usage, s, bad) : kNoKey;
        }
        return min2_from(0, second);
    }
    // Smallest key >= lo (kNoKey if none).
    __device__ __forceinline__ uint64_t min_from(uint64_t lo) const {
        uint64_t best = kNoKey;
#pragma unroll
        for (int j = 0; j < kItems; ++j)
            if (keys[j] >= lo && keys[j] < best) best = keys[j];
        return best;
    }
    // f(key) for every key <= hi (kNoKey never: hi < kNoKey).
    template <typename F>
    __device__ __forceinline__ void each_at_most(uint64_t hi, F &&f) const {
#pragma unroll
        for (int j = 0; j < kItems; ++j)
            if (keys[j] <= hi) f(keys[j]);
    }

    // The two smallest keys >= lo: returns the smallest, `second` gets the next (kNoKey if none).
    __device__ __forceinline__ uint64_t min2_from(uint64_t lo, uint64_t &second) const {
        uint64_t best = kNoKey, next = kNoKey;
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const uint64_t k = keys[j] >= lo ? keys[j] : kNoKey;
            next = k < best ? best : (k < next ? k : next);
            best = k < best ? k : best;
        }
        second = next;
        return best;
    }
};

// The keys of thread t's slots for any S, recomputed from global memory on each scan.
struct FastGlobalSlots {
    const int64_t *usage;
    Packing p;
    int32_t t;

    // Remembers thread t's slots; returns their smallest key (`second`: the next), checking every
    // usage (later scans read the same values, so they cannot meet a bad one).
    __device__ __forceinline__ uint64_t load(const int64_t *g_usage, const Packing &packing, int32_t thread,
                                             bool &bad, uint64_t &second) {
        usage = g_usage;
        p = packing;
        t = thread;
        return scan(0, bad, second);
    }
    __device__ __forceinline__ uint64_t min_from(uint64_t lo) const {
        bool ignored = false;
        uint64_t second;
        return scan(lo, ignored, second);
    }
    __device__ __forceinline__ uint64_t min2_from(uint64_t lo, uint64_t &second) const {
        bool ignored = false;
        return scan(lo, ignored, second);
    }
    template <typename F>
    __device__ __forceinline__ void each_at_most(uint64_t hi, F &&f) const {
        bool ignored = false;
        for (int32_t s = t; s < p.slots; s += kThreads) {
            const uint64_t k = p.key_at(usage, s, ignored);
            if (k <= hi) f(k);
        }
    }
    __device__ __forceinline__ uint64_t scan(uint64_t lo, bool &bad, uint64_t &second) const {
        uint64_t best = kNoKey, next = kNoKey;
#pragma unroll 8
        for (int32_t s = t; s < p.slots; s += kThreads) {
            uint64_t k = p.key_at(usage, s, bad);
            k = k >= lo ? k : kNoKey;
            next = k < best ? best : (k < next ? k : next);
            best = k < best ? k : best;
        }
        second = next;
        return best;
    }
};

template <int kItems>
struct FastSlotsFor {
    using type = FastRegisterSlots<kItems>;
};
template <>
struct FastSlotsFor<0> {
    using type = FastGlobalSlots;
};

// The register path's slots, prefetched at kernel start; nothing for the global path.
template <int kItems>
struct Prefetched {
    FastRegisterSlots<kItems> slots;
};
template <>
struct Prefetched<0> {};

// ---- General path: exact (usage, slot) pairs -----------------------------------------------------

struct Key {
    int64_t usage;
    int32_t slot;
};

__device__ __forceinline__ bool before(const Key &a, const Key &b) {
    return a.usage < b.usage || (a.usage == b.usage && a.slot < b.slot);
}
__device__ __forceinline__ Key no_key() { return {kNoUsage, INT32_MAX}; }
__device__ __forceinline__ bool is_key(const Key &k) { return k.usage != kNoUsage; }

// Smallest key of the warp, in every lane (butterfly over a total order, so all lanes agree).
__device__ __forceinline__ Key warp_min(Key k) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const Key other{__shfl_xor_sync(kFullMask, k.usage, offset), __shfl_xor_sync(kFullMask, k.slot, offset)};
        if (before(other, k)) k = other;
    }
    return k;
}

// This thread's slots, usage held in registers (S <= kThreads * kItems). Evictable slots only:
// slots past S and slots stamped with this step read as kNoUsage.
template <int kItems>
struct RegisterSlots {
    int64_t usage[kItems];

    // keys: the policy's key values; stamps: the usages when they differ (Frequency), else nullptr.
    __device__ __forceinline__ void load(const int64_t *keys, const int64_t *stamps, int32_t slots, int64_t step) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const int32_t s = j * kThreads + static_cast<int32_t>(threadIdx.x);
            const int64_t v = s < slots ? keys[s] : kNoUsage;
            const int64_t u = s < slots && stamps ? stamps[s] : v;
            usage[j] = u == step ? kNoUsage : v;
        }
    }
    // Smallest evictable key of this thread that comes after `last`.
    __device__ __forceinline__ Key min_above(const Key &last) const {
        Key best = no_key();
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const Key k{usage[j], j * kThreads + static_cast<int32_t>(threadIdx.x)};
            if (is_key(k) && before(last, k) && before(k, best)) best = k;
        }
        return best;
    }
};

// This thread's slots for any S: usage re-read from global memory on every scan.
struct GlobalSlots {
    const int64_t *usage;   // the key values
    const int64_t *stamps;  // Frequency: the usages; nullptr for LRU
    int32_t slots;
    int64_t step;

    __device__ __forceinline__ void load(const int64_t *keys, const int64_t *g_stamps, int32_t s_count, int64_t now) {
        usage = keys;
        stamps = g_stamps;
        slots = s_count;
        step = now;
    }
    __device__ __forceinline__ Key min_above(const Key &last) const {
        Key best = no_key();
        for (int32_t s = threadIdx.x; s < slots; s += kThreads) {
            const Key k{usage[s], s};
            const int64_t u = stamps ? stamps[s] : k.usage;
            if (u != step && before(last, k) && before(k, best)) best = k;
        }
        return best;
    }
};

template <int kItems>
struct SlotsFor {
    using type = RegisterSlots<kItems>;
};
template <>
struct SlotsFor<0> {
    using type = GlobalSlots;
};

struct Shared {
    int32_t active[kMaxAdmissionExperts];       // expert flags of this call
    int32_t expert_slot[kMaxAdmissionExperts];  // slot of each active expert after admission, -1 none
    int32_t missing[kMaxAdmissionExperts];      // missing experts, ascending id
    int32_t order[kMaxAdmissionExperts];        // hybrid by recency: order[r] = expert fetched r-th
    int64_t missing_recency[kMaxAdmissionExperts];
    uint32_t hit[kThreads * kRegisterItems / 32];  // register path: slots stamped by this call's hits
    union {
        struct {  // general path: per-warp candidate lists of a round
            int64_t usage[kWarps * kRound];
            int32_t slot[kWarps * kRound];
            int32_t victims[kMaxAdmissionExperts];  // victims[r] = r-th coldest evictable slot
        } round;
        struct {  // fast path
            uint64_t minima[kWarps * kFastVictims];  // each warp's smallest thread minima
            uint64_t second[kThreads];               // each thread's second key of the round
        } fast;
        struct {  // threshold path
            uint64_t warp_min[kWarps];              // each warp's smallest key
            uint64_t candidates[kPickCandidates];  // every key at or below the threshold
        } pick;
    } lists;
    uint64_t pick_threshold;   // threshold path: the k-th smallest warp minimum
    int32_t pick_count;        // threshold path: keys at or below it (may exceed kPickCandidates)
    int32_t warp_missing[kWarps], warp_active[kWarps];
    int64_t step;
    uint64_t next_key;  // fast path: the first key the next round may take
    int64_t taken_usage;
    int32_t taken_slot;
    int32_t any_bad;  // FT_ADMISSION_NO_BARRED only
#ifdef FT_ADMISSION_TRACE
    long long trace[kTracePoints];
#endif
};

struct AdmissionArgs {
    SlotCacheState st;
    int32_t layer;
    const int32_t *ids;
    int32_t *slots_out;
    int32_t count;
    HybridFetch fetch;  // hybrid only
};

}  // namespace

}  // namespace ft::cuda
