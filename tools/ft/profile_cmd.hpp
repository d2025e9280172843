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

// One line saying which saved profile applies to an engine on `device_name` ("" without a GPU)
// serving experts in `format` (FT_FORMAT_*), or that none does.
void print_profile_line(const char *device_name, int32_t format);

}  // namespace ft::tool
