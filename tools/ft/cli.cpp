// The ft program's help texts and command-line parser.
#include "cli.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

namespace ft::tool {
namespace {

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
    "                   mxfp4 (gpt-oss), ds_fp4 (DeepSeek-V4), and as GGUF files q4_0, q8_0,\n"
    "                   q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, and q4_k_m (types mixed per\n"
    "                   matrix and layer like llama.cpp's Q4_K_M: gate/up q4_k, down q6_k\n"
    "                   and q4_k in alternate layers) (default bf16)\n"
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
    "                   nvfp4, mxfp4, ds_fp4, q4_0, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs)\n"
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

// argv[1]: help (printed, exit 0), --version / -V (returns true: nothing follows), or a known
// command, which becomes o.command; then --help anywhere on the line prints that command's help.
bool parse_command(int argc, char **argv, Options &o) {
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
        return true;
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
    return false;
}

// Reads argv[i] (and, for an option with a value, argv[i + 1], advancing i) into o.
void parse_argument(int argc, char **argv, int &i, Options &o) {
    const bool run = o.command == "run", profile = o.command == "profile", info = o.command == "info";
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

// The rules between the options of `ft run`.
void check_run_options(const Options &o) {
    static const char *formats[] = {"bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0", "q8_0",
                                    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q4_k_m"};
    if (std::find(std::begin(formats), std::end(formats), o.format) == std::end(formats))
        usage_error("unknown format '" + o.format +
                    "' (bf16, fp8_block, nvfp4, mxfp4, ds_fp4, q4_0, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, q4_k_m)");
    if (o.format_given && !o.model.empty()) usage_error("--format chooses the synthetic checkpoint; a MODEL has its own format");
    if (o.no_gpu && o.backend != FT_BACKEND_AUTO && o.backend != FT_BACKEND_CPU)
        usage_error("--backend " + o.backend_name + " needs a GPU, and --no-gpu forbids one");
}

}  // namespace

const char *help_of(const std::string &command) {
    if (command == "info") return kInfoHelp;
    if (command == "run") return kRunHelp;
    if (command == "profile") return kProfileHelp;
    if (command == "version") return kVersionHelp;
    return nullptr;
}

Options parse(int argc, char **argv) {
    Options o;
    if (parse_command(argc, argv, o)) return o;
    for (int i = 2; i < argc; ++i) parse_argument(argc, argv, i, o);
    if (o.command == "run") check_run_options(o);
    return o;
}

}  // namespace ft::tool
