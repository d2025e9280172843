#include "ft/synth.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "ft/common.hpp"

namespace ft::synth {

namespace {

using nlohmann::ordered_json;

// ---- values ----------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// What a tensor holds; with the checkpoint layer and expert it seeds the values.
enum Kind : uint64_t {
    kGate = 1, kUp, kDown, kRouter, kBias, kSharedGate, kSharedUp, kSharedDown, kSharedGateProj,
    kDenseGate, kDenseUp, kDenseDown, kOther,
};

uint64_t tensor_key(const Spec &s, int layer, Kind kind, int expert) {
    const uint64_t id = (static_cast<uint64_t>(static_cast<uint32_t>(layer)) << 40) ^ (static_cast<uint64_t>(kind) << 32) ^
                        static_cast<uint32_t>(expert);
    return splitmix64(s.seed ^ splitmix64(id));
}

// Element `index` of the tensor with `key`: uniform in (-scale, scale), never exactly zero.
inline float value(uint64_t key, uint64_t index, float scale) {
    const uint64_t z = splitmix64(key + index * 0x9e3779b97f4a7c15ull);
    const float u = (static_cast<float>(z >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
    return u * scale;
}

// IEEE half from f32, rounding to nearest even (f16 expert tensors).
uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to infinity
    if (a < 0x38800000u) {                       // below 2^-14: subnormal, units of 2^-24
        float v;
        std::memcpy(&v, &a, 4);
        return sign | static_cast<uint16_t>(std::nearbyint(v * 16777216.0f));
    }
    uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);
}

enum class Dtype { bf16, f16, f32 };

Dtype parse_dtype(const std::string &d) {
    if (d == "BF16") return Dtype::bf16;
    if (d == "F16") return Dtype::f16;
    if (d == "F32") return Dtype::f32;
    fail(FT_ERR_INVALID_ARGUMENT, "synth: expert_dtype '", d, "' (BF16, F16, F32)");
}

const char *dtype_name(Dtype d) { return d == Dtype::bf16 ? "BF16" : d == Dtype::f16 ? "F16" : "F32"; }
size_t dtype_size(Dtype d) { return d == Dtype::f32 ? 4 : 2; }

// The bf16 a loader gets from a value stored as `d`.
uint16_t stored_as_bf16(float v, Dtype d) {
    if (d == Dtype::f16) return f32_to_bf16(f16_to_f32(f32_to_f16(v)));
    return f32_to_bf16(v);
}

void store(float v, Dtype d, uint8_t *out) {
    if (d == Dtype::f32) {
        std::memcpy(out, &v, 4);
    } else {
        const uint16_t h = d == Dtype::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(out, &h, 2);
    }
}

// ---- tensors ---------------------------------------------------------------------------------

// How stored element g maps to a logical matrix element. `plain`: element g of one matrix.
// The fused layouts hold every expert: [E, 2I, H] (gate rows then up rows), [E, H, 2I],
// [E, H, I] and [E, I, H].
enum class Mode { plain, gate_up, gate_up_t, down, down_t };

struct TensorDesc {
    std::string name;
    Dtype dtype = Dtype::bf16;
    std::vector<int64_t> shape;
    Mode mode = Mode::plain;
    int layer = 0;        // checkpoint layer (seeding)
    Kind kind = kOther;   // plain only
    int expert = 0;       // plain only
    float scale = 1.0f;   // plain only
    uint64_t numel() const {
        uint64_t n = 1;
        for (int64_t d : shape) n *= static_cast<uint64_t>(d);
        return n;
    }
};

// Fills out[0, count) with the values of elements [first, first + count) of t.
void generate(const Spec &s, const TensorDesc &t, uint64_t first, uint64_t count, float *out) {
    if (t.mode == Mode::plain) {
        const uint64_t key = tensor_key(s, t.layer, t.kind, t.expert);
        for (uint64_t i = 0; i < count; ++i) out[i] = value(key, first + i, t.scale);
        return;
    }
    const int64_t H = s.hidden, I = s.intermediate;
    const int64_t R = t.shape[1], C = t.shape[2];
    const float sh = 1.0f / std::sqrt(static_cast<float>(H)), si = 1.0f / std::sqrt(static_cast<float>(I));
    // Walk (expert, row, column) incrementally: no division per element.
    int64_t e = static_cast<int64_t>(first / static_cast<uint64_t>(R * C));
    int64_t r = static_cast<int64_t>(first % static_cast<uint64_t>(R * C)) / C;
    int64_t c = static_cast<int64_t>(first % static_cast<uint64_t>(C));
    uint64_t kg = 0, ku = 0, kd = 0;
    int64_t keyed = -1;
    for (uint64_t i = 0; i < count; ++i) {
        if (keyed != e) {
            kg = tensor_key(s, t.layer, kGate, static_cast<int>(e));
            ku = tensor_key(s, t.layer, kUp, static_cast<int>(e));
            kd = tensor_key(s, t.layer, kDown, static_cast<int>(e));
            keyed = e;
        }
        switch (t.mode) {
            case Mode::gate_up:  // row r of [2I, H]
                out[i] = r < I ? value(kg, r * H + c, sh) : value(ku, (r - I) * H + c, sh);
                break;
            case Mode::gate_up_t:  // [H, 2I]: column c is unit c of gate (c < I) or up
                out[i] = c < I ? value(kg, c * H + r, sh) : value(ku, (c - I) * H + r, sh);
                break;
            case Mode::down: out[i] = value(kd, r * I + c, si); break;
            case Mode::down_t: out[i] = value(kd, c * I + r, si); break;
            case Mode::plain: break;
        }
        if (++c == C) {
            c = 0;
            if (++r == R) {
                r = 0;
                ++e;
            }
        }
    }
}

bool is_deepseek_like(const std::string &a) { return a == "deepseek_v3" || a == "kimi_k2" || a == "glm4_moe"; }
bool is_qwen(const std::string &a) { return a == "qwen3_moe" || a == "qwen3_5_moe"; }

void check_spec(const Spec &s) {
    static const char *const archs[] = {"qwen3_moe", "qwen3_5_moe", "mixtral", "deepseek_v3", "kimi_k2", "glm4_moe"};
    if (std::find(std::begin(archs), std::end(archs), s.architecture) == std::end(archs))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: unknown architecture '", s.architecture, "'");
    if (s.num_layers <= 0 || s.num_experts <= 0 || s.top_k <= 0 || s.hidden <= 0 || s.intermediate <= 0 ||
        s.shards <= 0 || s.shards > 99999)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: sizes must be positive");
    if (is_deepseek_like(s.architecture) && s.shared_intermediate % s.intermediate != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.architecture, " shared_intermediate must be a multiple of intermediate");
    if (s.architecture == "glm4_moe" && s.shared_intermediate == 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: glm4_moe always has a shared expert (set shared_intermediate)");
    if ((s.architecture == "qwen3_moe" || s.architecture == "mixtral") && s.shared_intermediate != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.architecture, " has no shared expert");
    parse_dtype(s.expert_dtype);
}

std::string layer_prefix(const Spec &s, int layer) {
    return std::string(s.language_model_prefix ? "model.language_model.layers." : "model.layers.") +
           std::to_string(layer) + ".";
}

// Mixtral's per-expert exports use block_sparse_moe.{w1,w3,w2}; its fused (newer transformers)
// form and every other architecture use mlp.
std::string moe_block(const Spec &s) {
    return s.architecture == "mixtral" && s.layout == Spec::Layout::per_expert ? "block_sparse_moe." : "mlp.";
}

void add_moe_layer(const Spec &s, int l, std::vector<TensorDesc> &out) {
    const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, Is = s.shared_intermediate;
    const Dtype xd = parse_dtype(s.expert_dtype);
    const float sh = 1.0f / std::sqrt(static_cast<float>(H));
    const std::string b = layer_prefix(s, l) + moe_block(s);
    auto plain = [&](std::string name, Dtype d, std::vector<int64_t> shape, Kind kind, int expert, float scale) {
        TensorDesc t;
        t.name = std::move(name);
        t.dtype = d;
        t.shape = std::move(shape);
        t.layer = l;
        t.kind = kind;
        t.expert = expert;
        t.scale = scale;
        out.push_back(std::move(t));
    };
    auto fused = [&](std::string name, std::vector<int64_t> shape, Mode mode) {
        TensorDesc t;
        t.name = std::move(name);
        t.dtype = xd;
        t.shape = std::move(shape);
        t.mode = mode;
        t.layer = l;
        out.push_back(std::move(t));
    };

    plain(b + "gate.weight", Dtype::bf16, {E, H}, kRouter, 0, sh);
    if (is_deepseek_like(s.architecture)) plain(b + "gate.e_score_correction_bias", Dtype::f32, {E}, kBias, 0, 0.05f);

    switch (s.layout) {
        case Spec::Layout::per_expert: {
            const bool w = s.architecture == "mixtral";
            for (int e = 0; e < E; ++e) {
                const std::string p = b + "experts." + std::to_string(e) + ".";
                plain(p + (w ? "w1" : "gate_proj") + ".weight", xd, {I, H}, kGate, e, sh);
                plain(p + (w ? "w2" : "down_proj") + ".weight", xd, {H, I}, kDown, e,
                      1.0f / std::sqrt(static_cast<float>(I)));
                plain(p + (w ? "w3" : "up_proj") + ".weight", xd, {I, H}, kUp, e, sh);
            }
            break;
        }
        case Spec::Layout::fused:
            fused(b + "experts.gate_up_proj", {E, 2 * I, H}, Mode::gate_up);
            fused(b + "experts.down_proj", {E, H, I}, Mode::down);
            break;
        case Spec::Layout::fused_transposed:
            fused(b + "experts.gate_up_proj", {E, H, 2 * I}, Mode::gate_up_t);
            fused(b + "experts.down_proj", {E, I, H}, Mode::down_t);
            break;
    }

    if (Is > 0) {
        const std::string p = b + (s.architecture == "qwen3_5_moe" ? "shared_expert." : "shared_experts.");
        plain(p + "gate_proj.weight", xd, {Is, H}, kSharedGate, 0, sh);
        plain(p + "up_proj.weight", xd, {Is, H}, kSharedUp, 0, sh);
        plain(p + "down_proj.weight", xd, {H, Is}, kSharedDown, 0, 1.0f / std::sqrt(static_cast<float>(Is)));
        if (s.architecture == "qwen3_5_moe") plain(b + "shared_expert_gate.weight", xd, {1, H}, kSharedGateProj, 0, sh);
    }
}

std::vector<TensorDesc> all_tensors(const Spec &s) {
    const int64_t H = s.hidden, I = s.intermediate;
    std::vector<TensorDesc> out;
    auto other = [&](std::string name, std::vector<int64_t> shape, int layer, Kind kind) {
        TensorDesc t;
        t.name = std::move(name);
        t.shape = std::move(shape);
        t.layer = layer;
        t.kind = kind;
        t.scale = 0.5f;
        out.push_back(std::move(t));
    };
    const std::string model = s.language_model_prefix ? "model.language_model." : "model.";
    other(model + "embed_tokens.weight", {16, H}, -1, kOther);
    if (s.language_model_prefix) other("model.visual.patch_embed.proj.weight", {8, 12}, -2, kOther);

    const std::vector<int> moe = moe_layers(s);
    for (int l = 0; l < s.num_layers + (s.mtp_layer ? 1 : 0); ++l) {
        const std::string p = layer_prefix(s, l);
        other(p + "input_layernorm.weight", {H}, l, kOther);
        const bool is_moe = l == s.num_layers || std::find(moe.begin(), moe.end(), l) != moe.end();
        if (is_moe) {
            add_moe_layer(s, l, out);
        } else {  // a dense MLP (DeepSeek's first_k_dense_replace layers, Qwen's mlp_only_layers)
            other(p + "mlp.gate_proj.weight", {I, H}, l, kDenseGate);
            other(p + "mlp.up_proj.weight", {I, H}, l, kDenseUp);
            other(p + "mlp.down_proj.weight", {H, I}, l, kDenseDown);
        }
        if (l == s.num_layers) other(p + "eh_proj.weight", {H, 2 * H}, l, kOther);  // the MTP layer's own
    }
    other("lm_head.weight", {16, H}, -1, kDenseGate);
    return out;
}

ordered_json config_json(const Spec &s) {
    const std::string &a = s.architecture;
    ordered_json c;
    if (a == "qwen3_moe" || a == "qwen3_5_moe") {
        ordered_json t;
        t["model_type"] = a == "qwen3_moe" ? "qwen3_moe" : "qwen3_5_moe_text";
        t["hidden_size"] = s.hidden;
        t["intermediate_size"] = s.intermediate * 4;
        t["moe_intermediate_size"] = s.intermediate;
        if (a == "qwen3_5_moe") t["shared_expert_intermediate_size"] = s.shared_intermediate;
        t["num_hidden_layers"] = s.num_layers;
        t["num_attention_heads"] = 4;
        t["num_key_value_heads"] = 2;
        t["num_experts"] = s.num_experts;
        t["num_experts_per_tok"] = s.top_k;
        t["norm_topk_prob"] = s.norm_topk_prob;
        t["decoder_sparse_step"] = 1;
        t["mlp_only_layers"] = s.mlp_only_layers;
        t["hidden_act"] = s.hidden_act;
        t["rms_norm_eps"] = 1e-6;
        t["vocab_size"] = 16;
        t["tie_word_embeddings"] = false;
        if (a == "qwen3_moe") {
            c = t;
            c["architectures"] = {"Qwen3MoeForCausalLM"};
        } else {
            c["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
            c["model_type"] = "qwen3_5_moe";
            c["text_config"] = t;
            c["vision_config"] = {{"model_type", "qwen3_5_moe"}, {"depth", 1}, {"hidden_size", 8}};
        }
    } else if (a == "mixtral") {
        c["architectures"] = {"MixtralForCausalLM"};
        c["model_type"] = "mixtral";
        c["hidden_size"] = s.hidden;
        c["intermediate_size"] = s.intermediate;
        c["num_hidden_layers"] = s.num_layers;
        c["num_attention_heads"] = 4;
        c["num_key_value_heads"] = 2;
        c["num_local_experts"] = s.num_experts;
        c["num_experts_per_tok"] = s.top_k;
        c["hidden_act"] = s.hidden_act;
        c["router_aux_loss_coef"] = 0.02;
        c["vocab_size"] = 16;
    } else {  // deepseek_v3, kimi_k2, glm4_moe
        c["architectures"] = {a == "glm4_moe" ? "Glm4MoeForCausalLM" : "DeepseekV3ForCausalLM"};
        c["model_type"] = a;
        c["hidden_size"] = s.hidden;
        c["intermediate_size"] = s.intermediate * 4;
        c["moe_intermediate_size"] = s.intermediate;
        c["num_hidden_layers"] = s.num_layers;
        c["num_attention_heads"] = 4;
        c["n_routed_experts"] = s.num_experts;
        c["n_shared_experts"] = s.shared_intermediate / s.intermediate;
        c["num_experts_per_tok"] = s.top_k;
        c["first_k_dense_replace"] = s.first_dense;
        if (a != "glm4_moe") {
            c["moe_layer_freq"] = 1;
            c["scoring_func"] = "sigmoid";
            c["topk_method"] = "noaux_tc";
        }
        c["n_group"] = s.n_group;
        c["topk_group"] = s.topk_group;
        c["routed_scaling_factor"] = s.routed_scaling_factor;
        c["norm_topk_prob"] = s.norm_topk_prob;
        c["num_nextn_predict_layers"] = s.mtp_layer ? 1 : 0;
        c["hidden_act"] = s.hidden_act;
        c["vocab_size"] = 16;
    }
    c["torch_dtype"] = "bfloat16";
    return c;
}

// ---- file writing ----------------------------------------------------------------------------

class File {
public:
    explicit File(const std::string &path) : path_(path) {
        fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) fail(FT_ERR_IO, path, ": cannot create: ", std::strerror(errno));
    }
    ~File() {
        if (fd_ >= 0) ::close(fd_);
    }
    File(const File &) = delete;
    File &operator=(const File &) = delete;

    void write_at(const void *data, size_t bytes, uint64_t offset) const {
        const uint8_t *p = static_cast<const uint8_t *>(data);
        while (bytes > 0) {
            const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail(FT_ERR_IO, path_, ": write failed: ", std::strerror(errno));
            p += n;
            bytes -= static_cast<size_t>(n);
            offset += static_cast<uint64_t>(n);
        }
    }
    void close() {
        if (::close(fd_) != 0) fail(FT_ERR_IO, path_, ": close failed: ", std::strerror(errno));
        fd_ = -1;
    }

private:
    std::string path_;
    int fd_ = -1;
};

// Header text padded with spaces to a multiple of 8 so the data section is aligned, as the
// reference writer does.
std::string padded(std::string header) {
    while (header.size() % 8) header += ' ';
    return header;
}

void write_text(const std::string &path, const std::string &text) {
    File f(path);
    f.write_at(text.data(), text.size(), 0);
    f.close();
}

void make_dir(const std::string &dir) {
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = dir.find('/', pos + 1);
        partial = dir.substr(0, pos);
        if (partial.empty()) continue;
        if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
            fail(FT_ERR_IO, partial, ": cannot create directory: ", std::strerror(errno));
    }
}

struct Placed {
    const TensorDesc *t;
    size_t shard;
    uint64_t offset;  // absolute file offset
};

}  // namespace

std::vector<int> moe_layers(const Spec &s) {
    std::vector<int> out;
    for (int l = 0; l < s.num_layers; ++l) {
        if (is_qwen(s.architecture)) {
            if (std::find(s.mlp_only_layers.begin(), s.mlp_only_layers.end(), l) == s.mlp_only_layers.end())
                out.push_back(l);
        } else if (is_deepseek_like(s.architecture)) {
            if (l >= s.first_dense) out.push_back(l);
        } else {
            out.push_back(l);
        }
    }
    return out;
}

void write_checkpoint(const std::string &dir, const Spec &s, const std::function<bool(uint64_t, uint64_t)> &progress) {
    check_spec(s);
    make_dir(dir);
    write_text(dir + "/config.json", config_json(s).dump(2) + "\n");

    const std::vector<TensorDesc> tensors = all_tensors(s);
    uint64_t total = 0;
    for (const TensorDesc &t : tensors) total += t.numel() * dtype_size(t.dtype);

    // Contiguous runs of tensors per shard, cut by bytes.
    const size_t n_shards = static_cast<size_t>(s.shards);
    std::vector<std::vector<const TensorDesc *>> shard_tensors(n_shards);
    {
        uint64_t acc = 0;
        for (const TensorDesc &t : tensors) {
            const size_t shard = std::min(n_shards - 1, static_cast<size_t>(acc * n_shards / std::max<uint64_t>(total, 1)));
            shard_tensors[shard].push_back(&t);
            acc += t.numel() * dtype_size(t.dtype);
        }
    }
    auto shard_name = [&](size_t i) {
        if (n_shards == 1) return std::string("model.safetensors");
        char buf[64];
        std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n_shards);
        return std::string(buf);
    };

    std::vector<std::unique_ptr<File>> files;
    std::vector<Placed> placed;
    ordered_json weight_map = ordered_json::object();
    for (size_t i = 0; i < n_shards; ++i) {
        ordered_json header;
        header["__metadata__"] = {{"format", "pt"}};
        uint64_t off = 0;
        for (const TensorDesc *t : shard_tensors[i]) {
            const uint64_t bytes = t->numel() * dtype_size(t->dtype);
            header[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + bytes}}};
            off += bytes;
            weight_map[t->name] = shard_name(i);
        }
        const std::string text = padded(header.dump());
        files.push_back(std::make_unique<File>(dir + "/" + shard_name(i)));
        const uint64_t len = text.size();
        uint8_t prefix[8];
        for (int b = 0; b < 8; ++b) prefix[b] = static_cast<uint8_t>(len >> (8 * b));
        files.back()->write_at(prefix, 8, 0);
        files.back()->write_at(text.data(), text.size(), 8);
        uint64_t data_off = 8 + len;
        for (const TensorDesc *t : shard_tensors[i]) {
            placed.push_back({t, i, data_off});
            data_off += t->numel() * dtype_size(t->dtype);
        }
    }

    // Pieces of at most 1 Mi elements, generated and written by every core in parallel.
    struct Job {
        const Placed *p;
        uint64_t first, count;
    };
    constexpr uint64_t kJobElems = 1ull << 20;
    std::vector<Job> jobs;
    for (const Placed &p : placed)
        for (uint64_t first = 0; first < p.t->numel(); first += kJobElems)
            jobs.push_back({&p, first, std::min(kJobElems, p.t->numel() - first)});

    std::atomic<size_t> next{0};
    std::atomic<uint64_t> done{0};
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::exception_ptr error;
    auto worker = [&]() {
        std::vector<float> values;
        std::vector<uint8_t> bytes;
        try {
            for (size_t j; !stop && (j = next.fetch_add(1)) < jobs.size();) {
                const Job &job = jobs[j];
                const TensorDesc &t = *job.p->t;
                const size_t es = dtype_size(t.dtype);
                values.resize(job.count);
                bytes.resize(job.count * es);
                generate(s, t, job.first, job.count, values.data());
                for (uint64_t i = 0; i < job.count; ++i) store(values[i], t.dtype, &bytes[i * es]);
                files[job.p->shard]->write_at(bytes.data(), bytes.size(), job.p->offset + job.first * es);
                done += bytes.size();
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu);
            if (!error) error = std::current_exception();
            stop = true;
        }
    };
    const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < n_threads; ++i) pool.emplace_back(worker);
    if (progress) {
        uint64_t reported = UINT64_MAX;
        while (done.load() < total && !stop) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const uint64_t now = done.load();
            if (now != reported) {
                reported = now;
                if (!progress(now, total)) stop = true;
            }
        }
    }
    for (std::thread &t : pool) t.join();
    if (error) std::rethrow_exception(error);
    for (auto &f : files) f->close();
    if (stop) fail(FT_ERR_CANCELLED, "synth: writing ", dir, " cancelled by the progress callback");

    if (n_shards > 1) {
        ordered_json index;
        index["metadata"] = {{"total_size", total}};
        index["weight_map"] = weight_map;
        write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
    }
    if (progress) progress(total, total);
}

// ---- expected values -------------------------------------------------------------------------

namespace {

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

// ---- raw files -------------------------------------------------------------------------------

void write_safetensors(const std::string &path, const std::vector<RawTensor> &tensors) {
    ordered_json header = ordered_json::object();
    uint64_t off = 0;
    for (const RawTensor &t : tensors) {
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
        off += t.bytes.size();
    }
    std::vector<uint8_t> data;
    data.reserve(off);
    for (const RawTensor &t : tensors) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    write_raw_header(path, padded(header.dump()), data);
}

void write_raw_header(const std::string &path, const std::string &header, const std::vector<uint8_t> &data,
                      int64_t declared_length) {
    const uint64_t len = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
    uint8_t prefix[8];
    for (int b = 0; b < 8; ++b) prefix[b] = static_cast<uint8_t>(len >> (8 * b));
    File f(path);
    f.write_at(prefix, 8, 0);
    f.write_at(header.data(), header.size(), 8);
    if (!data.empty()) f.write_at(data.data(), data.size(), 8 + header.size());
    f.close();
}

}  // namespace ft::synth
