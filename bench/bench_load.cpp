// Checkpoint load throughput from the page cache, for both safetensors layouts (fused and
// per-expert): a synthetic Qwen3-MoE checkpoint of about FT_BENCH_LOAD_MB MiB (default 1500, 4
// shards) is written once per layout into $TMPDIR (or /tmp), loaded once to bring it into the page
// cache, then each iteration loads it with one reader per core. Counters: GB (bank bytes), GBps
// (bank bytes over the load time), write_GBps (the synthetic writer). The last expert loaded is
// compared with what was written.
//   bench_load [--benchmark_filter=fused]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "ft/common.hpp"
#include "ft/loader.hpp"
#include "ft/synth.hpp"
#include "scratch_dir.hpp"

namespace {

using ft::synth::Spec;
using ft::test::ScratchDir;

void BM_Load(benchmark::State &state, Spec::Layout layout) {
    const std::string mb_text = ft::env_string("FT_BENCH_LOAD_MB");
    const uint64_t target = (mb_text.empty() ? 1500ull : std::stoull(mb_text)) << 20;
    Spec s;
    s.architecture = "qwen3_moe";
    s.layout = layout;
    s.hidden = 2048;
    s.intermediate = 768;
    s.num_experts = 64;
    s.top_k = 8;
    s.shards = 4;
    const uint64_t per_layer = 3ull * s.hidden * s.intermediate * 2 * s.num_experts;
    s.num_layers = static_cast<int>(std::max<uint64_t>(1, target / per_layer));
    ScratchDir dir;
    const auto t0 = std::chrono::steady_clock::now();
    ft::synth::write_checkpoint(dir.path(), s);
    const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ft::LoadOptions opts;  // all cores
    std::unique_ptr<ft::Model> m = ft::load_checkpoint(dir.path(), opts);  // into the page cache
    for (auto _ : state) {
        m.reset();
        m = ft::load_checkpoint(dir.path(), opts);
    }
    const int32_t last = m->spec().num_layers - 1;
    if (std::memcmp(m->gate(last, 63), ft::synth::expert_weight(s, last, 63, FT_PROJ_GATE).data(),
                    static_cast<size_t>(s.hidden) * s.intermediate * 2) != 0)
        return state.SkipWithError("the loaded experts differ from the written ones");
    const double bytes = static_cast<double>(m->banks().total_bytes());
    state.counters["GB"] = bytes / 1e9;
    state.counters["GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["write_GBps"] = bytes / 1e9 / write_s;
}

BENCHMARK_CAPTURE(BM_Load, fused, Spec::Layout::fused)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Load, per_expert, Spec::Layout::per_expert)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
