// What every C shim of libfreetoken does around the C++ core: run it inside a catch-all, turn
// each exception into an ft_status and hand its message to a sink (a handle's error text or the
// caller's buffer). Shared by api.cpp and api_ep.cpp.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "freetoken.h"
#include "ft/common.hpp"

namespace ft::api {

// Copies msg into the caller's buffer (truncated, always terminated); NULL or size 0: nothing.
inline void write_error(char *buf, size_t size, const std::string &msg) {
    if (!buf || size == 0) return;
    const size_t n = std::min(size - 1, msg.size());
    std::memcpy(buf, msg.data(), n);
    buf[n] = '\0';
}

// Runs fn, mapping every exception to a status; the message goes to `sink`.
template <typename Fn, typename Sink>
ft_status guarded(Sink &&sink, Fn &&fn) noexcept {
    try {
        fn();
        return FT_OK;
    } catch (const ft::Error &e) {
        sink(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        sink("out of host memory");
        return FT_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        sink(std::string("internal error: ") + e.what());
        return FT_ERR_INTERNAL;
    } catch (...) {
        sink("internal error: unknown exception");
        return FT_ERR_INTERNAL;
    }
}

}  // namespace ft::api
