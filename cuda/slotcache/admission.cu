// Admission kernels (spec 4.3, 4.4): one CTA of 1024 threads per layer call.
//
// Work is done in expert space rather than query space: the active set is a flag per expert, so
// duplicate ids collapse without the original's [Kq, Kq] comparison, and a ballot/popc scan over
// the flags lists the misses in ascending expert id -- the LRU pairing order -- in one pass.
//
// Victim selection takes the k coldest evictable slots in ascending (usage, slot) order, with
// exact 64-bit usage (no packing into one word, so the result cannot depend on how large the step
// clock has grown). It runs in rounds of up to 32 victims:
//   1. every warp finds the R smallest keys of its own slots that lie above the last key taken in
//      earlier rounds, by R warp-shuffle argmins (no block barrier); after each argmin only the
//      winning lane rescans its own slots, for the smallest key above the one it just gave up;
//   2. warp 0 merges the 32 sorted warp lists by R more argmins, one list per lane.
// Keys are unique (the slot breaks ties), so "everything at or below the last key taken" is exactly
// the set already taken and no per-slot marks are needed. A round costs two barriers and about
// 2R shuffle argmins; 8 misses are one round.
//
// Where the usage lives: thread t owns slots t, t + 1024, t + 2048, ...; for S <= 8192 its eight
// usages sit in registers (RegisterSlots), above that each rescan re-reads them from global memory,
// where they stay in L1 after the first pass (GlobalSlots). Nothing about S has to fit in shared
// memory, so S is bounded only by int32. Per-expert state does live in shared memory, hence
// E <= kMaxAdmissionExperts.
//
// Evictable slots: the spec excludes slots stamped with this step (LRU) or owned by an expert
// active in this call (hybrid). These are the same set -- a slot is stamped with the new step only
// by this call's hit bumps, and an active expert that owns a slot is a hit -- so both kernels use
// "usage != step"; the host mirror uses the spec's own rule for each and the tests compare them.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ft/hybrid.hpp"
#include "ft/slotcache_cuda.hpp"

namespace ft::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kRegisterItems = 8;  // slots per thread held in registers: S <= 8192
constexpr int kRound = 32;         // victims chosen per round (one per lane in the merge)
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kNoUsage = INT64_MAX;  // marks "no key"; a real usage never reaches it

static_assert(kWarps == 32, "the merge gives one warp list to each lane of warp 0");
static_assert(kThreads >= kMaxAdmissionExperts, "one thread per expert");

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

struct Shared {
    int32_t active[kMaxAdmissionExperts];    // expert flags of this call
    int32_t expert_slot[kMaxAdmissionExperts];  // slot of each active expert after admission, -1 none
    int32_t missing[kMaxAdmissionExperts];   // missing experts, ascending id
    int32_t order[kMaxAdmissionExperts];     // hybrid by recency: order[r] = expert fetched r-th
    int32_t victims[kMaxAdmissionExperts];   // victims[r] = r-th coldest evictable slot
    int64_t missing_recency[kMaxAdmissionExperts];
    int64_t list_usage[kWarps * kRound];     // per-warp candidate lists of a round
    int32_t list_slot[kWarps * kRound];
    int32_t warp_missing[kWarps], warp_missing_before[kWarps], warp_active[kWarps];
    int32_t missing_count, active_count;
    int64_t step;
    int64_t taken_usage;
    int32_t taken_slot;
};

struct AdmissionArgs {
    SlotCacheState st;
    int32_t layer;
    const int32_t *ids;
    int32_t *slots_out;
    int32_t count;
    HybridFetch fetch;  // hybrid only
};

template <class Slots, bool kHybrid>
__global__ void __launch_bounds__(kThreads) admission_kernel(const AdmissionArgs a) {
    __shared__ Shared sh;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const SlotCacheState &st = a.st;
    const int32_t E = st.shape.experts, S = st.shape.slots, base = a.layer * E;

    if (tid < E) sh.active[tid] = 0;
    if (tid == 0) {
        const int64_t step = *st.step + 1;
        *st.step = step;
        sh.step = step;
    }
    __syncthreads();
    const int64_t step = sh.step;

    // Active set. Ids outside [0, E) take no part (the host API rejects ids >= E).
    for (int32_t p = tid; p < a.count; p += kThreads) {
        const int32_t id = a.ids[p];
        if (id >= 0 && id < E) atomicOr(&sh.active[id], 1);  // not a plain store: racecheck-clean
    }
    __syncthreads();

    // One thread per expert: look it up, stamp a hit with this step, flag a miss.
    bool active = false, missing = false;
    if (tid < E) {
        active = sh.active[tid] != 0;
        int32_t slot = -1;
        if (active) {
            slot = st.slot_for_id[base + tid];
            if (slot >= 0) st.usage[slot] = step;
        }
        sh.expert_slot[tid] = slot;
        missing = active && slot < 0;
    }

    // List the misses in ascending expert id: a block-wide exclusive scan of the miss flags.
    const unsigned missing_bits = __ballot_sync(kFullMask, missing);
    const unsigned active_bits = __ballot_sync(kFullMask, active);
    if (lane == 0) {
        sh.warp_missing[warp] = __popc(missing_bits);
        sh.warp_active[warp] = __popc(active_bits);
    }
    __syncthreads();
    if (warp == 0) {
        const int32_t own = sh.warp_missing[lane];
        int32_t inclusive = own, active_sum = sh.warp_active[lane];
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            const int32_t n = __shfl_up_sync(kFullMask, inclusive, offset);
            if (lane >= offset) inclusive += n;
            active_sum += __shfl_xor_sync(kFullMask, active_sum, offset);
        }
        sh.warp_missing_before[lane] = inclusive - own;
        if (lane == 31) sh.missing_count = inclusive;
        if (lane == 0) sh.active_count = active_sum;
    }
    __syncthreads();
    const int32_t M = sh.missing_count;
    if (missing) {
        const int32_t rank = sh.warp_missing_before[warp] + __popc(missing_bits & ((1u << lane) - 1u));
        sh.missing[rank] = tid;
        if (kHybrid) sh.missing_recency[rank] = st.expert_recency[base + tid];
    }
    const int32_t k = kHybrid ? static_cast<int32_t>(hybrid_fetch_limit(M, a.fetch)) : M;
    __syncthreads();

    // Which miss takes the r-th coldest slot: ascending id (LRU, hybrid lowest_id), or most
    // recently active first with ties to the lower id (hybrid recency; spec's score argmax).
    const int32_t *fetch_order = sh.missing;
    if (kHybrid && a.fetch.order == FetchOrder::Recency && k > 0) {
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
        fetch_order = sh.order;  // read only after the barriers below (k > 0)
    }

    if (k > 0) {
        Slots slots;
        slots.load(st.usage, S, step);  // hit stamps are visible: barriers since they were written
        Key taken{INT64_MIN, INT32_MIN};  // every key up to here is already a victim
        for (int32_t done = 0; done < k; done += kRound) {
            const int32_t R = k - done < kRound ? k - done : kRound;
            // 1. This warp's R smallest keys above `taken`, ascending.
            Key head = slots.min_above(taken);
            for (int32_t r = 0; r < R; ++r) {
                const Key best = warp_min(head);
                if (lane == 0) {
                    sh.list_usage[warp * kRound + r] = best.usage;
                    sh.list_slot[warp * kRound + r] = best.slot;
                }
                if (!is_key(best)) {  // this warp has no more evictable slots; warp-uniform
                    for (int32_t rest = r + 1 + lane; rest < R; rest += 32) {
                        sh.list_usage[warp * kRound + rest] = kNoUsage;
                        sh.list_slot[warp * kRound + rest] = INT32_MAX;
                    }
                    break;
                }
                if (head.slot == best.slot) head = slots.min_above(best);
            }
            __syncthreads();
            // 2. Warp 0 merges: lane j walks warp j's list.
            if (warp == 0) {
                int32_t pos = 0;
                Key cur{sh.list_usage[lane * kRound], sh.list_slot[lane * kRound]};
                Key best = no_key();
                for (int32_t r = 0; r < R; ++r) {
                    best = warp_min(cur);
                    // Cannot run out while S >= E (distinct ids of a layer <= E); -1 keeps the
                    // install below from writing anywhere if the state was corrupted.
                    if (lane == 0) sh.victims[done + r] = is_key(best) ? best.slot : -1;
                    if (is_key(best) && cur.slot == best.slot) {
                        ++pos;
                        cur = pos < R ? Key{sh.list_usage[lane * kRound + pos], sh.list_slot[lane * kRound + pos]}
                                      : no_key();
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

        // Install: miss fetch_order[i] moves into victims[i]. Victims and their old owners are
        // distinct, and no old owner is a miss of this call, so the writes never collide.
        for (int32_t i = tid; i < k; i += kThreads) {
            const int32_t victim = sh.victims[i], expert = fetch_order[i];
            if (victim < 0) continue;
            const int32_t old = st.id_of_slot[victim];
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
        __syncthreads();
    }

    // Rewrite: slot of each routed id, -1 for ids outside the layer and for CPU routes. The
    // thread that writes position p is the one that read it above, so slots_out may alias ids.
    for (int32_t p = tid; p < a.count; p += kThreads) {
        const int32_t id = a.ids[p];
        a.slots_out[p] = (id >= 0 && id < E) ? sh.expert_slot[id] : -1;
    }
    if (kHybrid && a.fetch.order == FetchOrder::Recency && active) st.expert_recency[base + tid] = step;
    if (tid == 0) {
        *st.num_indices = k;
        *st.num_missing_full = M;
        int64_t *row = st.stats + static_cast<int64_t>(a.layer) * kStatColumns;
        row[kStatActive] += sh.active_count;
        row[kStatMissing] += M;
        row[kStatFetched] += k;
        row[kStatCalls] += 1;
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
        admission_kernel<RegisterSlots<kRegisterItems>, kHybrid><<<1, kThreads, 0, stream>>>(args);
    else
        admission_kernel<GlobalSlots, kHybrid><<<1, kThreads, 0, stream>>>(args);
    return cudaGetLastError();
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

cudaError_t launch_slot_cache_clear_stats(const SlotCacheState &state, cudaStream_t stream) {
    if (state.shape.layers <= 0) return cudaErrorInvalidValue;
    clear_stats_kernel<<<1, 256, 0, stream>>>(state);
    return cudaGetLastError();
}

}  // namespace ft::cuda
