// Hostile files against the limits of docs/limits.md: each of them must be rejected quickly
// (within a second of the process's CPU time, ten under sanitizers, and ten times that in wall
// time) with FT_ERR_FORMAT naming the field, never by reading, allocating or looping in
// proportion to what the file merely declares. CPU time, because a loaded machine (CI building
// beside the tests) stretches the wall time of the 24 MB index below past a second.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ft/gguf.hpp"
#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using test::ScratchDir;
using test::write_file;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSeconds = 10.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr double kSeconds = 10.0;
#else
constexpr double kSeconds = 1.0;
#endif
#else
constexpr double kSeconds = 1.0;
#endif

// load_checkpoint(path) must fail with `status` and a message holding each of `parts`, within
// kSeconds of CPU time (all threads) and 10 kSeconds of wall time.
void expect_quick_rejection(const std::string &path, ft_status status, std::initializer_list<std::string> parts) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    test::expect_error([&] { load_checkpoint(path); }, status, parts);
    const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(cpu, kSeconds) << path << " (CPU seconds)";
    EXPECT_LT(wall, 10 * kSeconds) << path << " (wall seconds)";
}

const char *kMixtralConfig =
    R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 1, "num_experts_per_tok": 1,
        "num_local_experts": 2, "intermediate_size": 32})";

std::string le64(uint64_t v) {
    std::string s(8, '\0');
    std::memcpy(s.data(), &v, 8);
    return s;
}

// A sparse file of `bytes` (no data written); false where the file system cannot hold it.
bool sparse_file(const std::string &path, uint64_t bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return false;
    const bool ok = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0;
    ::close(fd);
    return ok;
}

TEST(FileLimits, TerabyteSparseShard) {
    ScratchDir dir;
    write_file(dir / "config.json", kMixtralConfig);
    if (!sparse_file(dir / "model.safetensors", 1ull << 40)) GTEST_SKIP() << "no 1 TB sparse file here";
    // All zeros: header length 0, which is no JSON object.
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"model.safetensors", "header"});
}

TEST(FileLimits, TerabyteSparseConfig) {
    ScratchDir dir;
    if (!sparse_file(dir / "config.json", 1ull << 40)) GTEST_SKIP() << "no 1 TB sparse file here";
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"config.json", "file size", "limit"});
}

TEST(FileLimits, TerabyteSparseGguf) {
    ScratchDir dir;
    if (!sparse_file(dir / "m.gguf", 1ull << 40)) GTEST_SKIP() << "no 1 TB sparse file here";
    expect_quick_rejection(dir / "m.gguf", FT_ERR_FORMAT, {"m.gguf", "magic"});
}

TEST(FileLimits, HeaderLengthTwoToThe63) {
    ScratchDir dir;
    write_file(dir / "config.json", kMixtralConfig);
    write_file(dir / "model.safetensors", le64(1ull << 63) + "{}");
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"header length 9223372036854775808"});
}

TEST(FileLimits, DataOffsetsPastEndOfFile) {
    ScratchDir dir;
    write_file(dir / "config.json", kMixtralConfig);
    const std::string header =
        R"({"model.layers.0.block_sparse_moe.gate.weight": {"dtype": "BF16", "shape": [2, 64], "data_offsets": [0, 1099511627776]}})";
    write_file(dir / "model.safetensors", le64(header.size()) + header + std::string(256, '\0'));
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"model.layers.0.block_sparse_moe.gate.weight", "data_offsets"});
}

TEST(FileLimits, IndexNamingAMillionShards) {
    ScratchDir dir;
    write_file(dir / "config.json", kMixtralConfig);
    std::string index = R"({"weight_map": {)";
    index.reserve(24u << 20);
    for (int i = 0; i < 1000000; ++i) {
        const std::string n = std::to_string(i);
        index += (i ? ",\"" : "\"") + n + "\":\"" + n + ".safetensors\"";
    }
    index += "}}";
    write_file(dir / "model.safetensors.index.json", index);
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"model.safetensors.index.json", "weight_map", "65536"});
}

TEST(FileLimits, GgufDeclaringTwoToThe40Tensors) {
    ScratchDir dir;
    std::string f = "GGUF";
    f += std::string("\x03\0\0\0", 4) + le64(1ull << 40) + le64(0) + std::string(64, '\0');
    write_file(dir / "m.gguf", f);
    expect_quick_rejection(dir / "m.gguf", FT_ERR_FORMAT, {"tensor count 1099511627776"});
}

// ---- the reproducers of the issue that filed these limits ------------------------------------

TEST(FileLimits, GgufBlockCountBeyondTheLimit) {
    ScratchDir dir;
    synth::Spec s;
    s.gguf = true;
    s.format = "q4_0";
    s.hidden = 64;
    s.intermediate = 32;
    s.num_experts = 4;
    s.num_layers = 2;
    synth::write_gguf(dir / "m.gguf", s);
    // Rewrite the file with block_count 67,109,120 and 2^31 - 1, keeping everything else.
    for (uint32_t declared : {67109120u, 2147483647u}) {
        GgufFile g(dir / "m.gguf");
        const GgufValue *v = g.find("qwen3moe.block_count");
        ASSERT_NE(v, nullptr);
        std::string bytes = test::read_file(dir / "m.gguf");
        // The value follows the key; find the key's bytes and the u32 type tag after them.
        const std::string key = "qwen3moe.block_count";
        const size_t at = bytes.find(key);
        ASSERT_NE(at, std::string::npos);
        uint32_t type;
        std::memcpy(&type, bytes.data() + at + key.size(), 4);
        ASSERT_EQ(type, 4u) << "block_count written as uint32";
        std::memcpy(bytes.data() + at + key.size() + 4, &declared, 4);
        write_file(dir / "big.gguf", bytes);
        expect_quick_rejection(dir / "big.gguf", FT_ERR_FORMAT, {"block_count", "4096"});
    }
}

TEST(FileLimits, ConfigWithAHugeLayerCount) {
    ScratchDir dir;
    write_file(dir / "config.json",
               R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2147483647,
                   "num_experts_per_tok": 2, "num_local_experts": 8, "intermediate_size": 32})");
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"num_hidden_layers", "2147483647", "4096"});
}

TEST(FileLimits, SharedExpertWidthOverflow) {
    ScratchDir dir;
    write_file(dir / "config.json",
               R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_experts_per_tok": 2,
                   "n_routed_experts": 8, "moe_intermediate_size": 65536, "n_shared_experts": 65536,
                   "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1})");
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"n_shared_experts"});
}

TEST(FileLimits, DeeplyNestedJson) {
    ScratchDir dir;
    write_file(dir / "config.json",
               "{\"model_type\": \"mixtral\", \"hidden_size\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
    expect_quick_rejection(dir.path(), FT_ERR_FORMAT, {"config.json", "nested deeper than 64"});
}

}  // namespace
}  // namespace ft
