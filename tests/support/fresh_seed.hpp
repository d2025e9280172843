// Seeds of tests that draw fresh random data on every run. The seed is printed (ctest
// --output-on-failure shows it beside a failure) and FT_TEST_SEED=N replays that run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace ft::test {

inline uint64_t fresh_seed(const char *what) {
    const char *env = std::getenv("FT_TEST_SEED");
    uint64_t seed;
    if (env && *env) {
        seed = std::strtoull(env, nullptr, 0);
    } else {
        std::random_device rd;
        seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::fprintf(stderr, "%s: seed %llu (FT_TEST_SEED=%llu replays it)\n", what, static_cast<unsigned long long>(seed),
                 static_cast<unsigned long long>(seed));
    return seed;
}

}  // namespace ft::test
