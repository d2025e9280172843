// The routed experts of a bf16/f16/f32 checkpoint into the bf16 banks (gate_up [2I, H], down
// [H, I] per expert): per-expert tensors, fused 3-D tensors ([E, 2I, H] / [E, H, I] or their
// transposes), GraniteMoE's input_linear / output_linear, and gpt-oss's interleaved layout.
#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "st_plan.hpp"

namespace ft::load {

void Planner::plan_layer_bf16(int l, const std::string &layer_prefix, const Block &b) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    const std::string block = layer_prefix + b.name;
    if (spec_.architecture == "gpt_oss") return plan_gpt_oss_bf16(l, block);

    const std::string first_per = block + "experts.0." + b.proj[0] + ".weight";
    const bool per_expert = ckpt_.contains(first_per);
    // Fused 3-D tensors exist only unquantised; a quantised export always stores per-expert
    // tensors (or, gpt-oss, its own _blocks names).
    for (const auto &names : {std::pair<std::string, std::string>{"experts.gate_up_proj", "experts.down_proj"},
                              std::pair<std::string, std::string>{"input_linear.weight", "output_linear.weight"}}) {
        const std::string gu = block + names.first, dn = block + names.second;
        if (!ckpt_.contains(gu) && !ckpt_.contains(dn)) continue;
        if (per_expert)
            fail(FT_ERR_FORMAT, ckpt_.dir(), ": layer ", spec_.moe_layers[l], " has both fused '", gu,
                 "' and per-expert '", first_per, "' tensors");
        plan_fused_bf16(l, require(gu, "fused gate/up projections of the routed experts"),
                        require(dn, "fused down projections of the routed experts"), false);
        return;
    }
    if (!per_expert)
        require(first_per, "routed expert 0; fused '" + block + "experts.gate_up_proj' is absent too");
    const std::vector<int64_t> shapes[3] = {{I, H}, {I, H}, {H, I}};
    for (int64_t e = 0; e < E; ++e) {
        for (int proj = 0; proj < 3; ++proj) {
            const std::string name = block + "experts." + std::to_string(e) + "." + b.proj[proj] + ".weight";
            const auto &t = require(name, "routed expert projection");
            check_float(t);
            check_shape(t, shapes[proj]);
            uint8_t *dst = proj == 2 ? banks.row(1, l, e)
                                     : banks.row(0, l, e) + (proj == 1 ? static_cast<size_t>(I * H * 2) : 0);
            add_bf16(t, 0, static_cast<uint64_t>(I * H), dst, l);
        }
    }
}

// gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I], or their transposes
// [E, H, 2I] / [E, I, H]; transposed_only admits only the latter.
void Planner::plan_fused_bf16(int l, const Entry &gu, const Entry &dn, bool transposed_only) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    const std::string &fused_gu = gu.info->name, &fused_dn = dn.info->name;
    check_float(gu);
    check_float(dn);
    const std::vector<int64_t> &gs = gu.info->shape, &ds = dn.info->shape;
    bool gu_std = !transposed_only && gs == std::vector<int64_t>{E, 2 * I, H};
    bool gu_tr = gs == std::vector<int64_t>{E, H, 2 * I};
    if (!gu_std && !gu_tr)
        fail(FT_ERR_FORMAT, gu.file->path(), ": tensor '", fused_gu, "': expected shape ",
             transposed_only ? shape_str({E, H, 2 * I}) : shape_str({E, 2 * I, H}) + " (or transposed " +
             shape_str({E, H, 2 * I}) + ")", ", got ", shape_str(gs));
    const bool dn_std = !transposed_only && ds == std::vector<int64_t>{E, H, I};
    const bool dn_tr = ds == std::vector<int64_t>{E, I, H};
    if (!dn_std && !dn_tr)
        fail(FT_ERR_FORMAT, dn.file->path(), ": tensor '", fused_dn, "': expected shape ",
             transposed_only ? shape_str({E, I, H}) : shape_str({E, H, I}) + " (or transposed " +
             shape_str({E, I, H}) + ")", ", got ", shape_str(ds));
    if (gu_std && gu_tr) {
        // hidden_size == 2 * intermediate_size: both readings of gate_up fit, but not of down
        // (H != I then), whose orientation decides.
        gu_std = dn_std;
        gu_tr = dn_tr;
    }
    // With H == I both readings fit down_proj; then it follows gate_up_proj's orientation.
    if ((gu_std && !dn_std) || (gu_tr && !dn_tr))
        fail(FT_ERR_FORMAT, dn.file->path(), ": tensor '", fused_dn, "' ", shape_str(ds), " is ",
             gu_std ? "transposed" : "not transposed", " but '", fused_gu, "' ", shape_str(gs), " is",
             gu_std ? " not" : "", "; inconsistent fused layout");
    if (gu_std) {
        // [E, 2I, H] with gate rows then up rows is exactly the gate_up bank; [E, H, I] the down bank.
        add_bf16(gu, 0, static_cast<uint64_t>(E * 2 * I * H), banks.row(0, l, 0), l);
        add_bf16(dn, 0, static_cast<uint64_t>(E * H * I), banks.row(1, l, 0), l);
    } else {
        // [E, H, 2I]: column j < I is gate unit j, I + j up unit j (gpt-oss interleaves them:
        // column 2j gate j, 2j + 1 up j); transposing each expert's [H, 2I] gives the [2I, H] bank
        // row. [E, I, H] transposes to the [H, I] down row.
        const bool interleaved = spec_.architecture == "gpt_oss";
        for (int64_t e = 0; e < E; ++e) {
            add_transpose(gu, static_cast<uint64_t>(e * H * 2 * I), H, 2 * I, banks.row(0, l, e), l, interleaved);
            add_transpose(dn, static_cast<uint64_t>(e * I * H), I, H, banks.row(1, l, e), l);
        }
    }
}

// bf16 gpt-oss as transformers writes it: experts.gate_up_proj [E, H, 2I] with gate and up
// interleaved on the last axis, gate_up_proj_bias [E, 2I] (interleaved alike),
// down_proj [E, I, H], down_proj_bias [E, H]. The biases go to LayerExtras in f32, gate biases
// then up biases per expert.
void Planner::plan_gpt_oss_bf16(int l, const std::string &block) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    const std::string experts = block + "experts.";
    plan_fused_bf16(l, require(experts + "gate_up_proj", "bf16 routed experts (gate and up, interleaved)"),
                    require(experts + "down_proj", "bf16 routed experts (down)"), true);
    LayerExtras &x = model_.extras(l);
    const Entry &gb = require(experts + "gate_up_proj_bias", "biases of the routed experts' gate and up projections");
    const Entry &db = require(experts + "down_proj_bias", "biases of the routed experts' down projections");
    check_shape(gb, {E, 2 * I});
    check_shape(db, {E, H});
    add_extra(gb, x.expert_gate_up_bias, Keep::f32, {}, 2 * I);
    add_extra(db, x.expert_down_bias, Keep::f32);
}

void Planner::plan_layer_fp8_nvfp4(int l, const std::string &block, const Block &b) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    const bool fp8 = spec_.format == Format::fp8_block;
    if (ckpt_.contains(block + "experts.gate_up_proj"))
        fail(FT_ERR_UNSUPPORTED, ckpt_.dir(), ": tensor '", block, "experts.gate_up_proj': fused 3-D ",
             format_name(spec_.format), " experts are not supported (per-expert tensors are)");
    for (int64_t e = 0; e < E; ++e) {
        for (int proj = 0; proj < 3; ++proj) {
            const std::string base = block + "experts." + std::to_string(e) + "." + b.proj[proj] + ".";
            const bool down = proj == 2;
            const int64_t N = down ? H : I, K = down ? I : H;
            const int64_t row0 = proj == 1 ? I : 0;  // first row of this projection in the gate_up banks
            const Entry &w = require(base + "weight", "routed expert projection");
            if (fp8) {
                // Banks: 0 gate_up e4m3 [2I, H], 1 gate_up_scale bf16 [2I/128, H/128], 2 down, 3 down_scale.
                const Entry &s = require(base + "weight_scale_inv", "128 x 128 block scales of the weight");
                check_dtype(w, {StDtype::F8_E4M3});
                check_shape(w, {N, K});
                check_dtype(s, {StDtype::BF16, StDtype::F32});
                check_shape(s, {N / kFp8Block, K / kFp8Block});
                uint8_t *wd = down ? banks.row(2, l, e) : banks.row(0, l, e) + row0 * H;
                uint8_t *sd = down ? banks.row(3, l, e)
                                   : banks.row(1, l, e) + (row0 / kFp8Block) * (H / kFp8Block) * 2;
                add_raw(w, 0, static_cast<uint64_t>(N * K), wd, l);
                add_bf16(s, 0, static_cast<uint64_t>((N / kFp8Block) * (K / kFp8Block)), sd, l);
            } else {
                // Banks: 0 packed [2I, H/2], 1 e4m3 scale [2I, H/16], 2 fp16 global [2I], 3-5 the same for down.
                const Entry &s = require(base + "weight_scale", "NVFP4 e4m3 block scales of the weight");
                const Entry &g = require(base + "weight_scale_2", "NVFP4 per-tensor global scale of the weight");
                check_dtype(w, {StDtype::U8, StDtype::I8});
                check_shape(w, {N, K / 2});
                check_dtype(s, {StDtype::F8_E4M3, StDtype::U8});
                check_shape(s, {N, K / kNvfp4Block});
                check_dtype(g, {StDtype::F32, StDtype::BF16, StDtype::F16});
                if (g.info->numel != 1 || g.info->shape.size() > 1)
                    fail(FT_ERR_FORMAT, g.file->path(), ": tensor '", g.info->name, "': expected a scalar, got shape ",
                         shape_str(g.info->shape));
                const int bank0 = down ? 3 : 0;
                add_raw(w, 0, static_cast<uint64_t>(N * K / 2), banks.row(bank0, l, e) + row0 * H / 2, l);
                add_raw(s, 0, static_cast<uint64_t>(N * K / kNvfp4Block),
                        banks.row(bank0 + 1, l, e) + row0 * H / kNvfp4Block, l);
                // The per-tensor global goes to each of the projection's output rows, so the gate
                // and up halves keep their own (never folded into the e4m3 scales: docs/formats.md).
                add_broadcast_f16(g, static_cast<uint64_t>(N), banks.row(bank0 + 2, l, e) + row0 * 2, l);
            }
        }
    }
}

void Planner::plan_layer_mxfp4(int l, const std::string &block) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    for (int which = 0; which < 2; ++which) {
        const bool down = which == 1;
        const std::string name = block + "experts." + (down ? "down_proj" : "gate_up_proj");
        // N output units (gate_up: 2I interleaved gate/up columns), reduced over K.
        const int64_t N = down ? H : 2 * I, K = down ? I : H;
        const Entry &bl = require(name + "_blocks", "MXFP4 e2m1 blocks of the routed experts");
        const Entry &sc = require(name + "_scales", "MXFP4 e8m0 scales of the routed experts");
        const Entry &bi = require(name + "_bias", "biases of the routed experts");
        check_dtype(bl, {StDtype::U8});
        check_shape(bl, {E, N, K / kMxfp4Block, 16});
        check_dtype(sc, {StDtype::U8, StDtype::F8_E8M0});
        check_shape(sc, {E, N, K / kMxfp4Block});
        check_float(bi);
        check_shape(bi, {E, N});
        // HF stores each expert as [N][K/2] bytes (and [N][K/32] scales); the banks hold the
        // transposes, N innermost, so a GEMV streams whole contiguous rows of K (docs/formats.md).
        const int bank0 = down ? 3 : 0;
        for (int64_t e = 0; e < E; ++e) {
            add_transpose_u8(bl, static_cast<uint64_t>(e * N * K / 2), N, K / 2, banks.row(bank0, l, e), l, false);
            add_transpose_u8(sc, static_cast<uint64_t>(e * N * K / kMxfp4Block), N, K / kMxfp4Block,
                             banks.row(bank0 + 1, l, e), l, true);
        }
        // Bias rows are [N] bf16 per expert, back to back: the whole [E, N] tensor at once.
        add_bf16(bi, 0, static_cast<uint64_t>(E * N), banks.row(bank0 + 2, l, 0), l);
    }
}

void Planner::plan_layer_ds_fp4(int l, const std::string &block, const Block &b) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();
    for (int64_t e = 0; e < E; ++e) {
        for (int proj = 0; proj < 3; ++proj) {
            const std::string base = block + "experts." + std::to_string(e) + "." + b.proj[proj] + ".";
            const bool down = proj == 2;
            const int64_t N = down ? H : I, K = down ? I : H;
            const int64_t row0 = proj == 1 ? I : 0;
            const Entry &w = require(base + "weight", "routed expert projection (packed fp4)");
            const Entry &s = require(base + "scale", "e8m0 scales of the weight");
            check_dtype(w, {StDtype::I8, StDtype::U8});
            check_shape(w, {N, K / 2});
            check_dtype(s, {StDtype::F8_E8M0, StDtype::U8});
            check_shape(s, {N, K / kDsfp4Block});
            // Banks: 0 packed [2I, H/2], 1 e8m0 [2I, H/32], 2 down packed [H, I/2], 3 down e8m0 [H, I/32].
            uint8_t *wd = down ? banks.row(2, l, e) : banks.row(0, l, e) + row0 * H / 2;
            uint8_t *sd = down ? banks.row(3, l, e) : banks.row(1, l, e) + row0 * H / kDsfp4Block;
            add_raw(w, 0, static_cast<uint64_t>(N * K / 2), wd, l);
            add_raw(s, 0, static_cast<uint64_t>(N * K / kDsfp4Block), sd, l, true);
        }
    }
}

}  // namespace ft::load
