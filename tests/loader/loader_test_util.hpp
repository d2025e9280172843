// Helpers shared by the loader tests: scratch directories and error expectations.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include "ft/common.hpp"

namespace ft::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at scope exit.
class ScratchDir {
public:
    ScratchDir() {
        const char *base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ft_loader_test_XXXXXX";
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    ScratchDir(const ScratchDir &) = delete;
    ScratchDir &operator=(const ScratchDir &) = delete;

    const std::string &path() const { return path_; }
    std::string operator/(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

inline void write_file(const std::string &path, const std::string &text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

inline std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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
