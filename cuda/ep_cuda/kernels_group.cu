// EP receive side on the device (ft/ep_cuda.hpp): the per-source record counts and
// group_by_expert (rows of each local slot in (record, route) order), as a chain of kernels or,
// at decode sizes, one block.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "ft/common.hpp"
#include "kernels_common.cuh"

namespace ft::ep::cuda {
namespace {

using namespace detail;


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

}  // namespace

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

}  // namespace ft::ep::cuda
