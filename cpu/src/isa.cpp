// ISA detection and CPU topology.
#include <sched.h>
#if defined(FT_CPU_X86_KERNELS)
#include <cpuid.h>
#endif
#if defined(FT_CPU_X86_KERNELS) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "ft/common.hpp"
#include "ft/knobs.hpp"
#include "ft/cpu.hpp"

namespace ft::cpu {

#if defined(FT_CPU_X86_KERNELS)
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool cpu_has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
}  // namespace
#endif

Isa cpu_best_isa() {
#if defined(FT_CPU_X86_KERNELS)
    // libgcc's __builtin_cpu_supports also checks that the OS saves the AVX/AVX-512 state (XCR0).
    static const Isa best = [] {
        __builtin_cpu_init();
        const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl");
        if (avx512 && __builtin_cpu_supports("avx512bf16")) return Isa::avx512bf16;
        if (avx512) return Isa::avx512;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
            return Isa::avx2;  // F16C: the quantised AVX2 kernels convert fp16 (every AVX2 CPU has it)
        return Isa::scalar;
    }();
    return best;
#else
    return Isa::scalar;
#endif
}

bool amx_bf16_available() {
#if defined(FT_CPU_X86_KERNELS) && defined(__linux__)
    static const bool ok = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        // CPUID.7.0:EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return false;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
        unsigned lo = 0, hi = 0;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo & (3u << 17)) != (3u << 17)) return false;  // XCR0: XTILECFG and XTILEDATA
        // Linux hands out the 8 KiB tile data state per process on request (ARCH_REQ_XCOMP_PERM,
        // XFEATURE_XTILEDATA); granted once, it holds for every thread.
        constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return ok;
#else
    return false;
#endif
}

const char *isa_name(Isa isa) {
    switch (isa) {
        case Isa::scalar: return "scalar";
        case Isa::avx2: return "avx2";
        case Isa::avx512: return "avx512";
        case Isa::avx512bf16: return "avx512bf16";
    }
    return "unknown";
}

bool isa_from_name(const char *name, Isa *out) {
    if (!name) return false;
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16})
        if (std::string(name) == isa_name(i)) {
            *out = i;
            return true;
        }
    return false;
}

Isa default_isa() { return capped_isa(read_tuning(false).cpu_isa); }

Isa capped_isa(const std::string &cap) {
    Isa best = cpu_best_isa();
    if (cap.empty()) return best;
    Isa wanted;
    if (!isa_from_name(cap.c_str(), &wanted)) {
        log(FT_LOG_WARN, "FT_CPU_ISA=", cap, " is not one of scalar|avx2|avx512|avx512bf16; ignored");
        return best;
    }
    return static_cast<int>(wanted) < static_cast<int>(best) ? wanted : best;
}

namespace {
// Parses a sysfs CPU list such as "0-3,8,10-11".
std::vector<int> parse_cpu_list(const std::string &s) {
    std::vector<int> cpus;
    size_t i = 0;
    while (i < s.size()) {
        size_t end = s.find(',', i);
        if (end == std::string::npos) end = s.size();
        std::string part = s.substr(i, end - i);
        size_t dash = part.find('-');
        try {
            if (dash == std::string::npos) {
                cpus.push_back(std::stoi(part));
            } else {
                int a = std::stoi(part.substr(0, dash)), b = std::stoi(part.substr(dash + 1));
                for (int c = a; c <= b; ++c) cpus.push_back(c);
            }
        } catch (const std::exception &) {
            return {};
        }
        i = end + 1;
    }
    return cpus;
}
}  // namespace

std::vector<int> physical_core_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> allowed;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) allowed.push_back(c);
    }
    if (allowed.empty()) {
        unsigned n = std::max(1u, std::thread::hardware_concurrency());
        for (unsigned c = 0; c < n; ++c) allowed.push_back(static_cast<int>(c));
        return allowed;
    }
    std::vector<int> reps;
    std::set<std::vector<int>> seen;
    for (int c : allowed) {
        std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list");
        std::string line;
        if (!f || !std::getline(f, line)) return allowed;
        std::vector<int> siblings = parse_cpu_list(line);
        if (siblings.empty()) return allowed;
        std::sort(siblings.begin(), siblings.end());
        if (seen.insert(siblings).second) reps.push_back(c);
    }
    return reps;
}

int logical_cpu_count() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int default_worker_count(bool drives_gpu) {
    const int cores = static_cast<int>(std::max<size_t>(1, physical_core_cpus().size()));
    if (!drives_gpu) return cores;
    return cores >= 4 ? cores - 2 : std::max(1, cores - 1);
}

size_t last_level_cache_bytes() {
    size_t best = 0;
    for (int i = 0; i < 16; ++i) {
        std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
        std::string v;
        if (!f || !std::getline(f, v) || v.empty()) break;
        size_t n = static_cast<size_t>(std::strtoull(v.c_str(), nullptr, 10));
        const char unit = v.back();
        if (unit == 'K') n <<= 10;
        else if (unit == 'M') n <<= 20;
        else if (unit == 'G') n <<= 30;
        best = std::max(best, n);
    }
    return best;
}

}  // namespace ft::cpu
