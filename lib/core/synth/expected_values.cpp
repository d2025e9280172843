// The expected contents of a synthetic checkpoint, recomputed from the seeds independently of the
// loader: bf16 weights after rounding, routers, shared experts, and any format's bank rows.
#include <cmath>

#include "synth_internal.hpp"

namespace ft::synth {

using namespace detail;

namespace {

// Checkpoint layer index of MoE layer `moe_layer`; throws when out of range.
int checkpoint_layer(const Spec &s, int moe_layer) {
    const std::vector<int> moe = moe_layers(s);
    if (moe_layer < 0 || moe_layer >= static_cast<int>(moe.size()))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: MoE layer ", moe_layer, " out of range");
    return moe[moe_layer];
}

std::vector<uint16_t> bf16_values(const Spec &s, int layer, Kind kind, int expert, uint64_t n, float scale, Dtype d) {
    const uint64_t key = tensor_key(s, layer, kind, expert);
    std::vector<uint16_t> out(n);
    for (uint64_t i = 0; i < n; ++i) out[i] = stored_as_bf16(value(key, i, scale), d);
    return out;
}

}  // namespace

std::vector<uint16_t> expert_weight(const Spec &s, int moe_layer, int expert, int proj) {
    const int l = checkpoint_layer(s, moe_layer);
    const uint64_t n = static_cast<uint64_t>(s.hidden) * s.intermediate;
    const Dtype d = parse_dtype(s.expert_dtype);
    switch (proj) {
        case FT_PROJ_GATE: return bf16_values(s, l, kGate, expert, n, 1.0f / std::sqrt(static_cast<float>(s.hidden)), d);
        case FT_PROJ_UP: return bf16_values(s, l, kUp, expert, n, 1.0f / std::sqrt(static_cast<float>(s.hidden)), d);
        case FT_PROJ_DOWN:
            return bf16_values(s, l, kDown, expert, n, 1.0f / std::sqrt(static_cast<float>(s.intermediate)), d);
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: unknown projection ", proj);
}

std::vector<float> router_weight(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    const std::vector<uint16_t> bits = bf16_values(s, l, kRouter, 0, static_cast<uint64_t>(s.num_experts) * s.hidden,
                                                   1.0f / std::sqrt(static_cast<float>(s.hidden)), Dtype::bf16);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
    return out;
}

std::vector<float> router_bias(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    const uint64_t key = tensor_key(s, l, kBias, 0);
    std::vector<float> out(s.num_experts);
    for (int e = 0; e < s.num_experts; ++e) out[e] = value(key, e, 0.05f);
    return out;
}

std::vector<uint16_t> shared_weight(const Spec &s, int moe_layer, int proj) {
    const int l = checkpoint_layer(s, moe_layer);
    if (s.gguf && format_is_block(gguf_shared_format(s, moe_layer))) {
        // GGUF block tensors: the reference dequantisation of the written blocks, rounded to bf16.
        const Format f = gguf_shared_format(s, moe_layer);
        const Kind k = proj == FT_PROJ_GATE ? kSharedGate : proj == FT_PROJ_UP ? kSharedUp : kSharedDown;
        const int64_t N = proj == FT_PROJ_DOWN ? s.hidden : s.shared_intermediate,
                      K = proj == FT_PROJ_DOWN ? s.shared_intermediate : s.hidden;
        const std::vector<uint8_t> b =
            bytes_of(block_byte_fn(f), tensor_key(s, l, k, 0), 0, static_cast<uint64_t>(N) * block_row_bytes(f, K));
        std::vector<uint16_t> out(static_cast<size_t>(N * K));
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = 0; n < N; ++n) {
            dequant_row_block(f, b.data() + static_cast<size_t>(n) * block_row_bytes(f, K), K, row.data());
            for (int64_t c = 0; c < K; ++c) out[static_cast<size_t>(n * K + c)] = f32_to_bf16(row[c]);
        }
        return out;
    }
    if (s.gguf && gguf_shared_format(s, moe_layer) == Format::mxfp4) {
        // ggml MXFP4 blocks (e8m0, then element j in the low nibble of byte j and element j + 16 in
        // its high nibble), decoded element by element, rounded to bf16.
        const Kind k = proj == FT_PROJ_GATE ? kSharedGate : proj == FT_PROJ_UP ? kSharedUp : kSharedDown;
        const int64_t N = proj == FT_PROJ_DOWN ? s.hidden : s.shared_intermediate,
                      K = proj == FT_PROJ_DOWN ? s.shared_intermediate : s.hidden;
        const std::vector<uint8_t> b = bytes_of(ggml_mxfp4_byte, tensor_key(s, l, k, 0), 0, static_cast<uint64_t>(N * (K / 32) * 17));
        std::vector<uint16_t> out(static_cast<size_t>(N * K));
        for (int64_t i = 0; i < N * K; ++i) {
            const uint8_t *blk = b.data() + (i / 32) * 17;
            const int64_t j = i % 32;
            const uint8_t code = static_cast<uint8_t>(j < 16 ? blk[1 + j] & 0x0f : blk[1 + j - 16] >> 4);
            out[static_cast<size_t>(i)] = f32_to_bf16(e2m1_to_f32(code) * e8m0_to_f32(blk[0]));
        }
        return out;
    }
    if (parse_format(s.format) == Format::fp8_block || s.architecture == "deepseek_v4") {
        // Written as e4m3 + scale_inv (DeepSeek-V4: + scale, e8m0 or float); the loader
        // dequantises to bf16 with the reference.
        const bool e8m0 = s.architecture == "deepseek_v4" && s.ds_shared_scale_dtype == "F8_E8M0";
        const int q = proj == FT_PROJ_GATE ? 0 : proj == FT_PROJ_UP ? 1 : 2;
        const Kind wk[3] = {kSharedGate, kSharedUp, kSharedDown}, sk[3] = {kSharedGateScale, kSharedUpScale, kSharedDownScale};
        const int64_t N = q == 2 ? s.hidden : s.shared_intermediate, K = q == 2 ? s.shared_intermediate : s.hidden;
        const uint64_t wkey = tensor_key(s, l, wk[q], 0), skey = tensor_key(s, l, sk[q], 0);
        std::vector<uint16_t> out(static_cast<size_t>(N * K));
        std::vector<uint16_t> band(static_cast<size_t>(K / 128));
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t b = 0; b < K / 128; ++b) {
                const uint64_t i = static_cast<uint64_t>((n / 128) * (K / 128) + b);
                band[b] = f32_to_bf16(e8m0 ? std::ldexp(1.0f, ds_shared_scale_byte(skey, i) - 127) : fp8_scale_inv(skey, i));
            }
            const std::vector<uint8_t> w = bytes_of(fp8_weight_byte, wkey, static_cast<uint64_t>(n * K), K);
            dequant_row_fp8_block(w.data(), band.data(), K, row.data());
            for (int64_t k = 0; k < K; ++k) out[n * K + k] = f32_to_bf16(row[k]);
        }
        return out;
    }
    const uint64_t n = static_cast<uint64_t>(s.hidden) * s.shared_intermediate;
    const Dtype d = parse_dtype(s.expert_dtype);
    const float sh = 1.0f / std::sqrt(static_cast<float>(s.hidden));
    switch (proj) {
        case FT_PROJ_GATE: return bf16_values(s, l, kSharedGate, 0, n, sh, d);
        case FT_PROJ_UP: return bf16_values(s, l, kSharedUp, 0, n, sh, d);
        case FT_PROJ_DOWN:
            return bf16_values(s, l, kSharedDown, 0, n, 1.0f / std::sqrt(static_cast<float>(s.shared_intermediate)), d);
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: unknown projection ", proj);
}

std::vector<uint16_t> shared_gate_weight(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    return bf16_values(s, l, kSharedGateProj, 0, static_cast<uint64_t>(s.hidden),
                       1.0f / std::sqrt(static_cast<float>(s.hidden)), parse_dtype(s.expert_dtype));
}

std::vector<int32_t> tid2eid(const Spec &s, int moe_layer) {
    const int l = checkpoint_layer(s, moe_layer);
    std::vector<int32_t> out(static_cast<size_t>(s.vocab_size) * static_cast<size_t>(s.top_k));
    for (size_t i = 0; i < out.size(); ++i) out[i] = tid2eid_value(s, l, i);
    return out;
}


// ---- any format ------------------------------------------------------------------------------

namespace {

using Rows = std::vector<std::vector<uint8_t>>;

// The seed key of tensor kind k of one expert of checkpoint layer l.
struct ExpertKeys {
    const Spec &s;
    int l, e;
    uint64_t operator()(Kind k) const { return tensor_key(s, l, k, e); }
};

Rows bf16_rows(const Spec &s, int moe_layer, int e) {
    std::vector<uint8_t> gu, dn;
    for (int proj : {FT_PROJ_GATE, FT_PROJ_UP})
        for (uint16_t v : expert_weight(s, moe_layer, e, proj)) append_u16(gu, v);
    for (uint16_t v : expert_weight(s, moe_layer, e, FT_PROJ_DOWN)) append_u16(dn, v);
    return {gu, dn};
}

Rows fp8_block_rows(const ExpertKeys &key, uint64_t H, uint64_t I) {
    std::vector<uint8_t> gu, gus, dn, dns;
    auto scales = [&](std::vector<uint8_t> &dst, Kind k, uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) append_u16(dst, f32_to_bf16(fp8_scale_inv(key(k), i)));
    };
    append(gu, bytes_of(fp8_weight_byte, key(kGate), 0, I * H));
    append(gu, bytes_of(fp8_weight_byte, key(kUp), 0, I * H));
    scales(gus, kGateScale, (I / 128) * (H / 128));  // gate's scale rows, then up's
    scales(gus, kUpScale, (I / 128) * (H / 128));
    append(dn, bytes_of(fp8_weight_byte, key(kDown), 0, H * I));
    scales(dns, kDownScale, (H / 128) * (I / 128));
    return {gu, gus, dn, dns};
}

Rows nvfp4_rows(const ExpertKeys &key, uint64_t H, uint64_t I) {
    std::vector<uint8_t> gp, gs, gg, dp, ds, dg;
    append(gp, bytes_of(any_byte, key(kGate), 0, I * H / 2));
    append(gp, bytes_of(any_byte, key(kUp), 0, I * H / 2));
    append(gs, bytes_of(e4m3_scale_byte, key(kGateScale), 0, I * H / 16));
    append(gs, bytes_of(e4m3_scale_byte, key(kUpScale), 0, I * H / 16));
    // Each projection's per-tensor global, once per output row.
    for (uint64_t r = 0; r < I; ++r) append_u16(gg, f32_to_f16(nvfp4_global(key(kGateGlobal))));
    for (uint64_t r = 0; r < I; ++r) append_u16(gg, f32_to_f16(nvfp4_global(key(kUpGlobal))));
    append(dp, bytes_of(any_byte, key(kDown), 0, H * I / 2));
    append(ds, bytes_of(e4m3_scale_byte, key(kDownScale), 0, H * I / 16));
    for (uint64_t r = 0; r < H; ++r) append_u16(dg, f32_to_f16(nvfp4_global(key(kDownGlobal))));
    return {gp, gs, gg, dp, ds, dg};
}

Rows ds_fp4_rows(const ExpertKeys &key, uint64_t H, uint64_t I) {
    std::vector<uint8_t> gp, gs, dp, ds;
    append(gp, bytes_of(any_byte, key(kGate), 0, I * H / 2));
    append(gp, bytes_of(any_byte, key(kUp), 0, I * H / 2));
    append(gs, bytes_of(e8m0_byte, key(kGateScale), 0, I * H / 32));
    append(gs, bytes_of(e8m0_byte, key(kUpScale), 0, I * H / 32));
    append(dp, bytes_of(any_byte, key(kDown), 0, H * I / 2));
    append(ds, bytes_of(e8m0_byte, key(kDownScale), 0, H * I / 32));
    return {gp, gs, dp, ds};
}

Rows mxfp4_rows(const ExpertKeys &key, uint64_t H, uint64_t I) {
    Rows rows;
    for (int down = 0; down < 2; ++down) {
        const uint64_t N = down ? H : 2 * I, K = down ? I : H;
        const uint64_t kb = key(down ? kDownBlocks : kGateUpBlocks), ks = key(down ? kDownScales : kGateUpScales),
                       kbias = key(down ? kDownBias : kGateUpBias);
        // Written per unit n as [K/2] bytes / [K/32] scales; the bank is the transpose.
        std::vector<uint8_t> blocks(K / 2 * N), scales(K / 32 * N), bias;
        for (uint64_t n = 0; n < N; ++n) {
            for (uint64_t j = 0; j < K / 2; ++j) blocks[j * N + n] = any_byte(kb, n * (K / 2) + j);
            for (uint64_t j = 0; j < K / 32; ++j) scales[j * N + n] = e8m0_byte(ks, n * (K / 32) + j);
            append_u16(bias, f32_to_bf16(value(kbias, n, 0.5f)));
        }
        rows.push_back(blocks);
        rows.push_back(scales);
        rows.push_back(bias);
    }
    return rows;
}

// GGUF block formats (q4_0, q8_0, K-quants, iq4_xs), each matrix in its own format: the blocks
// as written, gate rows then up rows.
Rows gguf_block_rows(const ExpertKeys &key, MatrixFormats mf, uint64_t H, uint64_t I) {
    const int64_t h = static_cast<int64_t>(H), i = static_cast<int64_t>(I);
    std::vector<uint8_t> gu;
    append(gu, bytes_of(block_byte_fn(mf.gate_up), key(kGate), 0, I * block_row_bytes(mf.gate_up, h)));
    append(gu, bytes_of(block_byte_fn(mf.gate_up), key(kUp), 0, I * block_row_bytes(mf.gate_up, h)));
    return {gu, bytes_of(block_byte_fn(mf.down), key(kDown), 0, H * block_row_bytes(mf.down, i))};
}

// GGUF MXFP4 (ggml blocks of 17 bytes per unit and 32 elements: e8m0, then element j in the low
// nibble of byte j and element j + 16 in its high nibble) re-laid-out into the transposed mxfp4
// banks: K/2 rows of N columns, element 2r in the low nibble; gate unit j is column 2j, up unit j
// column 2j + 1. Biases were written as F32 and are rounded to bf16.
Rows gguf_mxfp4_rows(const ExpertKeys &key, uint64_t H, uint64_t I) {
    Rows rows;
    for (int down = 0; down < 2; ++down) {
        const uint64_t N = down ? H : 2 * I, K = down ? I : H, ub = K / 32 * 17;
        std::vector<uint8_t> blocks(K / 2 * N), scales(K / 32 * N), bias;
        std::vector<uint8_t> codes(K);
        for (uint64_t n = 0; n < N; ++n) {
            // Column n holds down unit n, or gate / up unit n / 2.
            const Kind kind = down ? kDown : n % 2 == 0 ? kGate : kUp;
            const uint64_t unit = down ? n : n / 2;
            const std::vector<uint8_t> src = bytes_of(ggml_mxfp4_byte, key(kind), unit * ub, ub);
            for (uint64_t b = 0; b < K / 32; ++b) {
                const uint8_t *blk = src.data() + b * 17;
                scales[b * N + n] = blk[0];
                for (uint64_t j = 0; j < 32; ++j)
                    codes[b * 32 + j] = static_cast<uint8_t>(j < 16 ? blk[1 + j] & 0x0f : blk[1 + j - 16] >> 4);
            }
            for (uint64_t r = 0; r < K / 2; ++r)
                blocks[r * N + n] = static_cast<uint8_t>(codes[2 * r] | (codes[2 * r + 1] << 4));
            const float bv = down ? value(key(kDownBias), n, 0.5f)
                                  : value(key(kGateUpBias), (n % 2) * I + n / 2, 0.5f);
            append_u16(bias, f32_to_bf16(bv));
        }
        rows.push_back(blocks);
        rows.push_back(scales);
        rows.push_back(bias);
    }
    return rows;
}

// Every bank row of one expert, in schema order.
Rows expert_rows(const Spec &s, int moe_layer, int e) {
    const Format f = parse_format(s.format);
    const int l = checkpoint_layer(s, moe_layer);
    const uint64_t H = static_cast<uint64_t>(s.hidden), I = static_cast<uint64_t>(s.intermediate);
    const ExpertKeys key{s, l, e};
    if (s.gguf) {
        const MatrixFormats mf = gguf_layer_formats(s, moe_layer);
        if (format_is_block(mf.gate_up)) return gguf_block_rows(key, mf, H, I);
        if (mf.gate_up == Format::mxfp4) return gguf_mxfp4_rows(key, H, I);
        return bf16_rows(s, moe_layer, e);
    }
    switch (f) {
        case Format::bf16: return bf16_rows(s, moe_layer, e);
        case Format::fp8_block: return fp8_block_rows(key, H, I);
        case Format::nvfp4: return nvfp4_rows(key, H, I);
        case Format::ds_fp4: return ds_fp4_rows(key, H, I);
        case Format::mxfp4: return mxfp4_rows(key, H, I);
        default: break;
    }
    fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.format, " checkpoints are GGUF files (spec.gguf)");
}

// The format whose schema names the banks of MoE layer `moe_layer` (GGUF mixes: gate/up's).
Format layer_format(const Spec &s, int moe_layer) {
    return s.gguf ? gguf_layer_formats(s, moe_layer).gate_up : parse_format(s.format);
}

}  // namespace

std::vector<uint8_t> bank_row(const Spec &s, int moe_layer, int expert, const std::string &bank) {
    const Format f = layer_format(s, moe_layer);
    const int b = bank_index(f, bank);
    if (b < 0) fail(FT_ERR_INVALID_ARGUMENT, "synth: format ", s.format, " has no bank '", bank, "'");
    return expert_rows(s, moe_layer, expert)[static_cast<size_t>(b)];
}

std::vector<float> expert_dequant(const Spec &s, int moe_layer, int expert, int proj) {
    const Format f = layer_format(s, moe_layer);
    const std::vector<std::vector<uint8_t>> rows = expert_rows(s, moe_layer, expert);
    if (s.gguf && format_is_block(f)) {
        // Each matrix by its own format's reference row dequantiser.
        const MatrixFormats mf = gguf_layer_formats(s, moe_layer);
        const bool dn = proj == FT_PROJ_DOWN;
        const Format pf = dn ? mf.down : mf.gate_up;
        const int64_t N = dn ? s.hidden : s.intermediate, K = dn ? s.intermediate : s.hidden;
        const size_t rb = block_row_bytes(pf, K);
        const uint8_t *base = rows[dn ? 1 : 0].data() + (proj == FT_PROJ_UP ? static_cast<size_t>(N) * rb : 0);
        std::vector<float> out(static_cast<size_t>(N * K));
        for (int64_t n = 0; n < N; ++n) dequant_row_block(pf, base + static_cast<size_t>(n) * rb, K, &out[static_cast<size_t>(n * K)]);
        return out;
    }
    std::vector<const uint8_t *> ptrs;
    for (const auto &r : rows) ptrs.push_back(r.data());
    std::vector<float> out(static_cast<size_t>(s.hidden) * s.intermediate);
    dequant_projection(f, ptrs.data(), s.hidden, s.intermediate, proj, out.data());
    return out;
}

std::vector<float> expert_bias(const Spec &s, int moe_layer, int expert, int proj) {
    const Format f = layer_format(s, moe_layer);
    if (f != Format::mxfp4) return {};
    const std::vector<std::vector<uint8_t>> rows = expert_rows(s, moe_layer, expert);
    std::vector<const uint8_t *> ptrs;
    for (const auto &r : rows) ptrs.push_back(r.data());
    std::vector<float> out(static_cast<size_t>(proj == FT_PROJ_DOWN ? s.hidden : s.intermediate));
    projection_bias(f, ptrs.data(), s.hidden, s.intermediate, proj, out.data());
    return out;
}

}  // namespace ft::synth
