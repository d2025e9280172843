// libFuzzer target: the bandwidth profile JSON through ft_profile_load and its getters.
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string path = ftfuzz::fresh_dir("profile") + "/benchbw.json";
    ftfuzz::write_file(path, std::string(reinterpret_cast<const char *>(data), size));
    ft_profile *p = nullptr;
    char err[512] = "";
    const ft_status s = ft_profile_load(path.c_str(), &p, err, sizeof err);
    ftfuzz::check_status(s, err);
    if (s != FT_OK) {
        if (p) std::abort();
        return 0;
    }
    ft_profile_machine mach;
    mach.struct_size = sizeof mach;
    if (ft_profile_get_machine(p, &mach) == FT_OK && (!mach.gpu_name || !mach.cpu_model)) std::abort();
    for (int32_t f = 0; f <= FT_FORMAT_IQ4_XS + 1; ++f) {
        ft_profile_format pf;
        pf.struct_size = sizeof pf;
        if (ft_profile_get_format(p, f, &pf) == FT_OK && !pf.cpu_kernel) std::abort();
    }
    ft_profile_free(p);
    return 0;
}
