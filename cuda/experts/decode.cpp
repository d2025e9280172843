// Decode-time expert kernels (ft/cuda_experts.hpp). One decode call is, in stream order:
//   prep     one CTA groups the routes by slot on the device (a hash table in scratch: each
//            distinct slot once, with its routes); the other CTAs stage the input
//            (ds_fp4: FP8 round trip per 128; otherwise only a copy when x is not 16-byte aligned)
//   gate_up  grid (row tiles, distinct-slot capacity): CTAs past the device's group count return
//            at once; each streams its weight rows once and dots them with all the group's routes
//            (register chunks of kRouteChunk), epilogue = format clamp/bias + activation -> bf16
//            (bf16 gpt-oss: + the route's expert's f32 gate/up bias, from the bias table)
//   [ds_fp4] the intermediate is FP8-round-tripped per 128 in place
//   down     the same over the down rows -> f32 per route (mxfp4: + down bias)
//            (bf16 gpt-oss: + the route's expert's f32 down bias, from the bias table)
//   combine  y[t] = sum_k w * route (+ addend), one bf16 rounding
// gate_up and down run on tensor cores (mma.sync: decode_mma.cu, decode_mxfp4.cu) for bf16 and the
// FP8 and FP4 formats; the GGUF block formats on an integer-dot CUDA-core kernel with Q8_0
// activations (decode_dp4a.cu), and bf16 rows whose length is not a multiple of 8 on a float one
// (decode_simt.cu; also the block formats' fallback where the integer one does not fit).
// On both, a warp owns pairs of output rows (the integer one several, its CTA's rows staged in
// shared memory or prefetched into L2 first), its lanes split the reduction and finish with a
// shuffle.
// Every sum runs in a fixed order, so results are deterministic run to run. Experts of a model
// that mixes GGUF block formats run gate_up and down each on its own format's kernel.
// Files: decode_launch.hpp (constants, arguments, launchers), decode_kernels.cuh (shared device
// code), decode_group.cu (prep, round trip, combine), decode_mma.cu (row-major formats),
// decode_mxfp4.cu, decode_dp4a.cu and decode_simt.cu (CUDA-core); this file holds ExpertDecoder
// (host code).
#include "ft/cuda_experts.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "decode_launch.hpp"
#include "ft/common.hpp"
#include "ft/cuda_check.hpp"

namespace ft::cuda {
namespace {

using namespace decode;

// The grids of one projection's kernels (see ExpertDecoder::compute).
struct ProjGrids {
    dim3 mma, rowmajor, mxfp4_mma;
};

// One projection of the decode (gate/up + activation, or down): the format's tensor-core (`mma`)
// kernel, or the CUDA-core ones (the GGUF block formats, bf16 rows that are not a multiple of 8).
cudaError_t launch_projection(bool gate_up, Format f, bool mma, bool vec, const ProjGrids &g, const ProjArgs &p,
                              cudaStream_t s) {
    if (mma) {
        if (f == Format::mxfp4) return launch_mxfp4_projection(gate_up, g.mxfp4_mma, p, s);
        return launch_mma_projection(f, gate_up, g.mma, p, s);  // mma_ is only set for known formats
    }
    if ((f == Format::bf16 && !vec) || format_is_block(f)) return launch_simt_projection(f, gate_up, g.rowmajor, p, s);
    return cudaErrorInvalidValue;
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

bool aligned(const void *p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

// Bits of the grouping hash table for R routes: 2^bits >= 2R (at least 2 entries).
int32_t table_bits_for(size_t R) {
    int32_t b = 1;
    while ((size_t(1) << b) < 2 * R) ++b;
    return b;
}

// Bank roles of a format: [data, scale, extra] of gate_up and of down (-1 = none), the bank
// count and the alignment the data banks' vector loads need.
struct BankRoles {
    int gu[3] = {0, -1, -1}, dn[3] = {1, -1, -1};
    int nbanks = 2;
    size_t need_align = 16;
};

BankRoles bank_roles(Format format, bool vec) {
    BankRoles r;
    r.need_align = vec ? 16 : 2;
    switch (format) {
        case Format::bf16: break;
        case Format::fp8_block:
            r.gu[1] = 1, r.dn[0] = 2, r.dn[1] = 3, r.nbanks = 4;
            break;
        case Format::nvfp4:
            r.gu[1] = 1, r.gu[2] = 2, r.dn[0] = 3, r.dn[1] = 4, r.dn[2] = 5, r.nbanks = 6, r.need_align = 8;
            break;
        case Format::mxfp4:
            r.gu[1] = 1, r.gu[2] = 2, r.dn[0] = 3, r.dn[1] = 4, r.dn[2] = 5, r.nbanks = 6, r.need_align = 4;
            break;
        case Format::ds_fp4:
            r.gu[1] = 1, r.dn[0] = 2, r.dn[1] = 3, r.nbanks = 4;
            break;
        // The GGUF block formats: the float kernel reads bytes (decode_simt.cu); the integer-dot one
        // runs where dp4a_usable finds the rows 2-byte aligned.
        case Format::q4_0:
        case Format::q8_0:
        case Format::q2_k:
        case Format::q3_k:
        case Format::q4_k:
        case Format::q5_k:
        case Format::q6_k:
        case Format::iq4_xs: r.need_align = 1; break;
    }
    return r;
}

// Every bank present and aligned as the kernels load it.
bool banks_usable(const DeviceExperts &ex, Format format, const BankRoles &r) {
    if (ex.num_banks != r.nbanks) return false;
    for (int b = 0; b < r.nbanks; ++b) {
        // Data banks carry the vector loads; scales/biases/globals need 2-byte alignment at most.
        const bool data_bank = b == r.gu[0] || b == r.dn[0];
        const bool mx_scale = format == Format::mxfp4 && (b == r.gu[1] || b == r.dn[1]);  // 4-byte loads
        const size_t a = data_bank ? r.need_align : mx_scale ? 4 : 2;
        if (!ex.base[b] || !aligned(ex.base[b], a) || ex.row_bytes[b] % a != 0) return false;
    }
    return true;
}

// Experts of a model mixing block formats, for a decoder made for block format `decoder`: both
// projections' formats are block formats whose blocks divide H and I (as a model's validation
// demands), and every bank's rows hold at least that format's rows (gate_up [2I rows of H], down
// [H rows of I]).
bool block_mix_usable(const DeviceExperts &ex, Format decoder, int32_t H, int32_t I) {
    if (!format_is_block(decoder) || ex.num_banks != 2) return false;
    const Format f_gu = ex.format, f_dn = ex.down();
    if (!format_is_block(f_gu) || !format_is_block(f_dn)) return false;  // also false for unknown values
    for (const Format f : {f_gu, f_dn})
        if (H % format_block(f) != 0 || I % format_block(f) != 0) return false;
    return ex.row_bytes[0] >= 2 * size_t(I) * block_row_bytes(f_gu, H) &&
           ex.row_bytes[1] >= size_t(H) * block_row_bytes(f_dn, I);
}

// The bias tables (bf16 gpt-oss) are absent, or complete: bf16, both tables, a positive row
// count, f32-aligned, and the expert id of every route to index them.
bool biases_usable(const DeviceExperts &ex, const int32_t *expert_ids) {
    if (!ex.gate_up_bias && !ex.down_bias) return true;
    return ex.format == Format::bf16 && ex.down() == Format::bf16 && ex.gate_up_bias && ex.down_bias && ex.bias_experts > 0 && expert_ids &&
           aligned(ex.gate_up_bias, 4) && aligned(ex.down_bias, 4) && aligned(expert_ids, 4);
}

void set_banks(ProjArgs &p, const DeviceExperts &ex, const int *roles) {
    p.data = ex.base[roles[0]];
    p.data_rb = ex.row_bytes[roles[0]];
    p.scale = roles[1] >= 0 ? ex.base[roles[1]] : nullptr;
    p.scale_rb = roles[1] >= 0 ? ex.row_bytes[roles[1]] : 0;
    p.extra = roles[2] >= 0 ? ex.base[roles[2]] : nullptr;
    p.extra_rb = roles[2] >= 0 ? ex.row_bytes[roles[2]] : 0;
}

}  // namespace

ExpertDecoder::ExpertDecoder(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                             DeviceActivation act)
    : format_(format), hidden_(hidden), inter_(inter), top_k_(top_k), max_tokens_(max_tokens), act_(act) {
    if (!format_known(int32_t(format)))
        fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: unknown format ", int32_t(format));
    if (hidden <= 0 || inter <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: hidden ", hidden, " and intermediate ", inter, " must be > 0");
    const std::string geo = format_geometry_error(format, hidden, inter);
    if (!geo.empty()) fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: ", geo);
    if (top_k <= 0 || max_tokens <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "expert decoder: top_k ", top_k, " and max_tokens ", max_tokens, " must be > 0");
    vec_ = format != Format::bf16 || (hidden % 8 == 0 && inter % 8 == 0);
    // Tensor-core kernels for every format but the GGUF block formats; those and bf16 rows not a
    // multiple of 8 take the CUDA-core ones.
    mma_ = vec_ && !format_is_block(format);

    const size_t R = size_t(max_tokens) * size_t(top_k);
    size_t off = 0;
    auto take = [&off](size_t bytes) {
        const size_t at = off;
        off = align_up(off + bytes, 256);
        return at;
    };
    const size_t o_num = take(sizeof(int32_t));
    const size_t table = size_t(1) << table_bits_for(R);
    const size_t o_ints = take((6 * R + 3 * table) * sizeof(int32_t));
    const size_t o_xin = take(size_t(max_tokens) * size_t(hidden) * 2);
    const size_t o_inter = take(R * size_t(inter) * 2);
    const size_t o_out = take(R * size_t(hidden) * 4);
    scratch_bytes_ = off;

    int dev = 0;
    check(cudaGetDevice(&dev), "expert decoder: no usable CUDA device");
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0)
        sms_ = sms;
    else
        cudaGetLastError();
    scratch_ = DeviceBuffer(scratch_bytes_, cat("expert decoder: cannot allocate ", scratch_bytes_, " bytes of scratch").c_str());
    uint8_t *base = scratch_.get();
    num_groups_ = reinterpret_cast<int32_t *>(base + o_num);
    int32_t *ints = reinterpret_cast<int32_t *>(base + o_ints);
    group_slot_ = ints;
    group_start_ = ints + R;
    group_count_ = ints + 2 * R;
    group_routes_ = ints + 3 * R;  // then [4R, 6R) per-route grouping temporaries, 3 tables
    xin_ = reinterpret_cast<uint16_t *>(base + o_xin);
    inter_buf_ = reinterpret_cast<uint16_t *>(base + o_inter);
    route_out_ = reinterpret_cast<float *>(base + o_out);
    // Before the first call the group count must read as "no groups" for a stray launch.
    check(cudaMemset(num_groups_, 0, sizeof(int32_t)), "expert decoder: cudaMemset");
}

const char *ExpertDecoder::kernel_name() const {
    if (mma_) {
        switch (format_) {
            case Format::bf16: return "bf16-mma";
            case Format::fp8_block: return "fp8_block-mma";
            case Format::nvfp4: return "nvfp4-mma";
            case Format::ds_fp4: return "ds_fp4-mma(fp8 act)";
            case Format::mxfp4: return "mxfp4-mma";
            default: break;
        }
    }
    // The integer-dot kernel where both projections' activations fit its shared memory (banks
    // whose rows are not 2-byte aligned would take the float one).
    const bool dp4a = dp4a_fits(std::max(hidden_, inter_));
    switch (format_) {
        case Format::q4_0: return dp4a ? "q4_0-dp4a" : "q4_0-simt";
        case Format::q8_0: return dp4a ? "q8_0-dp4a" : "q8_0-simt";
        case Format::q2_k: return dp4a ? "q2_k-dp4a" : "q2_k-simt";
        case Format::q3_k: return dp4a ? "q3_k-dp4a" : "q3_k-simt";
        case Format::q4_k: return dp4a ? "q4_k-dp4a" : "q4_k-simt";
        case Format::q5_k: return dp4a ? "q5_k-dp4a" : "q5_k-simt";
        case Format::q6_k: return dp4a ? "q6_k-dp4a" : "q6_k-simt";
        case Format::iq4_xs: return dp4a ? "iq4_xs-dp4a" : "iq4_xs-simt";
        default: break;
    }
    return format_ == Format::bf16 ? "bf16-gemv-scalar" : "unknown";
}

// Groups the routes and stages x; returns the activations the gate_up projection reads.
cudaError_t ExpertDecoder::launch_prep_step(const uint16_t *x, const int32_t *slots, int32_t tokens,
                                           const uint16_t **xact, cudaStream_t stream) {
    const int64_t R = int64_t(tokens) * top_k_;
    const size_t Rmax = size_t(max_tokens_) * size_t(top_k_);
    const size_t table = size_t(1) << table_bits_for(Rmax);
    int32_t *const temps = group_routes_ + Rmax;
    GroupScratch gs{num_groups_,  group_slot_,        group_start_,          group_count_,
                    group_routes_, temps,              temps + Rmax,          temps + 2 * Rmax,
                    temps + 2 * Rmax + table,          temps + 2 * Rmax + 2 * table, table_bits_for(size_t(R))};
    const int mode = format_ == Format::ds_fp4 ? 2 : (!aligned(x, 16) ? 1 : 0);
    *xact = mode ? xin_ : x;
    const int64_t elems = int64_t(tokens) * hidden_;
    int prep_blocks = 0;
    if (mode == 1) prep_blocks = int((elems + kGroupThreads - 1) / kGroupThreads);
    if (mode == 2) prep_blocks = int((elems / 128 + kGroupThreads / 32 - 1) / (kGroupThreads / 32));
    prep_blocks = prep_blocks > 1024 ? 1024 : prep_blocks;
    return launched(launch_prep(prep_blocks, slots, int(R), gs, x, xin_, elems, mode, stream));
}

cudaError_t ExpertDecoder::compute(const DeviceExperts &ex, const uint16_t *x, const int32_t *slots, int32_t tokens,
                                   cudaStream_t stream, const int32_t *expert_ids) {
    if (tokens < 0 || tokens > max_tokens_) return cudaErrorInvalidValue;
    if (tokens == 0) return cudaSuccess;
    if (!x || !slots) return cudaErrorInvalidValue;
    if (ex.hidden != hidden_ || ex.inter != inter_) return cudaErrorInvalidValue;
    // Each projection runs on its own format: the decoder's, or (a block-format decoder) any
    // block formats of a model that mixes them.
    const Format f_gu = ex.format, f_dn = ex.down();
    const bool mixed = f_gu != format_ || f_dn != format_;
    if (mixed && !block_mix_usable(ex, format_, hidden_, inter_)) return cudaErrorInvalidValue;
    // A mix holds block formats only, as the decoder's is: the same bank roles and alignment, and
    // no tensor-core kernel (mma_ false), for both projections.
    const BankRoles roles = bank_roles(format_, vec_);
    if (!banks_usable(ex, format_, roles)) return cudaErrorInvalidValue;
    if (!biases_usable(ex, expert_ids)) return cudaErrorInvalidValue;

    const int64_t H = hidden_, I = inter_, R = int64_t(tokens) * top_k_;
    const uint16_t *xact = nullptr;
    cudaError_t e = launch_prep_step(x, slots, tokens, &xact, stream);
    if (e != cudaSuccess) return e;

    const bool ds = format_ == Format::ds_fp4;
    ProjArgs p{};
    p.g = GroupView{num_groups_, group_slot_, group_start_, group_count_, group_routes_};
    p.inter = inter_;
    p.top_k = top_k_;
    p.tokens = tokens;
    p.sms = sms_;
    p.activation = act_;
    p.ds_fp4 = ds;
    p.ds_clamp = ds && act_.kind == FT_ACT_SILU && std::isfinite(act_.limit) && act_.limit > 0.0f;
    p.inter_out = inter_buf_;
    p.route_out = route_out_;
    p.bias_ids = ex.gate_up_bias ? expert_ids : nullptr;
    p.bias_experts = ex.bias_experts;
    // Grid rows over the groups: CTAs past the device's group count exit at once, but each still
    // has to be scheduled, and R rows (one per route) at T = 8 meant 7 empty CTAs for every busy
    // one. A few waves of CTAs in all suffice (rows loop over the groups, each group still read by
    // exactly one CTA row, so results do not change); never fewer rows than top_k, so a
    // single-token call keeps one group per row.
    auto grid_y = [&](int64_t gx) {
        int64_t gy = std::max<int64_t>((16 * int64_t(sms_) + gx - 1) / gx, top_k_);
        gy = std::min<int64_t>(std::min<int64_t>(gy, R), kMaxGridY);
        return unsigned(gy);
    };

    // gate_up
    set_banks(p, ex, roles.gu);
    p.bias = ex.gate_up_bias;
    p.K = hidden_;
    p.N = 2 * inter_;
    p.act = xact;
    p.act_by_token = true;
    const int64_t gx_mx_gu = (2 * I + kMxMmaCols - 1) / kMxMmaCols;
    const ProjGrids grids_gu{dim3(unsigned((I + 7) / 8), grid_y((I + 7) / 8)),  // mma: 8 units (16 rows) per CTA
                             dim3(unsigned((I + kWarps - 1) / kWarps), grid_y((I + kWarps - 1) / kWarps)),
                             dim3(unsigned(gx_mx_gu), grid_y(gx_mx_gu))};
    if ((e = launched(launch_projection(true, f_gu, mma_, vec_, grids_gu, p, stream))) != cudaSuccess) return e;

    if (ds && (e = launched(launch_inter_round_trip(slots, inter_buf_, R, inter_, stream))) != cudaSuccess) return e;

    // down
    set_banks(p, ex, roles.dn);
    p.bias = ex.down_bias;
    p.K = inter_;
    p.N = hidden_;
    p.act = inter_buf_;
    p.act_by_token = false;
    const int64_t gx_mx_dn = (H + kMxMmaCols - 1) / kMxMmaCols;
    const int64_t gx_dn = (H + 2 * kWarps - 1) / (2 * kWarps);
    const ProjGrids grids_dn{dim3(unsigned((H + 15) / 16), grid_y((H + 15) / 16)),  // mma: 16 rows per CTA
                             dim3(unsigned(gx_dn), grid_y(gx_dn)),
                             dim3(unsigned(gx_mx_dn), grid_y(gx_mx_dn))};
    return launched(launch_projection(false, f_dn, mma_, vec_, grids_dn, p, stream));
}

cudaError_t ExpertDecoder::combine(const int32_t *slots, const float *w, const uint16_t *addend, uint16_t *y,
                                   int32_t tokens, cudaStream_t stream) {
    if (tokens < 0 || tokens > max_tokens_) return cudaErrorInvalidValue;
    return launch_combine_routes(route_out_, slots, w, addend, y, tokens, top_k_, hidden_, format_ == Format::ds_fp4,
                                 stream);
}

cudaError_t ExpertDecoder::decode(const DeviceExperts &experts, const uint16_t *x, const int32_t *slots,
                                  const float *w, const uint16_t *addend, uint16_t *y, int32_t tokens,
                                  cudaStream_t stream, const int32_t *expert_ids) {
    const cudaError_t e = compute(experts, x, slots, tokens, stream, expert_ids);
    if (e != cudaSuccess) return e;
    return combine(slots, w, addend, y, tokens, stream);
}

}  // namespace ft::cuda
