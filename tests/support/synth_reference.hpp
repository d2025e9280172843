// Synthetic checkpoints for the end-to-end tests: writing one in its format's real layout, and
// the fp64-reference view of one MoE layer's experts (ft::synth's exact dequantised values).
#pragma once

#include <string>
#include <vector>

#include "freetoken.h"
#include "ft/synth.hpp"
#include "moe_reference.hpp"

namespace ft::test {

// Writes `s` into `dir` (a GGUF file when s.gguf, else a Hugging Face checkpoint) and returns the
// path ft_model_load takes.
inline std::string write_synth_model(const std::string &dir, const ft::synth::Spec &s) {
    std::string path = dir;
    if (s.gguf) {
        path += "/model.gguf";
        ft::synth::write_gguf(path, s);
    } else {
        ft::synth::write_checkpoint(path, s);
    }
    return path;
}

// A small DeepSeek-V4 checkpoint whose first MoE layer routes by token id (tid2eid over
// `vocab` tokens) and which has an FP8 shared expert: 2 layers, 8 experts, top 3, H 256, I 128.
inline ft::synth::Spec dsv4_hashed_spec(int32_t vocab, uint64_t seed) {
    ft::synth::Spec s;
    s.architecture = "deepseek_v4";
    s.format = "ds_fp4";
    s.num_layers = 2;
    s.num_experts = 8;
    s.top_k = 3;
    s.hidden = 256;
    s.intermediate = 128;
    s.shared_intermediate = 256;
    s.hash_layers = 1;
    s.vocab_size = vocab;
    s.seed = seed;
    return s;
}

// The dequantised projections (and mxfp4 biases) of the experts of MoE layer `layer` of `s`.
struct SynthLayerRef {
    std::vector<std::vector<float>> gate, up, down, bias_gate, bias_up, bias_down;  // per expert

    SynthLayerRef(const ft::synth::Spec &s, int layer, int experts) {
        for (int e = 0; e < experts; ++e) {
            gate.push_back(ft::synth::expert_dequant(s, layer, e, FT_PROJ_GATE));
            up.push_back(ft::synth::expert_dequant(s, layer, e, FT_PROJ_UP));
            down.push_back(ft::synth::expert_dequant(s, layer, e, FT_PROJ_DOWN));
            bias_gate.push_back(ft::synth::expert_bias(s, layer, e, FT_PROJ_GATE));
            bias_up.push_back(ft::synth::expert_bias(s, layer, e, FT_PROJ_UP));
            bias_down.push_back(ft::synth::expert_bias(s, layer, e, FT_PROJ_DOWN));
        }
    }

    ft::test::ExpertF32 expert(int32_t e) const {
        ft::test::ExpertF32 x{gate[e].data(), up[e].data(), down[e].data()};
        if (!bias_gate[e].empty()) x.bias_gate = bias_gate[e].data(), x.bias_up = bias_up[e].data(), x.bias_down = bias_down[e].data();
        return x;
    }
};

}  // namespace ft::test
