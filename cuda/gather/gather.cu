// The zero-copy gather kernel: SM loads that go straight to page-locked host memory
// over PCIe, one launch for every bank of a layer.
//
// Work is cut into chunks of one (plan entry, bank) row, at most chunk_bytes each; a persistent
// grid of CTAs strides over the chunks of the first n = *num_indices entries, so the work (and the
// number of CTAs that do anything) follows the count read on the device, and count 0 costs one
// load per CTA. Each thread keeps `unroll` vector loads in flight before storing them: the link
// needs many outstanding reads (latency x bandwidth is ~100-200 KB on PCIe 5), and a grid-stride
// loop of one load per iteration would leave one per thread. A second kernel (tuning.bulk, sm_90+)
// lets the TMA issue the host reads as whole-chunk bulk copies instead, in case the SMs' 16-byte
// requests cannot fill the link; bench_gather compares the two.
#include <cstdint>

#include "ft/cuda_gather.hpp"

namespace ft::cuda {

namespace detail {

namespace {

struct KernelParams {
    const uint8_t *host[kMaxGatherBanks];
    uint8_t *slots[kMaxGatherBanks];
    uint64_t row_bytes[kMaxGatherBanks];
    uint64_t slot_bytes[kMaxGatherBanks];  // destination stride (>= row_bytes)
    uint64_t chunk_end[kMaxGatherBanks];  // chunks of one entry in banks 0..b together
    int32_t vec_bytes[kMaxGatherBanks];
    const int32_t *evict_slots;
    const int32_t *src_indices;
    const int64_t *num_indices;
    uint64_t chunk_bytes;
    int32_t capacity;
    int32_t num_banks;
};

constexpr size_t kMaxChunkBytes = size_t(1) << 30;  // keeps element counts of a chunk in 32 bits

template <GatherLoad L, typename T>
__device__ __forceinline__ T load(const T *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (L == GatherLoad::nc_l2_256 && sizeof(T) == 16) {
        uint4 v;
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
        return v;
    }
#endif
    if constexpr (L == GatherLoad::nc || L == GatherLoad::nc_l2_256) {
        return __ldg(p);
    } else if constexpr (L == GatherLoad::streaming) {
        return __ldcs(p);
    } else {
        return *p;
    }
}

template <GatherStore S, typename T>
__device__ __forceinline__ void store(T *p, const T &v) {
    if constexpr (S == GatherStore::streaming) {
        __stcs(p, v);
    } else {
        *p = v;
    }
}

// One chunk by the whole CTA. `bytes` is a multiple of sizeof(T) and both pointers are T-aligned
// (gather_vector_bytes chose T so that every row and every chunk offset is).
template <typename T, int U, GatherLoad L, GatherStore S>
__device__ __forceinline__ void copy_chunk(const uint8_t *src, uint8_t *dst, uint64_t bytes) {
    const T *s = reinterpret_cast<const T *>(src);
    T *d = reinterpret_cast<T *>(dst);
    const uint32_t n = static_cast<uint32_t>(bytes / sizeof(T));
    const uint32_t stride = blockDim.x;
    uint32_t i = threadIdx.x;
    // Whole rounds: U independent loads issued before the first store waits on any of them.
    // (n < 2^30 and stride * U <= 4096, so nothing below wraps.)
    for (; i + (U - 1) * stride < n; i += U * stride) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = load<L>(s + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) store<S>(d + i + u * stride, v[u]);
    }
    if (i < n) {  // the last partial round, its loads also all in flight at once
        T v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * stride < n) v[u] = load<L>(s + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * stride < n) store<S>(d + i + u * stride, v[u]);
    }
}

// Chunk v of the plan: entry v / per_entry, then the banks' chunks in order.
struct Piece {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t bytes;
    int vec_bytes;
    bool copy;  // false for an entry with a negative slot or source
};

__device__ __forceinline__ Piece piece_at(const KernelParams &p, uint64_t v, uint64_t per_entry) {
    const uint64_t entry = v / per_entry;
    uint64_t chunk = v - entry * per_entry;
    int b = 0;
    while (chunk >= p.chunk_end[b]) ++b;
    if (b > 0) chunk -= p.chunk_end[b - 1];
    const int32_t dst_slot = p.evict_slots[entry];
    const int32_t src_row = p.src_indices[entry];
    Piece c{};
    c.copy = dst_slot >= 0 && src_row >= 0;
    if (!c.copy) return c;
    const uint64_t row = p.row_bytes[b];
    const uint64_t offset = chunk * p.chunk_bytes;
    c.bytes = row - offset < p.chunk_bytes ? row - offset : p.chunk_bytes;
    c.src = p.host[b] + static_cast<uint64_t>(src_row) * row + offset;
    c.dst = p.slots[b] + static_cast<uint64_t>(dst_slot) * p.slot_bytes[b] + offset;
    c.vec_bytes = p.vec_bytes[b];
    return c;
}

// Planned entries: clamp(*num_indices, 0, capacity).
__device__ __forceinline__ int64_t planned(const KernelParams &p) {
    const int64_t n = *p.num_indices;
    return n <= 0 ? 0 : (n > p.capacity ? p.capacity : n);
}

template <int U, GatherLoad L, GatherStore S>
__device__ __forceinline__ void copy_piece(const Piece &c) {
    switch (c.vec_bytes) {
        case 16:
            copy_chunk<uint4, U, L, S>(c.src, c.dst, c.bytes);
            break;
        case 8:
            copy_chunk<uint2, U, L, S>(c.src, c.dst, c.bytes);
            break;
        case 4:
            copy_chunk<unsigned int, U, L, S>(c.src, c.dst, c.bytes);
            break;
        case 2:
            copy_chunk<unsigned short, U, L, S>(c.src, c.dst, c.bytes);
            break;
        default:
            copy_chunk<unsigned char, U, L, S>(c.src, c.dst, c.bytes);
            break;
    }
}

// Eight 16-byte values in flight need more than the 64 registers a 1024-thread bound leaves.
constexpr int max_threads(int unroll) {
    return unroll >= 8 ? 512 : 1024;
}

template <int U, GatherLoad L, GatherStore S>
__global__ void __launch_bounds__(max_threads(U)) gather_kernel(const __grid_constant__ KernelParams p) {
    const int64_t n = planned(p);
    const uint64_t per_entry = p.chunk_end[p.num_banks - 1];
    const uint64_t total = static_cast<uint64_t>(n) * per_entry;
    // Every value below is uniform across the CTA, so the branches do not diverge.
    for (uint64_t v = blockIdx.x; v < total; v += gridDim.x) {
        const Piece c = piece_at(p, v, per_entry);
        if (c.copy) copy_piece<U, L, S>(c);
    }
}

// ---- Bulk variant (sm_90+): the tensor memory accelerator moves whole chunks ------------------
// Thread 0 keeps `stages` chunks of host reads in flight as cp.async.bulk loads into shared
// memory (one mbarrier per stage), and writes each arrived chunk to its slot with a bulk store.
// Banks that do not allow 16-byte accesses are copied by all threads with plain loads instead.
// An mbarrier wait that never completes would hang the GPU; after ~2^26 polls it traps instead.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kMaxBulkStages = 8;  // the largest unroll

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bulk_issue_load(const Piece &c, uint8_t *buf, uint64_t *bar) {
    if (c.copy && c.vec_bytes == 16) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                     "r"(static_cast<uint32_t>(c.bytes))
                     : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_addr(buf)),
                     "l"(c.src), "r"(static_cast<uint32_t>(c.bytes)), "r"(smem_addr(bar))
                     : "memory");
    } else {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
    }
}

__device__ __forceinline__ void bulk_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    for (uint32_t polls = 0; !done; ++polls) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
        if (polls > (1u << 26)) __trap();
    }
}
#endif

__global__ void __launch_bounds__(1024) gather_bulk_kernel(const __grid_constant__ KernelParams p, int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t buffers[];
    __shared__ __align__(8) uint64_t bars[kMaxBulkStages];
    const int64_t n = planned(p);
    const uint64_t per_entry = p.chunk_end[p.num_banks - 1];
    const uint64_t total = static_cast<uint64_t>(n) * per_entry;
    if (blockIdx.x >= total) return;
    const uint64_t mine = (total - 1 - blockIdx.x) / gridDim.x + 1;  // chunks of this CTA
    const bool leader = threadIdx.x == 0;
    if (leader) {
        for (int s = 0; s < stages; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[s])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (uint64_t k = 0; k < mine && k < static_cast<uint64_t>(stages); ++k)
            bulk_issue_load(piece_at(p, blockIdx.x + k * gridDim.x, per_entry), buffers + k * p.chunk_bytes, &bars[k]);
    }
    __syncthreads();
    for (uint64_t k = 0; k < mine; ++k) {
        const uint64_t stage = k % static_cast<uint64_t>(stages);
        uint8_t *buf = buffers + stage * p.chunk_bytes;
        const Piece c = piece_at(p, blockIdx.x + k * gridDim.x, per_entry);
        const bool bulk = c.copy && c.vec_bytes == 16;
        if (leader) {
            bulk_wait(&bars[stage], static_cast<uint32_t>((k / static_cast<uint64_t>(stages)) & 1));
            if (bulk) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(c.dst),
                             "r"(smem_addr(buf)), "r"(static_cast<uint32_t>(c.bytes))
                             : "memory");
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }
        }
        if (c.copy && !bulk) copy_piece<1, GatherLoad::plain, GatherStore::plain>(c);
        if (leader && k + stages < mine) {
            // The stage's buffer is refilled only after the bulk store has finished reading it.
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            bulk_issue_load(piece_at(p, blockIdx.x + (k + stages) * gridDim.x, per_entry), buf, &bars[stage]);
        }
    }
    if (leader) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
    __trap();  // the launcher only starts this kernel on devices of compute capability 9.0 or later
#endif
}

template <int U, GatherLoad L>
cudaError_t launch_store(const KernelParams &p, const GatherTuning &t, unsigned grid, cudaStream_t stream) {
    if (t.store == GatherStore::streaming) {
        gather_kernel<U, L, GatherStore::streaming><<<grid, t.threads, 0, stream>>>(p);
    } else {
        gather_kernel<U, L, GatherStore::plain><<<grid, t.threads, 0, stream>>>(p);
    }
    return cudaGetLastError();
}

template <int U>
cudaError_t launch_load(const KernelParams &p, const GatherTuning &t, unsigned grid, cudaStream_t stream) {
    switch (t.load) {
        case GatherLoad::nc:
            return launch_store<U, GatherLoad::nc>(p, t, grid, stream);
        case GatherLoad::streaming:
            return launch_store<U, GatherLoad::streaming>(p, t, grid, stream);
        case GatherLoad::nc_l2_256:
            return launch_store<U, GatherLoad::nc_l2_256>(p, t, grid, stream);
        default:
            return launch_store<U, GatherLoad::plain>(p, t, grid, stream);
    }
}

cudaError_t launch_bulk(const KernelParams &p, const GatherTuning &t, unsigned grid, cudaStream_t stream) {
    // Attribute queries are host calls, allowed while a stream is captured.
    int device = 0, major = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e != cudaSuccess) return e;
    const size_t smem = t.chunk_bytes * static_cast<size_t>(t.unroll);
    // The static part (the mbarriers) needs a few bytes of the opt-in limit too.
    if (major < 9 || smem + 1024 > static_cast<size_t>(optin)) return cudaErrorInvalidValue;
    e = cudaFuncSetAttribute(gather_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    gather_bulk_kernel<<<grid, t.threads, smem, stream>>>(p, t.unroll);
    return cudaGetLastError();
}

const char *tuning_error(const GatherTuning &t) {
    if (t.blocks < 1) return "tuning: blocks must be >= 1";
    if (t.threads < 32 || t.threads > 1024 || t.threads % 32 != 0)
        return "tuning: threads must be a multiple of 32 in 32..1024";
    if (t.unroll != 1 && t.unroll != 2 && t.unroll != 4 && t.unroll != 8) return "tuning: unroll must be 1, 2, 4 or 8";
    if (t.threads > max_threads(t.unroll)) return "tuning: unroll 8 allows at most 512 threads";
    if (t.chunk_bytes < 16 || t.chunk_bytes % 16 != 0 || t.chunk_bytes > kMaxChunkBytes)
        return "tuning: chunk_bytes must be a multiple of 16 in 16..1 GiB";
    if (t.bulk && t.chunk_bytes * static_cast<size_t>(t.unroll) > (size_t(1) << 20))
        return "tuning: bulk stages must fit in shared memory";
    return nullptr;
}

}  // namespace

GatherTuning default_gather_tuning() {
    // Reasoned, not yet measured on the H200: 64 CTAs x 512 threads x 4 x 16 B keep 2 MiB of reads
    // requested, ~10x what PCIe 5 needs in flight, while leaving most SMs free for concurrent
    // work. Streaming loads keep the once-read host bytes from evicting L2 lines; plain stores let
    // the expert kernel that runs next find recently written slot bytes in L2.
    return GatherTuning{};
}

int gather_vector_bytes(const GatherBank &bank) {
    const uint64_t bits = static_cast<uint64_t>(bank.row_bytes) | static_cast<uint64_t>(bank.slot_bytes) |
                          reinterpret_cast<uintptr_t>(bank.host_layer) |
                          reinterpret_cast<uintptr_t>(bank.slots);
    for (int w = 16; w > 1; w /= 2)
        if (bits % static_cast<uint64_t>(w) == 0) return w;
    return 1;
}

const char *gather_argument_error(const GatherBank *banks, int num_banks, const GatherPlan &plan) {
    if (num_banks < 1 || num_banks > kMaxGatherBanks) return "num_banks must be in 1..8";
    if (!banks) return "banks is null";
    for (int b = 0; b < num_banks; ++b) {
        if (!banks[b].host_layer || !banks[b].slots) return "a bank has a null host or slot address";
        if (banks[b].row_bytes == 0) return "a bank has row_bytes 0";
        if (banks[b].slot_bytes != 0 && banks[b].slot_bytes < banks[b].row_bytes) return "a bank's slot_bytes is below its row_bytes";
    }
    if (plan.capacity < 0) return "plan capacity < 0";
    if (!plan.evict_slots || !plan.src_indices || !plan.num_indices) return "a plan pointer is null";
    return nullptr;
}

cudaError_t launch_gather_zero_copy_tuned(const GatherBank *banks, int num_banks, const GatherPlan &plan,
                                          const GatherTuning &tuning, cudaStream_t stream) {
    if (gather_argument_error(banks, num_banks, plan) || tuning_error(tuning)) return cudaErrorInvalidValue;
    if (plan.capacity == 0) return cudaSuccess;  // no entry can be planned

    KernelParams p{};
    uint64_t chunks = 0;
    for (int b = 0; b < num_banks; ++b) {
        p.host[b] = banks[b].host_layer;
        p.slots[b] = banks[b].slots;
        p.row_bytes[b] = banks[b].row_bytes;
        p.slot_bytes[b] = banks[b].slot_bytes ? banks[b].slot_bytes : banks[b].row_bytes;
        p.vec_bytes[b] = gather_vector_bytes(banks[b]);
        chunks += (banks[b].row_bytes + tuning.chunk_bytes - 1) / tuning.chunk_bytes;
        p.chunk_end[b] = chunks;
    }
    p.evict_slots = plan.evict_slots;
    p.src_indices = plan.src_indices;
    p.num_indices = plan.num_indices;
    p.chunk_bytes = tuning.chunk_bytes;
    p.capacity = plan.capacity;
    p.num_banks = num_banks;

    // No more CTAs than a full plan has chunks: the rest would only read the count and leave.
    const uint64_t most = chunks * static_cast<uint64_t>(plan.capacity);
    const unsigned grid = static_cast<unsigned>(most < static_cast<uint64_t>(tuning.blocks) ? most : tuning.blocks);
    if (tuning.bulk) return launch_bulk(p, tuning, grid, stream);
    switch (tuning.unroll) {
        case 1:
            return launch_load<1>(p, tuning, grid, stream);
        case 2:
            return launch_load<2>(p, tuning, grid, stream);
        case 4:
            return launch_load<4>(p, tuning, grid, stream);
        default:
            return launch_load<8>(p, tuning, grid, stream);
    }
}

}  // namespace detail

cudaError_t launch_gather_zero_copy(const GatherBank *banks, int num_banks, const GatherPlan &plan,
                                    cudaStream_t stream) {
    static const detail::GatherTuning tuning = detail::default_gather_tuning();
    return detail::launch_gather_zero_copy_tuned(banks, num_banks, plan, tuning, stream);
}

}  // namespace ft::cuda
