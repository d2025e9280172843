// The C handles ft_engine, ft_model and ft_session: the C++ objects of lib/engine/session plus
// the error text of the last failed call. Private to the C shims (api.cpp, api_ep.cpp).
#pragma once

#include <memory>
#include <string>

#include "freetoken.h"
#include "ft/session.hpp"

struct ft_engine {
    std::unique_ptr<ft::Engine> impl;
    std::string last_error;
};

struct ft_model {
    ft_engine *engine = nullptr;
    std::unique_ptr<ft::LoadedModel> impl;
    std::string architecture;
    std::string last_error;
};

struct ft_session {
    ft_model *model = nullptr;
    std::unique_ptr<ft::Session> impl;
    mutable std::string last_error;  // also written by the const statistics readers
};
