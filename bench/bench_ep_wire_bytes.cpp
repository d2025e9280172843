// Bytes leaving a rank per token for one MoE layer's dispatch and combine, on seeded routing
// traces, for the shapes issue 7's benchmark names. Prints a Markdown table; built in CI, run by
// hand: ep_wire_bytes [tokens] [seed].
//
// Columns: P = mean fraction of the R - 1 remote ranks a token is sent to; dispatch with dedup in
// FP8 records (payload + fp32 scales + metadata) and in bf16 records; the bf16 all-gather
// (ThunderEP's and vLLM's baseline) and a per-route bf16 all-to-all without dedup; our bf16
// combine (one partial per remote destination) and the same partials on the optional FP8 combine
// wire (e4m3 + fp32 scales). "vs AG" is FP8 dispatch over all-gather.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ep_traces.hpp"
#include "ft/ep.hpp"

namespace {

struct Shape {
    const char *name;
    int64_t hidden;
    int32_t experts, top_k;
};

struct Trace {
    const char *name;
    double zipf, pairs;
};

}  // namespace

int main(int argc, char **argv) {
    using namespace ft::ep;
    const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
    const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
    const Shape shapes[] = {{"H=7168 top-8 of 256", 7168, 256, 8}, {"H=2048 top-8 of 128", 2048, 128, 8}};
    const Trace traces[] = {{"uniform", 0.0, 0.0}, {"zipf1.0+pairs0.5", 1.0, 0.5}};
    std::printf("tokens %lld, seed %llu; bytes per token leaving its rank\n\n", static_cast<long long>(tokens),
                static_cast<unsigned long long>(seed));
    std::printf("| shape | trace | R | placement | P | FP8 dedup | bf16 dedup | bf16 all-gather | bf16 a2a | "
                "combine bf16 | combine FP8 | vs AG |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape &sh : shapes)
        for (const Trace &tr : traces) {
            ft::test::TraceSpec spec;
            spec.experts = sh.experts;
            spec.top_k = sh.top_k;
            spec.tokens = tokens;
            spec.zipf_exponent = tr.zipf;
            spec.pair_probability = tr.pairs;
            spec.seed = seed;
            const auto ids = ft::test::routing_trace(spec);
            PlannerInput in;
            in.num_experts = sh.experts;
            ft::test::routing_stats(ids, sh.experts, sh.top_k, in.load, in.coactivation);
            for (int32_t R : {2, 4, 8}) {
                in.num_ranks = R;
                const Placement linear = contiguous_placement(sh.experts, R);
                const Placement planned = plan_placement(in).placement;
                for (const auto &[pname, p] : {std::pair<const char *, const Placement &>{"contiguous", linear},
                                               std::pair<const char *, const Placement &>{"planned", planned}}) {
                    const WireBytes w = wire_bytes(p, ids.data(), tokens, sh.top_k, sh.hidden);
                    std::printf("| %s | %s | %d | %s | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f |\n", sh.name, tr.name,
                                R, pname, w.remote_fraction, w.dispatch_dedup_fp8, w.dispatch_dedup_bf16, w.allgather_bf16,
                                w.alltoall_bf16, w.combine_dedup_bf16, w.combine_dedup_fp8,
                                w.dispatch_dedup_fp8 / w.allgather_bf16);
                }
            }
        }
    return 0;
}
