// ft: the FreeToken command-line program.
//   ft info [MODEL]      build, CPU, GPU and (with a path) the model's summary
//   ft run  [MODEL]      decode a routing trace through a model and report speed against the
//                        machine's memory read bandwidth; without MODEL, a generated synthetic
//                        Qwen3-MoE-like checkpoint is written once and used
//   ft profile           measure this machine's bandwidths and save the profile
//   ft version           the library's version and build
// Exit status: 0 success, 1 failure, 2 usage error (one line on stderr and where to read more).
#include <cstdio>

#include "cli.hpp"
#include "freetoken.h"
#include "profile_cmd.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "run_cmd.hpp"

namespace {

using namespace ft::tool;

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
            print_model(mi, model);
        }
        ft_model_free(model);
    }
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
    ProfileOptions p = o.profile;
    p.threads = o.threads;
    return cmd_profile(p);
}
