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
// Policies: the key value of a slot is its usage (LRU) or its priority (Frequency: each active
// expert's thread updates the expert's priority and its slot's copy; an install copies the
// expert's priority into the victim). Only the values the keys are packed from change; which
// slots are evictable does not.
//
// Evictable slots: the rule excludes slots stamped with this step (LRU) or owned by an expert
// active in this call (hybrid). These are the same set -- a slot is stamped with the new step only
// by this call's hit bumps, and an active expert that owns a slot is a hit -- so both kernels use
// "usage != step"; the host mirror uses the rule as stated for each and the tests compare them.
//
// Files: admission_keys.cuh (constants, warp primitives, key packing, slot holders, shared state),
// admission_victims.cuh (install and the three victim searches), this file (the kernel, its
// launchers, reset and statistics).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ft/admission_trace.hpp"
#include "ft/cuda_launch.cuh"
#include "ft/hybrid.hpp"
#include "ft/slotcache_cuda.hpp"

#include "admission_keys.cuh"
#include "admission_victims.cuh"

namespace ft::cuda {

namespace {

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
    if constexpr (kItems > 0) pre.slots.prefetch(victim_keys(st), st.shape.slots, tid);
    const bool freq = st.shape.policy.kind == SlotPolicyKind::Frequency;
    const int64_t old_priority = freq && tid < E ? st.expert_priority[base + tid] : 0;
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
            int64_t priority = 0;
            if (freq) {  // every access, hit or miss, counts for the expert
                priority = frequency_priority(old_priority, step, st.shape.policy.half_life);
                st.expert_priority[base + tid] = priority;
            }
            if (slot >= 0) {
                st.usage[slot] = step;
                if (freq) st.priority[slot] = priority;
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
        // Frequency: every priority is range-checked against the packing itself.
        const bool packable = freq || static_cast<uint64_t>(step) < (uint64_t{1} << (63 - slot_bits));
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
        !st.num_indices || !st.num_missing_full || !st.expert_recency || !st.stats || !st.priority ||
        !st.expert_priority)
        return cudaErrorInvalidValue;
    if (s.policy.kind != SlotPolicyKind::Lru &&
        (s.policy.kind != SlotPolicyKind::Frequency || s.policy.half_life < 1 || s.policy.half_life > (int64_t{1} << 40)))
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
        st.expert_priority[i] = 0;
    }
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < st.shape.slots; i += stride) {
        st.id_of_slot[i] = -1;
        st.usage[i] = 0;
        st.priority[i] = 0;
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
