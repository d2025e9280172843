// Scratch directories and whole-file reads (scratch_dir.hpp), whole-file writes and byte reads, and the
// expectation that a call throws ft::Error with a given status and message.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "scratch_dir.hpp"

namespace ft::test {

inline void write_file(const std::string &path, const std::string &text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

inline void write_bytes(const std::string &path, const std::vector<uint8_t> &b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
    ASSERT_TRUE(out.good()) << path;
}

inline std::vector<uint8_t> read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Runs f, which must throw ft::Error with `status` and a message containing every one of `parts`.
template <typename F>
void expect_error(F &&f, ft_status status, std::initializer_list<std::string> parts) {
    try {
        f();
        ADD_FAILURE() << "expected status " << status << ", nothing was thrown";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), status) << e.what();
        for (const std::string &p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "message '" << e.what() << "' lacks '" << p << "'";
    }
}

}  // namespace ft::test
