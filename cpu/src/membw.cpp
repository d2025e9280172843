#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"

namespace ft::cpu {

double read_pass(ThreadPool &pool, const uint8_t *data, size_t bytes) {
    std::vector<long long> sink(static_cast<size_t>(pool.size()) * 8);  // a cache line per worker
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int w, int nw) {
        const size_t chunk = bytes / static_cast<size_t>(nw) / 64 * 64;
        const __m128i *a = reinterpret_cast<const __m128i *>(data + chunk * w);
        const __m128i *e = reinterpret_cast<const __m128i *>(data + chunk * (w + 1));
        // Four independent sums keep enough loads in flight to saturate memory.
        __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
        for (; a < e; a += 4) {
            s0 = _mm_add_epi64(s0, _mm_load_si128(a));
            s1 = _mm_add_epi64(s1, _mm_load_si128(a + 1));
            s2 = _mm_add_epi64(s2, _mm_load_si128(a + 2));
            s3 = _mm_add_epi64(s3, _mm_load_si128(a + 3));
        }
        s0 = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
        sink[static_cast<size_t>(w) * 8] = _mm_cvtsi128_si64(s0);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Publishing the sums keeps the compiler from dropping the loads.
    volatile long long keep = 0;
    for (long long v : sink) keep = keep + v;
    (void)keep;
    const size_t read = bytes / static_cast<size_t>(pool.size()) / 64 * 64 * static_cast<size_t>(pool.size());
    return static_cast<double>(read) / s;
}

double measure_read_bandwidth(ThreadPool &pool, size_t bytes, int passes) {
    bytes = std::max<size_t>(bytes / 4096 * 4096, 4096);
    uint8_t *buf = static_cast<uint8_t *>(std::aligned_alloc(4096, bytes));
    if (!buf) fail(FT_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes for the read-bandwidth probe");
    pool.run([&](int w, int nw) {
        const size_t a = bytes * w / nw, b = bytes * (w + 1) / nw;
        for (size_t i = a; i < b; ++i) buf[i] = static_cast<uint8_t>(i * 131u + 7u);
    });
    double best = 0.0;
    for (int i = 0; i < std::max(passes, 1); ++i) best = std::max(best, read_pass(pool, buf, bytes));
    std::free(buf);
    return best;
}

}  // namespace ft::cpu
