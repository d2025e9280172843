// Gather of missed experts (docs/ARCHITECTURE.md, "offload"): after an admission kernel has left a copy plan on the
// device (SlotCacheState::evict_slots / src_indices / num_indices), copy each planned expert's rows
// of every bank from the layer's page-locked host banks into its GPU slot.
//
// Two ways to move the bytes:
// - zero_copy: one kernel whose loads go straight to pinned host memory over PCIe. It reads the
//   count on the device, so it is capturable in a CUDA graph and replays copy exactly the current
//   misses. It occupies SMs while it runs.
// - copy_engine: the DMA engines (cudaMemcpyAsync). They need the plan on the host, so the call
//   synchronises the stream; not capturable.
// Which is faster depends on the machine (the original saw the zero-copy kernel reach ~31 GB/s);
// choose_gather_method measures both.
//
// Plan semantics shared by both methods: n = clamp(*num_indices, 0, capacity) entries; entry i
// copies expert src_indices[i] of the layer (row_bytes at row_bytes apart) to slot evict_slots[i]
// (slot_bytes apart) of every bank. Entries with a
// negative slot or source are skipped. Slots and sources are not range-checked (the admission
// kernels only produce valid ones); destination slots of one plan must be distinct.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ft/cuda_memory.hpp"

namespace ft::cuda {

// Most banks one gather serves (the widest schema, nvfp4 and mxfp4, has six).
inline constexpr int kMaxGatherBanks = 8;

struct GatherBank {
    const uint8_t *host_layer = nullptr;  // device-visible address of the layer's pinned host bank
    uint8_t *slots = nullptr;             // device slot array of this bank
    size_t row_bytes = 0;                 // bytes of one expert in this bank (any size; multiples of
                                          // 16 with 16-byte aligned bases take the 16-byte path)
    // Bytes from one slot to the next (0: row_bytes; else >= row_bytes): slots sized for the
    // largest layer of a model whose layers' rows differ (mixed block formats).
    size_t slot_bytes = 0;
};

struct GatherPlan {  // device pointers, as SlotCacheState holds them
    const int32_t *evict_slots = nullptr;
    const int32_t *src_indices = nullptr;
    const int64_t *num_indices = nullptr;
    int32_t capacity = 0;  // entries the plan arrays hold (an upper bound of the count)
};

enum class GatherMethod { zero_copy, copy_engine };

// Zero-copy: ONE kernel launch for all banks reads the count on the device (0 is a no-op) and
// copies each planned expert's rows of every bank from host memory into its slot. Capturable in a
// CUDA graph: no sync, no allocation, no host reads (the bank addresses, row sizes and plan
// pointers are baked into the launch). Returns cudaErrorInvalidValue (nothing enqueued) for bad
// arguments: num_banks not in 1..kMaxGatherBanks, a null banks/plan pointer or bank address, a
// zero row size, a slot size below the row size, capacity < 0; else the launch status.
cudaError_t launch_gather_zero_copy(const GatherBank *banks, int num_banks, const GatherPlan &plan,
                                    cudaStream_t stream);

// Copy engine: copies the plan (count and entries) to pinned host memory owned by this object,
// synchronises `stream`, then enqueues one cudaMemcpyAsync (cudaMemcpyDefault, so the
// device-visible address of registered memory works as the source) per (run of entries, bank) on
// `stream` and returns without waiting for them. Consecutive entries whose slots and sources both
// ascend by one are merged into one copy. NOT capturable (it reads the plan on the host), and one
// object serves one call at a time. Returns cudaErrorInvalidValue for the argument errors of
// launch_gather_zero_copy or a plan capacity above this object's, else the first CUDA error.
class CopyEngineGather {
public:
    explicit CopyEngineGather(int32_t capacity);  // pinned staging for `capacity` entries; throws ft::Error
    CopyEngineGather(const CopyEngineGather &) = delete;
    CopyEngineGather &operator=(const CopyEngineGather &) = delete;

    cudaError_t gather(const GatherBank *banks, int num_banks, const GatherPlan &plan, cudaStream_t stream);
    int32_t capacity() const { return capacity_; }

private:
    int32_t capacity_ = 0;
    PinnedBuffer staging_;  // int64 count, then capacity slots, capacity sources
};

// Measures both methods on the given banks with a synthetic plan of `count` experts: slots
// 0..count-1 filled from `count` distinct random experts of the layer's `experts_in_layer` (restores
// nothing -- run it before slots hold data; every bank's slot array needs >= count slots). Two
// warm-up calls, then timed back-to-back calls bracketed by events on `stream`; GB/s counts the
// expert bytes moved. Returns the faster method with both figures. Throws ft::Error:
// FT_ERR_INVALID_ARGUMENT for bad banks or count not in 1..experts_in_layer, FT_ERR_DEVICE (or
// FT_ERR_OUT_OF_MEMORY, FT_ERR_DEVICE_LOST) for CUDA failures.
struct GatherChoice {
    GatherMethod method;
    double zero_copy_gbs;
    double copy_engine_gbs;
};
GatherChoice choose_gather_method(const GatherBank *banks, int num_banks, int32_t experts_in_layer, int32_t count,
                                  cudaStream_t stream);

// The synthetic plan of the measurements (choose_gather_method, the profiler's gather rig), in
// int32 words as the device plan lays it out: the int64 count first (keeps it aligned), then the
// `count` destination slots 0..count-1, then their sources: `count` distinct experts of
// 0..experts-1 in the random order `seed` draws.
std::vector<int32_t> synthetic_gather_plan(int64_t experts, int32_t count, uint32_t seed);
// The GatherPlan of such a plan copied to the device at `device_plan`.
GatherPlan synthetic_gather_plan_view(const void *device_plan, int32_t count);

// ---- Tuning of the zero-copy kernel (for bench_gather and the tests) -----------------------------
namespace detail {

// ld.global, ld.global.nc, ld.global.cs, and ld.global.nc.L1::no_allocate.L2::256B (asks L2 to
// fetch 256-byte blocks, i.e. larger reads over the bus; 16-byte accesses only, else as nc).
enum class GatherLoad { plain, nc, streaming, nc_l2_256 };
enum class GatherStore { plain, streaming };  // st.global, st.global.cs

// The kernel runs `blocks` persistent CTAs of `threads` threads that stride over chunks of
// `chunk_bytes` of one (entry, bank) each; every thread keeps `unroll` loads of the bank's vector
// width (16 bytes where aligned) in flight before storing them.
struct GatherTuning {
    int blocks = 64;
    int threads = 512;              // multiple of 32 in 32..1024 (..512 with unroll 8)
    int unroll = 4;                 // 1, 2, 4, 8
    size_t chunk_bytes = 64 << 10;  // multiple of 16 in 16..1 GiB
    GatherLoad load = GatherLoad::streaming;
    GatherStore store = GatherStore::plain;
    // Compute capability 9.0+ only (else cudaErrorInvalidValue): thread 0 of each CTA moves
    // 16-byte-aligned chunks with cp.async.bulk through `unroll` shared-memory stages of
    // chunk_bytes each (they must fit the opt-in shared memory); load and store are ignored.
    bool bulk = false;
};

// What launch_gather_zero_copy uses (the member defaults above).
GatherTuning default_gather_tuning();

// launch_gather_zero_copy with explicit tuning; cudaErrorInvalidValue also for a tuning outside
// the ranges above.
cudaError_t launch_gather_zero_copy_tuned(const GatherBank *banks, int num_banks, const GatherPlan &plan,
                                          const GatherTuning &tuning, cudaStream_t stream);

// The widest access (16, 8, 4, 2 or 1 bytes) that every row of the bank can use: the largest power
// of two dividing the row size, the slot size and both base addresses.
int gather_vector_bytes(const GatherBank &bank);

// Why these arguments cannot be gathered, nullptr when they can (shared by both methods).
const char *gather_argument_error(const GatherBank *banks, int num_banks, const GatherPlan &plan);

}  // namespace detail

}  // namespace ft::cuda
