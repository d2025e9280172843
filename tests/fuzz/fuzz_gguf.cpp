// libFuzzer target: GGUF through ft_model_load. One part: a single .gguf file, loaded by its
// path (and decoded once if it loads). Several parts: a split model, each part written as
// model-0000i-of-0000n.gguf into one directory, loaded by the directory.
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_engine *e = ftfuzz::engine();
    const std::vector<std::string> parts = ftfuzz::split_parts(data, size);
    if (parts.size() > 8) return 0;
    const std::string dir = ftfuzz::fresh_dir("gguf");
    std::string path;
    if (parts.size() == 1) {
        path = dir + "/model.gguf";
        ftfuzz::write_file(path, parts[0]);
    } else {
        for (size_t i = 0; i < parts.size(); ++i) {
            char name[64];
            std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.gguf", i + 1, parts.size());
            ftfuzz::write_file(dir + "/" + name, parts[i]);
        }
        path = dir;
    }
    ft_model *m = nullptr;
    char err[512] = "";
    const ft_status s = ft_model_load(e, path.c_str(), nullptr, &m, err, sizeof err);
    ftfuzz::check_status(s, err);
    if (s == FT_OK) {
        ftfuzz::decode_once(m);
        ft_model_free(m);
    } else if (m) {
        std::abort();
    }
    return 0;
}
