// Admission kernel internals, part 2 (included only by admission.cu, whose header comment
// describes the algorithm): installing a miss, and the three victim searches -- the fast path's
// rounds, the threshold path, the general path.
#pragma once

#include "admission_keys.cuh"

namespace ft::cuda {

namespace {

// Moves `expert` of the layer into `victim` (evicting its owner, `old`) and records plan entry i.
// Victims and their old owners are distinct, and no old owner is a miss of this call, so calls for
// different i never write the same word.
__device__ __forceinline__ void install(const SlotCacheState &st, Shared &sh, int32_t i, int32_t victim,
                                        int32_t old, int32_t base, int32_t expert, int64_t step) {
    if (old >= 0) st.slot_for_id[old] = -1;
    st.id_of_slot[victim] = base + expert;
    st.slot_for_id[base + expert] = victim;
    st.usage[victim] = step;
    // The expert's priority was updated by its own thread before the lookup's barrier.
    if (st.shape.policy.kind == SlotPolicyKind::Frequency) st.priority[victim] = st.expert_priority[base + expert];
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
    const Packing p = packing_for(st, step);

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
            mine = done == 0 ? own.load(victim_keys(st), p, tid, bad, second) : own.min2_from(lo, second);
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
                theirs.load(victim_keys(st), p, winner_thread, ignored, unused);
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
    const Packing p = packing_for(st, step);

    // 1. This thread's keys and their minimum; the warp's minimum.
    bool bad = false;
    uint64_t second = kNoKey, mine;  // second: global path only
    Slots own;  // global path only (the register path's live in `pre`)
    if constexpr (kItems > 0) {
        pre.slots.keys_from_prefetch(p, sh.hit, tid, bad);
        mine = pre.slots.min_from(0);
    } else {
        mine = own.load(victim_keys(st), p, tid, bad, second);
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
    // Hit stamps are visible: barriers since they were written.
    const bool freq = st.shape.policy.kind == SlotPolicyKind::Frequency;
    slots.load(victim_keys(st), freq ? st.usage : nullptr, st.shape.slots, step);
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

}  // namespace

}  // namespace ft::cuda
