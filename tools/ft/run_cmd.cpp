// `ft run`: decode a routing trace through a model (a synthetic checkpoint written once when none
// is given) and report its speed against the machine's memory read bandwidth.
#include "run_cmd.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "freetoken.h"
#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/formats.hpp"
#include "ft/synth.hpp"
#include "profile_cmd.hpp"
#include "progress.hpp"
#include "report.hpp"

namespace ft::tool {
namespace {

struct EngineDeleter { void operator()(ft_engine *e) const { ft_engine_free(e); } };
struct ModelDeleter { void operator()(ft_model *m) const { ft_model_free(m); } };
struct SessionDeleter { void operator()(ft_session *s) const { ft_session_free(s); } };
using EnginePtr = std::unique_ptr<ft_engine, EngineDeleter>;
using ModelPtr = std::unique_ptr<ft_model, ModelDeleter>;
using SessionPtr = std::unique_ptr<ft_session, SessionDeleter>;

// The embedded default: Qwen3-MoE geometry per expert (H=2048, I=768, top-8) with fewer
// experts and layers, so it fits a laptop (about 600 MB in bf16) yet exceeds most CPU caches.
// Other formats keep the geometry and take the architecture whose releases use that format.
ft::synth::Spec synthetic_spec(const std::string &format) {
    ft::synth::Spec s;
    s.architecture = "qwen3_moe";
    s.num_layers = 2;
    s.num_experts = 32;
    s.top_k = 8;
    s.hidden = 2048;
    s.intermediate = 768;
    s.seed = 20261130;
    s.format = format;
    if (format == "mxfp4") {
        s.architecture = "gpt_oss";
        s.top_k = 4;
    } else if (format == "ds_fp4") {
        s.architecture = "deepseek_v4";
        s.top_k = 6;
    } else if (format == "q4_k_m") {
        // Types mixed per matrix and layer as llama.cpp's Q4_K_M files mix them: gate/up q4_k, down
        // q6_k in one layer and q4_k in the next.
        s.gguf = true;
        s.format = "q4_k";
        s.gguf_mix = {"q4_k/q6_k", "q4_k/q4_k"};
    } else if (ft::format_is_block(ft::parse_format(format))) {  // q4_0, q8_0, K-quants, iq4_xs: GGUF
        s.gguf = true;
    }
    return s;
}

// Writes the synthetic checkpoint unless a complete one is already there.
int ensure_synthetic(const std::string &dir, const std::string &format) {
    const std::string done = dir + "/.complete";
    struct stat st{};
    if (stat(done.c_str(), &st) == 0) return 0;
    if (!ft::make_dirs(dir)) {
        std::fprintf(stderr, "ft: cannot create %s: %s\n", dir.c_str(), std::strerror(errno));
        return 1;
    }
    const ft::synth::Spec spec = synthetic_spec(format);
    std::fprintf(stderr, "ft: writing a synthetic %s checkpoint (%s experts) to %s (once)\n", spec.architecture.c_str(), format.c_str(),
                dir.c_str());
    try {
        ProgressBar bar("writing");
        if (spec.gguf) {
            ft::synth::write_gguf(dir + "/model.gguf", spec);
        } else {
            ft::synth::write_checkpoint(dir, spec, [&bar](uint64_t d, uint64_t t) {
                bar.update(d, t);
                return true;
            });
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ft: writing the synthetic checkpoint failed: %s\n", e.what());
        return 1;
    }
    std::ofstream(done) << "ok\n";
    return 0;
}

// A routing trace like a real decode: a few experts are popular (Zipf-like, different per
// layer) and a token's experts tend to repeat those of the previous step.
class RoutingTrace {
public:
    RoutingTrace(int layers, int experts, uint64_t seed) : experts_(experts), rng_(seed) {
        popularity_.resize(static_cast<size_t>(layers) * experts);
        previous_.assign(static_cast<size_t>(layers) * experts, 0.0f);
        std::vector<int> perm(static_cast<size_t>(experts));
        for (int l = 0; l < layers; ++l) {
            for (int e = 0; e < experts; ++e) perm[e] = e;
            std::shuffle(perm.begin(), perm.end(), rng_);
            for (int r = 0; r < experts; ++r) popularity_[static_cast<size_t>(l) * experts + perm[r]] = -std::log(1.0f + r);
        }
    }

    // Router logits for `tokens` tokens of `layer`.
    void logits(int layer, int tokens, std::vector<float> &out) {
        out.resize(static_cast<size_t>(tokens) * experts_);
        std::uniform_real_distribution<float> u(1e-6f, 1.0f);
        for (int t = 0; t < tokens; ++t) {
            for (int e = 0; e < experts_; ++e) {
                const size_t i = static_cast<size_t>(layer) * experts_ + e;
                const float gumbel = -std::log(-std::log(u(rng_)));
                out[static_cast<size_t>(t) * experts_ + e] = popularity_[i] + 1.5f * previous_[i] + gumbel;
            }
        }
    }

    void chosen(int layer, int tokens, int k, const int32_t *ids) {
        float *prev = &previous_[static_cast<size_t>(layer) * experts_];
        std::fill(prev, prev + experts_, 0.0f);
        for (int i = 0; i < tokens * k; ++i) prev[ids[i]] = 1.0f;
    }

private:
    int experts_;
    std::mt19937_64 rng_;
    std::vector<float> popularity_, previous_;
};

// The engine, refused before anything is written or loaded when the backend asked for needs a
// GPU that this build or this machine lacks (it would fail only when the session is made).
int open_engine(const Options &o, EnginePtr &engine, ft_engine_info &ei) {
    ft_build_info build;
    build.struct_size = sizeof build;
    ft_build_info_get(&build);
    if (gpu_backend(o.backend) && !build.cuda) {
        std::fprintf(stderr, "ft: --backend %s needs a GPU, and this build of FreeToken has no CUDA support\n", o.backend_name.c_str());
        return 1;
    }
    ft_engine_params ep;
    ft_engine_params_init(&ep);
    ep.cpu_threads = o.threads;
    if (o.no_gpu) ep.device = FT_DEVICE_NONE;
    ft_engine *raw = nullptr;
    char err[1024];
    if (check(ft_engine_create(&ep, &raw, err, sizeof err), "engine", err)) return 1;
    engine.reset(raw);
    ei.struct_size = sizeof ei;
    ft_engine_get_info(raw, &ei);
    if (gpu_backend(o.backend) && ei.device < 0) {
        std::fprintf(stderr, "ft: --backend %s needs a GPU, and the engine found no usable CUDA device\n", o.backend_name.c_str());
        return 1;
    }
    return 0;
}

// MODEL, or the synthetic checkpoint of --format in the cache directory (written if missing).
int model_path(const Options &o, std::string &path) {
    path = o.model;
    if (!path.empty()) return 0;
    path = (o.cache_dir.empty() ? ft::cache_dir() : o.cache_dir) + "/synthetic-" + o.format;
    return ensure_synthetic(path, o.format);
}

// Loads the model with a progress bar, then reports it, the load time and the engine.
int load_model(const Options &o, const std::string &path, ft_engine *engine, const ft_engine_info &ei, ModelPtr &model,
               ft_model_info &mi, nlohmann::json &report) {
    ft_model_load_params lp;
    ft_model_load_params_init(&lp);
    ProgressBar load_bar("loading");
    lp.progress = progress_cb;
    lp.progress_user_data = &load_bar;
    char err[1024];
    ft_model *raw = nullptr;
    const auto l0 = std::chrono::steady_clock::now();
    const ft_status ls = ft_model_load(engine, path.c_str(), &lp, &raw, err, sizeof err);
    load_bar.finish();
    if (check(ls, "loading the model", err)) return 1;
    model.reset(raw);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();

    mi.struct_size = sizeof mi;
    ft_model_get_info(raw, &mi);
    if (o.json) {
        report["model"] = model_json(mi, path, o.model.empty(), raw);
        report["load"] = {{"seconds", load_s}, {"gb_per_s", mi.bank_bytes / 1e9 / load_s}};
        report["engine"] = {{"cpu_threads", ei.cpu_threads},
                            {"physical_cores", ei.physical_cores},
                            {"cpu_isa", ei.cpu_isa},
                            {"gpu", ei.device >= 0 ? ei.device_name : ""}};
    } else {
        print_model(mi, raw);
        std::printf("            loaded in %.2f s (%.2f GB/s)%s\n", load_s, mi.bank_bytes / 1e9 / load_s, o.model.empty() ? ", synthetic" : "");
        print_engine(engine);
    }
    return 0;
}

// The session on --backend, then the backend chosen, why, and the saved profile's state.
int open_session(const Options &o, ft_model *model, const ft_engine_info &ei, const ft_model_info &mi, SessionPtr &session,
                 nlohmann::json &report) {
    ft_session_params sp;
    ft_session_params_init(&sp);
    sp.backend = o.backend;
    sp.max_tokens = o.tokens;
    sp.cache_fraction = o.cache_fraction;
    char err[1024];
    ft_session *raw = nullptr;
    if (const int rc = check(ft_session_create(model, &sp, &raw, err, sizeof err), "creating the session", err)) return rc;
    session.reset(raw);
    const int32_t backend = ft_session_backend(raw);
    const ProfileStatus prof = profile_status(ei.device_name, format_shares(model, mi));
    if (o.json) {
        report["backend"] = {{"name", backend_key(backend)}, {"reason", ft_session_backend_reason(raw)}};
        report["profile"] = profile_json(prof);
    } else {
        std::printf("backend     %s\n", backend_name(backend));
        std::printf("  because   %s\n", ft_session_backend_reason(raw));
        std::printf("profile     %s\n", profile_text(prof).c_str());
    }
    return 0;
}

// The bound: how fast this machine's cores read memory, measured now, with as many threads as
// the engine's pool. Returns GB/s.
double measure_read(const Options &o, const ft_engine_info &ei, nlohmann::json &report) {
    double read_gbs = 0.0;
    {
        ft::cpu::ThreadPool probe_pool(ei.cpu_threads, true);
        read_gbs = ft::cpu::measure_read_bandwidth(probe_pool, size_t{1} << 30) / 1e9;
    }
    if (o.json)
        report["memory"] = {{"read_gbs", read_gbs}, {"threads", ei.cpu_threads}};
    else
        std::printf("memory      %.1f GB/s read bandwidth (%d threads, measured now)\n", read_gbs, ei.cpu_threads);
    return read_gbs;
}

// The decode loop's clock: each ft_decode call's time, and their sum.
struct DecodeTimes {
    std::vector<double> layer_ms;
    double total_s = 0.0;
};

// --steps steps of --tokens tokens through every MoE layer: route the trace's logits, then decode
// (only ft_decode is timed).
int decode_trace(const Options &o, ft_session *session, const ft_model_info &mi, DecodeTimes &times) {
    const int L = mi.num_layers, E = mi.num_experts, K = mi.top_k, H = mi.hidden_size, T = o.tokens;
    RoutingTrace trace(L, E, o.seed);
    std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // A pool of hidden states, reused round-robin, so generating them stays out of the timing.
    const int pool_tokens = std::max(T, 64);
    std::vector<uint16_t> hidden_pool(static_cast<size_t>(pool_tokens + T) * H);
    for (auto &v : hidden_pool) v = ft::f32_to_bf16(normal(rng));
    std::vector<uint16_t> out(static_cast<size_t>(T) * H);
    std::vector<int32_t> ids(static_cast<size_t>(T) * K);
    std::vector<float> weights(static_cast<size_t>(T) * K), logits;
    std::vector<int32_t> tokens(static_cast<size_t>(T));
    times.layer_ms.reserve(static_cast<size_t>(o.steps) * L);

    ProgressBar run_bar("decoding");
    int rc = 0;
    for (int step = 0; step < o.steps && !rc; ++step) {
        for (int l = 0; l < L && !rc; ++l) {
            trace.logits(l, T, logits);
            // DeepSeek-V4's hash-routed layers take token ids: random ones stand for the prompt's.
            for (int32_t &t : tokens) t = mi.vocab_size > 0 ? static_cast<int32_t>(rng() % uint64_t(mi.vocab_size)) : 0;
            rc = check(ft_route_tokens(session, l, T, logits.data(), tokens.data(), ids.data(), weights.data()),
                       "ft_route_tokens", ft_session_last_error(session));
            if (rc) break;
            trace.chosen(l, T, K, ids.data());
            const uint16_t *x = &hidden_pool[static_cast<size_t>((step * L + l) % pool_tokens) * H];
            const auto t0 = std::chrono::steady_clock::now();
            rc = check(ft_decode(session, l, T, x, ids.data(), weights.data(), out.data()), "ft_decode", ft_session_last_error(session));
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            times.total_s += s;
            times.layer_ms.push_back(s * 1e3);
        }
        run_bar.update(static_cast<uint64_t>(step + 1), static_cast<uint64_t>(o.steps));
    }
    run_bar.finish();
    return rc;
}

// The figures of a finished run.
struct DecodeFigures {
    bool on_gpu;
    double p50, p90;       // per-layer ft_decode time, ms
    double gbs;            // expert weights the calls needed, wherever read from, per second
    double tokens_per_s;
    double distinct;       // distinct experts per layer-step
    double hit_rate;       // GPU slot cache
    double of_read;        // gbs over the measured read bandwidth
    size_t llc;            // last-level cache bytes (0: unknown)
    bool cache_served;     // the experts are under 4x the last-level cache
};

// Expert weight bytes the GPU-side decode calls needed: every (call, expert) routed, at the
// expert size of its layer (a model mixing formats has layers of different sizes).
double gpu_expert_bytes(const ft_model *model, const ft_model_info &mi, const ft_session *session, const ft_session_stats &st) {
    if (!mi.mixed_formats) return static_cast<double>(st.cache_hits + st.cache_misses) * mi.expert_bytes;
    const std::vector<uint64_t> bytes = layer_expert_bytes(model, mi);
    double used = 0.0;
    for (int32_t l = 0; l < mi.num_layers; ++l) {
        ft_layer_stats ls;
        ls.struct_size = sizeof ls;
        if (ft_session_get_layer_stats(session, l, &ls) == FT_OK) used += static_cast<double>(ls.active_experts) * bytes[l];
    }
    return used;
}

DecodeFigures decode_figures(const Options &o, const ft_model *model, const ft_model_info &mi, const ft_session *session,
                             int32_t backend, const ft_session_stats &st, DecodeTimes &times, double read_gbs) {
    DecodeFigures f;
    const int L = mi.num_layers, T = o.tokens;
    std::sort(times.layer_ms.begin(), times.layer_ms.end());
    f.p50 = times.layer_ms[times.layer_ms.size() / 2];
    f.p90 = times.layer_ms[times.layer_ms.size() * 9 / 10];
    f.on_gpu = gpu_backend(backend);
    const double used = f.on_gpu ? gpu_expert_bytes(model, mi, session, st) : st.cpu_bytes;
    f.gbs = used / 1e9 / times.total_s;
    f.tokens_per_s = o.steps * T / times.total_s;
    f.distinct = (f.on_gpu ? static_cast<double>(st.cache_hits + st.cache_misses) : static_cast<double>(st.experts_cpu)) /
                 (static_cast<double>(o.steps) * L);
    const double calls = static_cast<double>(st.cache_hits + st.cache_misses);
    f.hit_rate = calls > 0 ? st.cache_hits / calls : 0.0;
    f.of_read = read_gbs > 0 ? f.gbs / read_gbs : 0.0;
    // A model that is not several times the last-level cache is partly served from it, and the
    // GB/s then exceed what memory alone delivers.
    f.llc = ft::cpu::last_level_cache_bytes();
    f.cache_served = f.llc > 0 && mi.bank_bytes < 4 * static_cast<uint64_t>(f.llc);
    return f;
}

void print_decode_json(const Options &o, const ft_model_info &mi, int32_t backend, const ft_session_stats &st,
                       const DecodeFigures &f, double total_s, nlohmann::json &report) {
    report["decode"] = {{"steps", o.steps},
                        {"tokens", o.tokens},
                        {"layers", mi.num_layers},
                        {"tokens_per_s", f.tokens_per_s},
                        {"layer_ms_median", f.p50},
                        {"layer_ms_p90", f.p90},
                        {"distinct_experts_per_layer_step", f.distinct}};
    if (f.on_gpu) {
        report["gpu"] = {{"expert_gbs", f.gbs},
                         {"cache_hit_rate", f.hit_rate},
                         {"fetched_gb", st.fetched_bytes / 1e9},
                         {"fetch_gbs", st.fetched_bytes / 1e9 / total_s}};
        if (backend == FT_BACKEND_HYBRID)
            report["hybrid"] = {{"cpu_gb", st.cpu_bytes / 1e9}, {"cpu_gbs", st.cpu_bytes / 1e9 / total_s}, {"fetch_fraction", st.hybrid_fraction}};
    } else {
        report["bandwidth"] = {{"expert_gbs", f.gbs}, {"fraction_of_read", f.of_read}};
    }
    report["cache"] = {{"last_level_bytes", f.llc}, {"serves_part_of_model", f.cache_served && !f.on_gpu}};
    std::printf("%s\n", report.dump(2).c_str());
}

void print_decode_text(const Options &o, const ft_model_info &mi, int32_t backend, const ft_session_stats &st,
                       const DecodeFigures &f, double total_s) {
    std::printf("decode      %d steps x %d token(s) x %d layers: %.1f tokens/s (MoE layers only)\n", o.steps, o.tokens,
                mi.num_layers, f.tokens_per_s);
    std::printf("per layer   %.3f ms median, %.3f ms p90; %.1f distinct experts read per layer-step\n", f.p50, f.p90, f.distinct);
    if (f.on_gpu) {
        std::printf("gpu         %.1f GB/s of expert weights; slot cache hit rate %.1f%%, %.2f GB fetched over PCIe (%.1f GB/s)\n", f.gbs,
                    100.0 * f.hit_rate, st.fetched_bytes / 1e9, st.fetched_bytes / 1e9 / total_s);
        if (backend == FT_BACKEND_HYBRID)
            std::printf("hybrid      CPU computed %.2f GB of missed experts (%.1f GB/s), fetch fraction now %.3f\n", st.cpu_bytes / 1e9,
                        st.cpu_bytes / 1e9 / total_s, st.hybrid_fraction);
    } else {
        std::printf("bandwidth   %.1f GB/s of expert weights = %.2f of the measured read bandwidth\n", f.gbs, f.of_read);
    }
    if (f.cache_served && !f.on_gpu)
        std::printf("note        the experts (%.2f GB) are under 4x the %.0f MB last-level cache: part of every step\n"
                    "            is read from cache; bench/bench_cpu_gemv measures DRAM alone\n",
                    mi.bank_bytes / 1e9, f.llc / 1e6);
}

}  // namespace

// Decodes a routing trace and reports its figures: as text lines (label, then the figures) or,
// with --json, as one JSON object holding the same figures, printed at the end.
int cmd_run(const Options &o) {
    EnginePtr engine;
    ModelPtr model;
    SessionPtr session;
    ft_engine_info ei;
    ft_model_info mi;
    std::string path;
    nlohmann::json report;
    if (open_engine(o, engine, ei) || model_path(o, path) || load_model(o, path, engine.get(), ei, model, mi, report))
        return 1;
    if (const int rc = open_session(o, model.get(), ei, mi, session, report)) return rc;
    const double read_gbs = measure_read(o, ei, report);
    DecodeTimes times;
    if (const int rc = decode_trace(o, session.get(), mi, times)) return rc;
    ft_session_stats st;
    st.struct_size = sizeof st;
    ft_session_get_stats(session.get(), &st);
    const int32_t backend = ft_session_backend(session.get());
    const DecodeFigures f = decode_figures(o, model.get(), mi, session.get(), backend, st, times, read_gbs);
    if (o.json)
        print_decode_json(o, mi, backend, st, f, times.total_s, report);
    else
        print_decode_text(o, mi, backend, st, f, times.total_s);
    return 0;
}

}  // namespace ft::tool
