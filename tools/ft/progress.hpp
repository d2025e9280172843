// A one-line progress bar on standard error, redrawn at most every 100 ms; silent when
// standard error is not a terminal (logs stay clean).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ft::tool {

class ProgressBar {
public:
    explicit ProgressBar(std::string label);
    ~ProgressBar();
    void update(uint64_t done, uint64_t total);
    void finish();

private:
    std::string label_;
    bool tty_;
    bool drawn_ = false;
    std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace ft::tool
