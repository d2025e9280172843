// `ft profile` and the profile line of `ft run`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// One format of a model and its share of the routed-expert bytes.
struct FormatShare {
    int32_t format;  // FT_FORMAT_*
    double share;
};

// One format's figures in the saved profile.
struct ProfileFigures {
    int32_t format;
    double share;                // of the model's routed-expert bytes
    bool measured = false;       // the profile has an entry for the format
    double cpu_gbs = 0;          // the CPU kernel's GB/s (0: not measured)
    double fetch_fraction = -1;  // hybrid fetch fraction (-1: none)
};

// Whether the saved profile applies to an engine on `device_name` ("" without a GPU) serving
// experts in the formats of `shares` (one, or the mix of a model whose layers or matrices differ),
// and its figures for them when it does.
struct ProfileStatus {
    std::string path;
    std::string state;   // none | unusable | other_gpu | no_figures (for some format) | applies
    std::string detail;  // unusable: the error; other_gpu: which GPUs differ
    std::vector<ProfileFigures> formats;  // per format of `shares`, in its order
    // applies: the CPU GB/s at which the model's bytes move, each format's share at its own rate
    // (1 / sum(share / cpu_gbs), as the backend selector blends them; 0: some format not measured)
    double cpu_gbs = 0;
    double fetch_fraction = -1;  // applies, one format: its hybrid fetch fraction (-1: none, or a mix)
};
ProfileStatus profile_status(const char *device_name, const std::vector<FormatShare> &shares);

// The status as the text after `ft run`'s "profile" label.
std::string profile_text(const ProfileStatus &p);

}  // namespace ft::tool
