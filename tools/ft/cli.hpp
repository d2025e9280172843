// The ft program's command line: the options of every command and their parser.
#pragma once

#include <cstdint>
#include <string>

#include "freetoken.h"
#include "profile_cmd.hpp"

namespace ft::tool {

struct Options {
    std::string command, model;
    int steps = 64, tokens = 1, threads = 0, backend = FT_BACKEND_AUTO;
    std::string backend_name = "auto";
    double cache_fraction = 0.0;
    uint64_t seed = 1;
    std::string cache_dir;
    std::string format = "bf16";
    bool format_given = false;
    bool no_gpu = false, json = false;
    ft::tool::ProfileOptions profile;
};

// The help text of `command`, or nullptr for an unknown command.
const char *help_of(const std::string &command);

// Parses the command line. Help requests print their text and exit 0; usage errors print one line
// naming what is wrong (and where the command's options are listed) and exit 2.
Options parse(int argc, char **argv);

}  // namespace ft::tool
