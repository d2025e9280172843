// Expert parallelism, host side (cuda/ep_cuda/README.md): expert placement and its planner, the
// dispatch layout with dedup per destination rank, the FP8 e4m3 wire format with one scale per
// 128 channels, the combine reduction, chunk planning for throughput mode and a model of the
// bytes on the wire.
//
// Everything here is the scalar reference the GPU kernels must reproduce bit for bit: every rule
// that a kernel could implement two ways (replica choice, rounding, summation order) is fixed in
// the comments below. Nothing here touches a device or a communicator.
//
// Terms. R ranks (GPUs), E logical experts, S physical slots per rank; physical expert
// p = rank * S + slot. T tokens on the source rank, K routes per token (top-k). H channels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ft::ep {

// ---- placement (5.4 step 5: EPLB-compatible maps) ------------------------------------------

// Where each logical expert lives. Replicas of one expert are always on distinct ranks, so on a
// given rank a logical expert has at most one slot.
struct Placement {
    int32_t num_experts = 0;        // E
    int32_t num_ranks = 0;          // R
    int32_t slots_per_rank = 0;     // S
    std::vector<int32_t> phy2log;   // [R*S] logical expert of physical p = rank * S + slot
    std::vector<int32_t> logcnt;    // [E] replicas of each logical expert, >= 1
    std::vector<int32_t> log2phy;   // [E*R] physical ids of expert e in ascending order, then -1

    int32_t rank_of(int32_t phy) const { return phy / slots_per_rank; }
    int32_t slot_of(int32_t phy) const { return phy % slots_per_rank; }
};

// Validates phy2log ([R*S], every expert placed, replicas on distinct ranks) and derives the
// other maps. Throws FT_ERR_INVALID_ARGUMENT naming the first violation.
Placement make_placement(int32_t num_experts, int32_t num_ranks, std::vector<int32_t> phy2log);

// Expert e on rank e / (E / R), slot e % (E / R); E a multiple of R.
Placement contiguous_placement(int32_t num_experts, int32_t num_ranks);

// ---- placement planner (5.4) ----------------------------------------------------------------

struct PlannerInput {
    int32_t num_experts = 0;
    int32_t num_ranks = 0;
    int32_t replicas = 0;                // extra physical copies; (E + replicas) % R == 0
    std::vector<double> load;            // [E] tokens per expert (moving average), >= 0
    std::vector<double> coactivation;    // [E*E] symmetric co-activation counts, or empty
    std::vector<double> rank_bandwidth;  // [R] link bytes/s (any unit), or empty for equal links
    double balance_tolerance = 0.05;     // the affinity pass may raise the max rank time by this
    int32_t max_swaps = 10000;           // upper bound on affinity swaps (each strictly improves)
};

struct PlanResult {
    Placement placement;
    std::vector<double> rank_load;  // [R] sum of replica loads (load[e] / logcnt[e]) per rank
    std::vector<double> rank_time;  // [R] rank_load / relative bandwidth
    double packed_max_time = 0;     // max rank_time after packing, before the affinity pass
    double cut_before = 0;          // co-activation weight across ranks after packing
    double cut_after = 0;           // ... and after the affinity pass (never larger)
    int32_t swaps = 0;
};

// Deterministic (no randomness; ties go to the lower id or rank):
//  1. Replicas (EPLB): `replicas` times, give one more copy to the expert with the largest
//     load / logcnt among those with logcnt < R (ties: lower id).
//  2. Packing, largest first: replicas sorted by load / logcnt descending (ties: lower id, then
//     lower replica index), each onto the rank with free slots and no copy of that expert that
//     finishes earliest, i.e. minimises (rank_load + w) / bandwidth (ties: lower rank). Every rank
//     ends with exactly S = (E + replicas) / R experts.
//  3. Affinity (only with coactivation): repeatedly apply the best swap of two single-copy
//     experts on different ranks that strictly lowers the cross-rank co-activation weight
//     cut = sum_{e<f, no common rank} coact[e][f] while keeping every rank_time <=
//     packed_max_time * (1 + tolerance) (best = largest gain; ties: lower e, then lower f).
//  4. Slots: each rank's experts in ascending logical id.
// Throws FT_ERR_INVALID_ARGUMENT for inconsistent sizes, negative or non-finite loads.
PlanResult plan_placement(const PlannerInput &input);

// Cross-rank co-activation weight of a placement (step 3's objective).
double coactivation_cut(const Placement &placement, const std::vector<double> &coactivation);

// ---- dispatch layout (5.2 step 2) -----------------------------------------------------------

// Replica choice for one route (token t, entry j, logical expert e >= 0), given the set G_t of
// ranks the token already goes to and a per-rank load L:
//   G_t starts as the ranks of the token's single-copy experts (forced destinations). Entries are
//   then visited in order j = 0..K-1; a replicated expert takes, among its replicas on ranks in
//   G_t if there is any, else among all its replicas, the one with the smallest L[rank] (ties:
//   lower rank); its rank joins G_t. Single-copy experts take their only replica.
// L is caller-supplied (e.g. the planner's rank_load, scaled to integers) or, when null,
// forced_rank_load() of the same routing: a histogram a GPU builds in one pass.
std::vector<int64_t> forced_rank_load(const Placement &placement, const int32_t *ids, int64_t tokens,
                                      int32_t top_k);

// What one source rank sends where. Routes with id < 0 are ignored; ids >= E are rejected.
// A token goes to rank r at most once, and only if one of its chosen replicas is on r
// (the source rank itself included: its rows are a local copy, not wire bytes).
struct DispatchLayout {
    int32_t num_ranks = 0;
    int32_t top_k = 0;
    int64_t tokens = 0;
    int32_t source_rank = 0;
    std::vector<int32_t> route_phy;     // [T*K] chosen physical expert of each route, -1 ignored
    std::vector<int32_t> row;           // [R*T] row of token t in the buffer for rank r, -1 not sent
    std::vector<int64_t> count;         // [R] rows for each rank
    std::vector<int64_t> offset;        // [R+1] exclusive prefix sum of count: rank r's rows are
                                        //       offset[r] .. offset[r+1]-1 of the send buffer
    std::vector<int64_t> expert_count;  // [R*S] rows each physical expert gets from this source
    // Send rows, concatenated in rank order; within a rank, in ascending token order.
    std::vector<int32_t> send_token;    // [offset[R]] source token of each row
    std::vector<int32_t> send_n;        // [offset[R]] routes the row carries (1..K)
    std::vector<int32_t> send_slot;     // [offset[R]*K] local slots, ascending logical id (ties:
                                        //       lower j), -1 padded
    std::vector<float> send_weight;     // [offset[R]*K] the routes' weights, 0 padded

    bool sends(int32_t rank, int64_t token) const { return row[static_cast<size_t>(rank) * tokens + token] >= 0; }
};

// weights may be null (all 1). rank_load: [R] or null (see forced_rank_load).
DispatchLayout dispatch_layout(const Placement &placement, const int32_t *ids, const float *weights,
                               int64_t tokens, int32_t top_k, int32_t source_rank,
                               const int64_t *rank_load = nullptr);

// ---- FP8 wire format (5.3) ------------------------------------------------------------------

inline constexpr int32_t kWireBlock = 128;  // channels per scale
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kAmaxFloor = 1e-4f;  // DeepEP's clamp: no zero or subnormal-tiny scales

enum class ScaleFormat : int32_t {
    Fp32 = 0,   // default: s = amax / 448, q = e4m3(x * (448 / amax))
    Ue8m0 = 1,  // option: s = 2^ceil(log2(amax / 448)), q = e4m3(x / s), stored as exponent + 127
};

// Per block of 128 channels of a bf16 row (H a multiple of 128):
//   amax = max(max |x| over the finite x of the block, 1e-4)     (fp32)
//   Fp32:  inv = 448 / amax (one fp32 division), q = f32_to_e4m3(x * inv) (one fp32 multiply,
//          round to nearest even, saturating at +-448), scale s = amax / 448 (fp32 division).
//   Ue8m0: r = amax / 448; e = unbiased exponent of r, +1 if any mantissa bit of r is set
//          (so 2^e >= r); q = f32_to_e4m3(ldexp(x, -e)) (exact scaling), stored byte e + 127.
//   NaN encodes as 0x7F; +-Inf saturates to +-448.
// Decoded value: e4m3_to_f32(q) * s (one fp32 multiply). Error: |x - x'| <= |x| / 16 +
// s * 2^-10 (half an e4m3 ulp, relative 2^-4 for normals, absolute 2^-10 s in the subnormal
// range), plus one fp32 rounding of the product.
size_t fp8_scale_bytes(int64_t hidden, ScaleFormat format);  // H/128 * (4 or 1)
void quantize_fp8_row(const uint16_t *x_bf16, int64_t hidden, ScaleFormat format, uint8_t *q, uint8_t *scales);
void dequantize_fp8_row(const uint8_t *q, const uint8_t *scales, int64_t hidden, ScaleFormat format, float *out);
// The decode multiplier of block b (scales in the row's wire bytes).
float fp8_block_scale(const uint8_t *scales, int64_t block, ScaleFormat format);

// ---- dispatch records ------------------------------------------------------------------------

enum class WireDtype : int32_t {
    Bf16 = 0,        // payload = H bf16 values, no scales
    Fp8Fp32 = 1,     // e4m3 payload, fp32 scales (the default on the wire)
    Fp8Ue8m0 = 2,    // e4m3 payload, e8m0 scales
};

// One dispatched row, a fixed-size record so a kernel indexes it as base + i * bytes. Byte
// offsets within the record (all little-endian; every field naturally aligned):
//   payload  [0, payload_bytes)             e4m3 x H, or bf16 x H
//   scales   [scales, +scale_bytes)         fp32 or e8m0 x H/128 (absent for Bf16), padded to 4
//   token    int32                          source token index
//   source   int16                          source rank
//   n        int16                          routes carried (1..K)
//   weight   float x K                      route weights (ascending logical id), 0 padded
//   slot     int16 x K                      local slots on the receiving rank, -1 padded
//   padding to a multiple of 16 bytes (vector loads and stores)
struct RecordLayout {
    size_t payload = 0, payload_bytes = 0;
    size_t scales = 0, scale_bytes = 0;
    size_t token = 0, source = 0, n = 0, weight = 0, slot = 0;
    size_t bytes = 0;  // record size
};
RecordLayout record_layout(int64_t hidden, int32_t top_k, WireDtype dtype);
inline size_t record_bytes(int64_t hidden, int32_t top_k, WireDtype dtype) { return record_layout(hidden, top_k, dtype).bytes; }

// Metadata of one record, as read back by the receiver.
struct RecordMeta {
    int32_t token = 0;
    int32_t source = 0;
    int32_t n = 0;
    std::vector<int32_t> slot;   // [n]
    std::vector<float> weight;   // [n]
};
RecordMeta read_record_meta(const uint8_t *record, const RecordLayout &layout, int32_t top_k);

// Writes the layout's send rows (offset[R] records) from x ([T, H] bf16) into `send`.
// Reference of the fused gather + quantise + pack kernel. Padding bytes are written as zero.
void pack_dispatch(const DispatchLayout &layout, const uint16_t *x_bf16, int64_t hidden, WireDtype dtype,
                   uint8_t *send);

// Payload of a record as floats (dequantised, or the bf16 values).
void unpack_payload(const uint8_t *record, const RecordLayout &layout, int64_t hidden, WireDtype dtype, float *out);

// Received rows grouped per local expert, the input order of a grouped GEMM: records are numbered
// in arrival-independent order (sources ascending, then each source's row order), and each
// expert's rows are listed in that order.
struct ExpertRows {
    std::vector<int64_t> offset;  // [S+1]
    std::vector<int64_t> record;  // record number of each row
    std::vector<int32_t> route;   // position of the route within that record's routes
};
// records: concatenated received records, count[s] from source s (s ascending).
ExpertRows group_by_expert(const uint8_t *records, const int64_t *count_per_source, int32_t num_ranks,
                           const RecordLayout &layout, int32_t top_k, int32_t slots_per_rank);

// ---- combine (5.2 step 6) --------------------------------------------------------------------

// Receiving rank, per record: partial[h] = bf16(acc) with acc = 0.0f and, for i = 0..n-1 (the
// record's route order, ascending logical id), acc = fmaf(weight[i], y_i[h], acc), where y_i is
// expert slot[i]'s bf16 output for this row. `expert_out` holds for each record its n outputs:
// expert_out[(record * K + i) * H + h]. The partials go back in the order the records came.
void reduce_partials(const uint8_t *records, int64_t num_records, const RecordLayout &layout, int32_t top_k,
                     int64_t hidden, const uint16_t *expert_out, uint16_t *partials);

// Source rank: out[t][h] = bf16(sum) with sum = 0.0f, then sum += partial from rank r for
// r = 0..R-1 in ascending order (fp32 adds, ranks that did not get t skipped). partials[r] points
// at the rows rank r returned, in the layout's row order for r. Tokens sent nowhere give +0.
// The order is fixed by rank, not by arrival: chunking cannot change the result.
void combine_at_source(const DispatchLayout &layout, const uint16_t *const *partials, int64_t hidden,
                       uint16_t *out_bf16);

// ---- FP8 combine (issue 7 item 2: optional, throughput mode, behind an accuracy gate) ----------

// With an FP8 combine wire each partial row (the bf16 output of reduce_partials) travels as
//   [e4m3 x H | scales: fp32 or e8m0 x H/128]      padded to a multiple of 4 bytes
// encoded by quantize_fp8_row (the dispatch quantiser, same rounding, same scales) and decoded
// by dequantize_fp8_row at the source. The source's own rows are not sent and stay bf16. Bf16
// means today's wire: the bf16 partial row, 2H bytes.
size_t combine_row_bytes(int64_t hidden, WireDtype dtype);  // 2H; H + H/32 (fp32); H + H/128 (e8m0)
// Default accuracy gate on the largest row error of a call. The measure is dominated by a row's
// largest values, which e4m3 keeps to half an ulp (2^-4 relative); small values lost to the
// subnormal range add at most H (amax / 448)^2 2^-20 to the squared error. So a finite row's
// error is below ~0.0626 whatever its range (~0.026 for gaussian rows, more when values sit near
// rounding midpoints), and a non-finite row's is +Inf. 0.05 passes normal data and trips on
// non-finite partials and on rows rounding near the worst case; lower it for a tighter budget.
inline constexpr float kCombineDefaultMaxRelError = 0.05f;
// Writes one row's wire bytes (padding zero) and returns its relative L2 error (the gate's
// measure, combine_rel_error of the decoded row; 0 for Bf16).
double encode_combine_row(const uint16_t *partial_bf16, int64_t hidden, WireDtype dtype, uint8_t *wire);
// The row's values at the source: dequantised (e4m3 * scale, one fp32 multiply) or the bf16 values.
void decode_combine_row(const uint8_t *wire, int64_t hidden, WireDtype dtype, float *out);
// ||decoded - row|| / ||row|| (L2, accumulated in double): 0 for an all-zero row, +Inf when the
// row holds a non-finite value (FP8 cannot carry Inf, so such a row must trip the gate).
double combine_rel_error(const uint16_t *row_bf16, const float *decoded, int64_t hidden);
// combine_at_source for any combine wire: rows[r] points at rank r's rows in `dtype` wire format
// (combine_row_bytes apart, the layout's row order for r), except rows[source_rank], which are the
// source's own bf16 partial rows (2H bytes apart). The sum is combine_at_source's: fp32 from 0,
// ranks ascending, of the decoded values, then one bf16 rounding; with Bf16 it is that function.
void combine_at_source_wire(const DispatchLayout &layout, const uint8_t *const *rows, int64_t hidden, WireDtype dtype,
                            uint16_t *out_bf16);

// ---- chunking for throughput mode (5.2 step 5) -----------------------------------------------

struct ChunkPolicy {
    size_t min_chunk_bytes = size_t(4) << 20;  // per peer: SHM a2a is at ~50% of peak at 1 MB
    double op_latency_s = 25e-6;                // NCCL's per-operation floor
    double max_overhead = 0.1;                  // a chunk should last >= latency / overhead
    int32_t max_chunks = 16;
};

// The chunk count C is one number for the whole group (one grouped call per chunk covers every
// peer), so every rank derives it from the all-gathered count matrix:
//   chunk_min = max(min_chunk_bytes, link_bytes_per_s * op_latency_s / max_overhead)
//   C = clamp(floor(max_{s != d} counts[s][d] * record_bytes / chunk_min), 1, max_chunks)
// Chunk c of the pair (s, d) holds records [floor(c n / C), floor((c + 1) n / C)), n = counts[s][d]
// (whole records; sender and receiver compute the same boundaries).
struct ChunkPlan {
    int32_t chunks = 1;
    int32_t num_ranks = 0;
    std::vector<int64_t> counts;  // [R*R] records from s to d
    int64_t begin(int32_t src, int32_t dst, int32_t chunk) const;  // first record of a chunk
    int64_t end(int32_t src, int32_t dst, int32_t chunk) const { return begin(src, dst, chunk + 1); }
};
ChunkPlan plan_chunks(const std::vector<int64_t> &counts, int32_t num_ranks, size_t record_bytes,
                      double link_bytes_per_s, const ChunkPolicy &policy = ChunkPolicy());

// ---- bytes on the wire (5.8) ------------------------------------------------------------------

// Bytes leaving a source rank per token (self excluded), averaged over all tokens of a global
// routing [T, K] split into R equal contiguous shares (token t on rank t / (T / R)).
struct WireBytes {
    double dispatch_dedup_fp8 = 0;  // our dispatch: one FP8 record per remote destination rank
    double dispatch_dedup_bf16 = 0; // the same with a bf16 payload
    double allgather_bf16 = 0;      // (R - 1) * 2H: ThunderEP / vLLM all-gather
    double alltoall_bf16 = 0;       // one bf16 row per remote route (per-expert a2a, no dedup)
    double combine_dedup_bf16 = 0;  // our combine: one bf16 partial per remote destination rank
    double remote_fraction = 0;     // P: mean fraction of the R - 1 remote ranks a token goes to
    double combine_dedup_fp8 = 0;   // the same partials on the FP8 combine wire (fp32 scales)
};
WireBytes wire_bytes(const Placement &placement, const int32_t *ids, int64_t tokens, int32_t top_k, int64_t hidden);

}  // namespace ft::ep
