// Whole checkpoints that are broken in one way each: the load must fail with the right status and
// a message naming the file or tensor, never crash or misread.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include "ft/loader.hpp"
#include "ft/safetensors.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using synth::RawTensor;
using synth::Spec;
using test::expect_error;
using test::ScratchDir;

// Rewrites dir/model.safetensors after `edit` has changed its tensor list.
void rewrite(const ScratchDir &dir, const std::function<void(std::vector<RawTensor> &)> &edit) {
    std::vector<RawTensor> ts;
    {
        SafetensorsFile f(dir / "model.safetensors");
        for (const std::string &n : f.names()) {
            const TensorInfo *t = f.find(n);
            ts.push_back({n, st_dtype_name(t->dtype), t->shape,
                          std::vector<uint8_t>(f.data(*t), f.data(*t) + t->nbytes())});
        }
    }
    edit(ts);
    synth::write_safetensors(dir / "model.safetensors", ts);
}

RawTensor &tensor(std::vector<RawTensor> &ts, const std::string &name) {
    for (RawTensor &t : ts)
        if (t.name == name) return t;
    throw std::runtime_error("test bug: no tensor " + name);
}

Spec small(const char *arch = "qwen3_moe") {
    Spec s;
    s.architecture = arch;
    s.seed = 77;
    if (std::string(arch) == "deepseek_v3") s.shared_intermediate = s.intermediate;
    return s;
}

TEST(HostileCheckpoint, MissingExpertTensor) {
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), small());
    rewrite(dir, [](std::vector<RawTensor> &ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(),
                              [](const RawTensor &t) { return t.name == "model.layers.1.mlp.experts.3.up_proj.weight"; }));
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"missing tensor 'model.layers.1.mlp.experts.3.up_proj.weight'"});
}

TEST(HostileCheckpoint, FewerExpertsThanConfigSays) {
    ScratchDir dir;
    Spec s = small();
    synth::write_checkpoint(dir.path(), s);
    std::string cfg = test::read_file(dir / "config.json");
    const std::string from = "\"num_experts\": 8", to = "\"num_experts\": 9";
    ASSERT_NE(cfg.find(from), std::string::npos);
    cfg.replace(cfg.find(from), from.size(), to);
    test::write_file(dir / "config.json", cfg);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"experts.8."});
}

TEST(HostileCheckpoint, WrongExpertShape) {
    ScratchDir dir;
    Spec s = small();
    synth::write_checkpoint(dir.path(), s);
    rewrite(dir, [&](std::vector<RawTensor> &ts) {
        tensor(ts, "model.layers.0.mlp.experts.5.down_proj.weight").shape = {s.intermediate, s.hidden};
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.5.down_proj.weight", "expected shape [64, 24]", "got [24, 64]"});
}

TEST(HostileCheckpoint, UnsupportedExpertDtype) {
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), small());
    rewrite(dir, [](std::vector<RawTensor> &ts) { tensor(ts, "model.layers.1.mlp.experts.2.gate_proj.weight").dtype = "I16"; });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_UNSUPPORTED,
                 {"model.layers.1.mlp.experts.2.gate_proj.weight", "I16"});
}

TEST(HostileCheckpoint, SquareFusedLayoutFollowsTheArchitecture) {
    // [E, 2I, H] == [E, H, 2I]: Qwen3-MoE's transformers layout is [E, 2I, H], and that reading
    // must give the values written.
    ScratchDir dir;
    Spec s = small();
    s.layout = Spec::Layout::fused;
    s.hidden = 64;
    s.intermediate = 32;
    synth::write_checkpoint(dir.path(), s);
    const auto m = load_checkpoint(dir.path());
    for (int e = 0; e < s.num_experts; ++e) {
        const std::vector<uint16_t> gate = synth::expert_weight(s, 0, e, FT_PROJ_GATE);
        const std::vector<uint16_t> down = synth::expert_weight(s, 0, e, FT_PROJ_DOWN);
        ASSERT_EQ(std::memcmp(m->gate(0, e), gate.data(), gate.size() * 2), 0) << "expert " << e;
        ASSERT_EQ(std::memcmp(m->down(0, e), down.data(), down.size() * 2), 0) << "expert " << e;
    }
}

TEST(HostileCheckpoint, InconsistentFusedLayout) {
    ScratchDir dir;
    Spec s = small();
    s.layout = Spec::Layout::fused;
    synth::write_checkpoint(dir.path(), s);
    // down_proj claims the transposed orientation while gate_up_proj is the plain one.
    rewrite(dir, [&](std::vector<RawTensor> &ts) {
        tensor(ts, "model.layers.1.mlp.experts.down_proj").shape = {s.num_experts, s.intermediate, s.hidden};
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"model.layers.1.mlp.experts.down_proj", "inconsistent"});

    synth::write_checkpoint(dir.path(), s);
    rewrite(dir, [&](std::vector<RawTensor> &ts) {
        tensor(ts, "model.layers.0.mlp.experts.gate_up_proj").shape = {s.num_experts, s.intermediate, 2 * s.hidden};
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.0.mlp.experts.gate_up_proj", "expected shape"});

    synth::write_checkpoint(dir.path(), s);
    rewrite(dir, [&](std::vector<RawTensor> &ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(),
                              [](const RawTensor &t) { return t.name == "model.layers.1.mlp.experts.down_proj"; }));
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"missing tensor 'model.layers.1.mlp.experts.down_proj'"});
}

TEST(HostileCheckpoint, FusedAndPerExpertInOneLayer) {
    ScratchDir dir;
    Spec s = small();
    synth::write_checkpoint(dir.path(), s);
    rewrite(dir, [&](std::vector<RawTensor> &ts) {
        ts.push_back({"model.layers.0.mlp.experts.gate_up_proj", "BF16", {1, 2}, {1, 2, 3, 4}});
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"layer 0", "both fused"});
}

TEST(HostileCheckpoint, MissingRouterAndCorrectionBias) {
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), small("deepseek_v3"));
    rewrite(dir, [](std::vector<RawTensor> &ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(), [](const RawTensor &t) {
            return t.name == "model.layers.1.mlp.gate.e_score_correction_bias";
        }));
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT,
                 {"model.layers.1.mlp.gate.e_score_correction_bias", "correction bias"});

    synth::write_checkpoint(dir.path(), small("deepseek_v3"));
    rewrite(dir, [](std::vector<RawTensor> &ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(),
                              [](const RawTensor &t) { return t.name == "model.layers.0.mlp.shared_experts.up_proj.weight"; }));
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"model.layers.0.mlp.shared_experts.up_proj.weight"});

    synth::write_checkpoint(dir.path(), small());
    rewrite(dir, [](std::vector<RawTensor> &ts) {
        ts.erase(std::find_if(ts.begin(), ts.end(), [](const RawTensor &t) { return t.name == "model.layers.0.mlp.gate.weight"; }));
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"model.layers.0.mlp.gate.weight", "router"});
}

TEST(HostileCheckpoint, NoDecoderLayers) {
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), small());
    rewrite(dir, [](std::vector<RawTensor> &ts) {
        for (RawTensor &t : ts) t.name = "backbone." + t.name;
    });
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"no decoder layer"});
}

class ShardedCheckpoint : public ::testing::Test {
protected:
    void SetUp() override {
        Spec s = small();
        s.num_layers = 3;
        s.shards = 3;
        synth::write_checkpoint(dir.path(), s);
    }
    std::string shard(int i) const { return dir / ("model-0000" + std::to_string(i) + "-of-00003.safetensors"); }
    ScratchDir dir;
};

TEST_F(ShardedCheckpoint, TruncatedShard) {
    const auto size = std::filesystem::file_size(shard(2));
    std::filesystem::resize_file(shard(2), size - 100);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"model-00002-of-00003.safetensors", "truncated"});
    std::filesystem::resize_file(shard(2), 6);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"model-00002-of-00003.safetensors", "too short"});
}

TEST_F(ShardedCheckpoint, MissingShardFile) {
    std::filesystem::remove(shard(3));
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_IO, {"model-00003-of-00003.safetensors", "missing"});
}

TEST_F(ShardedCheckpoint, IndexEscapingTheDirectory) {
    std::string index = test::read_file(dir / "model.safetensors.index.json");
    const std::string from = "\"model-00002-of-00003.safetensors\"";
    const size_t at = index.find(from);
    ASSERT_NE(at, std::string::npos);
    index.replace(at, from.size(), "\"../x\"");
    test::write_file(dir / "model.safetensors.index.json", index);
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"'../x'", "plain file name"});
}

TEST_F(ShardedCheckpoint, CorruptHeaderInOneShard) {
    // Overwrite the first header bytes of shard 1 (the JSON opening) with garbage.
    {
        FILE *f = std::fopen(shard(1).c_str(), "r+b");
        ASSERT_NE(f, nullptr);
        std::fseek(f, 8, SEEK_SET);
        std::fputs("#!", f);
        std::fclose(f);
    }
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"model-00001-of-00003.safetensors", "not valid JSON"});
}

TEST(HostileCheckpoint, ConfigProblemsSurfaceThroughLoad) {
    ScratchDir dir;
    synth::write_checkpoint(dir.path(), small());
    test::write_file(dir / "config.json", "{\"model_type\": \"qwen3_moe\"");
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_FORMAT, {"config.json"});
    test::write_file(dir / "config.json", R"({"model_type": "gpt_neox"})");
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_UNSUPPORTED, {"gpt_neox"});
    std::filesystem::remove(dir / "config.json");
    expect_error([&] { load_checkpoint(dir.path()); }, FT_ERR_IO, {"config.json"});
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// Random damage anywhere in a shard's length prefix and JSON header, and random truncations:
// every load either succeeds with a consistent model or fails with a loader status; none crashes,
// hangs or reports an internal error. (Run under ASan/UBSan in a sanitizer build to catch reads
// past the mapping that happen not to fault.)
TEST(HostileCheckpoint, RandomHeaderDamageNeverCrashes) {
    ScratchDir pristine;
    Spec s = small();
    s.num_layers = 1;
    synth::write_checkpoint(pristine.path(), s);
    std::vector<uint8_t> bytes;
    {
        std::ifstream in(pristine / "model.safetensors", std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    ASSERT_GT(bytes.size(), 16u);
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    const size_t header_end = std::min<size_t>(bytes.size(), 8 + header_len);

    ScratchDir dir;
    std::filesystem::copy_file(pristine / "config.json", dir / "config.json");
    std::mt19937_64 rng(20261130);
    int rejected = 0, truncated = 0, truncated_rejected = 0;
    for (int trial = 0; trial < 300; ++trial) {
        std::vector<uint8_t> damaged = bytes;
        const int kind = int(rng() % 3);
        if (kind == 0) {  // a few random bytes in the prefix or header
            for (int i = 0, n = 1 + int(rng() % 4); i < n; ++i) damaged[rng() % header_end] = uint8_t(rng());
        } else if (kind == 1) {  // a digit of the header changed to another digit (offsets, shapes)
            std::vector<size_t> digits;
            for (size_t i = 8; i < header_end; ++i)
                if (damaged[i] >= '0' && damaged[i] <= '9') digits.push_back(i);
            if (!digits.empty()) damaged[digits[rng() % digits.size()]] = uint8_t('0' + rng() % 10);
        } else {  // truncated anywhere: tensor bytes go missing, so the file must be refused
            damaged.resize(rng() % damaged.size());
            ++truncated;
        }
        {
            std::ofstream out(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
            out.write(reinterpret_cast<const char *>(damaged.data()), std::streamsize(damaged.size()));
        }
        try {
            std::unique_ptr<Model> m = load_checkpoint(dir.path());
            ASSERT_EQ(m->spec().num_layers, 1);  // a change the format cannot see (e.g. in a value)
            EXPECT_NE(kind, 2) << "trial " << trial << ": a file truncated to " << damaged.size() << " of "
                               << bytes.size() << " bytes loaded";
        } catch (const Error &e) {
            EXPECT_TRUE(e.status() == FT_ERR_FORMAT || e.status() == FT_ERR_IO || e.status() == FT_ERR_UNSUPPORTED)
                << "trial " << trial << ": status " << e.status() << ": " << e.what();
            ++rejected;
            truncated_rejected += kind == 2;
        }
    }
    EXPECT_GT(rejected, 150) << "the damage should mostly be detected";
    EXPECT_GT(truncated, 50);
    EXPECT_EQ(truncated_rejected, truncated);
}

}  // namespace
}  // namespace ft
