// `ft profile` and the profile line of `ft run`.
#pragma once

#include <cstdint>
#include <string>

namespace ft::tool {

struct ProfileOptions {
    std::string formats;  // comma list; empty: every format
    int threads = 0;
    bool no_gpu = false;
    double seconds = 30.0;
    bool json = false;
    std::string out, plot;
};

int cmd_profile(const ProfileOptions &o);

// Whether the saved profile applies to an engine on `device_name` ("" without a GPU) serving
// experts in `format` (FT_FORMAT_*), and its figures for that format when it does.
struct ProfileStatus {
    std::string path;
    std::string state;   // none | unusable | other_gpu | no_figures | applies
    std::string detail;  // unusable: the error; other_gpu: which GPUs differ
    double cpu_gbs = 0;  // applies: the CPU kernel's GB/s (0: not measured)
    double fetch_fraction = -1;  // applies: hybrid fetch fraction (-1: none)
};
ProfileStatus profile_status(const char *device_name, int32_t format);

// The status as the text after `ft run`'s "profile" label.
std::string profile_text(const ProfileStatus &p, int32_t format);

}  // namespace ft::tool
