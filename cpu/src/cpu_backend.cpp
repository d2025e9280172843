#include "ft/cpu_backend.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "ft/common.hpp"

namespace ft::cpu {

namespace {

// The block formats other than spec.format that a model's layers mix (ModelSpec::layer_formats).
std::vector<Format> mixed_formats(const ModelSpec &spec) {
    std::vector<Format> out;
    for (const LayerFormats &lf : spec.layer_formats)
        for (const Format f : {lf.gate_up, lf.down})
            if (f != spec.format && std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
    return out;
}

// Every routed expert computed by the CPU straight from the host banks.
class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const BackendContext &ctx)
        : model_(*ctx.model),
          executor_(*ctx.pool, model_.spec().format, model_.spec().hidden, model_.spec().intermediate, model_.spec().top_k,
                    ctx.params.max_tokens,
                    ActivationSpec{model_.spec().activation, model_.spec().swiglu_alpha, model_.spec().swiglu_limit},
                    ctx.params.shared_experts ? model_.spec().shared_intermediate : 0, static_cast<Isa>(ctx.cpu_isa),
                    moe_tuning(ctx.tuning), mixed_formats(model_.spec())) {
        const ModelSpec &s = model_.spec();
        if (ctx.params.shared_experts) {
            if (s.shared_intermediate <= 0) fail(FT_ERR_INVALID_ARGUMENT, "shared_experts asked for, but the model has no shared expert");
            for (int32_t l = 0; l < s.num_layers; ++l) {
                const LayerExtras &x = model_.extras(l);
                if (x.shared_gate.empty() || x.shared_up.empty() || x.shared_down.empty())
                    fail(FT_ERR_INVALID_ARGUMENT, "shared_experts asked for, but MoE layer ", l, " has no shared expert weights");
                SharedExpertView v;
                v.gate = reinterpret_cast<const uint16_t *>(x.shared_gate.bytes.data());
                v.up = reinterpret_cast<const uint16_t *>(x.shared_up.bytes.data());
                v.down = reinterpret_cast<const uint16_t *>(x.shared_down.bytes.data());
                v.intermediate = s.shared_intermediate;
                v.gate_proj = s.shared_expert_gate && !x.shared_gate_proj.empty()
                                  ? reinterpret_cast<const uint16_t *>(x.shared_gate_proj.bytes.data())
                                  : nullptr;
                shared_.push_back(v);
            }
        }
        executor_.set_weight_on_input(s.route_weight == FT_ROUTE_WEIGHT_INPUT);
    }

    void decode(const DecodeCall &c, ft_session_stats &stats) override {
        const ExpertSource src = expert_source(model_, c.layer);
        const auto t0 = std::chrono::steady_clock::now();
        const MoeStats s = executor_.run(src, shared_.empty() ? nullptr : &shared_[c.layer], c.num_tokens, c.hidden, c.ids,
                                         c.weights, c.out);
        stats.cpu_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stats.routes_cpu += s.routes_computed;
        stats.routes_skipped += s.routes_skipped;
        stats.experts_cpu += s.experts_read;
        stats.cpu_bytes += s.bytes_read;
    }

private:
    const Model &model_;
    MoeExecutor executor_;
    std::vector<SharedExpertView> shared_;
};

}  // namespace

ExpertSource expert_source(const Model &model, int32_t layer) {
    const ExpertBanks &banks = model.banks();
    ExpertSource src;
    const LayerFormats lf = model.layer_formats(layer);
    src.format = lf.gate_up;
    src.down_format = lf.down != lf.gate_up ? int32_t(lf.down) : -1;
    src.num_experts = model.spec().num_experts;
    src.num_banks = banks.num_banks();
    constexpr int kMaxBanks = static_cast<int>(sizeof src.base / sizeof src.base[0]);
    if (src.num_banks > kMaxBanks) fail(FT_ERR_INTERNAL, "CPU backend: ", src.num_banks, " banks, at most ", kMaxBanks, " supported");
    for (int b = 0; b < src.num_banks; ++b) {
        src.base[b] = banks.layer_base(b, layer);
        src.row_bytes[b] = banks.layer_row_bytes(b, layer);
    }
    if (model.spec().expert_biases) {
        const LayerExtras &x = model.extras(layer);
        src.gate_up_bias = reinterpret_cast<const float *>(x.expert_gate_up_bias.bytes.data());
        src.down_bias = reinterpret_cast<const float *>(x.expert_down_bias.bytes.data());
    }
    return src;
}

std::unique_ptr<Backend> make_cpu_backend(const BackendContext &ctx) { return std::make_unique<CpuBackend>(ctx); }

}  // namespace ft::cpu
