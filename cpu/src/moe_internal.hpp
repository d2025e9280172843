// Private state of MoeExecutor, shared by moe_executor.cpp and onednn_matmul.cpp.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "quant.hpp"

namespace ft::cpu {

// act(gate) * up for one intermediate unit, in fp32.
inline float activate(const ActivationSpec &a, float g, float u) {
    switch (a.kind) {
        case FT_ACT_GELU: return 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f)) * u;
        case FT_ACT_GELU_TANH: {
            const float k = 0.79788456080286536f;  // sqrt(2/pi)
            return 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * u;
        }
        case FT_ACT_SWIGLU_CLAMP: {
            g = std::fmin(g, a.limit);
            u = std::fmax(std::fmin(u, a.limit), -a.limit);
            return g / (1.0f + std::exp(-a.alpha * g)) * (u + 1.0f);
        }
        default: return g / (1.0f + std::exp(-g)) * u;  // FT_ACT_SILU
    }
}

// Rows of one work item: pass 1 computes IB gate and IB up rows, pass 2 HB down rows. 32 gives
// every worker independent items even at one token, while amortising the atomic grab.
constexpr int kRowBlock = 32;
// mxfp4 items cover this many 64-byte lines of each K row (see the executor's constructor).
constexpr int kMxfp4Lines = 2;
// Items of the other quantised SIMD groups (not batched): kRowBlock x b rows, b the largest power
// of two up to kMaxItemBlocks that leaves every worker at least kItemsPerWorker items of the pass.
// A kernel call reads its rows as two sequential streams, each started cold (the hardware
// prefetchers ramp up again); longer items spend less of their time in those starts.
// Pass-1 tiles hold kRouteChunk x kRowBlock x kMaxItemBlocks floats per worker (mxfp4 items too).
constexpr int kMaxItemBlocks = 8;
constexpr int kItemsPerWorker = 4;
static_assert(kMxfp4Lines <= kMaxItemBlocks, "mxfp4 items must fit the pass-1 tiles");
// At most this many routes go through one kernel call; more are done in chunks that re-read the
// item's weight block from cache instead of memory.
constexpr int kRouteChunk = 32;
// Output elements per reduction item.
constexpr int kReduceBlock = 512;

// A set of routes that use the same expert weights: one routed expert, or the shared expert.
struct MoeExecutor::Group {
    const uint16_t *gate, *up, *down;  // [inter,H], [inter,H], [H,inter]
    int32_t inter;
    int32_t first_slot, count;         // its routes occupy slots [first_slot, first_slot + count)
    uint16_t *inter_out;               // intermediate of the first slot; row stride `inter`
    bool onednn;
    bool quant;                        // routed expert in a quantised format: banks in `rows`
    bool batched;                      // quantised, dequantised tile by tile for the bf16 GEMV
    const uint8_t *rows[8];            // the expert's row of each bank (quantised formats)
    const float *gu_bias = nullptr;    // bf16 experts with biases: [2I] gate then up, [H] down
    const float *dn_bias = nullptr;
};

// Where each quantised format keeps its matrices in the bank schema (-1: none).
struct BankRoles {
    int gu_data, gu_scale, gu_global, gu_bias, dn_data, dn_scale, dn_global, dn_bias;
};

// A format the executor accepts: its kernels and its banks' row sizes (ft::bank_schema).
struct MoeExecutor::FormatEntry {
    Format format;
    const QuantOps *ops;  // nullptr for bf16
    std::vector<size_t> bank_bytes;
};

// Zeroed bytes starting on a cache line: the prepared activations, whose per-token strides are
// whole lines too, so no vector load of a kernel straddles two lines.
class LineBytes {
public:
    static constexpr size_t kLine = 64;
    static size_t stride(size_t bytes) { return (bytes + kLine - 1) / kLine * kLine; }
    void resize(size_t n) {
        p_.reset(n ? static_cast<uint8_t *>(::operator new(n, std::align_val_t(kLine))) : nullptr);
        if (n) std::memset(p_.get(), 0, n);
    }
    uint8_t *data() const { return p_.get(); }

private:
    struct Free {
        void operator()(uint8_t *p) const { ::operator delete(p, std::align_val_t(kLine)); }
    };
    std::unique_ptr<uint8_t, Free> p_;
};

struct MoeExecutor::Scratch {
    // Formats of the current call: the gate_up bank's and the down bank's (equal unless the
    // layer mixes block formats). Set by run() before the passes.
    int num_banks = 0;
    size_t bank_bytes[8] = {};               // bytes of each bank's row
    uint64_t expert_bytes = 0;               // one routed expert across all banks
    BankRoles roles{};                       // gu_* of the gate_up format, dn_* of the down format
    const QuantOps *gu_ops = nullptr;        // pass 1 and the input preparation (nullptr: bf16)
    const QuantOps *dn_ops = nullptr;        // pass 2 and the intermediate preparation
    bool batched_ok = false;                 // both formats have the batched path at this tier
    size_t act_in_bytes = 0, act_mid_bytes = 0;  // stride of the prepared inputs / intermediates (this call)
    int batched_in_cols = 0, batched_mid_cols = 0;  // bf16 columns of them the batched path reads
    int32_t batched_min = 0;                 // quant_batched_min_tokens over every accepted format
    int p2_block = kRowBlock;                // output rows per pass-2 item (mxfp4: 64 columns)
    int q1_blocks = 1, q2_blocks = 1;        // this call: blocks per item of SIMD quantised groups
    // mxfp4 items that run the SIMD GEMV (not the batched path): 64-byte lines of each K row per
    // item (kMxfp4Lines, see moe_executor.cpp).
    int mxfp4_lines = 1;

    // Preallocated for max_tokens.
    std::vector<uint64_t> keys;              // (expert << 32) | route, sorted to group routes
    std::vector<int32_t> route_slot;         // [T*K]: slot of each route, -1 when skipped
    std::vector<const uint16_t *> xptr;      // [slots]: input row of each slot's token
    std::vector<const uint16_t *> iptr;      // [slots]: intermediate row of each slot
    std::vector<Group> groups;
    std::vector<int64_t> p1_prefix, p2_prefix;  // first work item of each group, pass 1 / 2
    std::vector<uint16_t> inter;             // routed slots * I, then T * shared I
    std::vector<float> route_out;            // [slots, H] fp32 expert outputs, unweighted
    std::vector<float> shared_gate;          // [T]
    std::vector<float> tiles;                // per worker: gate and up tiles of pass 1
    LineBytes act_in;                        // quantised formats: prepared input per token
    LineBytes act_mid;                       // quantised formats: prepared intermediate per routed slot
    std::vector<const uint8_t *> aptr;       // [slots]: prepared input of each slot's token
    std::vector<const uint8_t *> mptr;       // [slots]: prepared intermediate of each slot
    std::vector<const uint16_t *> aptr16, mptr16;  // the same as bf16 rows (batched path)
    std::vector<uint16_t> deq;               // batched path, per worker: 2 * kRowBlock rows of deq_ld
    std::vector<float> deq_scale;            // batched path, per worker: 2 * kRowBlock row factors
    size_t deq_ld = 0;                       // bf16 elements per dequantised row
    std::vector<uint16_t> scaled_x;          // weight on input: [routes, H] bf16 w * x per slot
    std::vector<uint16_t> gathered_x;        // oneDNN path: [routes of one expert, H]
    std::vector<float> gate_up_f32;          // oneDNN path: [routes of one expert, 2 * I]

    // Per call.
    int32_t num_tokens = 0, routed_slots = 0;
    const float *w = nullptr;
    const uint16_t *x = nullptr;
    uint16_t *y = nullptr;
    bool has_shared = false;
    int32_t num_groups = 0;
    int64_t p1_total = 0, p2_total = 0, reduce_total = 0;
    int64_t prep_in_total = 0, prep_mid_total = 0;  // quantised formats: tokens, routed slots
    alignas(64) std::atomic<int64_t> p1_next{0};
    alignas(64) std::atomic<int64_t> p2_next{0};
    alignas(64) std::atomic<int64_t> reduce_next{0};
    alignas(64) std::atomic<int64_t> prep_in_next{0};
    alignas(64) std::atomic<int64_t> prep_mid_next{0};
    alignas(64) std::atomic<int> barrier_count{0};
    alignas(64) std::atomic<int> barrier_gen{0};
};

}  // namespace ft::cpu
