// `ft run`: decode a routing trace through a model and report its speed.
#pragma once

#include "cli.hpp"

namespace ft::tool {

int cmd_run(const Options &o);

}  // namespace ft::tool
