#include "golden_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ft::golden {

namespace {

using nlohmann::json;

struct EngineDeleter { void operator()(ft_engine *e) const { ft_engine_free(e); } };
struct ModelDeleter { void operator()(ft_model *m) const { ft_model_free(m); } };
struct SessionDeleter { void operator()(ft_session *s) const { ft_session_free(s); } };

// Thrown inside check_dir for a directory that cannot be checked; becomes Result::error.
struct Bad {
    std::string what;
};

template <typename... A>
[[noreturn]] void bad(const A &...a) {
    std::ostringstream s;
    (s << ... << a);
    throw Bad{s.str()};
}

std::string read_text(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) bad(path, ": cannot open");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// `count` little-endian 4-byte values (float32 or int32) from `path`.
template <typename T>
std::vector<T> read_raw(const std::string &path, size_t count) {
    static_assert(sizeof(T) == 4, "4-byte values");
    const std::string bytes = read_text(path);
    if (bytes.size() != count * 4) bad(path, ": ", bytes.size(), " bytes, expected ", count * 4);
    std::vector<T> out(count);
    for (size_t i = 0; i < count; ++i) {
        uint32_t v = 0;
        for (int b = 0; b < 4; ++b) v |= uint32_t(uint8_t(bytes[i * 4 + b])) << (8 * b);
        std::memcpy(&out[i], &v, 4);
    }
    return out;
}

float bf16_to_f32(uint16_t v) {
    const uint32_t bits = uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// The bf16 value of `f`, which the generator made bf16-representable; anything else is an error.
uint16_t exact_bf16(float f, const std::string &what) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (bits & 0xffffu) bad(what, ": value ", f, " is not bf16-representable");
    return uint16_t(bits >> 16);
}

std::vector<double> tensor_as_f64(const ft_tensor_view &v) {
    size_t n = 1;
    for (int d = 0; d < v.ndim; ++d) n *= size_t(v.shape[d]);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
        if (v.dtype == FT_DTYPE_F32) {
            out[i] = static_cast<const float *>(v.data)[i];
        } else {
            out[i] = bf16_to_f32(static_cast<const uint16_t *>(v.data)[i]);
        }
    }
    return out;
}

bool has_tensor(const ft_model *m, int32_t layer, int32_t which, ft_tensor_view &v) {
    v = {};
    v.struct_size = sizeof v;
    return ft_model_tensor(m, layer, which, &v) == FT_OK;
}

// Router logits [T, E] in fp64 from the model's router (plus its linear's bias where the rule does
// not use the bias for selection: gpt-oss).
std::vector<float> router_logits(const ft_model *m, const ft_model_info &info, int32_t moe_layer,
                                 const std::vector<float> &x, int32_t T) {
    const int32_t E = info.num_experts, H = info.hidden_size;
    ft_tensor_view w;
    if (!has_tensor(m, moe_layer, FT_TENSOR_ROUTER_WEIGHT, w)) bad("MoE layer ", moe_layer, ": no router weight");
    const std::vector<double> wr = tensor_as_f64(w);
    std::vector<double> bias;
    ft_tensor_view b;
    const bool selection_bias = info.routing == FT_ROUTING_SIGMOID_GROUP_TOPK ||
                                info.routing == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK ||
                                info.routing == FT_ROUTING_SOFTMAX_BIASED_TOPK;
    if (!selection_bias && has_tensor(m, moe_layer, FT_TENSOR_ROUTER_BIAS, b)) bias = tensor_as_f64(b);
    std::vector<float> logits(size_t(T) * E);
    for (int32_t t = 0; t < T; ++t)
        for (int32_t e = 0; e < E; ++e) {
            double z = bias.empty() ? 0.0 : bias[e];
            for (int32_t h = 0; h < H; ++h) z += wr[size_t(e) * H + h] * double(x[size_t(t) * H + h]);
            logits[size_t(t) * E + e] = float(z);
        }
    return logits;
}

void check_layer(ft_model *model, ft_session *session, const ft_model_info &info, const std::string &dir,
                 const json &entry, const std::vector<float> &x, int32_t T, LayerResult &out) {
    const int32_t H = info.hidden_size;
    out.layer = entry.at("layer").get<int32_t>();
    const int32_t K = entry.value("k", info.top_k);
    if (K != info.top_k) bad("layer ", out.layer, ": transformers routes ", K, " experts, the model says ", info.top_k);
    const int32_t l = ft_model_moe_layer(model, out.layer);
    if (l < 0) bad("checkpoint layer ", out.layer, " is not an MoE layer of the loaded model");
    const auto ids = read_raw<int32_t>(dir + "/" + entry.at("ids").get<std::string>(), size_t(T) * K);
    const auto w = read_raw<float>(dir + "/" + entry.at("weights").get<std::string>(), size_t(T) * K);
    const auto y = read_raw<float>(dir + "/" + entry.at("output").get<std::string>(), size_t(T) * H);

    // Routes: ft_route on the logits of the loaded router.
    const std::vector<float> logits = router_logits(model, info, l, x, T);
    std::vector<int32_t> our_ids(size_t(T) * K);
    std::vector<float> our_w(size_t(T) * K);
    if (ft_route(session, l, T, logits.data(), our_ids.data(), our_w.data()) != FT_OK)
        bad("ft_route: ", ft_session_last_error(session));
    out.routes_equal = true;
    for (int32_t t = 0; t < T; ++t) {
        std::vector<std::pair<int32_t, float>> a, b;
        for (int32_t k = 0; k < K; ++k) {
            a.emplace_back(our_ids[size_t(t) * K + k], our_w[size_t(t) * K + k]);
            b.emplace_back(ids[size_t(t) * K + k], w[size_t(t) * K + k]);
        }
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        bool same = true;
        for (int32_t k = 0; k < K; ++k) same &= a[k].first == b[k].first;
        if (!same) {
            if (out.routes_equal) {
                std::ostringstream s;
                s << "token " << t << ": ft_route chose {";
                for (auto &p : a) s << ' ' << p.first;
                s << " }, transformers {";
                for (auto &p : b) s << ' ' << p.first;
                s << " }";
                out.detail = s.str();
            }
            out.routes_equal = false;
            continue;
        }
        for (int32_t k = 0; k < K; ++k)
            out.max_weight_error = std::max(out.max_weight_error, std::fabs(double(a[k].second) - b[k].second));
    }

    // Output: ft_decode with transformers' routes, so a routing difference does not hide the experts'.
    std::vector<uint16_t> xb(x.size()), yb(size_t(T) * H);
    for (size_t i = 0; i < x.size(); ++i) xb[i] = exact_bf16(x[i], "hidden states");
    if (ft_decode(session, l, T, xb.data(), ids.data(), w.data(), yb.data()) != FT_OK)
        bad("ft_decode: ", ft_session_last_error(session));
    double num = 0, den = 0;
    for (size_t i = 0; i < yb.size(); ++i) {
        const double d = double(bf16_to_f32(yb[i])) - y[i];
        num += d * d;
        den += double(y[i]) * y[i];
    }
    out.relative_l2 = std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-300)) : INFINITY;
}

}  // namespace

bool Result::passed() const {
    if (!error.empty() || !skipped.empty() || layers.empty()) return false;
    for (const LayerResult &l : layers)
        if (!l.routes_equal || !(l.max_weight_error <= kMaxWeightError) || !(l.relative_l2 <= kMaxRelativeL2))
            return false;
    return true;
}

std::vector<std::string> golden_dirs(const std::string &root) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto &d : std::filesystem::directory_iterator(root, ec))
        if (d.is_directory() && std::filesystem::exists(d.path() / "golden.json")) out.push_back(d.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

Result check_dir(const std::string &dir, int32_t backend) {
    Result r;
    try {
        const json m = json::parse(read_text(dir + "/golden.json"));
        r.transformers_version = m.value("transformers_version", "");
        const int32_t T = m.at("tokens").get<int32_t>(), H = m.at("hidden").get<int32_t>();
        const std::vector<float> x = read_raw<float>(dir + "/" + m.at("hidden_states").get<std::string>(), size_t(T) * H);

        ft_engine_params ep;
        ft_engine_params_init(&ep);
        ep.cpu_threads = 2;
        ep.pin_threads = false;
        if (backend == FT_BACKEND_CPU) ep.device = FT_DEVICE_NONE;
        ft_engine *e = nullptr;
        char err[1024] = "";
        if (ft_engine_create(&ep, &e, err, sizeof err) != FT_OK) bad("ft_engine_create: ", err);
        std::unique_ptr<ft_engine, EngineDeleter> engine(e);
        ft_model *mp = nullptr;
        if (ft_model_load(engine.get(), dir.c_str(), nullptr, &mp, err, sizeof err) != FT_OK)
            bad("ft_model_load: ", err);
        std::unique_ptr<ft_model, ModelDeleter> model(mp);
        ft_model_info info{};
        info.struct_size = sizeof info;
        if (ft_model_get_info(model.get(), &info) != FT_OK) bad("ft_model_get_info failed");
        r.architecture = info.architecture;
        if (info.hidden_size != H) bad("hidden size ", info.hidden_size, ", golden.json says ", H);

        ft_session_params sp;
        ft_session_params_init(&sp);
        sp.backend = backend;
        sp.max_tokens = T;
        sp.shared_experts = info.shared_intermediate_size > 0;
        ft_session *sess = nullptr;
        const ft_status st = ft_session_create(model.get(), &sp, &sess, err, sizeof err);
        if (st == FT_ERR_UNSUPPORTED && backend != FT_BACKEND_CPU) {
            r.skipped = err;
            return r;
        }
        if (st != FT_OK) bad("ft_session_create: ", err);
        std::unique_ptr<ft_session, SessionDeleter> session(sess);
        for (const json &entry : m.at("layers")) {
            LayerResult lr;
            check_layer(model.get(), session.get(), info, dir, entry, x, T, lr);
            r.layers.push_back(lr);
        }
    } catch (const Bad &b) {
        r.error = b.what;
    } catch (const std::exception &ex) {
        r.error = std::string("malformed golden.json: ") + ex.what();
    }
    return r;
}

}  // namespace ft::golden
