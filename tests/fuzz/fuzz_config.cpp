// libFuzzer target: config.json alone through ft_model_load (the directory has no weights, so
// a config that parses ends in FT_ERR_IO or FT_ERR_FORMAT for the missing safetensors files).
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_engine *e = ftfuzz::engine();
    const std::string dir = ftfuzz::fresh_dir("cfg");
    ftfuzz::write_file(dir + "/config.json", std::string(reinterpret_cast<const char *>(data), size));
    ft_model *m = nullptr;
    char err[512] = "";
    const ft_status s = ft_model_load(e, dir.c_str(), nullptr, &m, err, sizeof err);
    ftfuzz::check_status(s, err);
    if (s == FT_OK || m) std::abort();  // nothing to load
    return 0;
}
