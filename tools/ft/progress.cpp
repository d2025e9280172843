#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace ft::tool {

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()), last_() {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done, uint64_t total) {
    if (!tty_ || total == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    const double frac = done >= total ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const int width = 30, fill = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(fill), '#');
    bar.resize(width, '.');
    const double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r%-14s [%s] %5.1f%%  %6.1fs", label_.c_str(), bar.c_str(), 100.0 * frac, secs);
    std::fflush(stderr);
}

void ProgressBar::finish() {
    if (tty_ && drawn_) {
        std::fprintf(stderr, "\r%*s\r", 70, "");
        std::fflush(stderr);
        drawn_ = false;
    }
}

}  // namespace ft::tool
