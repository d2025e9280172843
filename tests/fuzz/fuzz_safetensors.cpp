// libFuzzer target: a Hugging Face checkpoint directory through ft_model_load. Input parts
// (fuzz_util.hpp separator): config.json, model.safetensors.index.json (empty: none), then the
// shards, written as model.safetensors when there is one and no index, else as
// model-0000i-of-0000n.safetensors. A model that loads is decoded once.
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_engine *e = ftfuzz::engine();
    std::vector<std::string> parts = ftfuzz::split_parts(data, size);
    if (parts.size() > 10) return 0;
    const std::string dir = ftfuzz::fresh_dir("st");
    ftfuzz::write_file(dir + "/config.json", parts[0]);
    const bool index = parts.size() > 1 && !parts[1].empty();
    if (index) ftfuzz::write_file(dir + "/model.safetensors.index.json", parts[1]);
    const size_t shards = parts.size() > 2 ? parts.size() - 2 : 0;
    for (size_t i = 0; i < shards; ++i) {
        char name[64];
        if (shards == 1 && !index)
            std::snprintf(name, sizeof name, "model.safetensors");
        else
            std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards);
        ftfuzz::write_file(dir + "/" + name, parts[2 + i]);
    }
    ft_model *m = nullptr;
    char err[512] = "";
    const ft_status s = ft_model_load(e, dir.c_str(), nullptr, &m, err, sizeof err);
    ftfuzz::check_status(s, err);
    if (s == FT_OK) {
        ftfuzz::decode_once(m);
        ft_model_free(m);
    } else if (m) {
        std::abort();  // *out must be NULL on failure
    }
    return 0;
}
