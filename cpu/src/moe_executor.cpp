// MoE executor: groups a call's routes by expert so each distinct expert is read once for all of
// its tokens, then runs pass 1 (gate/up + activation into a bf16 intermediate) and pass 2 (down
// into per-route fp32 rows) over (expert, row block) work items, and finally sums each token's
// routes in route order. Every output value is produced by one fixed sequence of operations, so
// the result does not depend on the number of workers or on which worker took which item.
#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FT_CPU_RELAX() _mm_pause()
#else
#include <thread>
#define FT_CPU_RELAX() std::this_thread::yield()
#endif

#include "moe_internal.hpp"

namespace ft::cpu {
namespace {

// When oneDNN takes over an expert's routes (see cpu/README.md for the measurements). Against the
// SIMD kernels without AMX oneDNN's bf16 matmul was never faster, at any token count up to 128;
// against the AMX GEMV it was slower at 8, 16 and 32 tokens per expert: off in both cases. With
// AMX but FT_CPU_AMX=0 (16-core Xeon of the GPU machine) it was 2.2x slower than the AVX-512-BF16
// GEMV at 16 tokens per expert, even at 32 and 14 % faster at 64.
int32_t default_onednn_min_tokens(bool amx_gemv) { return !amx_gemv && amx_bf16_available() ? 64 : 0; }

// Routes per expert from which quantised experts are dequantised to bf16 for the multi-token GEMV:
// 8 on the AMX GEMV (its tiles cost the same for any token count; the direct kernels still win
// at 4), 16 on the AVX-512-BF16 one.
int32_t default_batched_min_tokens(bool amx_gemv) { return amx_gemv ? 8 : 16; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

BankRoles bank_roles(Format f) {
    // GGUF block formats (q4_0, q8_0, the K-quants, iq4_xs): gate_up bank 0, down bank 1, the
    // scales inside the blocks.
    if (format_is_block(f)) return {0, -1, -1, -1, 1, -1, -1, -1};
    switch (f) {
        case Format::fp8_block: return {0, 1, -1, -1, 2, 3, -1, -1};
        case Format::nvfp4: return {0, 1, 2, -1, 3, 4, 5, -1};
        case Format::mxfp4: return {0, 1, -1, 2, 3, 4, -1, 5};
        case Format::ds_fp4: return {0, 1, -1, -1, 2, 3, -1, -1};
        default: return {0, -1, -1, -1, 1, -1, -1, -1};  // bf16: the banks are read as bf16 rows
    }
}

const uint8_t *bank(const uint8_t *const *rows, int index) { return index >= 0 ? rows[index] : nullptr; }

float bf16_bits_to_f32(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return bf16_to_f32(v);
}

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

}  // namespace

MoeTuning moe_tuning(const Tuning &t) {
    MoeTuning m;
    m.onednn_min_tokens = t.cpu_onednn_min_tokens;
    m.quant_batched_min_tokens = t.cpu_quant_batched_min_tokens;
    m.amx = t.cpu_amx;
    m.quant.vnni = t.cpu_vnni;
    m.quant.mxfp4_w4a8 = t.cpu_mxfp4_w4a8;
    m.quant.nvfp4_w4a8 = t.cpu_nvfp4_w4a8;
    return m;
}

MoeExecutor::MoeExecutor(ThreadPool &pool, Format format, int32_t hidden, int32_t intermediate, int32_t top_k,
                         int32_t max_tokens, ActivationSpec act, int32_t shared_intermediate, Isa isa,
                         MoeTuning tuning, const std::vector<Format> &mixed_formats)
    : pool_(pool), format_(format), hidden_(hidden), inter_(intermediate), top_k_(top_k), max_tokens_(max_tokens),
      shared_inter_(shared_intermediate), act_(act), isa_(isa) {
    if (hidden <= 0 || intermediate <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: hidden (", hidden, ") and intermediate (", intermediate,
             ") sizes must be > 0");
    if (top_k <= 0 || top_k > 1024)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: top_k must be in [1, 1024], got ", top_k);
    if (max_tokens <= 0 || max_tokens > (1 << 20))
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: max_tokens must be in [1, 2^20], got ", max_tokens);
    if (shared_intermediate < 0)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: shared intermediate size must be >= 0, got ",
             shared_intermediate);
    if (act.kind < FT_ACT_SILU || act.kind > FT_ACT_SWIGLU_CLAMP)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: unknown activation ", act.kind);
    if (act.kind == FT_ACT_SWIGLU_CLAMP && (!std::isfinite(act.alpha) || !(act.limit > 0.0f)))
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: clamped SwiGLU needs a finite alpha and limit > 0 (or +inf), got alpha ",
             act.alpha, " limit ", act.limit);
    if (!format_known(int32_t(format)))
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: unknown expert format ", int32_t(format));
    if (const std::string err = format_geometry_error(format, hidden, intermediate); !err.empty())
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: ", err);
    gemv_ = gemv_kernel(isa);  // FT_ERR_UNSUPPORTED when the CPU lacks the tier
    if (const GemvFn amx = isa == Isa::avx512bf16 && tuning.amx ? gemv_kernel_amx() : nullptr) {
        gemv_ = amx;
        amx_gemv_ = true;
    }
    quant_ = quant_ops(format, isa, tuning.quant, amx_gemv_);
    for (const Format f : mixed_formats) {
        if (!format_known(int32_t(f)) || !format_is_block(f) || !format_is_block(format))
            fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: only GGUF block formats mix per layer or matrix, not ",
                 format_known(int32_t(f)) ? format_name(f) : "(unknown)", " with ", format_name(format));
        if (const std::string err = format_geometry_error(f, hidden, intermediate); !err.empty())
            fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: ", err);
    }
    // Every accepted format once, `format` first: its kernels (FT_ERR_UNSUPPORTED without) and rows.
    for (size_t i = 0; i <= mixed_formats.size(); ++i) {
        const Format f = i == 0 ? format : mixed_formats[i - 1];
        bool seen = false;
        for (const FormatEntry &e : formats_) seen |= e.format == f;
        if (seen) continue;
        FormatEntry e{f, i == 0 ? quant_ : quant_ops(f, isa, tuning.quant, amx_gemv_), {}};
        for (const BankSpec &b : bank_schema(f, hidden, intermediate)) e.bank_bytes.push_back(b.row_bytes);
        formats_.push_back(std::move(e));
    }

    const int32_t bmin = tuning.quant_batched_min_tokens < 0 ? default_batched_min_tokens(amx_gemv_)
                                                              : tuning.quant_batched_min_tokens;
    if (quant_ && quant_->dequant) quant_batched_min_tokens_ = bmin;
    bool any_dequant = false;
    for (const FormatEntry &e : formats_) any_dequant |= e.ops && e.ops->dequant;
    const int32_t batched_min = any_dequant ? bmin : 0;
    onednn_min_tokens_ =
        tuning.onednn_min_tokens < 0 ? default_onednn_min_tokens(amx_gemv_) : tuning.onednn_min_tokens;
    if (onednn_min_tokens_ > 0 && !onednn_bf16_available()) onednn_min_tokens_ = 0;

    const int64_t routes = int64_t(max_tokens) * top_k;
    const int64_t slots = routes + (shared_intermediate > 0 ? max_tokens : 0);
    const int64_t max_group = std::max<int64_t>(routes, max_tokens);
    s_ = std::make_unique<Scratch>();
    s_->batched_min = batched_min;
    // mxfp4's down matrix is read as columns of [K/2][H]: 64 columns are one cache line per K row,
    // so no line is shared by two items (32 would fetch every line twice, by two workers).
    if (format == Format::mxfp4) s_->p2_block = 2 * kRowBlock;
    // A line's 128-byte buddy is fetched with it by the adjacent-line prefetchers (Intel's
    // spatial prefetcher, Zen 4's L2 up/down one). With one line per item that buddy is the next
    // item's, read by another worker, so DRAM sends about twice the bytes used. Items of two
    // lines (128 columns) take both halves (pass 1: 5760-byte rows are 128-aligned; pass 2 with
    // H = 2880 only every other row is); with one token the VBMI kernel reads both lines per K
    // row in one pass.
    if (format == Format::mxfp4) s_->mxfp4_lines = kMxfp4Lines;
    // Prepared activations sized for the largest layout among the accepted formats.
    size_t act_in_cap = 0, act_mid_cap = 0;
    for (const FormatEntry &e : formats_) {
        if (!e.ops) continue;
        act_in_cap = std::max(act_in_cap, LineBytes::stride(e.ops->act_bytes(hidden)));
        act_mid_cap = std::max(act_mid_cap, LineBytes::stride(e.ops->act_bytes(intermediate)));
    }
    // The batched path's dequantised rows: as long as the activation part it reads.
    size_t deq_cols = 0;
    for (const FormatEntry &e : formats_) {
        if (!e.ops || !e.ops->dequant) continue;
        deq_cols = std::max({deq_cols, e.ops->dequant_act_bytes(hidden) / 2, e.ops->dequant_act_bytes(intermediate) / 2});
    }
    try {
        s_->keys.resize(routes);
        s_->route_slot.resize(routes);
        s_->xptr.resize(slots);
        s_->iptr.resize(slots);
        s_->groups.resize(routes + 1);
        s_->p1_prefix.resize(routes + 2);
        s_->p2_prefix.resize(routes + 2);
        s_->inter.resize(routes * intermediate + int64_t(max_tokens) * shared_intermediate);
        s_->route_out.resize(slots * hidden);
        s_->shared_gate.resize(max_tokens);
        s_->tiles.resize(size_t(pool.size()) * 2 * kRouteChunk * kRowBlock * kMaxItemBlocks);
        s_->aptr.resize(slots);
        s_->mptr.resize(slots);
        s_->aptr16.resize(slots);
        s_->mptr16.resize(slots);
        if (batched_min > 0 && batched_min <= max_group) {
            s_->deq_ld = deq_cols;
            s_->deq.resize(size_t(pool.size()) * 2 * kRowBlock * s_->deq_ld);
            s_->deq_scale.resize(size_t(pool.size()) * 2 * kRowBlock);
        }
        if (quant_) {
            s_->act_in.resize(size_t(max_tokens) * act_in_cap);
            s_->act_mid.resize(size_t(routes) * act_mid_cap);
        }
        if (onednn_min_tokens_ > 0 && onednn_min_tokens_ <= max_group) {
            s_->gathered_x.resize(max_group * hidden);
            s_->gate_up_f32.resize(max_group * 2 * std::max(intermediate, shared_intermediate));
        }
    } catch (const std::bad_alloc &) {
        fail(FT_ERR_OUT_OF_MEMORY, "MoE executor: cannot allocate scratch for ", max_tokens, " tokens x ", top_k,
             " routes (H=", hidden, ", I=", intermediate, ")");
    }
}

MoeExecutor::~MoeExecutor() = default;

void MoeExecutor::set_weight_on_input(bool on) {
    if (on && quant_)
        fail(FT_ERR_UNSUPPORTED, "MoE executor: route weights on the expert input are served for bf16 experts only, not ",
             format_name(format_));
    weight_on_input_ = on;
    try {
        s_->scaled_x.assign(on ? size_t(max_tokens_) * top_k_ * hidden_ : 0, 0);
    } catch (const std::bad_alloc &) {
        fail(FT_ERR_OUT_OF_MEMORY, "MoE executor: cannot allocate the scaled inputs of ", max_tokens_, " tokens");
    }
}

const char *MoeExecutor::kernel_name() const { return quant_ ? quant_->kernel : isa_name(isa_); }

MoeStats MoeExecutor::run(const ExpertSource &src, const SharedExpertView *shared, int32_t num_tokens,
                          const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y) {
    if (num_tokens < 0 || num_tokens > max_tokens_)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: num_tokens ", num_tokens, " outside [0, ", max_tokens_, "]");
    MoeStats stats;
    if (num_tokens == 0) return stats;
    if (!x || !ids || !w || !y) fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: NULL x, ids, weights or output");
    const int64_t H = hidden_, I = inter_, K = top_k_, T = num_tokens;
    Scratch &s = *s_;
    // The formats of this layer: gate_up in src.format, down in src.down_format where it mixes.
    auto entry = [this](int32_t f) -> const FormatEntry & {
        for (const FormatEntry &e : formats_)
            if (int32_t(e.format) == f) return e;
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: expert source in format ",
             format_known(f) ? format_name(Format(f)) : "(unknown)", ", the executor was made for ",
             format_name(format_), formats_.size() > 1 ? " and the block formats it mixes" : "");
    };
    const FormatEntry &gu = entry(int32_t(src.format));
    const FormatEntry &dn = src.down_format < 0 ? gu : entry(src.down_format);
    const int nbanks = int(gu.bank_bytes.size());
    s.num_banks = nbanks;
    s.expert_bytes = 0;
    for (int b = 0; b < nbanks; ++b) {
        // Two-bank block formats: bank 0 is gate_up, bank 1 down (the only ones that mix).
        s.bank_bytes[b] = (&dn != &gu && b == 1) ? dn.bank_bytes[1] : gu.bank_bytes[b];
        s.expert_bytes += s.bank_bytes[b];
    }
    s.roles = bank_roles(gu.format);
    if (&dn != &gu) {
        const BankRoles d = bank_roles(dn.format);
        s.roles.dn_data = d.dn_data;
        s.roles.dn_scale = d.dn_scale;
        s.roles.dn_global = d.dn_global;
        s.roles.dn_bias = d.dn_bias;
    }
    s.gu_ops = gu.ops;
    s.dn_ops = dn.ops;
    s.act_in_bytes = gu.ops ? LineBytes::stride(gu.ops->act_bytes(hidden_)) : 0;
    s.act_mid_bytes = dn.ops ? LineBytes::stride(dn.ops->act_bytes(inter_)) : 0;
    // The batched path dequantises both passes' rows to bf16: both formats need it at this tier.
    s.batched_ok = s.batched_min > 0 && gu.ops && gu.ops->dequant && dn.ops && dn.ops->dequant;
    if (s.batched_ok) {
        s.batched_in_cols = int(gu.ops->dequant_act_bytes(hidden_) / 2);
        s.batched_mid_cols = int(dn.ops->dequant_act_bytes(inter_) / 2);
    }
    if (src.num_experts <= 0 || src.num_banks != nbanks)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: expert source with ", src.num_banks, " banks and ", src.num_experts,
             " experts (", format_name(gu.format), " has ", nbanks, " banks)");
    for (int b = 0; b < nbanks; ++b) {
        if (!src.base[b]) fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: bank ", b, " has no base pointer");
        if (src.row_bytes[b] < s.bank_bytes[b])
            fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: rows of bank ", b, " are ", src.row_bytes[b],
                 " bytes, smaller than one expert's ", s.bank_bytes[b]);
    }
    if ((src.gate_up_bias || src.down_bias) && quant_)
        fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: expert biases beside the banks are for bf16 experts only");
    if (shared) {
        if (shared_inter_ == 0 || shared->intermediate != shared_inter_)
            fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: shared expert intermediate ", shared->intermediate,
                 " does not match the executor's ", shared_inter_);
        if (!shared->gate || !shared->up || !shared->down)
            fail(FT_ERR_INVALID_ARGUMENT, "MoE executor: shared expert with NULL weights");
    }

    // Group valid routes by expert: sort (expert, route) keys; slots follow the sorted order.
    int64_t nvalid = 0;
    for (int64_t r = 0; r < T * K; ++r) {
        int32_t e = ids[r];
        s.route_slot[r] = -1;
        if (e >= 0 && e < src.num_experts) s.keys[nvalid++] = (uint64_t(uint32_t(e)) << 32) | uint64_t(r);
    }
    std::sort(s.keys.begin(), s.keys.begin() + nvalid);
    stats.routes_computed = nvalid;
    stats.routes_skipped = T * K - nvalid;

    int32_t ng = 0;
    for (int64_t slot = 0; slot < nvalid; ++slot) {
        const int32_t e = int32_t(s.keys[slot] >> 32);
        const int64_t r = int64_t(s.keys[slot] & 0xffffffffu);
        s.route_slot[r] = int32_t(slot);
        s.xptr[slot] = x + (r / K) * H;
        if (weight_on_input_) {
            // The expert sees w * x, rounded to bf16 like any input row.
            uint16_t *xs = s.scaled_x.data() + slot * H;
            const uint16_t *xt = x + (r / K) * H;
            for (int64_t h = 0; h < H; ++h) xs[h] = f32_to_bf16(w[r] * bf16_to_f32(xt[h]));
            s.xptr[slot] = xs;
        }
        s.iptr[slot] = s.inter.data() + slot * I;
        if (quant_) {
            s.aptr[slot] = s.act_in.data() + size_t(r / K) * s.act_in_bytes;
            s.mptr[slot] = s.act_mid.data() + size_t(slot) * s.act_mid_bytes;
            s.aptr16[slot] = reinterpret_cast<const uint16_t *>(s.aptr[slot]);
            s.mptr16[slot] = reinterpret_cast<const uint16_t *>(s.mptr[slot]);
        }
        if (ng == 0 || int32_t(s.keys[s.groups[ng - 1].first_slot] >> 32) != e) {
            Group &g = s.groups[ng++];
            for (int b = 0; b < nbanks; ++b) g.rows[b] = src.base[b] + size_t(e) * src.row_bytes[b];
            g.quant = quant_ != nullptr;
            const uint16_t *gu = reinterpret_cast<const uint16_t *>(g.rows[0]);
            g.gate = gu;
            g.up = gu + I * H;
            g.down = reinterpret_cast<const uint16_t *>(g.rows[nbanks - 1]);
            g.inter = inter_;
            g.first_slot = int32_t(slot);
            g.count = 0;
            g.inter_out = s.inter.data() + slot * I;
            g.gu_bias = src.gate_up_bias ? src.gate_up_bias + size_t(e) * 2 * I : nullptr;
            g.dn_bias = src.down_bias ? src.down_bias + size_t(e) * H : nullptr;
        }
        s.groups[ng - 1].count++;
    }
    stats.experts_read = ng;
    stats.bytes_read = uint64_t(ng) * s.expert_bytes;

    s.has_shared = shared != nullptr;
    if (shared) {
        const int64_t Is = shared_inter_;
        uint16_t *shared_inter = s.inter.data() + int64_t(max_tokens_) * K * I;
        for (int64_t t = 0; t < T; ++t) {
            s.xptr[nvalid + t] = x + t * H;
            s.iptr[nvalid + t] = shared_inter + t * Is;
        }
        Group &g = s.groups[ng++];
        g = Group{shared->gate, shared->up, shared->down, shared_inter_, int32_t(nvalid), int32_t(T), shared_inter, false,
                  false, false, {}, nullptr, nullptr};
        stats.bytes_read += uint64_t(3 * Is * H) * 2;
        if (shared->gate_proj) {
            // sigmoid(gate_proj . x[t]): one row against all tokens, done here because it is tiny.
            gemv_(shared->gate_proj, H, 1, int(H), &s.xptr[nvalid], int(T), s.shared_gate.data(), 1);
            for (int64_t t = 0; t < T; ++t) s.shared_gate[t] = 1.0f / (1.0f + std::exp(-s.shared_gate[t]));
            stats.bytes_read += uint64_t(H) * 2;
        } else {
            std::fill(s.shared_gate.begin(), s.shared_gate.begin() + T, 1.0f);
        }
    }

    if (ng == 0) {
        // No route is this executor's (a hybrid step whose misses were all fetched): the sum is
        // zero, written here without waking the workers.
        std::fill(y, y + T * H, uint16_t(0));
        return stats;
    }

    // Work items: (group, row block) for the groups the SIMD kernels handle.
    bool any_onednn = false;
    int64_t q1_units = 0, q2_rows = 0;  // SIMD quantised groups: gate/up units, down rows
    for (int32_t gi = 0; gi < ng; ++gi) {
        Group &g = s.groups[gi];
        // The oneDNN path adds no biases: experts with biases stay on the SIMD kernels.
        // DeepSeek-V4's shared expert stays there too: its clamp lives in the SIMD pass.
        g.onednn = !g.quant && !g.gu_bias && !g.dn_bias && format_ != Format::ds_fp4 && onednn_min_tokens_ > 0 &&
                   g.count >= onednn_min_tokens_;
        g.batched = g.quant && s.batched_ok && g.count >= s.batched_min;
        any_onednn |= g.onednn;
        if (g.quant && !g.batched && format_ != Format::mxfp4) q1_units += g.inter, q2_rows += H;
    }
    auto blocks_for = [&](int64_t units) {
        int b = 1;
        while (b < kMaxItemBlocks && units >= int64_t(2 * b) * kRowBlock * kItemsPerWorker * pool_.size()) b *= 2;
        return b;
    };
    s.q1_blocks = blocks_for(q1_units);
    s.q2_blocks = blocks_for(q2_rows);
    s.p1_prefix[0] = s.p2_prefix[0] = 0;
    for (int32_t gi = 0; gi < ng; ++gi) {
        const Group &g = s.groups[gi];
        s.p1_prefix[gi + 1] = s.p1_prefix[gi] + (g.onednn ? 0 : ceil_div(g.inter, int64_t(kRowBlock) * p1_blocks(g)));
        s.p2_prefix[gi + 1] = s.p2_prefix[gi] + (g.onednn ? 0 : ceil_div(H, p2_rows(g)));
    }
    s.num_tokens = num_tokens;
    s.routed_slots = int32_t(nvalid);
    s.w = w;
    s.y = y;
    s.x = x;
    s.num_groups = ng;
    s.p1_total = s.p1_prefix[ng];
    s.p2_total = s.p2_prefix[ng];
    s.reduce_total = T * ceil_div(H, kReduceBlock);
    s.p1_next.store(0, std::memory_order_relaxed);
    s.p2_next.store(0, std::memory_order_relaxed);
    s.reduce_next.store(0, std::memory_order_relaxed);
    s.prep_in_total = quant_ ? T : 0;
    s.prep_mid_total = quant_ ? nvalid : 0;
    s.prep_in_next.store(0, std::memory_order_relaxed);
    s.prep_mid_next.store(0, std::memory_order_relaxed);
    s.barrier_count.store(0, std::memory_order_relaxed);

    if (!any_onednn) {
        pool_.run([this](int wk, int n) { run_pool_passes(wk, n, true); });
    } else {
        // oneDNN runs on its own OpenMP threads from this thread, while the pool is idle, so the
        // two never compete for cores.
        if (s.p1_total > 0) pool_.run([this](int wk, int n) { run_pool_passes(wk, n, false); });
        run_onednn_groups();
        pool_.run([this](int, int) {
            for (int64_t it; (it = s_->reduce_next.fetch_add(1, std::memory_order_relaxed)) < s_->reduce_total;)
                reduce_rows(it);
        });
    }
    return stats;
}

namespace {
// Spin barrier among the workers of one job (they are all running, so spinning is short).
void barrier(std::atomic<int> &count, std::atomic<int> &gen, int n) {
    const int g = gen.load(std::memory_order_acquire);
    if (count.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
        count.store(0, std::memory_order_relaxed);
        gen.fetch_add(1, std::memory_order_release);
    } else {
        while (gen.load(std::memory_order_acquire) == g) FT_CPU_RELAX();
    }
}
}  // namespace

// Phases, each a loop over atomically grabbed items, separated by spin barriers: [prepare the
// inputs of the quantised kernels per token] -> pass 1 -> [prepare the intermediates per routed
// slot] -> pass 2 -> reduction. The bracketed phases exist only for quantised formats.
void MoeExecutor::run_pool_passes(int worker, int num_workers, bool with_reduce) {
    Scratch &s = *s_;
    // Work continues through the barriers even after a failure, so no worker waits forever.
    std::exception_ptr error;
    auto guarded = [&error](auto &&fn) {
        try {
            fn();
        } catch (...) {
            if (!error) error = std::current_exception();
        }
    };
    if (quant_) {
        guarded([&] {
            for (int64_t t; (t = s.prep_in_next.fetch_add(1, std::memory_order_relaxed)) < s.prep_in_total;)
                s.gu_ops->prepare(s.x + t * hidden_, hidden_,
                                s.act_in.data() + size_t(t) * s.act_in_bytes);
        });
        barrier(s.barrier_count, s.barrier_gen, num_workers);
    }
    guarded([&] {
        for (int64_t it; (it = s.p1_next.fetch_add(1, std::memory_order_relaxed)) < s.p1_total;) run_item_pass1(worker, it);
    });
    barrier(s.barrier_count, s.barrier_gen, num_workers);
    if (quant_) {
        guarded([&] {
            for (int64_t slot; (slot = s.prep_mid_next.fetch_add(1, std::memory_order_relaxed)) < s.prep_mid_total;)
                s.dn_ops->prepare(s.iptr[slot], inter_, s.act_mid.data() + size_t(slot) * s.act_mid_bytes);
        });
        barrier(s.barrier_count, s.barrier_gen, num_workers);
    }
    guarded([&] {
        for (int64_t it; (it = s.p2_next.fetch_add(1, std::memory_order_relaxed)) < s.p2_total;) run_item_pass2(worker, it);
    });
    if (with_reduce) {
        barrier(s.barrier_count, s.barrier_gen, num_workers);
        for (int64_t it; (it = s.reduce_next.fetch_add(1, std::memory_order_relaxed)) < s.reduce_total;)
            reduce_rows(it);
    }
    if (error) std::rethrow_exception(error);
}

int32_t MoeExecutor::group_of(const std::vector<int64_t> &prefix, int64_t item) const {
    const int32_t ng = s_->num_groups;
    return int32_t(std::upper_bound(prefix.begin(), prefix.begin() + ng + 1, item) - prefix.begin() - 1);
}

int MoeExecutor::p1_blocks(const Group &g) const {
    if (!g.quant || g.batched) return 1;
    // kRowBlock intermediate units are 2 * kRowBlock interleaved gate/up columns, one line.
    return format_ == Format::mxfp4 ? s_->mxfp4_lines : s_->q1_blocks;
}

int64_t MoeExecutor::p2_rows(const Group &g) const {
    if (!g.quant) return kRowBlock;
    // The batched path's dequantisation scratch holds 2 * kRowBlock rows.
    if (g.batched) return s_->p2_block;
    if (format_ != Format::mxfp4) return int64_t(kRowBlock) * s_->q2_blocks;
    return int64_t(s_->mxfp4_lines) * 64;
}

// Pass 1 item: IB intermediate units of one group for all its routes: gate and up dot products,
// the format's epilogue (mxfp4 biases, ds_fp4 bf16 rounding and clamp), activation, bf16 store.
void MoeExecutor::run_item_pass1(int worker, int64_t it) {
    Scratch &s = *s_;
    const int32_t gi = group_of(s.p1_prefix, it);
    const Group &g = s.groups[gi];
    // mxfp4 (SIMD path): all the item's lines in one kernel call (its one-token pass reads two
    // lines per K row); the other quantised SIMD groups q1_blocks blocks of kRowBlock units per
    // call, the batched and bf16 paths one block.
    const int blocks = p1_blocks(g);
    const int64_t i0 = (it - s.p1_prefix[gi]) * blocks * kRowBlock;
    run_block_pass1(worker, g, i0, blocks * kRowBlock);
}

void MoeExecutor::run_block_pass1(int worker, const Group &g, int64_t i0, int units) {
    Scratch &s = *s_;
    const int64_t H = hidden_;
    float *gate_tile = s.tiles.data() + size_t(worker) * 2 * kRouteChunk * kRowBlock * kMaxItemBlocks;
    float *up_tile = gate_tile + kRouteChunk * units;
    uint16_t *deq = g.batched ? s.deq.data() + size_t(worker) * 2 * kRowBlock * s.deq_ld : nullptr;
    float *deq_scale = g.batched ? s.deq_scale.data() + size_t(worker) * 2 * kRowBlock : nullptr;
    if (g.batched) {
        // Dequantise the item's gate and up rows once, for all the group's routes.
        const detail::QuantMatrix m{bank(g.rows, s.roles.gu_data), bank(g.rows, s.roles.gu_scale),
                                    bank(g.rows, s.roles.gu_global), hidden_, 2 * int64_t(inter_)};
        const int n = int(std::min<int64_t>(kRowBlock, g.inter - i0));
        s.gu_ops->dequant(m, i0, n, deq, s.deq_ld, deq_scale);
        s.gu_ops->dequant(m, inter_ + i0, n, deq + kRowBlock * s.deq_ld, s.deq_ld, deq_scale + kRowBlock);
    }
    const int ni = int(std::min<int64_t>(units, g.inter - i0));
    const bool mxfp4 = g.quant && format_ == Format::mxfp4;
    // DeepSeek-V4 (ds_fp4 routed experts) treats its bf16 shared expert the same way.
    const bool ds = format_ == Format::ds_fp4;
    const bool ds_clamp = ds && act_.kind == FT_ACT_SILU && std::isfinite(act_.limit) && act_.limit > 0.0f;
    const BankRoles &ro = s.roles;
    const detail::QuantMatrix m{bank(g.rows, ro.gu_data), bank(g.rows, ro.gu_scale), bank(g.rows, ro.gu_global), H,
                                2 * int64_t(inter_)};
    for (int c0 = 0; c0 < g.count; c0 += kRouteChunk) {
        const int n = std::min(kRouteChunk, g.count - c0);
        int ld = units;  // tile row stride; mxfp4 computes gate/up columns interleaved
        if (!g.quant) {
            const uint16_t *const *xs = &s.xptr[g.first_slot + c0];
            gemv_(g.gate + i0 * H, H, ni, int(H), xs, n, gate_tile, ld);
            gemv_(g.up + i0 * H, H, ni, int(H), xs, n, up_tile, ld);
        } else if (g.batched) {
            const uint16_t *const *xs = &s.aptr16[g.first_slot + c0];
            const int cols = s.batched_in_cols;
            gemv_(deq, s.deq_ld, ni, cols, xs, n, gate_tile, ld);
            gemv_(deq + kRowBlock * s.deq_ld, s.deq_ld, ni, cols, xs, n, up_tile, ld);
            for (int j = 0; j < n; ++j)
                for (int i = 0; i < ni; ++i) {
                    gate_tile[j * ld + i] *= deq_scale[i];
                    up_tile[j * ld + i] *= deq_scale[kRowBlock + i];
                }
        } else if (mxfp4) {
            ld = 2 * units;  // one tile of n x 2 * units floats across both halves of the scratch
            s.gu_ops->gemv(m, 2 * i0, 2 * ni, &s.aptr[g.first_slot + c0], n, gate_tile, ld);
        } else {
            s.gu_ops->gemv(m, i0, ni, &s.aptr[g.first_slot + c0], n, gate_tile, ld);
            s.gu_ops->gemv(m, inter_ + i0, ni, &s.aptr[g.first_slot + c0], n, up_tile, ld);
        }
        for (int j = 0; j < n; ++j) {
            uint16_t *dst = g.inter_out + int64_t(c0 + j) * g.inter + i0;
            for (int i = 0; i < ni; ++i) {
                float gv, uv;
                if (mxfp4) {
                    const uint8_t *bias = g.rows[ro.gu_bias] + (i0 + i) * 4;
                    gv = gate_tile[j * ld + 2 * i] + bf16_bits_to_f32(bias);
                    uv = gate_tile[j * ld + 2 * i + 1] + bf16_bits_to_f32(bias + 2);
                } else {
                    gv = gate_tile[j * ld + i];
                    uv = up_tile[j * ld + i];
                    if (g.gu_bias) {
                        gv += g.gu_bias[i0 + i];
                        uv += g.gu_bias[inter_ + i0 + i];
                    }
                }
                if (ds) {
                    // DeepSeek-V4 keeps the GEMM outputs in bf16, then clamps at swiglu_limit.
                    gv = round_bf16(gv);
                    uv = round_bf16(uv);
                    if (ds_clamp) {
                        gv = std::fmin(gv, act_.limit);
                        uv = std::fmax(std::fmin(uv, act_.limit), -act_.limit);
                    }
                }
                dst[i] = f32_to_bf16(activate(act_, gv, uv));
            }
        }
    }
}

// Pass 2 item: HB output rows of one group's down projection for all its routes (fp32, before
// the route weight; mxfp4 adds the down bias here).
void MoeExecutor::run_item_pass2(int worker, int64_t it) {
    Scratch &s = *s_;
    const int64_t H = hidden_;
    const int32_t gi = group_of(s.p2_prefix, it);
    const Group &g = s.groups[gi];
    const int64_t block = p2_rows(g);
    const int64_t h0 = (it - s.p2_prefix[gi]) * block;
    const int nh = int(std::min<int64_t>(block, H - h0));
    const BankRoles &ro = s.roles;
    const detail::QuantMatrix m{bank(g.rows, ro.dn_data), bank(g.rows, ro.dn_scale), bank(g.rows, ro.dn_global),
                                int64_t(inter_), H};
    uint16_t *deq = g.batched ? s.deq.data() + size_t(worker) * 2 * kRowBlock * s.deq_ld : nullptr;
    float *deq_scale = g.batched ? s.deq_scale.data() + size_t(worker) * 2 * kRowBlock : nullptr;
    if (g.batched) s.dn_ops->dequant(m, h0, nh, deq, s.deq_ld, deq_scale);
    for (int c0 = 0; c0 < g.count; c0 += kRouteChunk) {
        const int n = std::min(kRouteChunk, g.count - c0);
        float *out = s.route_out.data() + int64_t(g.first_slot + c0) * H + h0;
        if (!g.quant) {
            gemv_(g.down + h0 * g.inter, g.inter, nh, g.inter, &s.iptr[g.first_slot + c0], n, out, H);
            if (g.dn_bias)
                for (int j = 0; j < n; ++j)
                    for (int h = 0; h < nh; ++h) out[j * H + h] += g.dn_bias[h0 + h];
            continue;
        }
        if (g.batched) {
            gemv_(deq, s.deq_ld, nh, s.batched_mid_cols, &s.mptr16[g.first_slot + c0], n, out, H);
            for (int j = 0; j < n; ++j)
                for (int h = 0; h < nh; ++h) out[j * H + h] *= deq_scale[h];
        } else {
            s.dn_ops->gemv(m, h0, nh, &s.mptr[g.first_slot + c0], n, out, H);
        }
        if (ro.dn_bias >= 0) {
            const uint8_t *bias = g.rows[ro.dn_bias] + h0 * 2;
            for (int j = 0; j < n; ++j)
                for (int h = 0; h < nh; ++h) out[j * H + h] += bf16_bits_to_f32(bias + h * 2);
        }
    }
}

// y[t, block] = sum over k (in route order) of w[t,k] * route_out[slot], plus the gated shared
// expert, rounded once to bf16. Skipped routes contribute nothing; all-skipped tokens get zeros.
void MoeExecutor::reduce_rows(int64_t item) {
    Scratch &s = *s_;
    const int64_t H = hidden_, K = top_k_;
    const int64_t blocks = (H + kReduceBlock - 1) / kReduceBlock;
    const int64_t t = item / blocks, h0 = (item % blocks) * kReduceBlock;
    const int nh = int(std::min<int64_t>(kReduceBlock, H - h0));
    float acc[kReduceBlock];
    std::fill(acc, acc + nh, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
        const int32_t slot = s.route_slot[t * K + k];
        if (slot < 0) continue;
        const float wk = weight_on_input_ ? 1.0f : s.w[t * K + k];
        const float *o = s.route_out.data() + int64_t(slot) * H + h0;
        if (format_ == Format::ds_fp4) {
            // DeepSeek-V4 rounds each route's weighted output to bf16 before the sum.
            for (int h = 0; h < nh; ++h) acc[h] += round_bf16(wk * o[h]);
        } else {
            for (int h = 0; h < nh; ++h) acc[h] += wk * o[h];
        }
    }
    if (s.has_shared) {
        const float g = s.shared_gate[t];
        const float *o = s.route_out.data() + (int64_t(s.routed_slots) + t) * H + h0;
        for (int h = 0; h < nh; ++h) acc[h] += g * o[h];
    }
    uint16_t *dst = s.y + t * H + h0;
    for (int h = 0; h < nh; ++h) dst[h] = f32_to_bf16(acc[h]);
}

}  // namespace ft::cpu
