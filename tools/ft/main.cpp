// ft: the FreeToken command-line program.
//   ft info [MODEL]      build, CPU, GPU and (with a path) the model's summary
//   ft run  [MODEL]      decode a routing trace through a model and report speed against the
//                        machine's memory read bandwidth; without MODEL, a generated synthetic
//                        Qwen3-MoE-like checkpoint is written once and used
//   ft profile           measure this machine's bandwidths and save the profile
//   ft version           the library's version and build
// Exit status: 0 success, 1 failure, 2 usage error (one line on stderr and where to read more).
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "freetoken.h"
#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "ft/synth.hpp"
#include "profile_cmd.hpp"
#include "progress.hpp"

namespace {

using ft::tool::ProgressBar;

const char *kMainHelp =
    "usage: ft <command> [options]\n"
    "\n"
    "commands:\n"
    "  info [MODEL]            build, CPU and GPU facts; with MODEL, its geometry\n"
    "  run  [MODEL] [options]  decode a routing trace and report tokens/s and GB/s\n"
    "  profile [options]       measure the memory, PCIe and CPU expert-kernel bandwidths of this\n"
    "                          machine and save them as the profile the library reads\n"
    "  version                 the library's version and build (also: ft --version)\n"
    "  help [COMMAND]          this text, or COMMAND's options (also: ft COMMAND --help)\n"
    "\n"
    "environment: FT_LOG=error|warn|info|debug, FT_CPU_ISA=scalar|avx2|avx512|avx512bf16\n"
    "exit status: 0 success, 1 failure, 2 usage error\n";

const char *kInfoHelp =
    "usage: ft info [MODEL] [options]\n"
    "\n"
    "Prints the build (version, CUDA, oneDNN), the CPU's kernel tier and the engine's GPU; with\n"
    "MODEL (a checkpoint directory or .gguf file), loads it and prints its geometry.\n"
    "\n"
    "options:\n"
    "  --threads N      CPU worker threads (default: one per physical core)\n"
    "  --no-gpu         do not use a GPU even if one is present\n"
    "  -h, --help       this text\n";

const char *kRunHelp =
    "usage: ft run [MODEL] [options]\n"
    "\n"
    "Decodes a routing trace through MODEL (a checkpoint directory or .gguf file) and reports\n"
    "tokens/s and the GB/s of expert weights against the memory read bandwidth measured in the\n"
    "same run. Without MODEL, a synthetic Qwen3-MoE-like checkpoint is written once and used.\n"
    "\n"
    "options:\n"
    "  --steps N        decode steps (default 64)\n"
    "  --tokens T       tokens per step (default 1)\n"
    "  --threads N      CPU worker threads (default: one per physical core)\n"
    "  --backend NAME   auto | cpu | gpu | offload | hybrid (default auto); gpu, offload and\n"
    "                   hybrid need a usable GPU\n"
    "  --cache-fraction F  offload: slot cache size as a fraction of all experts\n"
    "                   (default: what the free GPU memory holds)\n"
    "  --seed S         routing trace seed (default 1)\n"
    "  --format F       without MODEL: generate the synthetic checkpoint in format F, in the\n"
    "                   layout its real releases use: bf16, fp8_block, nvfp4 (Qwen3-MoE),\n"
    "                   mxfp4 (gpt-oss), ds_fp4 (DeepSeek-V4), q4_0 (GGUF) (default bf16)\n"
    "  --cache-dir DIR  where the synthetic checkpoint is kept\n"
    "                   (default $XDG_CACHE_HOME/freetoken or ~/.cache/freetoken)\n"
    "  --no-gpu         do not use a GPU even if one is present\n"
    "  --json           print the run's figures as one JSON object instead of the text\n"
    "  -h, --help       this text\n"
    "\n"
    "Results go to standard output; progress and notices to standard error.\n";

const char *kProfileHelp =
    "usage: ft profile [options]\n"
    "\n"
    "Measures the memory, PCIe and CPU expert-kernel bandwidths of this machine and saves them\n"
    "as the profile the library reads when it chooses a backend.\n"
    "\n"
    "options:\n"
    "  --formats LIST   comma list of formats to measure (default: all of bf16, fp8_block,\n"
    "                   nvfp4, mxfp4, ds_fp4, q4_0)\n"
    "  --threads N      CPU worker threads (default: one per physical core)\n"
    "  --no-gpu         measure the CPU only\n"
    "  --seconds S      soft bound on the whole run (default 30)\n"
    "  --out PATH       save the profile there instead of the default path\n"
    "                   ($FT_PROFILE_PATH, else $XDG_CACHE_HOME/freetoken/benchbw.json)\n"
    "  --json           print the profile's JSON instead of the table (it is saved as well)\n"
    "  --plot FILE.svg  draw the bandwidths and the predicted step time against the fetch\n"
    "                   fraction as SVG (the path must end in .svg)\n"
    "  -h, --help       this text\n";

const char *kVersionHelp =
    "usage: ft version (or ft --version)\n"
    "\n"
    "Prints the version of the FreeToken library in use and how it was built.\n";

// The command being parsed, for "see 'ft COMMAND --help'"; empty before one is known.
std::string g_command;

const char *help_of(const std::string &command) {
    if (command == "info") return kInfoHelp;
    if (command == "run") return kRunHelp;
    if (command == "profile") return kProfileHelp;
    if (command == "version") return kVersionHelp;
    return nullptr;
}

struct Options {
    std::string command, model;
    int steps = 64, tokens = 1, threads = 0, backend = FT_BACKEND_AUTO;
    std::string backend_name = "auto";
    double cache_fraction = 0.0;
    uint64_t seed = 1;
    std::string cache_dir;
    std::string format = "bf16";
    bool format_given = false;
    bool no_gpu = false, json = false;
    ft::tool::ProfileOptions profile;
};

// A usage error: one line naming what is wrong and where the command's options are listed.
[[noreturn]] void usage_error(const std::string &msg) {
    std::fprintf(stderr, "ft: %s\nsee 'ft%s%s --help'\n", msg.c_str(), g_command.empty() ? "" : " ", g_command.c_str());
    std::exit(2);
}

long parse_int(const std::string &flag, const char *v, long lo, long hi) {
    char *end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (!*v || !end || *end || errno == ERANGE || x < lo || x > hi)
        usage_error(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" + v + "'");
    return x;
}

double parse_double(const std::string &flag, const char *v, double lo_exclusive, double hi, const char *range) {
    char *end = nullptr;
    const double x = std::strtod(v, &end);
    if (!*v || !end || *end || !(x > lo_exclusive) || !(x <= hi)) usage_error(flag + " expects a number in " + range + ", not '" + v + "'");
    return x;
}

bool ends_with_svg(const std::string &path) {
    if (path.size() < 5 || path[path.size() - 5] == '/') return false;
    std::string ext = path.substr(path.size() - 4);
    for (char &c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext == ".svg";
}

Options parse(int argc, char **argv) {
    Options o;
    if (argc < 2) usage_error("missing command");
    o.command = argv[1];
    if (o.command == "-h" || o.command == "--help" || o.command == "help") {
        if (argc > 2 && o.command == "help") {
            const char *h = help_of(argv[2]);
            if (!h) usage_error(std::string("no help for unknown command '") + argv[2] + "'");
            if (argc > 3) usage_error("help takes one command name");
            std::fputs(h, stdout);
            std::exit(0);
        }
        if (argc > 2) usage_error(std::string("unexpected argument '") + argv[2] + "' after " + o.command);
        std::fputs(kMainHelp, stdout);
        std::exit(0);
    }
    if (o.command == "--version" || o.command == "-V") {
        if (argc > 2) usage_error(std::string("unexpected argument '") + argv[2] + "' after " + o.command);
        o.command = "version";
        return o;
    }
    if (!help_of(o.command)) {
        if (!o.command.empty() && o.command[0] == '-') usage_error("unknown option '" + o.command + "' (a command comes first)");
        usage_error("unknown command '" + o.command + "'");
    }
    g_command = o.command;
    // --help wins over anything else on the line.
    for (int i = 2; i < argc; ++i) {
        if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
            std::fputs(help_of(o.command), stdout);
            std::exit(0);
        }
    }

    const bool run = o.command == "run", profile = o.command == "profile", info = o.command == "info";
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        // Whether the current command has option `a`.
        auto has = [&](bool allowed) {
            if (!allowed) usage_error("unknown option '" + a + "' for 'ft " + o.command + "'");
            return true;
        };
        auto value = [&]() -> const char * {
            if (i + 1 >= argc) usage_error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--steps" && has(run)) o.steps = static_cast<int>(parse_int(a, value(), 1, 1000000));
        else if (a == "--tokens" && has(run)) o.tokens = static_cast<int>(parse_int(a, value(), 1, 65536));
        else if (a == "--threads" && has(run || profile || info)) o.threads = static_cast<int>(parse_int(a, value(), 0, 4096));
        else if (a == "--seed" && has(run)) o.seed = static_cast<uint64_t>(parse_int(a, value(), 0, 1L << 62));
        else if (a == "--cache-dir" && has(run)) o.cache_dir = value();
        else if (a == "--format" && has(run)) {
            o.format = value();
            o.format_given = true;
        } else if (a == "--no-gpu" && has(run || profile || info)) o.no_gpu = o.profile.no_gpu = true;
        else if (a == "--formats" && has(profile)) o.profile.formats = value();
        else if (a == "--seconds" && has(profile)) o.profile.seconds = parse_double(a, value(), 0.0, 86400.0, "(0, 86400]");
        else if (a == "--json" && has(run || profile)) o.json = o.profile.json = true;
        else if (a == "--out" && has(profile)) o.profile.out = value();
        else if (a == "--plot" && has(profile)) {
            o.profile.plot = value();
            if (!ends_with_svg(o.profile.plot))
                usage_error("--plot writes SVG only: '" + o.profile.plot + "' does not end in .svg");
        } else if (a == "--backend" && has(run)) {
            const std::string b = value();
            if (b == "auto") o.backend = FT_BACKEND_AUTO;
            else if (b == "cpu") o.backend = FT_BACKEND_CPU;
            else if (b == "gpu") o.backend = FT_BACKEND_GPU;
            else if (b == "offload") o.backend = FT_BACKEND_OFFLOAD;
            else if (b == "hybrid") o.backend = FT_BACKEND_HYBRID;
            else usage_error("unknown backend '" + b + "' (auto, cpu, gpu, offload, hybrid)");
            o.backend_name = b;
        } else if (a == "--cache-fraction" && has(run)) o.cache_fraction = parse_double(a, value(), 0.0, 1.0, "(0, 1]");
        else if (!a.empty() && a[0] == '-') usage_error("unknown option '" + a + "' for 'ft " + o.command + "'");
        else if (profile || o.command == "version") usage_error("unexpected argument '" + a + "'");
        else if (o.model.empty()) o.model = a;
        else usage_error("more than one model path given ('" + o.model + "', '" + a + "')");
    }
    if (run) {
        static const char *formats[] = {"bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0"};
        if (std::find(std::begin(formats), std::end(formats), o.format) == std::end(formats))
            usage_error("unknown format '" + o.format + "' (bf16, fp8_block, nvfp4, mxfp4, ds_fp4, q4_0)");
        if (o.format_given && !o.model.empty()) usage_error("--format chooses the synthetic checkpoint; a MODEL has its own format");
        if (o.no_gpu && o.backend != FT_BACKEND_AUTO && o.backend != FT_BACKEND_CPU)
            usage_error("--backend " + o.backend_name + " needs a GPU, and --no-gpu forbids one");
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
        case FT_ROUTING_TOPK_SIGMOID: return "top-k, sigmoid weights";
        case FT_ROUTING_SOFTMAX_GROUP_TOPK: return "softmax, group-limited top-k";
        case FT_ROUTING_SOFTMAX_BIASED_TOPK: return "softmax + bias, top-k";
        case FT_ROUTING_SPARSEMIXER: return "sparsemixer (top-2)";
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
    std::printf("cpu         best kernel tier %s; oneDNN bf16 matmul: %s\n", b.cpu_isa,
                b.onednn_bf16 ? "yes" : "no (below AVX-512: the library's own kernels run every batch)");

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

bool gpu_backend(int32_t b) { return b == FT_BACKEND_GPU || b == FT_BACKEND_OFFLOAD || b == FT_BACKEND_HYBRID; }

const char *backend_key(int32_t b) {
    switch (b) {
        case FT_BACKEND_CPU: return "cpu";
        case FT_BACKEND_GPU: return "gpu";
        case FT_BACKEND_OFFLOAD: return "offload";
        case FT_BACKEND_HYBRID: return "hybrid";
        default: return "?";
    }
}

nlohmann::json model_json(const ft_model_info &m, const std::string &path, bool synthetic) {
    nlohmann::json j = {{"path", path},
                        {"synthetic", synthetic},
                        {"architecture", m.architecture},
                        {"moe_layers", m.num_layers},
                        {"first_moe_layer", m.first_moe_layer},
                        {"total_layers", m.total_layers},
                        {"experts", m.num_experts},
                        {"top_k", m.top_k},
                        {"hidden_size", m.hidden_size},
                        {"intermediate_size", m.intermediate_size},
                        {"format", format_name(m.format)},
                        {"activation", act_name(m.activation)},
                        {"routing", routing_name(m.routing)},
                        {"expert_bytes", m.expert_bytes},
                        {"bank_bytes", m.bank_bytes},
                        {"shared_intermediate_size", m.shared_intermediate_size}};
    if (m.routing == FT_ROUTING_SIGMOID_GROUP_TOPK || m.routing == FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK) {
        j["num_groups"] = m.num_groups;
        j["topk_groups"] = m.topk_groups;
        j["routed_scaling_factor"] = m.routed_scaling_factor;
    }
    return j;
}

nlohmann::json profile_json(const ft::tool::ProfileStatus &p) {
    nlohmann::json j = {{"path", p.path}, {"state", p.state}};
    if (!p.detail.empty()) j["detail"] = p.detail;
    if (p.state == "applies") {
        j["cpu_gbs"] = p.cpu_gbs;
        if (p.fetch_fraction >= 0) j["fetch_fraction"] = p.fetch_fraction;
    }
    return j;
}

// Decodes a routing trace and reports its figures: as text lines (label, then the figures) or,
// with --json, as one JSON object holding the same figures, printed at the end.
int cmd_run(const Options &o) {
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
    ft_engine *engine = nullptr;
    ft_model *model = nullptr;
    ft_session *session = nullptr;
    char err[1024];
    if (check(ft_engine_create(&ep, &engine, err, sizeof err), "engine", err)) return 1;
    ft_engine_info ei;
    ei.struct_size = sizeof ei;
    ft_engine_get_info(engine, &ei);
    // A GPU backend without a GPU would fail only when the session is made: say so before the
    // model is written or loaded.
    if (gpu_backend(o.backend) && ei.device < 0) {
        std::fprintf(stderr, "ft: --backend %s needs a GPU, and the engine found no usable CUDA device\n", o.backend_name.c_str());
        ft_engine_free(engine);
        return 1;
    }

    std::string path = o.model;
    if (path.empty()) {
        path = (o.cache_dir.empty() ? ft::cache_dir() : o.cache_dir) + "/synthetic-" + o.format;
        if (ensure_synthetic(path, o.format)) {
            ft_engine_free(engine);
            return 1;
        }
    }

    nlohmann::json report;
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
    if (o.json) {
        report["model"] = model_json(mi, path, o.model.empty());
        report["load"] = {{"seconds", load_s}, {"gb_per_s", mi.bank_bytes / 1e9 / load_s}};
        report["engine"] = {{"cpu_threads", ei.cpu_threads},
                            {"physical_cores", ei.physical_cores},
                            {"cpu_isa", ei.cpu_isa},
                            {"gpu", ei.device >= 0 ? ei.device_name : ""}};
    } else {
        print_model(mi);
        std::printf("            loaded in %.2f s (%.2f GB/s)%s\n", load_s, mi.bank_bytes / 1e9 / load_s, o.model.empty() ? ", synthetic" : "");
        print_engine(engine);
    }

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
    const ft::tool::ProfileStatus prof = ft::tool::profile_status(ei.device_name, mi.format);
    if (o.json) {
        report["backend"] = {{"name", backend_key(backend)}, {"reason", ft_session_backend_reason(session)}};
        report["profile"] = profile_json(prof);
    } else {
        std::printf("backend     %s\n", backend_name(backend));
        std::printf("  because   %s\n", ft_session_backend_reason(session));
        std::printf("profile     %s\n", ft::tool::profile_text(prof, mi.format).c_str());
    }

    // The bound: how fast this machine's cores read memory, measured now, with as many
    // threads as the engine's pool.
    double read_gbs = 0.0;
    {
        ft::cpu::ThreadPool probe_pool(ei.cpu_threads, true);
        read_gbs = ft::cpu::measure_read_bandwidth(probe_pool, size_t{1} << 30) / 1e9;
    }
    if (o.json)
        report["memory"] = {{"read_gbs", read_gbs}, {"threads", ei.cpu_threads}};
    else
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
        const bool on_gpu = gpu_backend(backend);
        // Weight bytes the experts of each call needed, wherever they were read from.
        const double used = on_gpu ? static_cast<double>(st.cache_hits + st.cache_misses) * mi.expert_bytes : st.cpu_bytes;
        const double gbs = used / 1e9 / total_s;
        const double tokens_per_s = o.steps * T / total_s;
        const double distinct = (on_gpu ? static_cast<double>(st.cache_hits + st.cache_misses) : static_cast<double>(st.experts_cpu)) /
                                (static_cast<double>(o.steps) * L);
        const double calls = static_cast<double>(st.cache_hits + st.cache_misses);
        const double hit_rate = calls > 0 ? st.cache_hits / calls : 0.0;
        const double of_read = read_gbs > 0 ? gbs / read_gbs : 0.0;
        if (o.json) {
            report["decode"] = {{"steps", o.steps},
                                {"tokens", T},
                                {"layers", L},
                                {"tokens_per_s", tokens_per_s},
                                {"layer_ms_median", p50},
                                {"layer_ms_p90", p90},
                                {"distinct_experts_per_layer_step", distinct}};
            if (on_gpu) {
                report["gpu"] = {{"expert_gbs", gbs},
                                 {"cache_hit_rate", hit_rate},
                                 {"fetched_gb", st.fetched_bytes / 1e9},
                                 {"fetch_gbs", st.fetched_bytes / 1e9 / total_s}};
                if (backend == FT_BACKEND_HYBRID)
                    report["hybrid"] = {{"cpu_gb", st.cpu_bytes / 1e9}, {"cpu_gbs", st.cpu_bytes / 1e9 / total_s}, {"fetch_fraction", st.hybrid_fraction}};
            } else {
                report["bandwidth"] = {{"expert_gbs", gbs}, {"fraction_of_read", of_read}};
            }
            report["cache"] = {{"last_level_bytes", llc}, {"serves_part_of_model", cache_served && !on_gpu}};
            std::printf("%s\n", report.dump(2).c_str());
        } else {
            std::printf("decode      %d steps x %d token(s) x %d layers: %.1f tokens/s (MoE layers only)\n", o.steps, T, L, tokens_per_s);
            std::printf("per layer   %.3f ms median, %.3f ms p90; %.1f distinct experts read per layer-step\n", p50, p90, distinct);
            if (on_gpu) {
                std::printf("gpu         %.1f GB/s of expert weights; slot cache hit rate %.1f%%, %.2f GB fetched over PCIe (%.1f GB/s)\n", gbs,
                            100.0 * hit_rate, st.fetched_bytes / 1e9, st.fetched_bytes / 1e9 / total_s);
                if (backend == FT_BACKEND_HYBRID)
                    std::printf("hybrid      CPU computed %.2f GB of missed experts (%.1f GB/s), fetch fraction now %.3f\n", st.cpu_bytes / 1e9,
                                st.cpu_bytes / 1e9 / total_s, st.hybrid_fraction);
            } else {
                std::printf("bandwidth   %.1f GB/s of expert weights = %.2f of the measured read bandwidth\n", gbs, of_read);
            }
            if (cache_served && !on_gpu)
                std::printf("note        the experts (%.2f GB) are under 4x the %.0f MB last-level cache: part of every step\n"
                            "            is read from cache; bench/bench_cpu_gemv measures DRAM alone\n",
                            mi.bank_bytes / 1e9, llc / 1e6);
        }
    }
    ft_session_free(session);
    ft_model_free(model);
    ft_engine_free(engine);
    return rc;
}

int cmd_version() {
    ft_build_info b;
    b.struct_size = sizeof b;
    ft_build_info_get(&b);
    std::printf("ft (FreeToken) %s\n", ft_version_string());
    std::printf("build       %s; CUDA %s", b.compiler, b.cuda ? "yes" : "no");
    if (b.cuda) std::printf(" (runtime %d.%d, archs %s)", b.cuda_runtime_version / 1000, (b.cuda_runtime_version % 1000) / 10, b.cuda_archs);
    std::printf("; oneDNN %s; NCCL %s\n", b.onednn_version, b.nccl ? "yes" : "no");
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    const Options o = parse(argc, argv);
    if (o.command == "version") return cmd_version();
    if (o.command == "info") return cmd_info(o);
    if (o.command == "run") return cmd_run(o);
    ft::tool::ProfileOptions p = o.profile;
    p.threads = o.threads;
    return ft::tool::cmd_profile(p);
}
