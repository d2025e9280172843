// SafetensorsFile and SafetensorsCheckpoint on well-formed and hostile files.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ft/safetensors.hpp"
#include "ft/synth.hpp"
#include "scratch_files.hpp"

namespace ft {
namespace {

using synth::RawTensor;
using test::expect_error;
using test::ScratchDir;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (uint8_t &b : v) b = static_cast<uint8_t>(rng() | 1u);  // never zero
    return v;
}

TEST(Safetensors, ReadsWellFormedFile) {
    ScratchDir dir;
    const auto a = random_bytes(3 * 5 * 2, 1), b = random_bytes(7 * 4, 2), c = random_bytes(6, 3);
    synth::write_safetensors(dir / "x.safetensors", {{"a.weight", "BF16", {3, 5}, a},
                                                     {"b", "F32", {7}, b},
                                                     {"empty", "F16", {0, 4}, {}},
                                                     {"c", "U8", {2, 3}, c}});
    SafetensorsFile f(dir / "x.safetensors");
    EXPECT_EQ(f.path(), dir / "x.safetensors");
    ASSERT_EQ(f.names().size(), 4u);
    const TensorInfo *ta = f.find("a.weight");
    ASSERT_NE(ta, nullptr);
    EXPECT_EQ(ta->dtype, StDtype::BF16);
    EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(ta->numel, 15u);
    EXPECT_EQ(ta->nbytes(), a.size());
    EXPECT_EQ(std::memcmp(f.data(*ta), a.data(), a.size()), 0);
    const TensorInfo *tb = f.find("b");
    ASSERT_NE(tb, nullptr);
    EXPECT_EQ(tb->dtype, StDtype::F32);
    EXPECT_EQ(tb->file_offset, ta->file_offset + a.size());
    EXPECT_EQ(std::memcmp(f.data(*tb), b.data(), b.size()), 0);
    const TensorInfo *tc = f.find("c");
    ASSERT_NE(tc, nullptr);
    EXPECT_EQ(std::memcmp(f.data(*tc), c.data(), c.size()), 0);
    const TensorInfo *te = f.find("empty");
    ASSERT_NE(te, nullptr);
    EXPECT_EQ(te->numel, 0u);
    EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, MetadataAndAllDtypes) {
    ScratchDir dir;
    std::vector<RawTensor> ts;
    const char *names[] = {"BF16", "F16", "F32", "F64", "I8", "U8", "I16", "I32", "I64", "F8_E4M3", "F8_E5M2", "BOOL"};
    const size_t sizes[] = {2, 2, 4, 8, 1, 1, 2, 4, 8, 1, 1, 1};
    for (int i = 0; i < 12; ++i) ts.push_back({std::string("t") + names[i], names[i], {3}, random_bytes(3 * sizes[i], i)});
    synth::write_safetensors(dir / "x.safetensors", ts);
    SafetensorsFile f(dir / "x.safetensors");
    for (int i = 0; i < 12; ++i) {
        const TensorInfo *t = f.find(std::string("t") + names[i]);
        ASSERT_NE(t, nullptr) << names[i];
        EXPECT_STREQ(st_dtype_name(t->dtype), names[i]);
        EXPECT_EQ(st_dtype_size(t->dtype), sizes[i]);
    }
    synth::write_raw_header(dir / "m.safetensors",
                            R"({"__metadata__":{"format":"pt","n":"1"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                            {7, 9});
    SafetensorsFile m(dir / "m.safetensors");
    EXPECT_EQ(m.metadata().at("format"), "pt");
    EXPECT_EQ(m.names(), std::vector<std::string>{"w"});
    EXPECT_EQ(m.data(*m.find("w"))[1], 9);
}

struct HostileCase {
    const char *what;
    std::string header;
    size_t data_bytes;
    ft_status status;
    std::vector<std::string> parts;
};

TEST(Safetensors, RejectsHostileHeaders) {
    const std::vector<HostileCase> cases = {
        {"not JSON", "{\"a\": {", 0, FT_ERR_FORMAT, {"not valid JSON"}},
        {"not an object", "[1, 2, 3]", 0, FT_ERR_FORMAT, {"not a JSON object"}},
        {"entry not an object", R"({"a": 5})", 0, FT_ERR_FORMAT, {"'a'", "not a JSON object"}},
        {"missing dtype", R"({"a":{"shape":[1],"data_offsets":[0,2]}})", 2, FT_ERR_FORMAT, {"'a'", "dtype"}},
        {"unknown dtype", R"({"w1":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,2]}})", 2, FT_ERR_FORMAT,
         {"'w1'", "unknown dtype 'Q4_K'"}},
        {"offsets past data", R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 8, FT_ERR_FORMAT,
         {"'a'", "past"}},
        {"end before begin", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[6,2]}})", 8, FT_ERR_FORMAT,
         {"'a'", "before begin"}},
        {"span mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16, FT_ERR_FORMAT,
         {"'a'", "span 8 bytes", "needs 12"}},
        {"overlap", R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
         16, FT_ERR_FORMAT, {"'b'", "overlap", "'a'"}},
        {"overlap inside", R"({"a":{"dtype":"U8","shape":[12],"data_offsets":[0,12]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"c":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}})",
         16, FT_ERR_FORMAT, {"overlap", "'a'"}},
        {"negative dim", R"({"a":{"dtype":"U8","shape":[-2, 4],"data_offsets":[0,8]}})", 8, FT_ERR_FORMAT,
         {"'a'", "negative"}},
        {"fractional dim", R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 8, FT_ERR_FORMAT,
         {"'a'", "not an integer"}},
        {"overflowing shape", R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8,
         FT_ERR_FORMAT, {"'a'", "overflow"}},
        {"overflowing bytes", R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
         FT_ERR_FORMAT, {"'a'", "overflow"}},
        {"huge dim beyond u64", R"({"a":{"dtype":"U8","shape":[1e30],"data_offsets":[0,8]}})", 8, FT_ERR_FORMAT,
         {"'a'", "not an integer"}},
        {"offsets wrong arity", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", 8, FT_ERR_FORMAT,
         {"'a'", "data_offsets"}},
        {"negative offset", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", 8, FT_ERR_FORMAT,
         {"'a'", "data_offsets"}},
        {"shape not array", R"({"a":{"dtype":"U8","shape":"2","data_offsets":[0,2]}})", 8, FT_ERR_FORMAT,
         {"'a'", "shape"}},
        {"metadata not object", R"({"__metadata__":[1]})", 0, FT_ERR_FORMAT, {"__metadata__"}},
    };
    ScratchDir dir;
    for (const HostileCase &c : cases) {
        SCOPED_TRACE(c.what);
        const std::string path = dir / "bad.safetensors";
        synth::write_raw_header(path, c.header, std::vector<uint8_t>(c.data_bytes, 0x5a));
        try {
            SafetensorsFile f(path);
            ADD_FAILURE() << "accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.status(), c.status) << e.what();
            EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
            for (const std::string &p : c.parts)
                EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
        }
    }
}

TEST(Safetensors, RejectsShortAndTruncatedFiles) {
    ScratchDir dir;
    test::write_file(dir / "short.safetensors", "abcde");
    expect_error([&] { SafetensorsFile f(dir / "short.safetensors"); }, FT_ERR_FORMAT, {"short.safetensors", "too short"});
    test::write_file(dir / "zero.safetensors", "");
    expect_error([&] { SafetensorsFile f(dir / "zero.safetensors"); }, FT_ERR_FORMAT, {"too short"});

    const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
    synth::write_raw_header(dir / "len.safetensors", header, {1, 2, 3, 4}, header.size() + 100);
    expect_error([&] { SafetensorsFile f(dir / "len.safetensors"); }, FT_ERR_FORMAT, {"header length", "past the end"});
    synth::write_raw_header(dir / "huge.safetensors", header, {1, 2, 3, 4}, int64_t(1) << 40);
    expect_error([&] { SafetensorsFile f(dir / "huge.safetensors"); }, FT_ERR_FORMAT, {"header length"});
    // Claims one more data byte than the file holds.
    synth::write_raw_header(dir / "trunc.safetensors", R"({"a":{"dtype":"U8","shape":[5],"data_offsets":[0,5]}})",
                            {1, 2, 3, 4});
    expect_error([&] { SafetensorsFile f(dir / "trunc.safetensors"); }, FT_ERR_FORMAT, {"'a'", "truncated"});

    expect_error([&] { SafetensorsFile f(dir / "nope.safetensors"); }, FT_ERR_IO, {"nope.safetensors", "cannot open"});
}

// ---- checkpoint directories ------------------------------------------------------------------

void write_two_shards(const ScratchDir &dir) {
    synth::write_safetensors(dir / "s1.safetensors", {{"a", "U8", {3}, {1, 2, 3}}, {"b", "U8", {1}, {4}}});
    synth::write_safetensors(dir / "s2.safetensors", {{"c", "U8", {2}, {5, 6}}});
}

TEST(SafetensorsCheckpoint, IndexSingleFileAndScan) {
    {
        ScratchDir dir;
        write_two_shards(dir);
        test::write_file(dir / "model.safetensors.index.json",
                         R"({"metadata":{},"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})");
        SafetensorsCheckpoint ck(dir.path());
        EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "c"}));  // the index decides
        ASSERT_NE(ck.find("c"), nullptr);
        EXPECT_EQ(ck.find("c")->file->data(*ck.find("c")->info)[1], 6);
        EXPECT_EQ(ck.find("b"), nullptr);
        EXPECT_EQ(ck.num_files(), 2u);
    }
    {
        ScratchDir dir;
        write_two_shards(dir);
        SafetensorsCheckpoint ck(dir.path());  // no index: both files scanned
        EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
        EXPECT_EQ(ck.find("b")->file->data(*ck.find("b")->info)[0], 4);
    }
    {
        ScratchDir dir;
        synth::write_safetensors(dir / "model.safetensors", {{"z", "U8", {2}, {8, 9}}});
        synth::write_safetensors(dir / "other.safetensors", {{"y", "U8", {1}, {1}}});
        SafetensorsCheckpoint ck(dir.path());  // model.safetensors alone wins
        EXPECT_EQ(ck.names(), std::vector<std::string>{"z"});
    }
}

TEST(SafetensorsCheckpoint, RejectsBadIndexesAndDirectories) {
    ScratchDir dir;
    write_two_shards(dir);
    const std::string index = dir / "model.safetensors.index.json";

    test::write_file(index, R"({"weight_map":{"a":"../s1.safetensors"}})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"'a'", "../s1.safetensors", "plain file name"});
    test::write_file(index, R"({"weight_map":{"a":"/etc/passwd"}})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"plain file name"});
    test::write_file(index, R"({"weight_map":{"a":".."}})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"plain file name"});
    test::write_file(index, R"({"weight_map":{"a":"s1.safetensors","c":"s9.safetensors"}})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_IO, {"s9.safetensors", "missing"});
    test::write_file(index, R"({"weight_map":{"c":"s1.safetensors"}})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"'c'", "s1.safetensors", "does not contain"});
    test::write_file(index, R"({"weight_map":{"a":3}})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"'a'"});
    test::write_file(index, R"({"weight_map":[]})");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"weight_map"});
    test::write_file(index, R"({"weight_map":)");
    expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, FT_ERR_FORMAT, {"index.json", "not valid JSON"});

    ScratchDir empty;
    expect_error([&] { SafetensorsCheckpoint ck(empty.path()); }, FT_ERR_IO, {"no model.safetensors"});
    expect_error([&] { SafetensorsCheckpoint ck(empty / "absent"); }, FT_ERR_IO, {"absent"});

    // Without an index, a tensor in two files is ambiguous.
    ScratchDir dup;
    synth::write_safetensors(dup / "a.safetensors", {{"t", "U8", {1}, {1}}});
    synth::write_safetensors(dup / "b.safetensors", {{"t", "U8", {1}, {2}}});
    expect_error([&] { SafetensorsCheckpoint ck(dup.path()); }, FT_ERR_FORMAT, {"'t'", "a.safetensors", "b.safetensors"});
}

}  // namespace
}  // namespace ft
