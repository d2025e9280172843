// Slot cache policies on decode traces, simulated on the host (no GPU): hit rate of LRU, of the
// frequency-aware policy for several half-lives, and Belady's optimum for the same capacity.
//   trace_sim [--geometry qwen3|dsv3|gptoss|nvfp4] [--steps N] [--s S] [--repeat R]
//             [--cache-fraction F] [--seed N] [--trace FILE] [--half-life CALLS ...]
// A --trace file (FT_TRACE_ROUTES) replaces the generator; the geometry then comes from the file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/slot_sim.hpp"
#include "ft/trace.hpp"

namespace {

struct Geometry {
    const char *name;
    int32_t layers, experts, top_k;
};

const Geometry kGeometries[] = {
    {"qwen3", 24, 128, 8},   // Qwen3-30B-A3B: H 2048, I 768
    {"dsv3", 4, 256, 8},     // DeepSeek-V3 shaped, 4 layers: H 7168, I 2048
    {"gptoss", 36, 128, 4},  // gpt-oss-120b shaped, mxfp4: H = I = 2880
    {"nvfp4", 24, 128, 8},   // nvfp4, Qwen3-30B-A3B shaped
};

[[noreturn]] void usage(const char *why) {
    std::fprintf(stderr, "trace_sim: %s\n", why);
    std::exit(2);
}

}  // namespace

int main(int argc, char **argv) {
    ft::ZipfTraceSpec spec;
    const Geometry *g = &kGeometries[0];
    spec.steps = 2000;
    double fraction = 0.25;
    std::string file;
    std::vector<int64_t> half_lives;
    for (int i = 1; i < argc; ++i) {
        auto value = [&](const char *flag) -> const char * {
            if (std::strcmp(argv[i], flag) != 0) return nullptr;
            if (i + 1 >= argc) usage("a flag lacks its value");
            return argv[++i];
        };
        if (const char *v = value("--geometry")) {
            g = nullptr;
            for (const Geometry &c : kGeometries)
                if (std::strcmp(c.name, v) == 0) g = &c;
            if (!g) usage("unknown geometry (qwen3, dsv3, gptoss, nvfp4)");
        } else if (const char *v = value("--steps")) {
            spec.steps = std::atoll(v);
        } else if (const char *v = value("--s")) {
            spec.s = std::atof(v);
        } else if (const char *v = value("--repeat")) {
            spec.repeat = std::atof(v);
        } else if (const char *v = value("--cache-fraction")) {
            fraction = std::atof(v);
        } else if (const char *v = value("--seed")) {
            spec.seed = std::strtoull(v, nullptr, 10);
        } else if (const char *v = value("--trace")) {
            file = v;
        } else if (const char *v = value("--half-life")) {
            half_lives.push_back(std::atoll(v));
        } else {
            usage("unknown argument");
        }
    }
    try {
        ft::RouteTrace trace;
        if (!file.empty()) {
            trace = ft::read_route_trace(file);
        } else {
            spec.layers = g->layers;
            spec.experts = g->experts;
            spec.top_k = g->top_k;
            trace = ft::make_zipf_trace(spec);
        }
        const int64_t all = int64_t(trace.layers) * trace.experts;
        const auto slots = static_cast<int32_t>(
            std::max<int64_t>(trace.experts, std::min<int64_t>(all, std::llround(std::ceil(fraction * all)))));
        if (half_lives.empty())
            for (int64_t steps : {4, 8, 16, 64, 256}) half_lives.push_back(steps * trace.layers);
        const ft::CacheSim belady = ft::simulate_belady(trace, slots);
        const ft::CacheSim lru = ft::simulate_slot_cache(trace, slots, {ft::SlotPolicyKind::Lru, 1});
        std::printf("trace: %s, L %d, E %d, k %d, %zu calls, %d slots (%.0f%%)\n",
                    file.empty() ? (std::string(g->name) + " zipf s " + std::to_string(spec.s) + " repeat " +
                                    std::to_string(spec.repeat)).c_str()
                                 : file.c_str(),
                    trace.layers, trace.experts, trace.top_k, trace.calls.size(), slots, 100.0 * slots / all);
        std::printf("%-24s %8s %10s\n", "policy", "hit", "/belady");
        std::printf("%-24s %8.4f %10.3f\n", "belady", belady.hit_rate(), 1.0);
        // The best fixed set of `slots` experts, chosen knowing the whole trace (no slot left for
        // the misses: an upper bound on any static placement).
        std::vector<int64_t> count(static_cast<size_t>(all), 0);
        int64_t requests = 0;
        for (const auto &c : trace.calls) {
            std::vector<int32_t> d;
            for (int32_t id : c.ids)
                if (id >= 0) d.push_back(id);
            std::sort(d.begin(), d.end());
            d.erase(std::unique(d.begin(), d.end()), d.end());
            for (int32_t id : d) ++count[static_cast<size_t>(c.layer) * trace.experts + id];
            requests += static_cast<int64_t>(d.size());
        }
        std::sort(count.begin(), count.end(), std::greater<>());
        int64_t top = 0;
        for (int32_t i = 0; i < slots; ++i) top += count[i];
        std::printf("%-24s %8.4f %10.3f\n", "best static set", double(top) / requests,
                    double(top) / requests / belady.hit_rate());
        std::printf("%-24s %8.4f %10.3f\n", "lru", lru.hit_rate(), lru.hit_rate() / belady.hit_rate());
        for (int64_t h : half_lives) {
            const ft::CacheSim f = ft::simulate_slot_cache(trace, slots, {ft::SlotPolicyKind::Frequency, h});
            char name[64];
            std::snprintf(name, sizeof name, "frequency h=%lld", static_cast<long long>(h));
            std::printf("%-24s %8.4f %10.3f\n", name, f.hit_rate(), f.hit_rate() / belady.hit_rate());
        }
    } catch (const ft::Error &e) {
        std::fprintf(stderr, "trace_sim: %s\n", e.what());
        return 1;
    }
    return 0;
}
