// The bandwidth profile (docs/formulas.md, "Bandwidth profile"): what this machine's buses and
// kernels really do, as JSON in FreeToken's schema version 4, so profiles written by the original
// engine are read here and ours are readable there. Our own additions live under the top-level
// key "freetoken". Reader rules: a profile of another GPU is ignored; a format's backend
// recommendation and hybrid fetch fraction come from its per-format entry, then from the
// per-model entries.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ft/formats.hpp"

namespace ft {

// Measurements of one expert format (a `dtype_kernels` or `workloads[*].kernels` entry).
// Missing or null numbers are empty.
struct KernelEntry {
    uint64_t expert_bytes = 0;
    int64_t synth_experts = 0;
    std::optional<double> cpu_moe_gbs;             // CPU expert GEMV at bs=1
    std::string cpu_moe_isa;
    std::optional<double> pcie_gather_gbs;         // gather into GPU slots
    std::optional<double> cpu_moe_overlap_gbs;     // both running at once: CPU side
    std::optional<double> pcie_gather_overlap_gbs; // both running at once: PCIe side
    std::optional<double> ratio;                   // cpu / pcie, standalone
    std::string recommended;                       // "hybrid", "offload" or empty
    std::string note;
};

struct WorkloadEntry {
    std::string name;
    int64_t hidden = 0, inter = 0, experts = 0, top_k = 0;
    std::map<std::string, KernelEntry> kernels;              // by format key
    std::map<std::string, std::string> recommended_backend;  // by format key
};

struct Profile {
    int64_t version = 4;
    std::string timestamp;  // local ISO-8601 with offset
    int64_t epoch = 0;
    std::string host;
    int64_t gpu_index = -1;
    std::string gpu_name;   // empty: unknown (such a profile is accepted on any GPU)
    int64_t physical_cores = 0, threads_used = 0;
    double threshold = 2.0;
    std::optional<double> cpu_stream_read_gbs, pcie_linear_h2d_gbs, pcie_linear_d2h_gbs;
    std::map<std::string, std::string> dtypes;          // format key -> "hybrid" | "offload"
    std::map<std::string, KernelEntry> dtype_kernels;   // format key -> measurements
    std::vector<WorkloadEntry> workloads;               // per-model entries, in file order
    // Our additions (written under "freetoken"): library version and CPU model.
    std::string library_version;
    std::string cpu_model;
};

// The profile's key for an expert format: the original engine's names (mxfp4 is "mxfp4_triton").
std::string profile_format_key(Format f);

// Parses a profile. FT_ERR_FORMAT (naming the field) for invalid JSON, a version other than 4,
// or a field of the wrong type.
Profile profile_from_json(const std::string &text);
// Serialises with 2-space indentation, bandwidths rounded to 2 decimals and ratios to 3, as the
// original writer does.
std::string profile_to_json(const Profile &p);

// Where profiles live: $FT_PROFILE_PATH, else $XDG_CACHE_HOME/freetoken/benchbw.json
// (XDG_CACHE_HOME defaults to ~/.cache).
std::string default_profile_path();

// Reads and parses `path`: FT_ERR_IO if it cannot be read, FT_ERR_FORMAT as profile_from_json.
Profile load_profile(const std::string &path);
// Writes atomically: a temporary file beside `path` renamed over it; parent folders are created.
void save_profile(const Profile &p, const std::string &path);

// The profile at `path` (default path when empty) if it exists, parses, and was measured on
// `serving_gpu` (when both names are known); otherwise nothing, with a log line saying why.
std::optional<Profile> load_usable_profile(const std::string &path, const std::string &serving_gpu);

// "hybrid" or "offload" for a format: dtypes[key] if set; else over the per-model entries,
// "hybrid" only if all say hybrid, "offload" if any says offload; nothing if none.
std::optional<std::string> backend_recommendation(const Profile &p, const std::string &format_key);

// The share of a step's misses to fetch over PCIe so that both sides finish together, from the
// first entry (dtype_kernels, then each workload in file order) that gives one: with both
// overlapped figures, min(1, pcie_ov / (pcie_ov + cpu_ov)); else with both standalone figures,
// min(1, pcie / cpu) (the original's rule, which assumes the two fully contend for DRAM).
std::optional<double> hybrid_fetch_fraction(const Profile &p, const std::string &format_key);
// The same rule on one entry: from its overlapped pair, else its standalone pair, else nothing.
std::optional<double> entry_fetch_fraction(const KernelEntry &e);

// The per-format verdict a profile records ("recommended", and `dtypes`), between the two
// backends the original engine chooses from. With both overlapped figures: "hybrid" iff
// cpu_ov + pcie_ov > pcie_gather, i.e. iff splitting a step's misses at the fetch fraction moves
// them faster than fetching them all (the hits cost both the same, so this holds at every hit
// rate). Otherwise with both standalone figures the original's rule, "hybrid" iff
// cpu > threshold x pcie; with the gather figure alone "offload" (the original's default).
// Nothing without a gather figure.
std::optional<std::string> entry_verdict(const KernelEntry &e, double threshold);

}  // namespace ft
