// Writes the seed corpora of the fuzz targets: valid checkpoints from lib/core/synth (safetensors
// directories packed into one input, config.json files, GGUF files single and split), a profile
// written by lib/engine/profile, and a few API call sequences. Usage: fuzz_seeds OUT_DIR; creates
// OUT_DIR/{safetensors,config,gguf,profile,api}/.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "ft/common.hpp"
#include "ft/profile.hpp"
#include "ft/synth.hpp"
#include "fuzz_util.hpp"

namespace {

std::string read_all(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

void put(const std::string &path, const std::string &bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
    if (!out) throw std::runtime_error("cannot write " + path);
}

ft::synth::Spec tiny(const std::string &arch, const std::string &format) {
    ft::synth::Spec s;
    s.architecture = arch;
    s.format = format;
    s.num_layers = 1;
    s.num_experts = 4;
    s.top_k = 2;
    s.hidden = 64;
    s.intermediate = 32;
    return s;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
        return 2;
    }
    const std::string out = argv[1];
    try {
        for (const char *sub : {"", "/safetensors", "/config", "/gguf", "/profile", "/api", "/work"})
            if (!ft::make_dirs(out + sub)) throw std::runtime_error("cannot create " + out + sub);
        const std::string work = out + "/work";

        // Safetensors checkpoints: config.json, index (or empty), shards.
        struct St { const char *name; ft::synth::Spec spec; };
        std::vector<St> st;
        st.push_back({"qwen3_moe_bf16", tiny("qwen3_moe", "bf16")});
        {
            ft::synth::Spec s = tiny("deepseek_v3", "bf16");
            s.num_layers = 2;
            s.first_dense = 1;
            s.shards = 2;
            s.shared_intermediate = 32;
            s.n_group = 2;
            s.topk_group = 1;
            st.push_back({"deepseek_v3_sharded", s});
        }
        {
            ft::synth::Spec s = tiny("mixtral", "bf16");
            s.expert_dtype = "F16";
            st.push_back({"mixtral_f16", s});
        }
        {
            ft::synth::Spec s = tiny("qwen3_moe", "bf16");
            s.layout = ft::synth::Spec::Layout::fused;
            s.intermediate = 24;
            st.push_back({"qwen3_moe_fused", s});
        }
        st.push_back({"gpt_oss_mxfp4", tiny("gpt_oss", "mxfp4")});
        for (const St &c : st) {
            const std::string dir = work + "/" + c.name;
            ft::synth::write_checkpoint(dir, c.spec);
            std::vector<std::string> parts{read_all(dir + "/config.json")};
            if (c.spec.shards > 1) {
                parts.push_back(read_all(dir + "/model.safetensors.index.json"));
                for (int i = 0; i < c.spec.shards; ++i) {
                    char name[64];
                    std::snprintf(name, sizeof name, "/model-%05d-of-%05d.safetensors", i + 1, c.spec.shards);
                    parts.push_back(read_all(dir + name));
                }
            } else {
                parts.push_back("");
                parts.push_back(read_all(dir + "/model.safetensors"));
            }
            put(out + "/safetensors/" + c.name, ftfuzz::join_parts(parts));
            put(out + "/config/" + c.name + ".json", parts[0]);
        }
        for (const char *arch : {"qwen3_5_moe", "glm4_moe", "kimi_k2"}) {
            ft::synth::Spec s = tiny(arch, "bf16");
            s.shared_intermediate = std::string(arch) == "qwen3_5_moe" ? 16 : s.intermediate;
            const std::string dir = work + "/cfg_" + arch;
            ft::synth::write_checkpoint(dir, s);
            put(out + "/config/" + arch + ".json", read_all(dir + "/config.json"));
        }

        // GGUF: Q4_0 and BF16 experts, fused gate_up, and a split pair.
        struct Gg { const char *name; const char *format; bool fused; };
        for (const Gg &g : {Gg{"q4_0", "q4_0", false}, Gg{"bf16", "bf16", false}, Gg{"q4_0_fused", "q4_0", true}}) {
            ft::synth::Spec s = tiny("qwen3_moe", g.format);
            s.gguf = true;
            s.gguf_fused_gate_up = g.fused;
            const std::string path = work + "/" + g.name + ".gguf";
            ft::synth::write_gguf(path, s);
            put(out + "/gguf/" + g.name, read_all(path));
        }
        put(out + "/gguf/split", ftfuzz::join_parts({read_all(work + "/q4_0.gguf"), read_all(work + "/bf16.gguf")}));
        // Every other expert type (K-quants at their 256-element blocks, 2 experts), a mix per
        // matrix and layer, shared experts, and a real split set of three parts.
        auto gguf_tiny = [&](const char *format, int k) {
            ft::synth::Spec s = tiny("qwen3_moe", format);
            s.gguf = true;
            s.num_experts = 2;
            s.top_k = 1;
            if (k == 256) s.hidden = s.intermediate = 256;
            return s;
        };
        for (const char *f : {"q8_0", "mxfp4", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"}) {
            const ft::synth::Spec s = gguf_tiny(f, std::string(f) == "q8_0" || std::string(f) == "mxfp4" ? 32 : 256);
            const std::string path = work + "/" + f + ".gguf";
            ft::synth::write_gguf(path, s);
            put(out + "/gguf/" + f, read_all(path));
        }
        {
            ft::synth::Spec s = gguf_tiny("q4_k", 256);
            s.num_layers = 2;
            s.gguf_mix = {"q4_k/q6_k", "q8_0/iq4_xs"};
            ft::synth::write_gguf(work + "/mixed.gguf", s);
            put(out + "/gguf/mixed", read_all(work + "/mixed.gguf"));
            s = gguf_tiny("q4_k", 256);
            s.shared_intermediate = 256;
            s.gguf_shared_gate = true;
            ft::synth::write_gguf(work + "/shared.gguf", s);
            put(out + "/gguf/shared", read_all(work + "/shared.gguf"));
            s = gguf_tiny("q8_0", 32);
            s.gguf_splits = 3;
            ft::synth::write_gguf(work + "/set.gguf", s);
            std::vector<std::string> parts;
            for (int k = 1; k <= 3; ++k) parts.push_back(read_all(ft::synth::gguf_part_path(work + "/set.gguf", k, 3)));
            put(out + "/gguf/split3", ftfuzz::join_parts(parts));
            put(out + "/gguf/split3_first", parts[0]);
        }

        // A profile with machine figures, one dtype verdict and one workload.
        ft::Profile p;
        p.timestamp = "2026-01-01T00:00:00+00:00";
        p.epoch = 1767225600;
        p.host = "seed";
        p.gpu_index = 0;
        p.gpu_name = "Seed GPU";
        p.physical_cores = 16;
        p.threads_used = 15;
        p.cpu_stream_read_gbs = 180.5;
        p.pcie_linear_h2d_gbs = 50.25;
        p.pcie_linear_d2h_gbs = 49.0;
        p.dtypes["bf16"] = "offload";
        ft::KernelEntry k;
        k.expert_bytes = 1 << 20;
        k.synth_experts = 64;
        k.cpu_moe_gbs = 120.0;
        k.cpu_moe_isa = "avx512bf16";
        k.pcie_gather_gbs = 45.0;
        k.cpu_moe_overlap_gbs = 90.0;
        k.pcie_gather_overlap_gbs = 40.0;
        k.ratio = 2.6;
        k.recommended = "hybrid";
        p.dtype_kernels["nvfp4"] = k;
        p.dtype_kernels["q4_0"] = k;
        ft::WorkloadEntry w;
        w.name = "seed-model";
        w.hidden = 2048;
        w.inter = 768;
        w.experts = 128;
        w.top_k = 8;
        w.kernels["bf16"] = k;
        w.recommended_backend["bf16"] = "hybrid";
        p.workloads.push_back(w);
        put(out + "/profile/full.json", ft::profile_to_json(p));
        put(out + "/profile/minimal.json", "{\"version\": 4}");

        // API sequences: a few fixed byte patterns (the target reads them as choices).
        for (int i = 0; i < 4; ++i) {
            std::string b;
            for (int j = 0; j < 512; ++j) b.push_back(static_cast<char>((j * (2 * i + 3) + i * 17) & 0xff));
            put(out + "/api/seq" + std::to_string(i), b);
        }
        std::string zeros(256, '\0'), ones(256, '\x01');
        put(out + "/api/zeros", zeros);
        put(out + "/api/ones", ones);
        if (std::system(("rm -rf '" + work + "'").c_str()) != 0) return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
