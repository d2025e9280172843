// ft: the FreeToken command-line program.
//   ft info [MODEL]      build, CPU, GPU and (with a path) the model's summary
//   ft run  [MODEL]      decode a routing trace through a model and report speed against the
//                        machine's memory read bandwidth; without MODEL, a generated synthetic
//                        Qwen3-MoE-like checkpoint is written once and used
//   ft profile           measure this machine's bandwidths and save the profile
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "freetoken.h"
#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/synth.hpp"
#include "profile_cmd.hpp"
#include "progress.hpp"

namespace {

using ft::tool::ProgressBar;

const char *kUsage =
    "usage: ft <command> [options]\n"
    "\n"
    "commands:\n"
    "  info [MODEL]            build, CPU and GPU facts; with MODEL, its geometry\n"
    "  run  [MODEL] [options]  decode a routing trace and report tokens/s and GB/s\n"
    "  profile [options]       measure the memory, PCIe and CPU expert-kernel bandwidths of this\n"
    "                          machine and save them as the profile the library reads\n"
    "\n"
    "run options:\n"
    "  --steps N        decode steps (default 64)\n"
    "  --tokens T       tokens per step (default 1)\n"
    "  --threads N      CPU worker threads (default: one per physical core)\n"
    "  --backend NAME   auto | cpu | gpu | offload | hybrid (default auto)\n"
    "  --cache-fraction F  offload: slot cache size as a fraction of all experts\n"
    "                   (default: what the free GPU memory holds)\n"
    "  --seed S         routing trace seed (default 1)\n"
    "  --format F       without MODEL: generate the synthetic checkpoint in format F, in the\n"
    "                   layout its real releases use: bf16, fp8_block, nvfp4 (Qwen3-MoE),\n"
    "                   mxfp4 (gpt-oss), ds_fp4 (DeepSeek-V4), q4_0 (GGUF) (default bf16)\n"
    "  --cache-dir DIR  where the synthetic checkpoint is kept\n"
    "                   (default $XDG_CACHE_HOME/freetoken or ~/.cache/freetoken)\n"
    "  --no-gpu         do not use a GPU even if one is present\n"
    "\n"
    "profile options:\n"
    "  --formats LIST   comma list of formats to measure (default: all of bf16, fp8_block,\n"
    "                   nvfp4, mxfp4, ds_fp4, q4_0)\n"
    "  --threads N      CPU worker threads (default: one per physical core)\n"
    "  --no-gpu         measure the CPU only\n"
    "  --seconds S      soft bound on the whole run (default 30)\n"
    "  --out PATH       save the profile there instead of the default path\n"
    "                   ($FT_PROFILE_PATH, else $XDG_CACHE_HOME/freetoken/benchbw.json)\n"
    "  --json           print the profile's JSON instead of the table (it is saved as well)\n"
    "  --plot FILE.svg  draw the bandwidths and the predicted step time against the fetch\n"
    "                   fraction\n"
    "\n"
    "environment: FT_LOG=error|warn|info|debug, FT_CPU_ISA=scalar|avx2|avx512|avx512bf16\n";

struct Options {
    std::string command, model;
    int steps = 64, tokens = 1, threads = 0, backend = FT_BACKEND_AUTO;
    double cache_fraction = 0.0;
    uint64_t seed = 1;
    std::string cache_dir;
    std::string format = "bf16";
    bool no_gpu = false;
    ft::tool::ProfileOptions profile;
};

[[noreturn]] void usage_error(const std::string &msg) {
    std::fprintf(stderr, "ft: %s\n\n%s", msg.c_str(), kUsage);
    std::exit(2);
}

long parse_int(const std::string &flag, const char *v, long lo, long hi) {
    char *end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (!end || *end || x < lo || x > hi) usage_error(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
}

Options parse(int argc, char **argv) {
    Options o;
    if (argc < 2) usage_error("missing command");
    o.command = argv[1];
    if (o.command == "-h" || o.command == "--help" || o.command == "help") {
        std::fputs(kUsage, stdout);
        std::exit(0);
    }
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc) usage_error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--steps") o.steps = static_cast<int>(parse_int(a, value(), 1, 1000000));
        else if (a == "--tokens") o.tokens = static_cast<int>(parse_int(a, value(), 1, 65536));
        else if (a == "--threads") o.threads = static_cast<int>(parse_int(a, value(), 0, 4096));
        else if (a == "--seed") o.seed = static_cast<uint64_t>(parse_int(a, value(), 0, 1L << 62));
        else if (a == "--cache-dir") o.cache_dir = value();
        else if (a == "--format") o.format = value();
        else if (a == "--no-gpu") o.no_gpu = o.profile.no_gpu = true;
        else if (a == "--formats") o.profile.formats = value();
        else if (a == "--seconds") {
            const char *v = value();
            char *end = nullptr;
            o.profile.seconds = std::strtod(v, &end);
            if (!end || *end || !(o.profile.seconds > 0) || o.profile.seconds > 86400) usage_error("--seconds expects a number in (0, 86400]");
        } else if (a == "--json") o.profile.json = true;
        else if (a == "--out") o.profile.out = value();
        else if (a == "--plot") o.profile.plot = value();
        else if (a == "--backend") {
            const std::string b = value();
            if (b == "auto") o.backend = FT_BACKEND_AUTO;
            else if (b == "cpu") o.backend = FT_BACKEND_CPU;
            else if (b == "gpu") o.backend = FT_BACKEND_GPU;
            else if (b == "offload") o.backend = FT_BACKEND_OFFLOAD;
            else if (b == "hybrid") o.backend = FT_BACKEND_HYBRID;
            else usage_error("unknown backend '" + b + "' (auto, cpu, gpu, offload, hybrid)");
        } else if (a == "--cache-fraction") {
            const char *v = value();
            char *end = nullptr;
            o.cache_fraction = std::strtod(v, &end);
            if (!end || *end || !(o.cache_fraction > 0) || o.cache_fraction > 1) usage_error("--cache-fraction expects a number in (0, 1]");
        } else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        } else if (!a.empty() && a[0] == '-') usage_error("unknown option " + a);
        else if (o.model.empty()) o.model = a;
        else usage_error("more than one model path given");
    }
    return o;
}

int check(ft_status s, const char *what, const char *detail) {
    if (s == FT_OK) return 0;
    std::fprintf(stderr, "ft: %s failed: %s: %s\n", what, ft_status_string(s), detail && *detail ? detail : "(no detail)");
    return 1;
}

bool progress_cb(void *user, const char *, uint64_t done, uint64_t total) {
    static_cast<ProgressBar *>(user)->update(done, total);
    return true;
}

const char *backend_name(int32_t b) {
    switch (b) {
        case FT_BACKEND_CPU: return "cpu";
        case FT_BACKEND_GPU: return "gpu (every expert resident)";
        case FT_BACKEND_OFFLOAD: return "offload (GPU slot cache)";
        case FT_BACKEND_HYBRID: return "hybrid (GPU slot cache + CPU)";
        default: return "?";
    }
}

const char *act_name(int32_t a) {
    switch (a) {
        case FT_ACT_SILU: return "silu";
        case FT_ACT_GELU: return "gelu";
        case FT_ACT_GELU_TANH: return "gelu_tanh";
        case FT_ACT_SWIGLU_CLAMP: return "swiglu_clamp";
        default: return "?";
    }
}

// Names of the expert formats (values of ft_model_info.format).
const char *format_name(int32_t f) {
    static const char *names[] = {"?", "bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0"};
    return f >= 1 && f <= 6 ? names[f] : "?";
}

const char *routing_name(int32_t r) {
    switch (r) {
        case FT_ROUTING_SOFTMAX_TOPK: return "softmax top-k";
        case FT_ROUTING_SOFTMAX_TOPK_RENORM: return "softmax top-k, renormalised";
        case FT_ROUTING_SIGMOID_GROUP_TOPK: return "sigmoid + bias, group-limited top-k";
        case FT_ROUTING_TOPK_SOFTMAX: return "top-k, softmax over k";
        case FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK: return "sqrt(softplus) + bias, group-limited top-k";
        default: return "?";
    }
}

void print_model(const ft_model_info &m) {
    std::printf("model       %s: %d MoE layers (first at layer %d of %d), %d experts, top-%d\n", m.architecture, m.num_layers,
                m.first_moe_layer, m.total_layers, m.num_experts, m.top_k);
    std::printf("            H=%d I=%d, %s, %s, routing %s", m.hidden_size, m.intermediate_size, format_name(m.format),
                act_name(m.activation), routing_name(m.routing));
    if (m.routing == FT_ROUTING_SIGMOID_GROUP_TOPK || m.routing == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK)
        std::printf(" (%d groups, keep %d, scale %.3g)", m.num_groups, m.topk_groups, m.routed_scaling_factor);
    std::printf("\n            %.2f MB per expert, %.2f GB of routed experts", m.expert_bytes / 1e6, m.bank_bytes / 1e9);
    if (m.shared_intermediate_size) std::printf(", shared expert width %d", m.shared_intermediate_size);
    std::printf("\n");
}

void print_engine(ft_engine *engine) {
    ft_engine_info e;
    e.struct_size = sizeof e;
    ft_engine_get_info(engine, &e);
    std::printf("engine      %d CPU workers (%d physical cores), kernels %s, %s%s\n", e.cpu_threads, e.physical_cores, e.cpu_isa,
                e.device >= 0 ? "GPU " : "no GPU", e.device >= 0 ? e.device_name : "");
}

int cmd_info(const Options &o) {
    ft_build_info b;
    b.struct_size = sizeof b;
    ft_build_info_get(&b);
    std::printf("freetoken   %s (%s)\n", ft_version_string(), b.compiler);
    std::printf("build       CUDA %s", b.cuda ? "yes" : "no");
    if (b.cuda) std::printf(" (runtime %d.%d, archs %s)", b.cuda_runtime_version / 1000, (b.cuda_runtime_version % 1000) / 10, b.cuda_archs);
    std::printf(", oneDNN %s, NCCL %s\n", b.onednn_version, b.nccl ? "yes" : "no");
    std::printf("cpu         best kernel tier %s\n", b.cpu_isa);

    ft_engine_params ep;
    ft_engine_params_init(&ep);
    if (o.no_gpu) ep.device = FT_DEVICE_NONE;
    ep.cpu_threads = o.threads;
    ft_engine *engine = nullptr;
    char err[512];
    if (check(ft_engine_create(&ep, &engine, err, sizeof err), "engine", err)) return 1;
    print_engine(engine);
    int rc = 0;
    if (!o.model.empty()) {
        ft_model *model = nullptr;
        ProgressBar bar("loading");
        ft_model_load_params lp;
        ft_model_load_params_init(&lp);
        lp.progress = progress_cb;
        lp.progress_user_data = &bar;
        rc = check(ft_model_load(engine, o.model.c_str(), &lp, &model, err, sizeof err), "loading the model", err);
        bar.finish();
        if (!rc) {
            ft_model_info mi;
            mi.struct_size = sizeof mi;
            ft_model_get_info(model, &mi);
            print_model(mi);
        }
        ft_model_free(model);
    }
    ft_engine_free(engine);
    return rc;
}


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
    } else if (format == "q4_0") {
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
    std::printf("writing a synthetic %s checkpoint (%s experts) to %s (once)\n", spec.architecture.c_str(), format.c_str(),
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

int cmd_run(const Options &o) {
    std::string path = o.model;
    if (!path.empty() && o.format != "bf16") usage_error("--format chooses the synthetic checkpoint; a MODEL has its own format");
    if (path.empty()) {
        static const char *formats[] = {"bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0"};
        if (std::find(std::begin(formats), std::end(formats), o.format) == std::end(formats)) usage_error("unknown format '" + o.format + "'");
        path = (o.cache_dir.empty() ? ft::cache_dir() : o.cache_dir) + "/synthetic-" + o.format;
        if (ensure_synthetic(path, o.format)) return 1;
    }

    ft_engine_params ep;
    ft_engine_params_init(&ep);
    ep.cpu_threads = o.threads;
    if (o.no_gpu) ep.device = FT_DEVICE_NONE;
    ft_engine *engine = nullptr;
    ft_model *model = nullptr;
    ft_session *session = nullptr;
    char err[1024];
    if (check(ft_engine_create(&ep, &engine, err, sizeof err), "engine", err)) return 1;

    ft_model_load_params lp;
    ft_model_load_params_init(&lp);
    ProgressBar load_bar("loading");
    lp.progress = progress_cb;
    lp.progress_user_data = &load_bar;
    const auto l0 = std::chrono::steady_clock::now();
    const ft_status ls = ft_model_load(engine, path.c_str(), &lp, &model, err, sizeof err);
    load_bar.finish();
    if (check(ls, "loading the model", err)) {
        ft_engine_free(engine);
        return 1;
    }
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();

    ft_model_info mi;
    mi.struct_size = sizeof mi;
    ft_model_get_info(model, &mi);
    print_model(mi);
    std::printf("            loaded in %.2f s (%.2f GB/s)%s\n", load_s, mi.bank_bytes / 1e9 / load_s, o.model.empty() ? ", synthetic" : "");
    print_engine(engine);

    ft_session_params sp;
    ft_session_params_init(&sp);
    sp.backend = o.backend;
    sp.max_tokens = o.tokens;
    sp.cache_fraction = o.cache_fraction;
    int rc = check(ft_session_create(model, &sp, &session, err, sizeof err), "creating the session", err);
    if (rc) {
        ft_model_free(model);
        ft_engine_free(engine);
        return rc;
    }
    const int32_t backend = ft_session_backend(session);
    std::printf("backend     %s\n", backend_name(backend));
    std::printf("  because   %s\n", ft_session_backend_reason(session));
    {
        ft_engine_info pi;
        pi.struct_size = sizeof pi;
        ft_engine_get_info(engine, &pi);
        ft::tool::print_profile_line(pi.device_name, mi.format);
    }

    // The bound: how fast this machine's cores read memory, measured now, with as many
    // threads as the engine's pool.
    ft_engine_info ei;
    ei.struct_size = sizeof ei;
    ft_engine_get_info(engine, &ei);
    double read_gbs = 0.0;
    {
        ft::cpu::ThreadPool probe_pool(ei.cpu_threads, true);
        read_gbs = ft::cpu::measure_read_bandwidth(probe_pool, size_t{1} << 30) / 1e9;
    }
    std::printf("memory      %.1f GB/s read bandwidth (%d threads, measured now)\n", read_gbs, ei.cpu_threads);
    // A model that is not several times the last-level cache is partly served from it, and the
    // GB/s below then exceed what memory alone delivers.
    const size_t llc = ft::cpu::last_level_cache_bytes();
    const bool cache_served = llc > 0 && mi.bank_bytes < 4 * static_cast<uint64_t>(llc);

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
    std::vector<double> layer_ms;
    layer_ms.reserve(static_cast<size_t>(o.steps) * L);

    ProgressBar run_bar("decoding");
    double total_s = 0.0;
    for (int step = 0; step < o.steps && !rc; ++step) {
        for (int l = 0; l < L && !rc; ++l) {
            trace.logits(l, T, logits);
            rc = check(ft_route(session, l, T, logits.data(), ids.data(), weights.data()), "ft_route", ft_session_last_error(session));
            if (rc) break;
            trace.chosen(l, T, K, ids.data());
            const uint16_t *x = &hidden_pool[static_cast<size_t>((step * L + l) % pool_tokens) * H];
            const auto t0 = std::chrono::steady_clock::now();
            rc = check(ft_decode(session, l, T, x, ids.data(), weights.data(), out.data()), "ft_decode", ft_session_last_error(session));
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            total_s += s;
            layer_ms.push_back(s * 1e3);
        }
        run_bar.update(static_cast<uint64_t>(step + 1), static_cast<uint64_t>(o.steps));
    }
    run_bar.finish();
    if (!rc) {
        ft_session_stats st;
        st.struct_size = sizeof st;
        ft_session_get_stats(session, &st);
        std::sort(layer_ms.begin(), layer_ms.end());
        const double p50 = layer_ms[layer_ms.size() / 2], p90 = layer_ms[layer_ms.size() * 9 / 10];
        const bool on_gpu = backend == FT_BACKEND_GPU || backend == FT_BACKEND_OFFLOAD || backend == FT_BACKEND_HYBRID;
        // Weight bytes the experts of each call needed, wherever they were read from.
        const double used = on_gpu ? static_cast<double>(st.cache_hits + st.cache_misses) * mi.expert_bytes : st.cpu_bytes;
        const double gbs = used / 1e9 / total_s;
        std::printf("decode      %d steps x %d token(s) x %d layers: %.1f tokens/s (MoE layers only)\n", o.steps, T, L, o.steps * T / total_s);
        const double distinct = on_gpu ? static_cast<double>(st.cache_hits + st.cache_misses) : static_cast<double>(st.experts_cpu);
        std::printf("per layer   %.3f ms median, %.3f ms p90; %.1f distinct experts read per layer-step\n", p50, p90,
                    distinct / (static_cast<double>(o.steps) * L));
        if (on_gpu) {
            const double calls = static_cast<double>(st.cache_hits + st.cache_misses);
            std::printf("gpu         %.1f GB/s of expert weights; slot cache hit rate %.1f%%, %.2f GB fetched over PCIe (%.1f GB/s)\n",
                        gbs, calls > 0 ? 100.0 * st.cache_hits / calls : 0.0, st.fetched_bytes / 1e9, st.fetched_bytes / 1e9 / total_s);
            if (backend == FT_BACKEND_HYBRID)
                std::printf("hybrid      CPU computed %.2f GB of missed experts (%.1f GB/s), fetch fraction now %.3f\n",
                            st.cpu_bytes / 1e9, st.cpu_bytes / 1e9 / total_s, st.hybrid_fraction);
        } else {
            std::printf("bandwidth   %.1f GB/s of expert weights = %.2f of the measured read bandwidth\n", gbs,
                        read_gbs > 0 ? gbs / read_gbs : 0.0);
        }
        if (cache_served && !on_gpu)
            std::printf("note        the experts (%.2f GB) are under 4x the %.0f MB last-level cache: part of every step\n"
                        "            is read from cache; bench/bench_cpu_gemv measures DRAM alone\n",
                        mi.bank_bytes / 1e9, llc / 1e6);
    }
    ft_session_free(session);
    ft_model_free(model);
    ft_engine_free(engine);
    return rc;
}

}  // namespace

int main(int argc, char **argv) {
    const Options o = parse(argc, argv);
    if (o.command == "info") return cmd_info(o);
    if (o.command == "run") return cmd_run(o);
    if (o.command == "profile") {
        if (!o.model.empty()) usage_error("profile takes no model path");
        ft::tool::ProfileOptions p = o.profile;
        p.threads = o.threads;
        return ft::tool::cmd_profile(p);
    }
    usage_error("unknown command '" + o.command + "'");
}
