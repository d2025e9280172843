// EP dispatch layout on the device (ft/ep_cuda.hpp): the device twin of ft/ep.hpp's
// dispatch_layout (replica choice, dedup mask, send rows), as a chain of kernels or, at decode
// sizes, one block. Also the placement tables' device copy.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "ft/common.hpp"
#include "kernels_common.cuh"

namespace ft::ep::cuda {
namespace {

using namespace detail;

// ---- layout ------------------------------------------------------------------------------------

// Ranks of the token's single-copy experts (the forced_rank_load() bits of one token).
__device__ __forceinline__ uint64_t single_copy_ranks(const DevicePlacement &p, const int32_t *id, int32_t K) {
    uint64_t hit = 0;
    for (int32_t j = 0; j < K; ++j) {
        const int32_t e = id[j];
        if (e >= 0 && e < p.num_experts && p.logcnt[e] == 1)
            hit |= 1ull << rank_of(p, p.log2phy[int64_t(e) * p.num_ranks]);
    }
    return hit;
}

// Replica choice of one token's routes (route_phy[0..K)) and its dedup mask, as dispatch_layout():
// a replicated expert goes to a rank the token already reaches if any, else the least loaded
// replica (ties: lower rank). `load` holds the forced loads of ALL tokens.
__device__ __forceinline__ uint64_t choose_token(const DevicePlacement &p, const int32_t *id, int32_t K,
                                                 const int64_t *load, int32_t *route_phy) {
    uint64_t goes = single_copy_ranks(p, id, K);
    for (int32_t j = 0; j < K; ++j) {
        const int32_t e = id[j];
        if (e < 0 || e >= p.num_experts) {
            route_phy[j] = -1;
            continue;
        }
        const int32_t n = p.logcnt[e];
        const int32_t *reps = p.log2phy + int64_t(e) * p.num_ranks;
        int32_t choice = reps[0];
        if (n > 1) {
            bool any_going = false;
            for (int32_t i = 0; i < n; ++i) any_going = any_going || ((goes >> rank_of(p, reps[i])) & 1);
            choice = -1;
            for (int32_t i = 0; i < n; ++i) {
                const int32_t r = rank_of(p, reps[i]);
                if (any_going && !((goes >> r) & 1)) continue;
                if (choice < 0) {
                    choice = reps[i];
                    continue;
                }
                const int32_t c = rank_of(p, choice);
                if (load[r] < load[c] || (load[r] == load[c] && r < c)) choice = reps[i];
            }
        }
        route_phy[j] = choice;
        goes |= 1ull << rank_of(p, choice);
    }
    return goes;
}

// forced_rank_load(): ranks of each token's single-copy experts, one count per token and rank.
__global__ void forced_load_kernel(DevicePlacement p, const int32_t *ids, int64_t tokens, int32_t K, int64_t *load) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tokens; t += int64_t(gridDim.x) * blockDim.x) {
        uint64_t hit = single_copy_ranks(p, ids + t * K, K);
        while (hit) {
            const int r = __ffsll(static_cast<long long>(hit)) - 1;
            hit &= hit - 1;
            atomicAdd(reinterpret_cast<unsigned long long *>(load + r), 1ull);
        }
    }
}

// Replica choice and the dedup mask of dispatch_layout(), one thread per token.
__global__ void choose_kernel(DevicePlacement p, const int32_t *ids, int64_t tokens, int32_t K, const int64_t *load,
                              int32_t *route_phy, uint64_t *mask) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tokens; t += int64_t(gridDim.x) * blockDim.x)
        mask[t] = choose_token(p, ids + t * K, K, load, route_phy + t * K);
}

// row[r][t]: rows of rank r in ascending token order (an exclusive scan of bit r), one block per
// rank; count[r] the total.
__global__ void row_scan_kernel(const uint64_t *mask, int64_t tokens, int32_t *row, int64_t *count) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    using Scan = cub::BlockScan<int32_t, kScanThreads>;
    __shared__ typename Scan::TempStorage tmp;
    const int r = blockIdx.x;
    int64_t running = 0;
    for (int64_t base = 0; base < tokens; base += kScanThreads) {
        const int64_t t = base + threadIdx.x;
        const int32_t flag = t < tokens ? static_cast<int32_t>((mask[t] >> r) & 1) : 0;
        int32_t excl, total;
        Scan(tmp).ExclusiveSum(flag, excl, total);
        if (t < tokens) row[int64_t(r) * tokens + t] = flag ? static_cast<int32_t>(running + excl) : -1;
        running += total;
        __syncthreads();  // tmp is reused by the next tile
    }
    if (threadIdx.x == 0) count[r] = running;
}

__global__ void offset_kernel(const int64_t *count, int32_t R, int64_t *offset) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int64_t s = 0;
    offset[0] = 0;
    for (int32_t r = 0; r < R; ++r) offset[r + 1] = s += count[r];
}

// expert_count increments of the chain: global 64-bit atomics (the one block counts in shared).
struct GlobalExpertCount {
    int64_t *n;
    __device__ void add(int32_t phy) const { atomicAdd(reinterpret_cast<unsigned long long *>(n + phy), 1ull); }
};

// Send rows of token t: routes in ascending logical id (ties: lower j), per destination rank.
template <typename Count>
__device__ __forceinline__ void send_rows_of(const DevicePlacement &p, const int32_t *ids, const float *weights,
                                             int64_t tokens, int32_t K, int64_t t, const int32_t *route_phy,
                                             uint64_t goes, const int32_t *row, const int64_t *offset, Count count,
                                             int32_t *send_token, int32_t *send_n, int32_t *send_slot,
                                             float *send_weight) {
    const int32_t *id = ids + t * K;
    const int32_t *phy = route_phy + t * K;
    int32_t order[kMaxTopK];
    int32_t m = 0;
    for (int32_t j = 0; j < K; ++j) {
        if (phy[j] < 0) continue;
        // Stable insertion: equal ids keep ascending j.
        int32_t at = m++;
        while (at > 0 && id[order[at - 1]] > id[j]) {
            order[at] = order[at - 1];
            --at;
        }
        order[at] = j;
    }
    while (goes) {
        const int r = __ffsll(static_cast<long long>(goes)) - 1;
        goes &= goes - 1;
        const int64_t out = offset[r] + row[int64_t(r) * tokens + t];
        send_token[out] = static_cast<int32_t>(t);
        int32_t n = 0;
        for (int32_t i = 0; i < m; ++i) {
            const int32_t j = order[i];
            if (rank_of(p, phy[j]) != r) continue;
            send_slot[out * K + n] = phy[j] % p.slots_per_rank;
            send_weight[out * K + n] = weights ? weights[t * K + j] : 1.0f;
            count.add(phy[j]);
            ++n;
        }
        send_n[out] = n;
        for (int32_t i = n; i < K; ++i) {
            send_slot[out * K + i] = -1;
            send_weight[out * K + i] = 0.0f;
        }
    }
}

__global__ void send_rows_kernel(DevicePlacement p, const int32_t *ids, const float *weights, int64_t tokens, int32_t K,
                                 const int32_t *route_phy, const uint64_t *mask, const int32_t *row,
                                 const int64_t *offset, int64_t *expert_count, int32_t *send_token, int32_t *send_n,
                                 int32_t *send_slot, float *send_weight) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tokens; t += int64_t(gridDim.x) * blockDim.x)
        send_rows_of(p, ids, weights, tokens, K, t, route_phy, mask[t], row, offset, GlobalExpertCount{expert_count},
                     send_token, send_n, send_slot, send_weight);
}

// The whole layout in ONE block, for decode sizes (tokens * top_k <= kSmallLayoutRoutes and
// R * S <= kSmallLayoutSlots). At 1..64 tokens the chain above (2 memsets + 5 kernels) costs its
// launches, not its work (~33 us on an H200 at 1 token), and its memsets break the PDL chain;
// this does the same passes with __syncthreads between them, counts in shared memory (integer
// atomics: order-free), and writes every output the chain writes, bit for bit: forced_load (when
// rank_load is null), route_phy, mask, row, count, offset, expert_count and the send_* rows.
//
// A WARP handles a token, lane j its route j (K <= kMaxTopK = 32): what is left at decode sizes
// is the latency of dependent loads, and one thread walking K routes chains ~30 of them (ids ->
// logcnt -> log2phy -> load, per route, then route_phy and weights again). Here every lane issues
// its own loads at once, the per-token sets are warp ORs, the replica choice runs serially over
// values already in registers, and the stable order and send positions come from shuffles,
// ballots and popc. At most 32 tokens (one per warp) the route loads stay in registers from the
// first pass to the last.
constexpr int kSmallLayoutThreads = 1024;
constexpr int64_t kSmallLayoutRoutes = 4096;
constexpr int32_t kSmallLayoutSlots = 4096;  // int32 counters in shared memory: 16 KiB

__device__ __forceinline__ uint64_t warp_or64(uint64_t v) {
    const uint32_t lo = __reduce_or_sync(kFullWarp, static_cast<uint32_t>(v));
    const uint32_t hi = __reduce_or_sync(kFullWarp, static_cast<uint32_t>(v >> 32));
    return (uint64_t(hi) << 32) | lo;
}

// Lane j's route of one token. Lanes >= K and ids out of [0, E) are "no route": id = -1, n = 0.
struct LaneRoute {
    int32_t id = -1, n = 0, phy0 = -1;
    float weight = 0.0f;
};

// All of a lane's loads are independent of each other except logcnt/log2phy on the id.
__device__ __forceinline__ LaneRoute load_lane_route(const DevicePlacement &p, const int32_t *ids,
                                                     const float *weights, int64_t t, int32_t K, int lane) {
    LaneRoute a;
    if (lane >= K) return a;
    const int32_t e = ids[t * K + lane];
    a.weight = weights ? weights[t * K + lane] : 1.0f;
    if (e < 0 || e >= p.num_experts) return a;
    a.id = e;
    a.n = p.logcnt[e];
    a.phy0 = p.log2phy[int64_t(e) * p.num_ranks];
    return a;
}

// single_copy_ranks() of the warp's token: the ranks of its single-copy experts.
__device__ __forceinline__ uint64_t warp_single_copy(const DevicePlacement &p, const LaneRoute &a) {
    return warp_or64(a.id >= 0 && a.n == 1 ? 1ull << rank_of(p, a.phy0) : 0ull);
}

// choose_token() for the warp's token; returns lane's route_phy (-1: no route) and sets `goes`.
// The least loaded replica (ties: lower rank) is the replica whose rank comes first in `spos`,
// the ranks' positions sorted by (load, rank); so each route's candidates are a 64-bit mask in
// that sorted space and the choice is its lowest bit. Routes are taken in ascending j, each
// seeing the ranks chosen before it, as dispatch_layout() does.
__device__ __forceinline__ int32_t warp_choose(const DevicePlacement &p, const LaneRoute &a, int lane,
                                               const int32_t *spos, const int32_t *srank, uint64_t &goes) {
    const bool multi = a.id >= 0 && a.n > 1;
    const int32_t *reps = p.log2phy + int64_t(multi ? a.id : 0) * p.num_ranks;
    uint64_t srep = 0;  // ranks holding a replica of the lane's expert, in sorted space
    if (multi)
        for (int32_t i = 0; i < a.n; ++i) srep |= 1ull << spos[rank_of(p, reps[i])];
    uint64_t sgoes = warp_or64(a.id >= 0 && a.n == 1 ? 1ull << spos[rank_of(p, a.phy0)] : 0ull);
    int32_t mine = -1;  // sorted position of the lane's chosen rank
    for (uint32_t todo = __ballot_sync(kFullWarp, multi); todo; todo &= todo - 1) {
        const int j = __ffs(todo) - 1;
        const uint64_t cand_all = __shfl_sync(kFullWarp, srep, j);
        const uint64_t going = cand_all & sgoes;
        const uint64_t cand = going ? going : cand_all;
        const int32_t sp = __ffsll(static_cast<long long>(cand)) - 1;
        sgoes |= 1ull << sp;
        if (lane == j) mine = sp;
    }
    int32_t phy = -1;
    if (a.id >= 0) {
        phy = a.phy0;
        if (multi) {
            const int32_t want = srank[mine];
            phy = -1;
            for (int32_t i = 0; i < a.n && phy < 0; ++i)
                if (rank_of(p, reps[i]) == want) phy = reps[i];  // the first replica on that rank
        }
    }
    goes = warp_or64(phy >= 0 ? 1ull << rank_of(p, phy) : 0ull);
    return phy;
}

// send_rows_of() for the warp's token: lane j's route goes to rank rank_of(phy) at position
// (routes of that rank before it in ascending id, ties lower j); the lowest lane of each rank
// writes the row's token and n, and the warp pads that row's unused entries.
__device__ __forceinline__ void warp_send_rows(const DevicePlacement &p, int32_t K, int64_t tokens, int64_t t,
                                               int lane, int32_t id, int32_t phy, float weight, const int32_t *row,
                                               const int64_t *offset, int32_t *expert_n, const LayoutBuffers &L) {
    const bool routed = phy >= 0;
    const int32_t r = routed ? rank_of(p, phy) : -1;
    int64_t out = 0;
    if (routed) out = offset[r] + row[int64_t(r) * tokens + t];
    int32_t before = 0;
    for (int32_t i = 0; i < K; ++i) {
        const int32_t id_i = __shfl_sync(kFullWarp, id, i), r_i = __shfl_sync(kFullWarp, r, i);
        before += r_i == r && (id_i < id || (id_i == id && i < lane));
    }
    const uint32_t same = __match_any_sync(kFullWarp, r);  // lanes with no route share r = -1
    const int32_t n = __popc(same);
    if (routed) {
        L.send_slot[out * K + before] = phy % p.slots_per_rank;
        L.send_weight[out * K + before] = weight;
        atomicAdd(expert_n + phy, 1);
        if (lane == __ffs(same) - 1) {
            L.send_token[out] = static_cast<int32_t>(t);
            L.send_n[out] = n;
        }
    }
    for (uint32_t lead = __ballot_sync(kFullWarp, routed && lane == __ffs(same) - 1); lead; lead &= lead - 1) {
        const int l = __ffs(lead) - 1;
        const int64_t o = __shfl_sync(kFullWarp, out, l);
        const int32_t m = __shfl_sync(kFullWarp, n, l);
        if (lane >= m && lane < K) {
            L.send_slot[o * K + lane] = -1;
            L.send_weight[o * K + lane] = 0.0f;
        }
    }
}

__global__ void __launch_bounds__(kSmallLayoutThreads, 1)
small_layout_kernel(DevicePlacement p, const int32_t *ids, const float *weights, int64_t tokens, int32_t K,
                    const int64_t *rank_load, LayoutBuffers L) {
    __shared__ int32_t expert_n[kSmallLayoutSlots];
    __shared__ int32_t forced[kMaxRanks];
    __shared__ int32_t spos[kMaxRanks], srank[kMaxRanks];  // ranks sorted by (load, rank)
    __shared__ int64_t load[kMaxRanks];
    __shared__ int64_t count[kMaxRanks];
    __shared__ int64_t offset[kMaxRanks + 1];
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int32_t R = p.num_ranks, RS = R * p.slots_per_rank;
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int warp = tid / 32, lane = tid % 32, nwarps = nthreads / 32;
    // One token per warp at most: its route loads are issued once, before the first barrier.
    const bool cached = tokens <= nwarps;
    LaneRoute held;
    if (cached && warp < tokens) held = load_lane_route(p, ids, weights, warp, K, lane);
    for (int32_t i = tid; i < RS; i += nthreads) expert_n[i] = 0;
    for (int32_t r = tid; r < R; r += nthreads) forced[r] = 0;
    __syncthreads();
    // Forced loads of every token first: each choice below compares them.
    if (rank_load == nullptr) {
        for (int64_t t = warp; t < tokens; t += nwarps) {
            const LaneRoute a = cached ? held : load_lane_route(p, ids, weights, t, K, lane);
            const uint64_t hit = warp_single_copy(p, a);
            if ((hit >> lane) & 1) atomicAdd(forced + lane, 1);
            if ((hit >> (lane + 32)) & 1) atomicAdd(forced + lane + 32, 1);
        }
        __syncthreads();
        for (int32_t r = tid; r < R; r += nthreads) load[r] = L.forced_load[r] = forced[r];
    } else {
        for (int32_t r = tid; r < R; r += nthreads) load[r] = rank_load[r];
    }
    __syncthreads();
    // Position of rank r in the (load, rank) order: how many ranks come before it.
    for (int32_t r = warp; r < R; r += nwarps) {
        const int64_t lr = load[r];
        const int32_t a = lane, b = lane + 32;
        const bool a_first = a < R && (load[a] < lr || (load[a] == lr && a < r));
        const bool b_first = b < R && (load[b] < lr || (load[b] == lr && b < r));
        const int32_t at = __popc(__ballot_sync(kFullWarp, a_first)) + __popc(__ballot_sync(kFullWarp, b_first));
        if (lane == 0) {
            spos[r] = at;
            srank[at] = r;
        }
    }
    __syncthreads();
    int32_t held_phy = -1;
    for (int64_t t = warp; t < tokens; t += nwarps) {
        const LaneRoute a = cached ? held : load_lane_route(p, ids, weights, t, K, lane);
        uint64_t goes;
        const int32_t phy = warp_choose(p, a, lane, spos, srank, goes);
        if (lane < K) L.route_phy[t * K + lane] = phy;
        if (lane == 0) L.mask[t] = goes;
        held_phy = phy;
    }
    __syncthreads();  // the block's global writes are visible to the whole block past the barrier
    // Row scan, one warp per rank: ballots over 32 tokens at a time, ascending, as the cub scan.
    const uint32_t below = (1u << lane) - 1u;
    for (int32_t r = warp; r < R; r += nwarps) {
        int64_t running = 0;
        for (int64_t base = 0; base < tokens; base += 32) {
            const int64_t t = base + lane;
            const bool flag = t < tokens && ((L.mask[t] >> r) & 1);
            const uint32_t ballot = __ballot_sync(kFullWarp, flag);
            if (t < tokens)
                L.row[int64_t(r) * tokens + t] = flag ? static_cast<int32_t>(running + __popc(ballot & below)) : -1;
            running += __popc(ballot);
        }
        if (lane == 0) count[r] = L.count[r] = running;
    }
    __syncthreads();
    // Offsets: an inclusive warp scan of the counts, ranks lane and lane + 32.
    if (warp == 0) {
        int64_t lo = lane < R ? count[lane] : 0, hi = lane + 32 < R ? count[lane + 32] : 0;
        warp_scan64(lo, hi);
        if (lane == 0) offset[0] = L.offset[0] = 0;
        if (lane < R) offset[lane + 1] = L.offset[lane + 1] = lo;
        if (lane + 32 < R) offset[lane + 33] = L.offset[lane + 33] = hi;
    }
    __syncthreads();
    for (int64_t t = warp; t < tokens; t += nwarps) {
        int32_t id = held.id, phy = held_phy;
        float weight = held.weight;
        if (!cached) {
            const LaneRoute a = load_lane_route(p, ids, weights, t, K, lane);
            id = a.id;
            weight = a.weight;
            phy = lane < K ? L.route_phy[t * K + lane] : -1;
        }
        warp_send_rows(p, K, tokens, t, lane, id, phy, weight, L.row, offset, expert_n, L);
    }
    __syncthreads();
    for (int32_t i = tid; i < RS; i += nthreads) L.expert_count[i] = expert_n[i];
}

}  // namespace

// ---- placement ---------------------------------------------------------------------------------

PlacementBuffer::PlacementBuffer(const Placement &p) {
    const size_t E = static_cast<size_t>(p.num_experts), R = static_cast<size_t>(p.num_ranks);
    if (p.num_ranks < 1 || p.num_ranks > kMaxRanks)
        fail(FT_ERR_UNSUPPORTED, "EP on the GPU supports 1..", kMaxRanks, " ranks, not ", p.num_ranks);
    mem_ = ft::cuda::DeviceBuffer((E + E * R) * sizeof(int32_t), "EP: placement allocation");
    int32_t *mem = mem_.get<int32_t>();
    check_cuda(cudaMemcpy(mem, p.logcnt.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice), "placement upload");
    check_cuda(cudaMemcpy(mem + E, p.log2phy.data(), E * R * sizeof(int32_t), cudaMemcpyHostToDevice),
               "placement upload");
    view_ = {p.num_experts, p.num_ranks, p.slots_per_rank, mem, mem + E};
}

// ---- layout ------------------------------------------------------------------------------------

size_t layout_bytes(int32_t R, int32_t S, int32_t K, int64_t T) {
    const size_t t = static_cast<size_t>(T), r = static_cast<size_t>(R), k = static_cast<size_t>(K);
    return align256(t * k * 4) + align256(t * 8) + align256(r * 8) + align256(r * t * 4) + align256(r * 8) +
           align256((r + 1) * 8) + align256(r * S * 8) + 2 * align256(r * t * 4) + 2 * align256(r * t * k * 4);
}

LayoutBuffers carve_layout(void *base, int32_t R, int32_t S, int32_t K, int64_t T) {
    uint8_t *p = static_cast<uint8_t *>(base);
    const size_t t = static_cast<size_t>(T), r = static_cast<size_t>(R), k = static_cast<size_t>(K);
    LayoutBuffers L;
    L.num_ranks = R;
    L.slots = S;
    L.top_k = K;
    L.max_tokens = T;
    L.route_phy = take<int32_t>(p, t * k);
    L.mask = take<uint64_t>(p, t);
    L.forced_load = take<int64_t>(p, r);
    L.row = take<int32_t>(p, r * t);
    L.count = take<int64_t>(p, r);
    L.offset = take<int64_t>(p, r + 1);
    L.expert_count = take<int64_t>(p, r * S);
    L.send_token = take<int32_t>(p, r * t);
    L.send_n = take<int32_t>(p, r * t);
    L.send_slot = take<int32_t>(p, r * t * k);
    L.send_weight = take<float>(p, r * t * k);
    return L;
}

void launch_layout(const DevicePlacement &p, const int32_t *ids, const float *weights, int64_t tokens, int32_t K,
                   int32_t source_rank, const int64_t *rank_load, const LayoutBuffers &L, cudaStream_t st) {
    const int32_t R = p.num_ranks;
    if (tokens < 0 || tokens > L.max_tokens || K != L.top_k || K < 1 || K > kMaxTopK || R != L.num_ranks ||
        source_rank < 0 || source_rank >= R)
        fail(FT_ERR_INVALID_ARGUMENT, "EP layout: ", tokens, " tokens (max ", L.max_tokens, "), top-k ", K,
             ", source ", source_rank, " of ", R);
    if (tokens * K <= kSmallLayoutRoutes && int64_t(R) * p.slots_per_rank <= kSmallLayoutSlots) {
        launch_pdl(small_layout_kernel, dim3(1), dim3(kSmallLayoutThreads), 0, st, p, ids, weights, tokens, K,
                   rank_load, L);
        check_launch("layout kernel");
        return;
    }
    check_cuda(cudaMemsetAsync(L.expert_count, 0, sizeof(int64_t) * R * p.slots_per_rank, st), "layout clear");
    if (rank_load == nullptr) {
        check_cuda(cudaMemsetAsync(L.forced_load, 0, sizeof(int64_t) * R, st), "layout clear");
        if (tokens > 0) launch_pdl(forced_load_kernel, dim3(grid_for(tokens, 256)), dim3(256), 0, st, p, ids, tokens, K, L.forced_load);
        rank_load = L.forced_load;
    }
    if (tokens > 0)
        launch_pdl(choose_kernel, dim3(grid_for(tokens, 256)), dim3(256), 0, st, p, ids, tokens, K, rank_load, L.route_phy, L.mask);
    launch_pdl(row_scan_kernel, dim3(R), dim3(kScanThreads), 0, st, L.mask, tokens, L.row, L.count);
    launch_pdl(offset_kernel, dim3(1), dim3(1), 0, st, L.count, R, L.offset);
    if (tokens > 0)
        launch_pdl(send_rows_kernel, dim3(grid_for(tokens, 128)), dim3(128), 0, st, p, ids, weights, tokens, K, L.route_phy, L.mask, L.row,
                                                               L.offset, L.expert_count, L.send_token, L.send_n,
                                                               L.send_slot, L.send_weight);
    check_launch("layout kernels");
}

}  // namespace ft::ep::cuda
