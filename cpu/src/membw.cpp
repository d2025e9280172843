#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <new>
#include <vector>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "kernels.hpp"

namespace ft::cpu {

namespace {

using ReadFn = uint64_t (*)(const uint8_t *, size_t, int, size_t, int);

#if !defined(FT_CPU_X86_KERNELS)
uint64_t read_sum_portable(const uint8_t *p, size_t bytes, int, size_t, int) {
    uint64_t sum = 0;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v;
        std::memcpy(&v, p + i, 8);
        sum += v;
    }
    return sum;
}
#endif

ReadFn read_kernel(Isa isa) {
#if defined(FT_CPU_X86_KERNELS)
    if (isa >= Isa::avx512) return detail::read_sum_avx512;
    if (isa >= Isa::avx2) return detail::read_sum_avx2;
    return detail::read_sum_sse2;
#else
    return read_sum_portable;
#endif
}

}  // namespace

double read_pass(ThreadPool &pool, const uint8_t *data, size_t bytes, ReadProbe probe) {
    const ReadFn fn = read_kernel(default_isa());
    const size_t n = static_cast<size_t>(pool.size());
    const size_t unit = static_cast<size_t>(std::max(probe.streams, 1)) * (probe.stride ? probe.stride : 64);
    const size_t chunk = bytes / n / unit * unit;
    std::vector<uint64_t> sink(n * 8);  // a cache line per worker
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int w, int) { sink[static_cast<size_t>(w) * 8] = fn(data + chunk * w, chunk, probe.streams, probe.stride, probe.prefetch); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Publishing the sums keeps the compiler from dropping the loads.
    volatile uint64_t keep = 0;
    for (uint64_t v : sink) keep = keep + v;
    (void)keep;
    return static_cast<double>(chunk * n) / s;
}

double best_read_bandwidth(ThreadPool &pool, const uint8_t *buf, size_t bytes, int passes, ReadProbe *best_probe,
                           double max_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    // The bound is the best read these cores reach: one or several streams per core, far apart
    // or close together (as the rows of a weight matrix are), with and without software prefetch;
    // which shape wins depends on the CPU.
    double best = 0.0;
    ReadProbe winner;
    auto search = [&] {
        for (int streams : {1, 4, 8})
            for (size_t stride : {size_t{0}, size_t{4096}, size_t{16384}}) {
                if (streams == 1 && stride) continue;
                for (int prefetch : {0, 512, 1024})
                    for (int i = 0; i < std::max(passes, 1); ++i) {
                        const ReadProbe probe{streams, stride, prefetch};
                        const double r = read_pass(pool, buf, bytes, probe);
                        if (r > best) best = r, winner = probe;
                        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= max_seconds)
                            return;
                    }
            }
    };
    search();
    if (best_probe) *best_probe = winner;
    return best;
}

double measure_read_bandwidth(ThreadPool &pool, size_t bytes, int passes) {
    bytes = std::max<size_t>(bytes / 4096 * 4096, 4096);
    uint8_t *buf = static_cast<uint8_t *>(std::aligned_alloc(4096, bytes));
    if (!buf) fail(FT_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes, " bytes for the read-bandwidth probe");
    pool.run([&](int w, int nw) {
        const size_t a = bytes * w / nw, b = bytes * (w + 1) / nw;
        for (size_t i = a; i < b; ++i) buf[i] = static_cast<uint8_t>(i * 131u + 7u);
    });
    const double best = best_read_bandwidth(pool, buf, bytes, passes);
    std::free(buf);
    return best;
}

}  // namespace ft::cpu
