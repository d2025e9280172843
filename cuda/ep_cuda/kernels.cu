// The EP kernels: device twins of ft/ep.hpp's layout, pack_dispatch, group_by_expert,
// unpack_payload, reduce_partials and combine_at_source. Comments name the host rule each one
// mirrors; the tests compare them bit for bit.
#include <cub/block/block_scan.cuh>

#include <cub/block/block_radix_sort.cuh>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_launch.cuh"
#include "ft/cuda_numerics.cuh"
#include "ft/ep_cuda.hpp"

namespace ft::ep::cuda {

using ft::cuda::launch_pdl;
using ft::cuda::pdl_wait;

void check_cuda(cudaError_t err, const char *what) { ft::cuda::check_cuda(err, "EP: ", what); }

namespace {

// The device decoders of the expert kernels (ft::cuda), not the host ones of ft/common.hpp.
using ::ft::cuda::bf16_to_f32;
using ::ft::cuda::e4m3_to_f32;
using ::ft::cuda::e8m0_to_f32;

constexpr int kScanThreads = 256;

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

template <typename T>
T *take(uint8_t *&p, size_t count) {
    T *out = reinterpret_cast<T *>(p);
    p += align256(count * sizeof(T));
    return out;
}

int grid_for(int64_t items, int per_block, int cap = 8192) {
    const int64_t g = (items + per_block - 1) / per_block;
    return static_cast<int>(std::clamp<int64_t>(g, 1, cap));
}

// Host ft::f32_to_bf16 exactly (NaN keeps its payload with the quiet bit set), so even NaN rows
// match the reference byte for byte.
__device__ __forceinline__ uint16_t to_bf16(float f) {
    uint32_t bits = __float_as_uint(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

// Host ft::f32_to_e4m3: round to nearest even, saturating, NaN -> 0x7F whatever its sign.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
    if (isnan(v)) return 0x7f;
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Four consecutive bf16 values (8-byte aligned) to fp32, and back.
__device__ __forceinline__ void load4(const uint16_t *p, float (&v)[4]) {
    const uint2 raw = *reinterpret_cast<const uint2 *>(p);
    v[0] = bf16_to_f32(raw.x & 0xffffu);
    v[1] = bf16_to_f32(raw.x >> 16);
    v[2] = bf16_to_f32(raw.y & 0xffffu);
    v[3] = bf16_to_f32(raw.y >> 16);
}

__device__ __forceinline__ void store4(uint16_t *p, const float (&v)[4]) {
    uint2 out;
    out.x = uint32_t(to_bf16(v[0])) | (uint32_t(to_bf16(v[1])) << 16);
    out.y = uint32_t(to_bf16(v[2])) | (uint32_t(to_bf16(v[3])) << 16);
    *reinterpret_cast<uint2 *>(p) = out;
}

// Decode multiplier of FP8 wire block b: an fp32 scale or an e8m0 exponent byte.
__device__ __forceinline__ float block_scale(const uint8_t *scales, int64_t b, WireDtype dtype) {
    return dtype == WireDtype::Fp8Fp32 ? reinterpret_cast<const float *>(scales)[b] : e8m0_to_f32(scales[b]);
}

// The four e4m3 bytes of a word (lowest first), each times the block's multiplier: one fp32
// multiply, as the host's dequantize_fp8_row.
__device__ __forceinline__ void dequant4(uint32_t q, float scale, float (&v)[4]) {
    for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(e4m3_to_f32(static_cast<uint8_t>(q >> (8 * i))), scale);
}

__device__ __forceinline__ int32_t rank_of(const DevicePlacement &p, int32_t phy) { return phy / p.slots_per_rank; }

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
constexpr uint32_t kFullWarp = 0xffffffffu;

// Inclusive sums over the warp of two values per lane, lo for index lane and hi for lane + 32
// (ranks and sources, R <= kMaxRanks = 64). Integer sums, so equal to the serial running sums.
__device__ __forceinline__ void warp_scan64(int64_t &lo, int64_t &hi) {
    const int lane = threadIdx.x % 32;
    for (int d = 1; d < 32; d <<= 1) {
        const int64_t lo_up = __shfl_up_sync(kFullWarp, lo, d), hi_up = __shfl_up_sync(kFullWarp, hi, d);
        if (lane >= d) {
            lo += lo_up;
            hi += hi_up;
        }
    }
    hi += __shfl_sync(kFullWarp, lo, 31);
}

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

// ---- pack + quantise ---------------------------------------------------------------------------

struct RecordGeom {
    uint32_t payload_bytes, scales, scale_bytes, token, source, n, weight, slot, bytes;
};

RecordGeom geom(int64_t hidden, int32_t K, WireDtype dtype) {
    const RecordLayout L = record_layout(hidden, K, dtype);
    return {static_cast<uint32_t>(L.payload_bytes), static_cast<uint32_t>(L.scales), static_cast<uint32_t>(L.scale_bytes),
            static_cast<uint32_t>(L.token), static_cast<uint32_t>(L.source), static_cast<uint32_t>(L.n),
            static_cast<uint32_t>(L.weight), static_cast<uint32_t>(L.slot), static_cast<uint32_t>(L.bytes)};
}

constexpr int kPackThreads = 128;  // 4 warps; each warp quantises one 128-channel block at a time

// One 128-channel block: lane holds channels 4*lane .. 4*lane+3. The dispatch records and the
// FP8 combine rows are both encoded here. Returns the block's decode multiplier (what
// dequantize_fp8_row multiplies by); v and word receive the lane's inputs and e4m3 bytes.
__device__ __forceinline__ float quantise_block(const uint16_t *xb, uint8_t *qb, uint8_t *scale_at, WireDtype dtype,
                                                int lane, float (&v)[4], uint32_t &word) {
    load4(xb + 4 * lane, v);
    float amax = 0.0f;
    for (int i = 0; i < 4; ++i) {
        const float a = fabsf(v[i]);
        if (isfinite(a)) amax = fmaxf(amax, a);
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    amax = fmaxf(amax, kAmaxFloor);
    word = 0;
    float scale;
    if (dtype == WireDtype::Fp8Fp32) {
        const float inv = kE4m3Max / amax;
        for (int i = 0; i < 4; ++i) word |= uint32_t(to_e4m3(v[i] * inv)) << (8 * i);
        scale = amax / kE4m3Max;
        if (lane == 0) *reinterpret_cast<float *>(scale_at) = scale;
    } else {
        const uint32_t bits = __float_as_uint(amax / kE4m3Max);
        const int e = int((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
        for (int i = 0; i < 4; ++i) word |= uint32_t(to_e4m3(ldexpf(v[i], -e))) << (8 * i);
        if (lane == 0) *scale_at = static_cast<uint8_t>(e + 127);
        scale = e8m0_to_f32(static_cast<uint8_t>(e + 127));
    }
    *reinterpret_cast<uint32_t *>(qb + 4 * lane) = word;
    return scale;
}

__global__ void pack_kernel(const int64_t *offset, int32_t R, const int32_t *send_token, const int32_t *send_n,
                            const int32_t *send_slot, const float *send_weight, int32_t K, const uint16_t *x,
                            int64_t hidden, WireDtype dtype, int32_t source_rank, uint8_t *base, size_t peer_bytes,
                            RecordGeom g, const int64_t *header_count) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    // Latency mode: block 0 also writes the per-peer headers (header_kernel's work, one launch
    // fewer at decode sizes). The grid has at least one block, whatever the row count.
    if (header_count && blockIdx.x == 0)
        for (int32_t r = threadIdx.x; r < R; r += blockDim.x) {
            int64_t *h = reinterpret_cast<int64_t *>(base + r * peer_bytes);
            h[0] = header_count[r];
            h[1] = 0;
        }
    const int64_t total = offset[R];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t i = blockIdx.x; i < total; i += gridDim.x) {
        uint8_t *rec;
        if (peer_bytes == 0) {
            rec = base + i * g.bytes;
        } else {
            int32_t r = 0;
            while (r + 1 < R && offset[r + 1] <= i) ++r;
            rec = base + r * peer_bytes + kPeerHeaderBytes + (i - offset[r]) * g.bytes;
        }
        const uint16_t *xt = x + int64_t(send_token[i]) * hidden;
        const int64_t blocks = hidden / kWireBlock;
        if (dtype == WireDtype::Bf16) {
            // 8 bytes per thread, in order.
            for (int64_t c = threadIdx.x; c < hidden / 4; c += blockDim.x)
                reinterpret_cast<uint2 *>(rec)[c] = reinterpret_cast<const uint2 *>(xt)[c];
        } else {
            const size_t sb = dtype == WireDtype::Fp8Fp32 ? 4 : 1;
            float v[4];
            uint32_t word;
            for (int64_t b = warp; b < blocks; b += kPackThreads / 32)
                quantise_block(xt + b * kWireBlock, rec + b * kWireBlock, rec + g.scales + b * sb, dtype, lane, v,
                               word);
        }
        // Metadata, and zero in every padding byte (the host memsets the record first).
        const uint32_t scales_end = g.scales + g.scale_bytes;
        for (uint32_t at = scales_end + threadIdx.x; at < g.token; at += blockDim.x) rec[at] = 0;
        if (threadIdx.x == 0) {
            *reinterpret_cast<int32_t *>(rec + g.token) = send_token[i];
            *reinterpret_cast<int16_t *>(rec + g.source) = static_cast<int16_t>(source_rank);
            *reinterpret_cast<int16_t *>(rec + g.n) = static_cast<int16_t>(send_n[i]);
        }
        for (int32_t j = threadIdx.x; j < K; j += blockDim.x) {
            *reinterpret_cast<float *>(rec + g.weight + 4 * j) = send_weight[i * K + j];
            *reinterpret_cast<int16_t *>(rec + g.slot + 2 * j) = static_cast<int16_t>(send_slot[i * K + j]);
        }
        for (uint32_t at = g.slot + 2 * K + threadIdx.x; at < g.bytes; at += blockDim.x) rec[at] = 0;
    }
}

__global__ void header_kernel(const int64_t *count, int32_t R, uint8_t *base, size_t peer_bytes) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int r = threadIdx.x;
    if (r >= R) return;
    int64_t *h = reinterpret_cast<int64_t *>(base + r * peer_bytes);
    h[0] = count[r];
    h[1] = 0;
}

// ---- receive side ----------------------------------------------------------------------------


// One warp: lane l reads the counts of sources l and l + 32 at once (the headers or the matrix
// column), so the kernel waits for one round of loads instead of R in a row.
__global__ void receive_counts_kernel(int64_t *count, int64_t *prefix, int32_t R, const uint8_t *base,
                                      size_t peer_bytes, int64_t capacity, const int64_t *matrix, int32_t me,
                                      int32_t stride) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    if (threadIdx.x >= 32) return;
    const int32_t lane = threadIdx.x;
    int64_t c[2] = {0, 0};
    for (int h = 0; h < 2; ++h) {
        const int32_t s = lane + 32 * h;
        if (s >= R) continue;
        c[h] = matrix ? matrix[int64_t(s) * stride + me] : *reinterpret_cast<const int64_t *>(base + s * peer_bytes);
        // A header can only come from a peer's pack kernel; clamping keeps a corrupt one in bounds.
        if (!matrix) c[h] = c[h] < 0 ? 0 : (c[h] > capacity ? capacity : c[h]);
    }
    int64_t lo = c[0], hi = c[1];
    warp_scan64(lo, hi);
    if (lane == 0) prefix[0] = 0;
    if (lane < R) {
        count[lane] = c[0];
        prefix[lane + 1] = lo;
    }
    if (lane + 32 < R) {
        count[lane + 32] = c[1];
        prefix[lane + 33] = hi;
    }
}

// Records of chunk c: source s contributes [count*c/C, count*(c+1)/C) (ChunkPlan::begin/end);
// the virtual index v runs over them, sources ascending. first[s] is prefix[s] (where source s's
// records start when the region is packed), kept here so that a position needs no global load.
struct ChunkTable {
    int64_t begin[kMaxRanks];
    int64_t first[kMaxRanks];
    int64_t vstart[kMaxRanks + 1];
};

// Warp 0 fills the table: lane l takes sources l and l + 32, so all count and prefix loads are in
// flight together; vstart is a warp scan of the per-source lengths. Needs blockDim.x >= 32.
__device__ void load_chunk_table(ChunkTable &tab, const int64_t *count, const int64_t *prefix, int32_t R, int32_t c,
                                 int32_t C) {
    if (threadIdx.x < 32) {
        const int32_t lane = threadIdx.x;
        int64_t n[2] = {0, 0}, p[2] = {0, 0}, len[2] = {0, 0};
        for (int h = 0; h < 2; ++h) {
            const int32_t s = lane + 32 * h;
            if (s >= R) continue;
            n[h] = count[s];
            p[h] = prefix[s];
        }
        for (int h = 0; h < 2; ++h) {
            const int32_t s = lane + 32 * h;
            if (s >= R) continue;
            const int64_t b = n[h] * c / C;
            tab.begin[s] = b;
            tab.first[s] = p[h];
            len[h] = n[h] * (c + 1) / C - b;
        }
        warp_scan64(len[0], len[1]);
        if (lane == 0) tab.vstart[0] = 0;
        if (lane < R) tab.vstart[lane + 1] = len[0];
        if (lane + 32 < R) tab.vstart[lane + 33] = len[1];
    }
    __syncthreads();
}

struct RecvGeom {
    const uint8_t *base;
    size_t peer_bytes;
    int64_t capacity;
    uint32_t bytes;
};

// (source, index) of virtual record v -> its position. The source is the last s with
// vstart[s] <= v (the serial scan's answer, empty sources skipped): a binary search over the
// non-decreasing vstart, log2(kMaxRanks) shared loads at most, no global ones.
__device__ __forceinline__ int64_t position_of(const ChunkTable &tab, int32_t R, const RecvGeom &rg, int64_t v,
                                               int32_t &source) {
    int32_t s = 0;
#pragma unroll
    for (int32_t step = kMaxRanks / 2; step > 0; step >>= 1)
        if (s + step < R && tab.vstart[s + step] <= v) s += step;
    source = s;
    const int64_t i = tab.begin[s] + (v - tab.vstart[s]);
    return rg.peer_bytes ? s * rg.capacity + i : tab.first[s] + i;
}

__device__ __forceinline__ const uint8_t *record_at(const RecvGeom &rg, int64_t pos) {
    if (rg.peer_bytes == 0) return rg.base + pos * rg.bytes;
    // 32-bit division where it fits (always at decode sizes): a 64-bit one is a long call.
    int64_t s, i;
    if (pos >= 0 && pos <= INT32_MAX && rg.capacity > 0 && rg.capacity <= INT32_MAX) {
        const uint32_t p32 = static_cast<uint32_t>(pos), c32 = static_cast<uint32_t>(rg.capacity);
        s = p32 / c32;
        i = p32 % c32;
    } else {
        s = pos / rg.capacity;
        i = pos % rg.capacity;
    }
    return rg.base + s * rg.peer_bytes + kPeerHeaderBytes + i * rg.bytes;
}

__device__ __forceinline__ int32_t rec_n(const uint8_t *rec, const RecordGeom &g) {
    return *reinterpret_cast<const int16_t *>(rec + g.n);
}
__device__ __forceinline__ int32_t rec_slot(const uint8_t *rec, const RecordGeom &g, int32_t j) {
    return *reinterpret_cast<const int16_t *>(rec + g.slot + 2 * j);
}

// Counting pass of group_by_expert. It also copies each record's slots into the dense
// route_slot (the placement pass then reads 2K bytes per record instead of scattered records)
// and clears route_row.
__global__ void group_count_kernel(const int64_t *count, const int64_t *prefix, int32_t R, RecvGeom rg, RecordGeom g,
                                   int32_t K, int32_t S, int32_t c, int32_t C, int64_t *fill, int32_t *route_row,
                                   int16_t *route_slot) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ ChunkTable tab;
    load_chunk_table(tab, count, prefix, R, c, C);
    const int64_t total = tab.vstart[R];
    for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < total; v += int64_t(gridDim.x) * blockDim.x) {
        int32_t s;
        const int64_t pos = position_of(tab, R, rg, v, s);
        const uint8_t *rec = record_at(rg, pos);
        const int32_t n = rec_n(rec, g);
        for (int32_t j = 0; j < K; ++j) {
            int32_t slot = j < n ? rec_slot(rec, g, j) : -1;
            if (slot < 0 || slot >= S) slot = -1;
            route_slot[pos * K + j] = static_cast<int16_t>(slot);
            route_row[pos * K + j] = -1;
            if (slot >= 0) atomicAdd(reinterpret_cast<unsigned long long *>(fill + slot), 1ull);
        }
    }
}

__global__ void group_scan_kernel(const int64_t *fill, int32_t S, int64_t max_rows, int64_t *offset, int32_t *overflow) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    if (threadIdx.x != 0) return;
    offset[0] = 0;
    for (int32_t s = 0; s < S; ++s) offset[s + 1] = offset[s] + fill[s];
    if (offset[S] > max_rows) *overflow = 1;
}

// Placement pass: one block per local slot scans the chunk's records in order (kFillItems
// consecutive records per thread), so each slot's rows come out in (record, route) order without
// atomics.
constexpr int kFillThreads = 512, kFillItems = 4;

__global__ void __launch_bounds__(kFillThreads)
group_fill_kernel(const int64_t *count, const int64_t *prefix, int32_t R, RecvGeom rg, int32_t K, int32_t c, int32_t C,
                  const int64_t *offset, int64_t max_rows, const int16_t *route_slot, int32_t *route_row,
                  int64_t *row_position, int32_t *row_route) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    using Scan = cub::BlockScan<int32_t, kFillThreads>;
    __shared__ ChunkTable tab;
    __shared__ typename Scan::TempStorage tmp;
    load_chunk_table(tab, count, prefix, R, c, C);
    const int32_t slot = blockIdx.x;
    const int64_t total = tab.vstart[R];
    int64_t running = offset[slot];
    for (int64_t base = 0; base < total; base += int64_t(kFillThreads) * kFillItems) {
        int64_t pos[kFillItems];
        int32_t mine[kFillItems], excl[kFillItems];
        for (int i = 0; i < kFillItems; ++i) {
            const int64_t v = base + int64_t(threadIdx.x) * kFillItems + i;
            mine[i] = 0;
            pos[i] = -1;
            if (v < total) {
                int32_t s;
                pos[i] = position_of(tab, R, rg, v, s);
                for (int32_t j = 0; j < K; ++j) mine[i] += route_slot[pos[i] * K + j] == slot;
            }
        }
        int32_t tile;
        Scan(tmp).ExclusiveSum(mine, excl, tile);
        for (int i = 0; i < kFillItems; ++i) {
            if (!mine[i]) continue;
            int64_t row = running + excl[i];
            for (int32_t j = 0; j < K; ++j) {
                if (route_slot[pos[i] * K + j] != slot) continue;
                if (row < max_rows) {
                    row_position[row] = pos[i];
                    row_route[row] = j;
                    route_row[pos[i] * K + j] = static_cast<int32_t>(row);
                }
                ++row;
            }
        }
        running += tile;
        __syncthreads();  // tmp is reused by the next tile
    }
}

// group_by_expert in ONE block, for decode sizes (max_positions * top_k <= kSmallGroupRoutes,
// slots <= kSmallGroupSlots). The chain (memset + count, scan, fill kernels) costs ~20 us of
// launches at 1 token; this clears expert_fill itself and runs the same passes with
// __syncthreads between them. Counting pass: group_count_kernel's writes, counts in shared
// memory, one thread per ROUTE (record n and slot j loaded together, kSmallGroupBatch routes'
// loads in flight per thread before any store), and each route's slot kept in shared memory as
// the placement's sort key. Scan: one cub scan of the slots (same offsets and overflow rule as
// group_scan_kernel). Placement: the chunk's routes q = v * K + j, taken 1024 at a time in
// ascending q, are stably radix-sorted by slot, so a route's rank among its slot's routes of the
// tile is its distance from the start of its slot's run; adding the rows placed by earlier tiles
// gives exactly group_fill_kernel's (record, route) order per slot. Positions come from the chunk
// table in shared memory; the only global loads are the counts and the records' metadata.
constexpr int kSmallGroupThreads = 512, kSmallGroupItems = 2, kSmallGroupBatch = 4;
constexpr int kSmallGroupTile = kSmallGroupThreads * kSmallGroupItems;
constexpr int64_t kSmallGroupRoutes = 8192;
constexpr int32_t kSmallGroupSlots = kSmallGroupTile;  // the offset scan holds one slot per item
static_assert(kSmallGroupSlots < 65535 && kSmallGroupTile <= 32767, "slot keys and run starts are 16-bit");

// Route q = v * K + j -> (v, j), in 32 bits where q fits (a 64-bit division is a long call).
__device__ __forceinline__ void split_route(int64_t q, int32_t K, int64_t &v, int32_t &j) {
    if (q <= INT32_MAX) {
        const int32_t q32 = static_cast<int32_t>(q);
        v = q32 / K;
        j = q32 % K;
    } else {
        v = q / K;
        j = static_cast<int32_t>(q % K);
    }
}

__global__ void __launch_bounds__(kSmallGroupThreads)
small_group_kernel(RecvGeom rg, RecordGeom g, int32_t c, int32_t C, ReceiveBuffers B) {
    using Sort = cub::BlockRadixSort<uint32_t, kSmallGroupThreads, kSmallGroupItems, int32_t>;
    using Scan = cub::BlockScan<int64_t, kSmallGroupThreads>;
    __shared__ union {
        typename Sort::TempStorage sort;
        typename Scan::TempStorage scan;
    } tmp;
    __shared__ ChunkTable tab;
    __shared__ int32_t placed[kSmallGroupSlots];  // routes per slot, then rows placed so far
    // expert_offset; int32 is enough: the rows are at most the routes, and q is an int32 below.
    __shared__ int32_t first[kSmallGroupSlots + 1];
    __shared__ int16_t run_start[kSmallGroupSlots];      // sorted index where a slot's run begins
    __shared__ uint16_t sorted_slot[kSmallGroupTile];    // the tile's sorted keys
    __shared__ uint16_t route_key[kSmallGroupRoutes];    // route q's slot, S for none (the sort key)
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int32_t R = B.num_ranks, K = B.top_k, S = B.slots;
    const int tid = threadIdx.x;
    for (int32_t s = tid; s < S; s += kSmallGroupThreads) placed[s] = 0;
    load_chunk_table(tab, B.count, B.prefix, R, c, C);  // ends in __syncthreads
    const int64_t total = tab.vstart[R];
    const int64_t routes = total * K;
    for (int64_t q0 = tid; q0 < routes; q0 += int64_t(kSmallGroupBatch) * kSmallGroupThreads) {
        int64_t pos[kSmallGroupBatch];
        int32_t slot[kSmallGroupBatch], route[kSmallGroupBatch];
        // Loads of every route of the batch first: a store in between could alias them.
#pragma unroll
        for (int u = 0; u < kSmallGroupBatch; ++u) {
            const int64_t q = q0 + int64_t(u) * kSmallGroupThreads;
            pos[u] = -1;
            slot[u] = -1;
            route[u] = 0;
            if (q < routes) {
                int64_t v;
                int32_t src;
                split_route(q, K, v, route[u]);
                pos[u] = position_of(tab, R, rg, v, src);
                const uint8_t *rec = record_at(rg, pos[u]);
                // Slot j < K lies in the record whatever n says, so both loads go out at once.
                const int32_t n = rec_n(rec, g), sl = rec_slot(rec, g, route[u]);
                slot[u] = route[u] < n && sl >= 0 && sl < S ? sl : -1;
            }
        }
#pragma unroll
        for (int u = 0; u < kSmallGroupBatch; ++u) {
            const int64_t q = q0 + int64_t(u) * kSmallGroupThreads;
            if (q >= routes) continue;
            B.route_slot[pos[u] * K + route[u]] = static_cast<int16_t>(slot[u]);
            B.route_row[pos[u] * K + route[u]] = -1;
            if (slot[u] >= 0) atomicAdd(placed + slot[u], 1);
            if (q < kSmallGroupRoutes) route_key[q] = static_cast<uint16_t>(slot[u] >= 0 ? slot[u] : S);
        }
    }
    __syncthreads();
    {
        int64_t n[kSmallGroupItems], excl[kSmallGroupItems], rows;
        for (int i = 0; i < kSmallGroupItems; ++i) {
            const int32_t s = tid * kSmallGroupItems + i;
            n[i] = s < S ? placed[s] : 0;
        }
        Scan(tmp.scan).ExclusiveSum(n, excl, rows);
        for (int i = 0; i < kSmallGroupItems; ++i) {
            const int32_t s = tid * kSmallGroupItems + i;
            if (s >= S) continue;
            first[s] = static_cast<int32_t>(excl[i]);
            B.expert_offset[s] = excl[i];
            B.expert_fill[s] = n[i];
        }
        if (tid == 0) {
            first[S] = static_cast<int32_t>(rows);
            B.expert_offset[S] = rows;
            if (rows > B.max_rows) *B.overflow = 1;
        }
    }
    __syncthreads();  // placed[] was read; first[], route_key[] and the route_* writes are visible
    for (int32_t s = tid; s < S; s += kSmallGroupThreads) placed[s] = 0;
    const int end_bit = 32 - __clz(S);  // keys 0..S, S = "no slot" (sorts last)
    for (int64_t base = 0; base < routes; base += kSmallGroupTile) {
        uint32_t key[kSmallGroupItems];
        int32_t q[kSmallGroupItems];
        for (int i = 0; i < kSmallGroupItems; ++i) {
            const int64_t qq = base + tid * kSmallGroupItems + i;
            q[i] = static_cast<int32_t>(qq);
            key[i] = static_cast<uint32_t>(S);
            if (qq >= routes) continue;
            if (qq < kSmallGroupRoutes) {
                key[i] = route_key[qq];
            } else {  // past the launch bound (counts larger than the buffers promise): reread
                int64_t v;
                int32_t j, src;
                split_route(qq, K, v, j);
                const int32_t slot = B.route_slot[position_of(tab, R, rg, v, src) * K + j];
                if (slot >= 0) key[i] = static_cast<uint32_t>(slot);
            }
        }
        __syncthreads();  // tmp (scan or the previous tile's sort) and placed[] are free
        Sort(tmp.sort).Sort(key, q, 0, end_bit);
        for (int i = 0; i < kSmallGroupItems; ++i)
            sorted_slot[tid * kSmallGroupItems + i] = static_cast<uint16_t>(key[i]);
        __syncthreads();
        for (int i = 0; i < kSmallGroupItems; ++i) {
            const int32_t at = tid * kSmallGroupItems + i;
            if (key[i] < uint32_t(S) && (at == 0 || sorted_slot[at - 1] != key[i]))
                run_start[key[i]] = static_cast<int16_t>(at);
        }
        __syncthreads();
        for (int i = 0; i < kSmallGroupItems; ++i) {
            const int32_t at = tid * kSmallGroupItems + i;
            if (key[i] >= uint32_t(S)) continue;
            const int64_t row = int64_t(first[key[i]]) + placed[key[i]] + (at - run_start[key[i]]);
            if (row >= B.max_rows) continue;
            int64_t v;
            int32_t j, src;
            split_route(q[i], K, v, j);
            const int64_t pos = position_of(tab, R, rg, v, src);
            B.row_position[row] = pos;
            B.row_route[row] = j;
            B.route_row[pos * K + j] = static_cast<int32_t>(row);
        }
        __syncthreads();  // every thread has read placed[] for this tile
        for (int i = 0; i < kSmallGroupItems; ++i) {
            const int32_t at = tid * kSmallGroupItems + i;
            if (key[i] < uint32_t(S) && (at + 1 == kSmallGroupTile || sorted_slot[at + 1] != key[i]))
                placed[key[i]] += at - run_start[key[i]] + 1;
        }
    }
}

constexpr int kUnpackThreads = 128;

// Global loads that stay where they are written (asm volatile): the compiler sinks plain loads
// below a bound check that does not need them, back into the chain of dependent loads.
__device__ __forceinline__ int64_t load_early(const int64_t *p) {
    int64_t v;
    asm volatile("ld.global.s64 %0, [%1];" : "=l"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}
__device__ __forceinline__ int32_t load_early(const int32_t *p) {
    int32_t v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}

// unpack_payload(): e4m3 * scale in fp32 (or the bf16 values), per expert row.
__global__ void unpack_kernel(const int64_t *offset, int32_t S, int64_t max_rows, RecvGeom rg, RecordGeom g,
                              int64_t hidden, WireDtype dtype, const int64_t *row_position, const int32_t *row_route,
                              uint16_t *x_bf16, float *x_f32, int32_t *row_source, int32_t *row_token,
                              float *row_weight) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    const int64_t rows = offset[S];
    for (int64_t row = blockIdx.x; row < max_rows; row += gridDim.x) {
        // The row's position and route are read BEFORE its count is known, so the three loads go
        // out together: every row below max_rows lies in the buffers, and the values of a row at
        // or past the count are never used.
        const int64_t position = load_early(row_position + row);
        const int32_t route = load_early(row_route + row);
        if (row >= rows) break;
        const uint8_t *rec = record_at(rg, position);
        if (threadIdx.x == 0) {
            // The three metadata loads before the first store (a store could alias them).
            const int32_t source = *reinterpret_cast<const int16_t *>(rec + g.source);
            const int32_t token = *reinterpret_cast<const int32_t *>(rec + g.token);
            const float weight = *reinterpret_cast<const float *>(rec + g.weight + 4 * route);
            row_source[row] = source;
            row_token[row] = token;
            row_weight[row] = weight;
        }
        for (int64_t c4 = threadIdx.x; c4 < hidden / 4; c4 += blockDim.x) {
            float v[4];
            if (dtype == WireDtype::Bf16)
                load4(reinterpret_cast<const uint16_t *>(rec) + 4 * c4, v);
            else
                dequant4(reinterpret_cast<const uint32_t *>(rec)[c4], block_scale(rec + g.scales, c4 * 4 / kWireBlock, dtype),
                         v);
            if (x_bf16) store4(x_bf16 + row * hidden + 4 * c4, v);
            if (x_f32) reinterpret_cast<float4 *>(x_f32 + row * hidden)[c4] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
}

constexpr int kReduceThreads = 256;

// reduce_partials(): acc = fma(weight_j, y_j, acc) over the record's routes in order, four
// channels per thread (each channel's chain is the host's).
__global__ void reduce_kernel(const int64_t *count, const int64_t *prefix, int32_t R, RecvGeom rg, RecordGeom g,
                              int32_t K, int32_t c, int32_t C, int64_t hidden, const int32_t *route_row,
                              const uint16_t *y, uint16_t *partial) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ ChunkTable tab;
    __shared__ float w[kMaxTopK];
    __shared__ int32_t yrow[kMaxTopK];
    __shared__ int32_t n;
    load_chunk_table(tab, count, prefix, R, c, C);
    const int64_t total = tab.vstart[R];
    for (int64_t v = blockIdx.x; v < total; v += gridDim.x) {
        int32_t s;
        const int64_t pos = position_of(tab, R, rg, v, s);
        const uint8_t *rec = record_at(rg, pos);
        if (threadIdx.x == 0) n = min(rec_n(rec, g), K);
        if (threadIdx.x < K) {
            w[threadIdx.x] = *reinterpret_cast<const float *>(rec + g.weight + 4 * threadIdx.x);
            yrow[threadIdx.x] = route_row[pos * K + threadIdx.x];
        }
        __syncthreads();
        for (int64_t h = 4 * threadIdx.x; h < hidden; h += 4 * blockDim.x) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, yv[4];
            for (int32_t j = 0; j < n; ++j) {
                if (yrow[j] < 0) continue;
                load4(y + int64_t(yrow[j]) * hidden + h, yv);
                for (int i = 0; i < 4; ++i) acc[i] = fmaf(w[j], yv[i], acc[i]);
            }
            store4(partial + pos * hidden + h, acc);
        }
        __syncthreads();
    }
}

// combine_at_source(): fp32 sum from 0 over ranks in ascending order, then bf16.
__global__ void combine_kernel(const int32_t *row, const int64_t *offset, int32_t R, int64_t tokens,
                               const uint16_t *partial, int64_t peer_rows, int64_t hidden, uint16_t *out) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ int64_t base[kMaxRanks];
    for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        for (int32_t r = threadIdx.x; r < R; r += blockDim.x) {
            const int32_t rr = row[int64_t(r) * tokens + t];
            base[r] = rr < 0 ? -1 : ((peer_rows ? r * peer_rows : offset[r]) + rr) * hidden;
        }
        __syncthreads();
        for (int64_t h = 4 * threadIdx.x; h < hidden; h += 4 * blockDim.x) {
            float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pv[4];
            for (int32_t r = 0; r < R; ++r) {
                if (base[r] < 0) continue;
                load4(partial + base[r] + h, pv);
                for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(sum[i], pv[i]);
            }
            store4(out + t * hidden + h, sum);
        }
        __syncthreads();  // base is rewritten for the next token
    }
}

// ---- FP8 combine -------------------------------------------------------------------------------

constexpr int kEncodeThreads = 128;  // 4 warps; each warp encodes one 128-channel block at a time

// encode_combine_row() for the records of chunk c not from `me` (positions prefix[s] + i), with the
// dispatch quantiser, and the gate's measure: per row ||dequant - x|| / ||x|| in double (0 for a
// zero row, +Inf with a non-finite value), max-ed into *max_bits as fp32 bits.
__global__ void __launch_bounds__(kEncodeThreads)
encode_combine_kernel(const int64_t *count, const int64_t *prefix, int32_t R, int32_t me, int32_t c, int32_t C,
                      int64_t hidden, WireDtype dtype, uint32_t row_bytes, const uint16_t *partial, uint8_t *wire,
                      uint32_t *max_bits) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    constexpr int kWarps = kEncodeThreads / 32;
    __shared__ ChunkTable tab;
    __shared__ double err_w[kWarps], norm_w[kWarps];
    __shared__ int bad_w[kWarps];
    load_chunk_table(tab, count, prefix, R, c, C);
    const RecvGeom rg{nullptr, 0, 0, 0};
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t total = tab.vstart[R], blocks = hidden / kWireBlock;
    const uint32_t sb = dtype == WireDtype::Fp8Fp32 ? 4 : 1;
    const uint32_t used = static_cast<uint32_t>(hidden + blocks * sb);
    for (int64_t v = blockIdx.x; v < total; v += gridDim.x) {
        int32_t source;
        const int64_t pos = position_of(tab, R, rg, v, source);
        if (source == me) continue;  // the source's own rows stay bf16 (same v for the whole block)
        const uint16_t *row = partial + pos * hidden;
        uint8_t *out = wire + pos * row_bytes;
        double err = 0, norm = 0;
        int bad = 0;
        for (int64_t b = warp; b < blocks; b += kWarps) {
            float x[4];
            uint32_t word;
            const float scale = quantise_block(row + b * kWireBlock, out + b * kWireBlock, out + hidden + b * sb,
                                               dtype, lane, x, word);
            float back[4];
            dequant4(word, scale, back);
            for (int i = 0; i < 4; ++i) {
                bad |= !isfinite(x[i]);
                const double d = static_cast<double>(back[i]) - static_cast<double>(x[i]);
                err += d * d;
                norm += static_cast<double>(x[i]) * x[i];
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            err += __shfl_xor_sync(0xffffffffu, err, o);
            norm += __shfl_xor_sync(0xffffffffu, norm, o);
        }
        bad = __any_sync(0xffffffffu, bad);
        if (lane == 0) {
            err_w[warp] = err;
            norm_w[warp] = norm;
            bad_w[warp] = bad;
        }
        for (uint32_t at = used + threadIdx.x; at < row_bytes; at += blockDim.x) out[at] = 0;
        __syncthreads();
        if (threadIdx.x == 0) {
            double e = 0, n = 0;
            int any_bad = 0;
            for (int w = 0; w < kWarps; ++w) {
                e += err_w[w];
                n += norm_w[w];
                any_bad |= bad_w[w];
            }
            const float rel = any_bad ? INFINITY : (n > 0 ? static_cast<float>(sqrt(e) / sqrt(n)) : 0.0f);
            atomicMax(max_bits, __float_as_uint(rel));  // non-negative floats order as their bits
        }
        __syncthreads();  // err_w is rewritten for the next row
    }
}

// combine_at_source_wire(): fp32 sum from 0 over ranks in ascending order of the decoded rows
// (e4m3 * scale, one fp32 multiply; the own row's bf16 values), then bf16.
__global__ void combine_wire_kernel(const int32_t *row, const int64_t *offset, int32_t R, int64_t tokens,
                                    const uint8_t *wire, uint32_t row_bytes, WireDtype dtype, int32_t me,
                                    const uint16_t *own, const int64_t *own_first, int64_t hidden, uint16_t *out) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ int64_t base[kMaxRanks];  // bytes into wire, or elements into own for r == me
    for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        for (int32_t r = threadIdx.x; r < R; r += blockDim.x) {
            const int32_t rr = row[int64_t(r) * tokens + t];
            base[r] = rr < 0 ? -1 : (r == me ? (*own_first + rr) * hidden : (offset[r] + rr) * int64_t(row_bytes));
        }
        __syncthreads();
        for (int64_t h = 4 * threadIdx.x; h < hidden; h += 4 * blockDim.x) {
            float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pv[4];
            for (int32_t r = 0; r < R; ++r) {
                if (base[r] < 0) continue;
                if (r == me) {
                    load4(own + base[r] + h, pv);
                } else {
                    const uint8_t *rp = wire + base[r];
                    dequant4(*reinterpret_cast<const uint32_t *>(rp + h), block_scale(rp + hidden, h / kWireBlock, dtype),
                             pv);
                }
                for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(sum[i], pv[i]);
            }
            store4(out + t * hidden + h, sum);
        }
        __syncthreads();  // base is rewritten for the next token
    }
}

// The gate word of the count exchange: bit 0 = (max error > limit), bits 32..63 = its fp32 bits.
__global__ void gate_word_kernel(const uint32_t *max_bits, float limit, int64_t *word) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const uint32_t bits = *max_bits;
    const int64_t tripped = __uint_as_float(bits) <= limit ? 0 : 1;
    *word = tripped | static_cast<int64_t>(static_cast<uint64_t>(bits) << 32);
}

void check_launch(const char *what) { check_cuda(cudaGetLastError(), what); }

RecvGeom recv_geom(const RecvRegion &src, const RecordGeom &g) {
    return {src.base, src.peer_bytes, src.capacity, g.bytes};
}

}  // namespace

// ---- placement ---------------------------------------------------------------------------------

PlacementBuffer::PlacementBuffer(const Placement &p) {
    const size_t E = static_cast<size_t>(p.num_experts), R = static_cast<size_t>(p.num_ranks);
    if (p.num_ranks < 1 || p.num_ranks > kMaxRanks)
        fail(FT_ERR_UNSUPPORTED, "EP on the GPU supports 1..", kMaxRanks, " ranks, not ", p.num_ranks);
    check_cuda(cudaMalloc(&mem_, (E + E * R) * sizeof(int32_t)), "placement allocation");
    check_cuda(cudaMemcpy(mem_, p.logcnt.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice), "placement upload");
    check_cuda(cudaMemcpy(mem_ + E, p.log2phy.data(), E * R * sizeof(int32_t), cudaMemcpyHostToDevice),
               "placement upload");
    view_ = {p.num_experts, p.num_ranks, p.slots_per_rank, mem_, mem_ + E};
}

PlacementBuffer::~PlacementBuffer() { cudaFree(mem_); }

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

void launch_pack(const LayoutBuffers &L, int64_t max_rows, const uint16_t *x, int64_t hidden, WireDtype dtype,
                 int32_t source_rank, const WireRegion &dst, cudaStream_t st) {
    const RecordGeom g = geom(hidden, L.top_k, dtype);
    if (reinterpret_cast<uintptr_t>(x) % 8 || reinterpret_cast<uintptr_t>(dst.base) % 16 || dst.peer_bytes % 16)
        fail(FT_ERR_INVALID_ARGUMENT, "EP pack: x must be 8-byte and the wire buffer 16-byte aligned");
    // Latency mode: pack_kernel's block 0 writes the headers unless there is no pack kernel.
    const bool fused_header = dst.peer_bytes && max_rows > 0;
    if (dst.peer_bytes && !fused_header)
        launch_pdl(header_kernel, dim3(1), dim3(kMaxRanks), 0, st, L.count, L.num_ranks, dst.base, dst.peer_bytes);
    if (max_rows > 0)
        launch_pdl(pack_kernel, dim3(grid_for(max_rows, 1, 16384)), dim3(kPackThreads), 0, st, 
            L.offset, L.num_ranks, L.send_token, L.send_n, L.send_slot, L.send_weight, L.top_k, x, hidden, dtype,
            source_rank, dst.base, dst.peer_bytes, g, fused_header ? static_cast<const int64_t *>(L.count) : nullptr);
    check_launch("pack kernel");
}

// ---- receive -----------------------------------------------------------------------------------

size_t receive_bytes(int32_t R, int32_t S, int32_t K, int64_t T, int64_t rows) {
    const size_t pos = static_cast<size_t>(R) * static_cast<size_t>(T), r = static_cast<size_t>(R);
    const size_t n = static_cast<size_t>(rows);
    return align256(r * 8) + align256((r + 1) * 8) + align256((S + 1) * 8) + align256(S * 8) + align256(pos * K * 4) +
           align256(pos * K * 2) + align256(n * 8) + 4 * align256(n * 4) + align256(4);
}

ReceiveBuffers carve_receive(void *base, int32_t R, int32_t S, int32_t K, int64_t T, int64_t rows) {
    uint8_t *p = static_cast<uint8_t *>(base);
    const size_t pos = static_cast<size_t>(R) * static_cast<size_t>(T), n = static_cast<size_t>(rows);
    ReceiveBuffers B;
    B.num_ranks = R;
    B.slots = S;
    B.top_k = K;
    B.max_positions = static_cast<int64_t>(pos);
    B.max_rows = rows;
    B.count = take<int64_t>(p, R);
    B.prefix = take<int64_t>(p, R + 1);
    B.expert_offset = take<int64_t>(p, S + 1);
    B.expert_fill = take<int64_t>(p, S);
    B.route_row = take<int32_t>(p, pos * K);
    B.route_slot = take<int16_t>(p, pos * K);
    B.row_position = take<int64_t>(p, n);
    B.row_route = take<int32_t>(p, n);
    B.row_source = take<int32_t>(p, n);
    B.row_token = take<int32_t>(p, n);
    B.row_weight = take<float>(p, n);
    B.overflow = take<int32_t>(p, 1);
    return B;
}

void launch_receive_counts(const ReceiveBuffers &B, const RecvRegion &src, const int64_t *count_matrix, int32_t me,
                           cudaStream_t st, int32_t matrix_stride) {
    if (matrix_stride != 0 && matrix_stride < B.num_ranks)
        fail(FT_ERR_INVALID_ARGUMENT, "EP receive counts: matrix stride ", matrix_stride, " < ", B.num_ranks, " ranks");
    launch_pdl(receive_counts_kernel, dim3(1), dim3(32), 0, st, B.count, B.prefix, B.num_ranks, src.base, src.peer_bytes, src.capacity,
                                            count_matrix, me, matrix_stride ? matrix_stride : B.num_ranks);
    check_launch("receive counts");
}

void launch_group(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, int32_t c,
                  int32_t C, cudaStream_t st) {
    if (C < 1 || c < 0 || c >= C) fail(FT_ERR_INVALID_ARGUMENT, "EP group: chunk ", c, " of ", C);
    const RecordGeom g = geom(hidden, B.top_k, dtype);
    const RecvGeom rg = recv_geom(src, g);
    if (B.max_positions * B.top_k <= kSmallGroupRoutes && B.slots >= 1 &&
        B.slots <= kSmallGroupSlots) {
        launch_pdl(small_group_kernel, dim3(1), dim3(kSmallGroupThreads), 0, st, rg, g, c, C, B);
        check_launch("group kernel");
        return;
    }
    check_cuda(cudaMemsetAsync(B.expert_fill, 0, sizeof(int64_t) * B.slots, st), "group clear");
    launch_pdl(group_count_kernel, dim3(grid_for(B.max_positions, 256, 1024)), dim3(256), 0, st, 
        B.count, B.prefix, B.num_ranks, rg, g, B.top_k, B.slots, c, C, B.expert_fill, B.route_row, B.route_slot);
    launch_pdl(group_scan_kernel, dim3(1), dim3(1), 0, st, B.expert_fill, B.slots, B.max_rows, B.expert_offset, B.overflow);
    launch_pdl(group_fill_kernel, dim3(B.slots), dim3(kFillThreads), 0, st, B.count, B.prefix, B.num_ranks, rg, B.top_k, c, C,
                                                        B.expert_offset, B.max_rows, B.route_slot, B.route_row,
                                                        B.row_position, B.row_route);
    check_launch("group kernels");
}

void launch_unpack(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, uint16_t *x_bf16,
                   float *x_f32, cudaStream_t st) {
    const RecordGeom g = geom(hidden, B.top_k, dtype);
    if (B.max_rows > 0)
        launch_pdl(unpack_kernel, dim3(grid_for(B.max_rows, 1, 16384)), dim3(kUnpackThreads), 0, st, 
            B.expert_offset, B.slots, B.max_rows, recv_geom(src, g), g, hidden, dtype, B.row_position, B.row_route,
            x_bf16, x_f32, B.row_source, B.row_token, B.row_weight);
    check_launch("unpack kernel");
}

void launch_reduce(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, int32_t c,
                   int32_t C, const uint16_t *y, uint16_t *partial, cudaStream_t st) {
    if (C < 1 || c < 0 || c >= C) fail(FT_ERR_INVALID_ARGUMENT, "EP reduce: chunk ", c, " of ", C);
    const RecordGeom g = geom(hidden, B.top_k, dtype);
    if (B.max_positions > 0)
        launch_pdl(reduce_kernel, dim3(grid_for(B.max_positions, 1, 16384)), dim3(kReduceThreads), 0, st, 
            B.count, B.prefix, B.num_ranks, recv_geom(src, g), g, B.top_k, c, C, hidden, B.route_row, y, partial);
    check_launch("reduce kernel");
}

void launch_combine(const LayoutBuffers &L, int64_t tokens, const uint16_t *partial, int64_t peer_rows, int64_t hidden,
                    uint16_t *out, cudaStream_t st) {
    if (reinterpret_cast<uintptr_t>(out) % 8 || reinterpret_cast<uintptr_t>(partial) % 8)
        fail(FT_ERR_INVALID_ARGUMENT, "EP combine: output and partials must be 8-byte aligned");
    if (tokens > 0)
        launch_pdl(combine_kernel, dim3(grid_for(tokens, 1, 16384)), dim3(256), 0, st, L.row, L.offset, L.num_ranks, tokens, partial,
                                                                   peer_rows, hidden, out);
    check_launch("combine kernel");
}

// ---- FP8 combine ---------------------------------------------------------------------------------

void launch_encode_combine(const ReceiveBuffers &B, int64_t hidden, WireDtype dtype, int32_t me, int32_t c, int32_t C,
                           const uint16_t *partial, uint8_t *wire, uint32_t *max_error_bits, cudaStream_t st) {
    if (dtype == WireDtype::Bf16) fail(FT_ERR_INVALID_ARGUMENT, "EP combine encoding: the wire is bf16");
    if (C < 1 || c < 0 || c >= C) fail(FT_ERR_INVALID_ARGUMENT, "EP combine encoding: chunk ", c, " of ", C);
    const size_t rb = combine_row_bytes(hidden, dtype);
    if (reinterpret_cast<uintptr_t>(wire) % 4 || reinterpret_cast<uintptr_t>(partial) % 8)
        fail(FT_ERR_INVALID_ARGUMENT, "EP combine encoding: wire must be 4-byte and partials 8-byte aligned");
    if (B.max_positions > 0)
        launch_pdl(encode_combine_kernel, dim3(grid_for(B.max_positions, 1, 16384)), dim3(kEncodeThreads), 0, st, 
            B.count, B.prefix, B.num_ranks, me, c, C, hidden, dtype, static_cast<uint32_t>(rb), partial, wire,
            max_error_bits);
    check_launch("combine encoding kernel");
}

void launch_combine_wire(const LayoutBuffers &L, int64_t tokens, const uint8_t *wire, WireDtype dtype, int32_t me,
                         const uint16_t *own_partial, const int64_t *own_first, int64_t hidden, uint16_t *out,
                         cudaStream_t st) {
    if (dtype == WireDtype::Bf16) fail(FT_ERR_INVALID_ARGUMENT, "EP combine (wire): the wire is bf16");
    if (me < 0 || me >= L.num_ranks) fail(FT_ERR_INVALID_ARGUMENT, "EP combine (wire): rank ", me, " of ", L.num_ranks);
    if (reinterpret_cast<uintptr_t>(out) % 8 || reinterpret_cast<uintptr_t>(own_partial) % 8 ||
        reinterpret_cast<uintptr_t>(wire) % 4)
        fail(FT_ERR_INVALID_ARGUMENT, "EP combine (wire): misaligned output, partials or wire");
    const size_t rb = combine_row_bytes(hidden, dtype);
    if (tokens > 0)
        launch_pdl(combine_wire_kernel, dim3(grid_for(tokens, 1, 16384)), dim3(256), 0, st, L.row, L.offset, L.num_ranks, tokens, wire,
                                                                        static_cast<uint32_t>(rb), dtype, me,
                                                                        own_partial, own_first, hidden, out);
    check_launch("combine (wire) kernel");
}

void launch_gate_word(const uint32_t *max_error_bits, float limit, int64_t *word, cudaStream_t st) {
    launch_pdl(gate_word_kernel, dim3(1), dim3(1), 0, st, max_error_bits, limit, word);
    check_launch("gate word kernel");
}

}  // namespace ft::ep::cuda
