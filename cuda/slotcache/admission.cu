// Admission kernels (docs/formulas.md, "Slot cache"): one CTA of 1024 threads per layer call.
//
// Work is done in expert space rather than query space: the active set is a flag per expert, so
// duplicate ids collapse without the original's [Kq, Kq] comparison, and a ballot/popc count over
// the flags lists the misses in ascending expert id -- the LRU pairing order. A call without
// misses ends after three barriers.
//
// Victims are the k coldest evictable slots in ascending (usage, slot) order. Thread t owns slots
// t, t + 1024, t + 2048, ... Three ways to find them:
//
// Threshold path (k <= 32, every decode step; see pick_victims): with the packed keys below, one
// warp minimum per warp gives a threshold T, the k-th smallest warp minimum, at or above the k
// coldest keys; the few keys <= T are ranked against each other in parallel. No loop over k:
// a chain of k dependent warp minima cost about 300 cycles per victim on the H200.
//
// Fast path (any k, as long as the clock is small enough for the packing below). The key
// (usage << slot_bits) | slot is exact -- usage lies in [0, step) for every evictable slot, which
// is checked, and step < 2^(63 - slot_bits) -- and orders slots exactly as (usage, slot) does.
// Rounds of R <= 32 victims each take the R smallest keys at or above the first key no earlier
// round took:
//   1. every thread takes the minimum such key of its own slots;
//   2. every warp lists its R smallest thread minima, by R single-instruction warp minima
//      (__reduce_min_sync on the two halves of the key);
//   3. warp 0 merges the 32 lists into the R smallest thread minima: the owners of the R coldest
//      slots are among those R threads (a slot of any other thread has R smaller keys before it:
//      the R winning minima);
//   4. lane i of warp 0 takes the slots of winner i and the lanes merge them by R more warp minima,
//      the winning lane stepping to its next key; lane r installs victim r of the round.
// No barrier inside the loops: two block barriers per round (decode: one round), against one or
// two per victim in a sequential argmin.
//
// General path (a clock past the packing limit, or a usage outside [0, step), which the API never
// writes): rounds of up to 32 victims, each warp finding its R smallest exact (usage, slot) pairs
// above the last one taken by R shuffle argmins, warp 0 merging the 32 lists. Slower, but exact
// for any int64 usage.
//
// Where the usage lives: for S <= 8192 a thread's eight usages are loaded into registers at kernel
// start, before they are needed, and a shared bitmap marks the slots this call's hits stamp; above
// that they are re-read from global memory (L1) on each scan. Nothing about S has to fit in shared
// memory, so S is bounded only by int32. Per-expert state does live in shared memory, hence
// E <= kMaxAdmissionExperts.
//
// Evictable slots: the rule excludes slots stamped with this step (LRU) or owned by an expert
// active in this call (hybrid). These are the same set -- a slot is stamped with the new step only
// by this call's hit bumps, and an active expert that owns a slot is a hit -- so both kernels use
// "usage != step"; the host mirror uses the rule as stated for each and the tests compare them.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ft/admission_trace.hpp"
#include "ft/cuda_launch.cuh"
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

// Packing of (usage, slot) into one word, and the check that makes it exact.
struct Packing {
    int64_t step;
    int32_t slots;
    int32_t slot_bits;  // bits of S - 1

    __device__ __forceinline__ int32_t slot_of(uint64_t key) const {
        return static_cast<int32_t>(key & ((uint64_t{1} << slot_bits) - 1));
    }
    // Key of slot s with usage u: kNoKey when not evictable (stamped with this step); `bad` is set
    // for a usage outside [0, step], which the packing cannot order (the general path takes over).
    __device__ __forceinline__ uint64_t key(int64_t u, int32_t s, bool &bad) const {
        if (u == step) return kNoKey;
        if (u < 0 || u > step) {
            bad = true;
            return kNoKey;
        }
        return (static_cast<uint64_t>(u) << slot_bits) | static_cast<uint32_t>(s);
    }
};

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
            keys[j] = s < p.slots && !stamped ? p.key(static_cast<int64_t>(keys[j]), s, bad) : kNoKey;
        }
    }

    // Loads thread t's keys; returns the smallest, `second` gets the next.
    __device__ __forceinline__ uint64_t load(const int64_t *usage, const Packing &p, int32_t t, bool &bad,
                                             uint64_t &second) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const int32_t s = j * kThreads + t;
            keys[j] = s < p.slots ? p.key(usage[s], s, bad) : kNoKey;
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
            const uint64_t k = p.key(usage[s], s, ignored);
            if (k <= hi) f(k);
        }
    }
    __device__ __forceinline__ uint64_t scan(uint64_t lo, bool &bad, uint64_t &second) const {
        uint64_t best = kNoKey, next = kNoKey;
#pragma unroll 8
        for (int32_t s = t; s < p.slots; s += kThreads) {
            uint64_t k = p.key(usage[s], s, bad);
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

    __device__ __forceinline__ void load(const int64_t *g_usage, int32_t slots, int64_t step) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            const int32_t s = j * kThreads + static_cast<int32_t>(threadIdx.x);
            const int64_t u = s < slots ? g_usage[s] : kNoUsage;
            usage[j] = u == step ? kNoUsage : u;
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
    const int64_t *usage;
    int32_t slots;
    int64_t step;

    __device__ __forceinline__ void load(const int64_t *g_usage, int32_t s_count, int64_t now) {
        usage = g_usage;
        slots = s_count;
        step = now;
    }
    __device__ __forceinline__ Key min_above(const Key &last) const {
        Key best = no_key();
        for (int32_t s = threadIdx.x; s < slots; s += kThreads) {
            const Key k{usage[s], s};
            if (k.usage != step && before(last, k) && before(k, best)) best = k;
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

// Moves `expert` of the layer into `victim` (evicting its owner, `old`) and records plan entry i.
// Victims and their old owners are distinct, and no old owner is a miss of this call, so calls for
// different i never write the same word.
__device__ __forceinline__ void install(const SlotCacheState &st, Shared &sh, int32_t i, int32_t victim,
                                        int32_t old, int32_t base, int32_t expert, int64_t step) {
    if (old >= 0) st.slot_for_id[old] = -1;
    st.id_of_slot[victim] = base + expert;
    st.slot_for_id[base + expert] = victim;
    st.usage[victim] = step;
    if (i < st.shape.plan_capacity) {  // always true after the launcher's check
        st.evict_slots[i] = victim;
        st.src_indices[i] = expert;
    }
    sh.expert_slot[expert] = victim;
}

// Fast path, steps 1-4 of the header, in rounds of up to 32 victims: a round finds the R smallest
// keys at or above `lo`, the first key no earlier round took. Every thread calls it; returns false
// (having changed nothing) when some usage is outside [0, step], for the general path to take
// over. Two block barriers per round, the last after the installs.
// keyed: pick_victims has already turned the register path's usages into keys.
template <int kItems>
__device__ __forceinline__ bool fast_victims(const SlotCacheState &st, Shared &sh, int32_t k, int64_t step,
                                             int32_t base, const int32_t *fetch_order, Prefetched<kItems> &pre,
                                             bool keyed) {
    using Slots = typename FastSlotsFor<kItems>::type;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int32_t S = st.shape.slots;
    const Packing p{step, S, S > 1 ? 32 - __clz(S - 1) : 0};

    bool bad = false;
    uint64_t lo = 0;
    Slots own;  // global path only (the register path's live in `pre`)
    for (int32_t done = 0; done < k; done += kFastVictims) {
        const int32_t R = k - done < kFastVictims ? k - done : kFastVictims;
        // 1. This thread's two smallest keys at or above lo (the first round also loads and
        // checks); the second is published for the shortcut of step 3.
        uint64_t second = kNoKey;
        uint64_t mine;
        if constexpr (kItems > 0) {  // usages loaded at kernel start
            if (done == 0 && !keyed) pre.slots.keys_from_prefetch(p, sh.hit, tid, bad);
            mine = pre.slots.min2_from(lo, second);
        } else {
            mine = done == 0 ? own.load(st.usage, p, tid, bad, second) : own.min2_from(lo, second);
        }
        sh.lists.fast.second[tid] = second;
        // 2. This warp's R smallest thread minima, ascending; a list cut short ends with kNoKey.
        for (int32_t r = 0; r < R; ++r) {
            const uint64_t m = warp_min(mine);
            if (lane == 0) sh.lists.fast.minima[warp * kFastVictims + r] = m;
            if (m == kNoKey) break;  // warp-uniform
            if (mine == m) mine = kNoKey;
        }
        if (done == 0) {
#ifdef FT_ADMISSION_NO_BARRED
            if (bad) sh.any_bad = 1;  // A/B switch: a plain barrier instead of bar.red
            __syncthreads();
            if (sh.any_bad) return false;
#else
            if (__syncthreads_or(bad)) return false;  // uniform: every thread sees the same answer
#endif
            FT_TRACE(sh, kTraceMinima);
        } else {
            __syncthreads();
        }

        if (warp == 0) {
            // 3. Merge: lane j walks warp j's list; lane r keeps the r-th smallest thread minimum.
            // The loop bodies here and in step 4 are branch-free (selects, loads by every lane):
            // no lane leaves the warp's path between two warp minima.
            const uint64_t *list = sh.lists.fast.minima + lane * kFastVictims;
            int32_t pos = 0;
            uint64_t head = list[0], winner = kNoKey;
            for (int32_t r = 0; r < R; ++r) {
                const uint64_t m = warp_min(head);
                if (m == kNoKey) break;  // warp-uniform; fewer evictable threads than R (never: S >= E)
                winner = lane == r ? m : winner;
                // A list is ascending and ends at R entries or at its first kNoKey, so entry pos + 1
                // exists whenever head (entry pos) is a real key and pos + 1 < R.
                const bool step_on = head == m;
                const int32_t at = step_on && pos + 1 < R ? pos + 1 : pos;
                const uint64_t following = list[at];  // every lane loads: in bounds, no branch
                head = step_on ? (pos + 1 < R ? following : kNoKey) : head;
                pos = at;
            }
            // Shortcut: when no winner's second key comes before the R-th smallest thread minimum,
            // the R coldest keys are the winners' minima themselves (every other key is either a
            // non-winner's, above its minimum and so above the R-th, or a winner's second or
            // later). After a decode step the few slots stamped together rarely share a thread,
            // so this usually holds and step 4 -- a dependent global load and R warp minima --
            // is skipped. The vote is warp-uniform.
            uint64_t mine_key = kNoKey, last = kNoKey;
            const int32_t winner_thread = winner == kNoKey ? 0 : p.slot_of(winner) % kThreads;
            const uint64_t winner_second = sh.lists.fast.second[winner_thread];  // every lane loads
            const uint64_t rth = __shfl_sync(kFullMask, winner, R - 1);
            const bool simple =
                __all_sync(kFullMask, lane >= R || (winner != kNoKey && rth != kNoKey && winner_second > rth));
            FT_TRACE_PATH(sh, simple ? kTracePathShortcut : kTracePathStep4);
            if (simple) {
                mine_key = lane < R ? winner : kNoKey;
                last = rth;
            } else {
                // 4. Lane i holds winner i's slots; R rounds of "smallest head wins, winner steps on".
                Slots theirs;
                bool ignored = false;
                uint64_t unused;
                theirs.load(st.usage, p, winner_thread, ignored, unused);
                head = winner;  // the smallest key >= lo of those slots
                for (int32_t r = 0; r < R; ++r) {
                    const uint64_t m = warp_min(head);
                    last = m;
                    if (m == kNoKey) break;  // warp-uniform; cannot run out while S >= E
                    mine_key = lane == r ? m : mine_key;
                    const uint64_t following = theirs.min_from(m + 1);  // every lane scans: no branch
                    head = head == m ? following : head;
                }
            }
            FT_TRACE(sh, kTraceMerged);
            const int32_t victim = mine_key == kNoKey ? -1 : p.slot_of(mine_key);
            const int32_t old = victim >= 0 ? st.id_of_slot[victim] : -1;  // no install has run yet
            __syncwarp();  // every lane's scans and owner reads are done before any install rewrites them
            if (lane < R && victim >= 0)
                install(st, sh, done + lane, victim, old, base, fetch_order[done + lane], step);
            if (lane == 0) sh.next_key = last == kNoKey ? kNoKey : last + 1;
        }
        __syncthreads();
        FT_TRACE(sh, kTraceInstalled);
        lo = sh.next_key;
    }
    return true;
}

// Threshold path, for up to kPickVictims victims (every decode step): the k coldest keys by one
// warp minimum per warp, a threshold and a rank, instead of k rounds of warp minima.
//   1. Every warp takes the minimum of its threads' keys (one REDUX pair).
//   2. Warp 0 ranks the 32 warp minima; T = the k-th smallest. At least k keys are <= T (the k
//      warp minima themselves), so the k coldest keys are all <= T.
//   3. Every thread appends its keys <= T to a shared list (after a decode step, about k of them).
//   4. Thread i ranks candidate i against the others; rank r < k installs victim r.
// Four block barriers and no loop over k. When more than kPickCandidates keys are <= T, or fewer
// than k keys are evictable, the rounds of fast_victims take over, with the keys computed here.
// Returns false (having changed nothing) when some usage is outside [0, step], as fast_victims.
template <int kItems>
__device__ __forceinline__ bool pick_victims(const SlotCacheState &st, Shared &sh, int32_t k, int64_t step,
                                             int32_t base, const int32_t *fetch_order, Prefetched<kItems> &pre) {
    using Slots = typename FastSlotsFor<kItems>::type;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int32_t S = st.shape.slots;
    const Packing p{step, S, S > 1 ? 32 - __clz(S - 1) : 0};

    // 1. This thread's keys and their minimum; the warp's minimum.
    bool bad = false;
    uint64_t second = kNoKey, mine;  // second: global path only
    Slots own;  // global path only (the register path's live in `pre`)
    if constexpr (kItems > 0) {
        pre.slots.keys_from_prefetch(p, sh.hit, tid, bad);
        mine = pre.slots.min_from(0);
    } else {
        mine = own.load(st.usage, p, tid, bad, second);
    }
    const uint64_t warp_min_key = warp_min(mine);
    FT_TRACE(sh, kTraceKeys);
    if (lane == 0) sh.lists.pick.warp_min[warp] = warp_min_key;
    if (tid == 0) sh.pick_count = 0;
    if (__syncthreads_or(bad)) return false;  // uniform
    FT_TRACE(sh, kTraceMinima);

    // 2. T: the k-th smallest warp minimum (kNoKey when fewer than k warps have a key). Lane j's
    // rank is the number of smaller minima; the lanes ranked k - 1 or later hold the k-th and up.
    if (warp == 0) {
        const uint64_t w = sh.lists.pick.warp_min[lane];
        int32_t rank = 0;
#pragma unroll 8
        for (int i = 0; i < kWarps; ++i) rank += sh.lists.pick.warp_min[i] < w ? 1 : 0;
        const uint64_t t = warp_min(rank >= k - 1 ? w : kNoKey);
        if (lane == 0) sh.pick_threshold = t;
    }
    __syncthreads();
    FT_TRACE(sh, kTraceThreshold);

    // 3. Every key <= T, in any order.
    const uint64_t threshold = sh.pick_threshold;
    const uint64_t hi = threshold == kNoKey ? kNoKey - 1 : threshold;
    auto append = [&sh](uint64_t key) {
        const int32_t at = atomicAdd(&sh.pick_count, 1);
        if (at < kPickCandidates) sh.lists.pick.candidates[at] = key;
    };
    if (mine <= hi) {  // else none of this thread's keys is
        if constexpr (kItems > 0)
            pre.slots.each_at_most(hi, append);
        else if (second <= hi)  // more than its minimum qualifies: scan again
            own.each_at_most(hi, append);
        else
            append(mine);
    }
    __syncthreads();
    FT_TRACE(sh, kTraceCandidates);
    const int32_t count = sh.pick_count;
    if (count > kPickCandidates || count < k)  // uniform
        return fast_victims<kItems>(st, sh, k, step, base, fetch_order, pre, true);

    // 4. Rank r < k: the r-th coldest slot, which takes miss fetch_order[r]. Keys are distinct (the
    // slot is in the low bits), so the ranks are too.
    FT_TRACE_PATH(sh, kTracePathThreshold);
    // The owner's load is issued before the ranking, so its latency overlaps the loop.
    if (tid < count) {
        const uint64_t key = sh.lists.pick.candidates[tid];
        const int32_t victim = p.slot_of(key);
        const int32_t old = st.id_of_slot[victim];
        int32_t rank = 0;
#pragma unroll 4
        for (int32_t j = 0; j < count; ++j) rank += sh.lists.pick.candidates[j] < key ? 1 : 0;
        if (rank < k) install(st, sh, rank, victim, old, base, fetch_order[rank], step);
    }
    FT_TRACE(sh, kTraceMerged);
    __syncthreads();
    FT_TRACE(sh, kTraceInstalled);
    return true;
}

// General path: rounds of up to 32 victims (header). Every thread calls it; ends with a barrier.
template <int kItems>
__device__ __forceinline__ void general_victims(const SlotCacheState &st, Shared &sh, int32_t k, int64_t step,
                                                int32_t base, const int32_t *fetch_order) {
    using Slots = typename SlotsFor<kItems>::type;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    Slots slots;
    slots.load(st.usage, st.shape.slots, step);  // hit stamps are visible: barriers since they were written
    Key taken{INT64_MIN, INT32_MIN};              // every key up to here is already a victim
    int64_t *list_usage = sh.lists.round.usage;
    int32_t *list_slot = sh.lists.round.slot;
    for (int32_t done = 0; done < k; done += kRound) {
        const int32_t R = k - done < kRound ? k - done : kRound;
        // 1. This warp's R smallest keys above `taken`, ascending.
        Key head = slots.min_above(taken);
        for (int32_t r = 0; r < R; ++r) {
            const Key best = warp_min(head);
            if (lane == 0) {
                list_usage[warp * kRound + r] = best.usage;
                list_slot[warp * kRound + r] = best.slot;
            }
            if (!is_key(best)) {  // this warp has no more evictable slots; warp-uniform
                for (int32_t rest = r + 1 + lane; rest < R; rest += 32) {
                    list_usage[warp * kRound + rest] = kNoUsage;
                    list_slot[warp * kRound + rest] = INT32_MAX;
                }
                break;
            }
            if (head.slot == best.slot) head = slots.min_above(best);
        }
        __syncthreads();
        // 2. Warp 0 merges: lane j walks warp j's list.
        if (warp == 0) {
            int32_t pos = 0;
            Key cur{list_usage[lane * kRound], list_slot[lane * kRound]};
            Key best = no_key();
            for (int32_t r = 0; r < R; ++r) {
                best = warp_min(cur);
                // Cannot run out while S >= E (distinct ids of a layer <= E); -1 keeps the
                // install below from writing anywhere if the state was corrupted.
                if (lane == 0) sh.lists.round.victims[done + r] = is_key(best) ? best.slot : -1;
                if (is_key(best) && cur.slot == best.slot) {
                    ++pos;
                    cur = pos < R ? Key{list_usage[lane * kRound + pos], list_slot[lane * kRound + pos]} : no_key();
                }
            }
            if (lane == 0) {
                sh.taken_usage = best.usage;
                sh.taken_slot = best.slot;
            }
        }
        __syncthreads();
        taken = Key{sh.taken_usage, sh.taken_slot};
    }
    // Install: miss fetch_order[i] moves into victims[i].
    for (int32_t i = tid; i < k; i += kThreads) {
        const int32_t victim = sh.lists.round.victims[i];
        if (victim >= 0) install(st, sh, i, victim, st.id_of_slot[victim], base, fetch_order[i], step);
    }
    __syncthreads();
}

// kItems: slots per thread kept in registers (S <= kThreads * kItems), 0 for any S.
template <int kItems, bool kHybrid>
__global__ void __launch_bounds__(kThreads) admission_kernel(const AdmissionArgs a) {
    __shared__ Shared sh;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const SlotCacheState &st = a.st;
#ifdef FT_ADMISSION_TRACE
    if (tid == 0) sh.trace[kTracePath] = 0;
#endif
    FT_TRACE(sh, kTraceEntry);
    // Launched by launch_pdl: wait for the previous kernel (the routing, a previous admission),
    // then let the next kernel of the step be scheduled at once -- this one CTA leaves the rest of
    // the GPU idle, and the launch gap would otherwise add to every layer's latency.
    pdl_wait();
    pdl_trigger();
    FT_TRACE(sh, kTraceWaited);
    const int32_t E = st.shape.experts, base = a.layer * E;

    // Every global load that does not depend on another is issued first, so their latencies
    // overlap instead of adding up: this thread's first routed id, the clock (thread 0), the slot
    // of expert `tid` and, for the hybrid, its recency (nothing in this kernel writes either
    // before they are used), and (register path) the usages of this thread's slots for the victim
    // search, which a shared bitmap later corrects for this call's hit stamps.
    const int32_t first_id = tid < a.count ? a.ids[tid] : -1;
    const int64_t clock = tid == 0 ? *st.step : 0;
    const int32_t expert_slot = tid < E ? st.slot_for_id[base + tid] : -1;
    const int64_t recency = kHybrid && tid < E ? st.expert_recency[base + tid] : 0;
    Prefetched<kItems> pre;
    if constexpr (kItems > 0) pre.slots.prefetch(st.usage, st.shape.slots, tid);
    if (tid < E) sh.active[tid] = 0;
    if constexpr (kItems > 0)
        for (int32_t i = tid; i < kThreads * kRegisterItems / 32; i += kThreads) sh.hit[i] = 0;
    __syncthreads();
    FT_TRACE(sh, kTraceInit);

    // Active set. Ids outside [0, E) take no part (the host API rejects ids >= E).
    if (first_id >= 0 && first_id < E) atomicOr(&sh.active[first_id], 1);  // not a plain store: racecheck-clean
    for (int32_t p = tid + kThreads; p < a.count; p += kThreads) {
        const int32_t id = a.ids[p];
        if (id >= 0 && id < E) atomicOr(&sh.active[id], 1);
    }
    // The clock advances here rather than before the first barrier: its load has had the active
    // set's time to arrive.
    if (tid == 0) {
        *st.step = clock + 1;
        sh.step = clock + 1;
        sh.any_bad = 0;
    }
    __syncthreads();
    FT_TRACE(sh, kTraceActive);
    const int64_t step = sh.step;

    // One thread per expert: look it up, stamp a hit with this step, flag a miss.
    bool active = false, missing = false;
    if (tid < E) {
        active = sh.active[tid] != 0;
        int32_t slot = -1;
        if (active) {
            slot = expert_slot;
            if (slot >= 0) {
                st.usage[slot] = step;
                // The prefetched usage of this slot is stale: mark it not evictable.
                if constexpr (kItems > 0) atomicOr(&sh.hit[slot >> 5], 1u << (slot & 31));
            }
        }
        sh.expert_slot[tid] = slot;
        missing = active && slot < 0;
    }
    const unsigned missing_bits = __ballot_sync(kFullMask, missing);
    const unsigned active_bits = __ballot_sync(kFullMask, active);
    if (lane == 0) {
        sh.warp_missing[warp] = __popc(missing_bits);
        sh.warp_active[warp] = __popc(active_bits);
    }
    __syncthreads();
    FT_TRACE(sh, kTraceLookup);
    // Every warp sums the per-warp counts itself (no barrier for a shared scan): M, the misses of
    // the warps before this one, and the distinct active experts.
    const int32_t per_warp = sh.warp_missing[lane];
    const int32_t M = warp_sum(per_warp);
    const int32_t missing_before = warp_sum(lane < warp ? per_warp : 0);
    const int32_t active_count = warp_sum(sh.warp_active[lane]);
    const int32_t k = kHybrid ? static_cast<int32_t>(hybrid_fetch_limit(M, a.fetch)) : M;

    if (k > 0) {  // block-uniform
        // The misses in ascending expert id, read after the barriers below.
        if (missing) {
            const int32_t rank = missing_before + __popc(missing_bits & ((1u << lane) - 1u));
            sh.missing[rank] = tid;
            if (kHybrid) sh.missing_recency[rank] = recency;
        }
        // Which miss takes the r-th coldest slot: ascending id (LRU, hybrid lowest_id), or most
        // recently active first with ties to the lower id (hybrid recency; the argmax of recency * E + (E - 1 - e)).
        const int32_t *fetch_order = sh.missing;
        if (kHybrid && a.fetch.order == FetchOrder::Recency) {
            __syncthreads();
            // O(M) per miss: cheap for decode's handful of misses, tolerable for a batch's hundreds.
            for (int32_t i = tid; i < M; i += kThreads) {
                const int64_t r = sh.missing_recency[i];
                int32_t rank = 0;
                for (int32_t j = 0; j < M; ++j) {
                    const int64_t rj = sh.missing_recency[j];
                    rank += (rj > r || (rj == r && j < i)) ? 1 : 0;  // sh.missing is ascending in id
                }
                if (rank < k) sh.order[rank] = sh.missing[i];
            }
            fetch_order = sh.order;  // read only after the selection's barriers
        }
        // The hit stamps (written before the barriers above) are visible to the usage loads.
        const int32_t slot_bits = st.shape.slots > 1 ? 32 - __clz(st.shape.slots - 1) : 0;
        const bool packable = static_cast<uint64_t>(step) < (uint64_t{1} << (63 - slot_bits));
        const bool done = packable && (k <= kPickVictims
                                           ? pick_victims<kItems>(st, sh, k, step, base, fetch_order, pre)
                                           : fast_victims<kItems>(st, sh, k, step, base, fetch_order, pre, false));
        if (!done) {
            FT_TRACE_PATH(sh, kTracePathGeneral);
            general_victims<kItems>(st, sh, k, step, base, fetch_order);
        }
    }

    // Rewrite: slot of each routed id, -1 for ids outside the layer and for CPU routes. The
    // thread that writes position p is the one that read it above, so slots_out may alias ids.
    if (tid < a.count) a.slots_out[tid] = (first_id >= 0 && first_id < E) ? sh.expert_slot[first_id] : -1;
    for (int32_t p = tid + kThreads; p < a.count; p += kThreads) {
        const int32_t id = a.ids[p];
        a.slots_out[p] = (id >= 0 && id < E) ? sh.expert_slot[id] : -1;
    }
    if (kHybrid && a.fetch.order == FetchOrder::Recency && active) st.expert_recency[base + tid] = step;
    if (tid == 0) {
        *st.num_indices = k;
        *st.num_missing_full = M;
    }
    FT_TRACE(sh, kTraceEnd);
#ifdef FT_ADMISSION_TRACE
    if (tid == 0)
        for (int i = 0; i < kTracePoints; ++i)
            g_admission_trace[(step % kTraceCalls) * kTracePoints + i] = i == kTracePath ? sh.trace[i] : sh.trace[i] - sh.trace[kTraceEntry];
#endif
    // Statistics as reductions without a return value (the threads do not wait for a read of the
    // row), one column per thread.
    if (tid < kStatColumns) {
        const int64_t add = tid == kStatActive ? active_count : tid == kStatMissing ? M : tid == kStatFetched ? k : 1;
        atomicAdd(reinterpret_cast<unsigned long long *>(st.stats + static_cast<int64_t>(a.layer) * kStatColumns + tid),
                  static_cast<unsigned long long>(add));
    }
}

cudaError_t check_args(const SlotCacheState &st, int32_t layer, const int32_t *ids, const int32_t *slots_out,
                       int64_t count) {
    const SlotCacheShape &s = st.shape;
    if (s.experts <= 0 || s.experts > kMaxAdmissionExperts || s.slots < s.experts) return cudaErrorInvalidValue;
    if (!st.slot_for_id || !st.id_of_slot || !st.usage || !st.step || !st.evict_slots || !st.src_indices ||
        !st.num_indices || !st.num_missing_full || !st.expert_recency || !st.stats)
        return cudaErrorInvalidValue;
    if (count > INT32_MAX || admission_argument_error(s, layer, ids, slots_out, count)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

template <bool kHybrid>
cudaError_t launch(const SlotCacheState &st, int32_t layer, const int32_t *ids, int32_t *slots_out, int64_t count,
                   const HybridFetch &fetch, cudaStream_t stream) {
    if (const cudaError_t e = check_args(st, layer, ids, slots_out, count); e != cudaSuccess) return e;
    const AdmissionArgs args{st, layer, ids, slots_out, static_cast<int32_t>(count), fetch};
    if (st.shape.slots <= kThreads * kRegisterItems)
        return launch_pdl(admission_kernel<kRegisterItems, kHybrid>, dim3(1), dim3(kThreads), 0, stream, args);
    return launch_pdl(admission_kernel<0, kHybrid>, dim3(1), dim3(kThreads), 0, stream, args);
}

__global__ void reset_kernel(const SlotCacheState st) {
    const int64_t ids = static_cast<int64_t>(st.shape.layers) * st.shape.experts;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < ids; i += stride) {
        st.slot_for_id[i] = -1;
        st.expert_recency[i] = -1;
    }
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < st.shape.slots; i += stride) {
        st.id_of_slot[i] = -1;
        st.usage[i] = 0;
    }
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < st.shape.plan_capacity;
         i += stride) {
        st.evict_slots[i] = -1;
        st.src_indices[i] = -1;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *st.step = 0;
        *st.num_indices = 0;
        *st.num_missing_full = 0;
    }
}

__global__ void clear_stats_kernel(const SlotCacheState st) {
    const int64_t n = static_cast<int64_t>(st.shape.layers) * kStatColumns;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st.stats[i] = 0;
}

}  // namespace

cudaError_t launch_admit_lru(const SlotCacheState &state, int32_t layer, const int32_t *ids, int32_t *slots_out,
                             int64_t count, cudaStream_t stream) {
    return launch<false>(state, layer, ids, slots_out, count, HybridFetch{}, stream);
}

cudaError_t launch_admit_hybrid(const SlotCacheState &state, int32_t layer, const int32_t *ids, int32_t *slots_out,
                                int64_t count, const HybridFetch &fetch, cudaStream_t stream) {
    return launch<true>(state, layer, ids, slots_out, count, fetch, stream);
}

cudaError_t launch_slot_cache_reset(const SlotCacheState &state, cudaStream_t stream) {
    const int64_t ids = static_cast<int64_t>(state.shape.layers) * state.shape.experts;
    const int64_t most = ids > state.shape.slots ? ids : state.shape.slots;
    if (most <= 0) return cudaErrorInvalidValue;
    const int threads = 256;
    const int64_t blocks = (most + threads - 1) / threads;
    reset_kernel<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), threads, 0, stream>>>(state);
    return cudaGetLastError();
}

#ifdef FT_ADMISSION_TRACE
cudaError_t admission_trace_copy(long long *host) {
    return cudaMemcpyFromSymbol(host, g_admission_trace, sizeof(g_admission_trace));
}
#endif

cudaError_t launch_slot_cache_clear_stats(const SlotCacheState &state, cudaStream_t stream) {
    if (state.shape.layers <= 0) return cudaErrorInvalidValue;
    clear_stats_kernel<<<1, 256, 0, stream>>>(state);
    return cudaGetLastError();
}

}  // namespace ft::cuda
