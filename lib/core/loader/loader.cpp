// Checkpoint -> Model. Loading runs in two phases: a plan that resolves every tensor, checks its
// dtype and shape and cuts the copies into pieces of at most kPieceBytes (so that all errors come
// before any I/O and a few huge fused tensors still keep every reader busy), then parallel readers
// (pieces.cpp) that pread each piece straight into its bank row (or convert it from the read-only
// mapping).
//
// Expert formats come from the tensors found (the config's quantization_config must agree):
// bf16/f16/f32 per-expert or fused tensors -> bf16 banks (gpt-oss: interleaved, with biases);
// `weight` + `weight_scale_inv` -> fp8_block; `weight` + `weight_scale` + `weight_scale_2` ->
// nvfp4 (ModelOpt); gpt-oss `*_blocks` / `*_scales` / `*_bias` -> mxfp4; DeepSeek-V4
// `{w1,w2,w3}.{weight,scale}` -> ds_fp4. The tensor layout is in st_layout.cpp, the planner in
// st_planner.cpp and st_experts.cpp. GGUF files go through gguf_loader.cpp.
#include "ft/loader.hpp"

#include <sys/stat.h>
#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ft/common.hpp"
#include "ft/gguf.hpp"
#include "ft/safetensors.hpp"
#include "st_plan.hpp"

namespace ft {

namespace {

bool is_regular(const std::string &p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The .gguf file `path` names (a file, or a directory without config.json holding one file or
// the parts of one split set), or "" for a Hugging Face checkpoint directory.
std::string gguf_path(const std::string &path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) fail(FT_ERR_IO, path, ": ", std::strerror(errno));
    if (is_regular(path)) {
        if (ends_with(path, ".gguf")) return path;
        fail(FT_ERR_IO, path, ": not a checkpoint directory or .gguf file");
    }
    if (is_regular(path + "/config.json")) return "";
    std::vector<std::string> found;
    if (DIR *d = ::opendir(path.c_str())) {
        while (const dirent *e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (ends_with(n, ".gguf")) found.push_back(n);
        }
        ::closedir(d);
    }
    if (found.empty()) return "";  // the Hugging Face path reports what is missing
    return gguf_directory_model(path, found);  // one file, or the first part of one split set
}

}  // namespace

std::unique_ptr<Model> load_checkpoint(const std::string &path, const LoadOptions &opts) {
    const std::string gguf = gguf_path(path);
    if (!gguf.empty()) return load::load_gguf(gguf, opts);

    const std::string &dir = path;
    ModelSpec spec = read_model_config(dir);
    SafetensorsCheckpoint ckpt(dir);
    const std::string prefix = load::find_layer_prefix(ckpt, spec);
    spec.format = load::detect_format(ckpt, spec, prefix);
    spec.expert_biases = spec.format == Format::bf16 && load::gpt_oss_bf16(ckpt, spec, prefix);
    const std::string gerr = format_geometry_error(spec.format, spec.hidden, spec.intermediate);
    if (!gerr.empty()) {
        const std::string lp = prefix + std::to_string(spec.moe_layers[0]) + ".";
        const load::Block b = load::find_block(ckpt, spec, lp);
        const std::string first = lp + b.name + "experts." +
                                  (spec.format == Format::mxfp4 ? std::string("gate_up_proj_blocks")
                                                                : std::string("0.") + b.proj[0] + ".weight");
        fail(FT_ERR_FORMAT, dir, ": tensor '", first, "': ", gerr, " (partial blocks are not supported)");
    }
    auto model = std::make_unique<Model>(std::move(spec));

    load::Planner planner(ckpt, *model, prefix);
    planner.plan();
    if (opts.on_model_allocated) opts.on_model_allocated(*model);
    std::vector<load::Piece> &pieces = planner.pieces();

    const int threads = load::reader_threads(opts, pieces.size());
    log(FT_LOG_INFO, "loading ", dir, ": ", model->spec().num_layers, " MoE layers of ",
        format_name(model->spec().format), " experts, ", pieces.size(), " pieces, ", threads, " readers");
    load::execute(pieces, planner.layer_bytes(), threads, opts);
    return model;
}

}  // namespace ft
