#include "ft/profile.hpp"
#include "ft/knobs.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ft/common.hpp"
#include "ft/json_limits.hpp"

namespace ft {

namespace {

using Json = nlohmann::ordered_json;

// ordered_json (file order is kept: the first workload wins) inserts each key with a linear
// search of its object, so the keys of a profile are bounded: real ones have a few hundred.
constexpr int64_t kMaxProfileKeys = 16384;

// Typed reads that name the offending field.
struct Reader {
    const Json &obj;
    std::string where;

    const Json *find(const char *key) const {
        auto it = obj.find(key);
        return it == obj.end() || it->is_null() ? nullptr : &*it;
    }
    std::optional<double> number(const char *key) const {
        const Json *v = find(key);
        if (!v) return std::nullopt;
        if (!v->is_number()) fail(FT_ERR_FORMAT, "profile: ", where, key, " must be a number");
        return v->get<double>();
    }
    int64_t integer(const char *key, int64_t def) const {
        const Json *v = find(key);
        if (!v) return def;
        if (!v->is_number_integer() && !v->is_number_unsigned())
            fail(FT_ERR_FORMAT, "profile: ", where, key, " must be an integer");
        return v->get<int64_t>();
    }
    std::string string(const char *key) const {
        const Json *v = find(key);
        if (!v) return {};
        if (!v->is_string()) fail(FT_ERR_FORMAT, "profile: ", where, key, " must be a string");
        return v->get<std::string>();
    }
    const Json *object(const char *key) const {
        const Json *v = find(key);
        if (v && !v->is_object()) fail(FT_ERR_FORMAT, "profile: ", where, key, " must be an object");
        return v;
    }
};

KernelEntry entry_from(const Json &j, const std::string &where) {
    if (!j.is_object()) fail(FT_ERR_FORMAT, "profile: ", where, " must be an object");
    Reader r{j, where + "."};
    KernelEntry e;
    e.expert_bytes = static_cast<uint64_t>(std::max<int64_t>(0, r.integer("expert_bytes", 0)));
    e.synth_experts = r.integer("synth_experts", 0);
    e.cpu_moe_gbs = r.number("cpu_moe_gbs");
    e.cpu_moe_isa = r.string("cpu_moe_isa");
    e.pcie_gather_gbs = r.number("pcie_gather_gbs");
    e.cpu_moe_overlap_gbs = r.number("cpu_moe_overlap_gbs");
    e.pcie_gather_overlap_gbs = r.number("pcie_gather_overlap_gbs");
    e.ratio = r.number("ratio");
    e.recommended = r.string("recommended");
    e.note = r.string("note");
    return e;
}

std::map<std::string, KernelEntry> entries_from(const Json *j, const std::string &where) {
    std::map<std::string, KernelEntry> out;
    if (!j) return out;
    for (auto it = j->begin(); it != j->end(); ++it) out[it.key()] = entry_from(it.value(), where + "." + it.key());
    return out;
}

std::map<std::string, std::string> verdicts_from(const Json *j, const std::string &where) {
    std::map<std::string, std::string> out;
    if (!j) return out;
    for (auto it = j->begin(); it != j->end(); ++it) {
        if (it.value().is_null()) continue;
        if (!it.value().is_string()) fail(FT_ERR_FORMAT, "profile: ", where, ".", it.key(), " must be a string");
        out[it.key()] = it.value().get<std::string>();
    }
    return out;
}

Json rounded(const std::optional<double> &v, int decimals) {
    if (!v || !std::isfinite(*v)) return nullptr;
    const double scale = std::pow(10.0, decimals);
    return std::round(*v * scale) / scale;
}

Json entry_to(const KernelEntry &e) {
    Json j;
    j["expert_bytes"] = e.expert_bytes;
    j["synth_experts"] = e.synth_experts;
    j["cpu_moe_gbs"] = rounded(e.cpu_moe_gbs, 2);
    j["cpu_moe_isa"] = e.cpu_moe_isa.empty() ? Json(nullptr) : Json(e.cpu_moe_isa);
    j["isa_sweep"] = nullptr;
    j["pcie_gather_gbs"] = rounded(e.pcie_gather_gbs, 2);
    j["cpu_moe_overlap_gbs"] = rounded(e.cpu_moe_overlap_gbs, 2);
    j["pcie_gather_overlap_gbs"] = rounded(e.pcie_gather_overlap_gbs, 2);
    j["ratio"] = rounded(e.ratio, 3);
    j["recommended"] = e.recommended.empty() ? Json(nullptr) : Json(e.recommended);
    j["note"] = e.note;
    return j;
}

bool positive(const std::optional<double> &v) { return v && *v > 0.0; }


}  // namespace

std::string profile_format_key(Format f) { return f == Format::mxfp4 ? "mxfp4_triton" : format_name(f); }

Profile profile_from_json(const std::string &text) {
    Json j;
    try {
        int64_t keys = 0;
        const auto depth_ok = json_depth_guard<Json>("profile");
        j = Json::parse(text, [&](int depth, Json::parse_event_t ev, Json &v) {
            if (ev == Json::parse_event_t::key && ++keys > kMaxProfileKeys)
                fail(FT_ERR_FORMAT, "profile: more than ", kMaxProfileKeys, " object keys (the limit)");
            return depth_ok(depth, ev, v);
        });
    } catch (const Json::exception &e) {
        fail(FT_ERR_FORMAT, "profile: not valid JSON: ", e.what());
    }
    if (!j.is_object()) fail(FT_ERR_FORMAT, "profile: the top level must be an object");
    Reader r{j, ""};
    Profile p;
    p.version = r.integer("version", 0);
    if (p.version != 4) fail(FT_ERR_FORMAT, "profile: version ", p.version, " is not supported (4)");
    p.timestamp = r.string("timestamp");
    p.epoch = r.integer("epoch", 0);
    p.host = r.string("host");
    if (const Json *g = r.object("gpu")) {
        Reader gr{*g, "gpu."};
        p.gpu_index = gr.integer("index", -1);
        p.gpu_name = gr.string("name");
    }
    if (const Json *c = r.object("cpu")) {
        Reader cr{*c, "cpu."};
        p.physical_cores = cr.integer("physical_cores", 0);
        p.threads_used = cr.integer("threads_used", 0);
    }
    p.threshold = r.number("threshold").value_or(2.0);
    if (const Json *c = r.object("ceilings")) {
        Reader cr{*c, "ceilings."};
        p.cpu_stream_read_gbs = cr.number("cpu_stream_read_gbs");
        p.pcie_linear_h2d_gbs = cr.number("pcie_linear_h2d_gbs");
        p.pcie_linear_d2h_gbs = cr.number("pcie_linear_d2h_gbs");
    }
    p.dtypes = verdicts_from(r.object("dtypes"), "dtypes");
    p.dtype_kernels = entries_from(r.object("dtype_kernels"), "dtype_kernels");
    if (const Json *w = r.object("workloads")) {
        for (auto it = w->begin(); it != w->end(); ++it) {
            const std::string where = "workloads." + it.key();
            if (!it.value().is_object()) fail(FT_ERR_FORMAT, "profile: ", where, " must be an object");
            Reader wr{it.value(), where + "."};
            WorkloadEntry e;
            e.name = it.key();
            if (const Json *m = wr.object("model")) {
                Reader mr{*m, where + ".model."};
                e.hidden = mr.integer("hidden", 0);
                e.inter = mr.integer("inter", 0);
                e.experts = mr.integer("experts", 0);
                e.top_k = mr.integer("top_k", 0);
            }
            e.kernels = entries_from(wr.object("kernels"), where + ".kernels");
            e.recommended_backend = verdicts_from(wr.object("recommended_moe_backend"), where + ".recommended_moe_backend");
            p.workloads.push_back(std::move(e));
        }
    }
    if (const Json *f = r.object("freetoken")) {
        Reader fr{*f, "freetoken."};
        p.library_version = fr.string("library_version");
        p.cpu_model = fr.string("cpu_model");
    }
    return p;
}

std::string profile_to_json(const Profile &p) {
    Json j;
    j["version"] = 4;
    j["timestamp"] = p.timestamp;
    j["epoch"] = p.epoch;
    j["host"] = p.host;
    j["gpu"] = {{"index", p.gpu_index}, {"name", p.gpu_name.empty() ? Json(nullptr) : Json(p.gpu_name)}};
    j["cpu"] = {{"physical_cores", p.physical_cores}, {"threads_used", p.threads_used}};
    j["threshold"] = p.threshold;
    j["ceilings"] = {{"cpu_stream_read_gbs", rounded(p.cpu_stream_read_gbs, 2)},
                     {"pcie_linear_h2d_gbs", rounded(p.pcie_linear_h2d_gbs, 2)},
                     {"pcie_linear_d2h_gbs", rounded(p.pcie_linear_d2h_gbs, 2)}};
    j["dtypes"] = Json::object();
    for (const auto &[k, v] : p.dtypes) j["dtypes"][k] = v;
    j["dtype_kernels"] = Json::object();
    for (const auto &[k, e] : p.dtype_kernels) j["dtype_kernels"][k] = entry_to(e);
    j["workloads"] = Json::object();
    for (const WorkloadEntry &w : p.workloads) {
        Json wj;
        wj["model"] = {{"name", w.name}, {"hidden", w.hidden}, {"inter", w.inter}, {"experts", w.experts}, {"top_k", w.top_k}};
        wj["kernels"] = Json::object();
        for (const auto &[k, e] : w.kernels) wj["kernels"][k] = entry_to(e);
        wj["recommended_moe_backend"] = Json::object();
        for (const auto &[k, v] : w.recommended_backend) wj["recommended_moe_backend"][k] = v;
        j["workloads"][w.name] = wj;
    }
    j["freetoken"] = {{"library_version", p.library_version}, {"cpu_model", p.cpu_model}};
    return j.dump(2) + "\n";
}

std::string default_profile_path() {
    const std::string explicit_path = read_tuning(false).profile_path;
    if (!explicit_path.empty()) return explicit_path;
    return cache_dir() + "/benchbw.json";
}

Profile load_profile(const std::string &path) {
    check_file_size(path, limits::kMaxJsonFileBytes);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(FT_ERR_IO, "profile: cannot read ", path, ": ", std::strerror(errno));
    std::ostringstream text;
    text << in.rdbuf();
    try {
        return profile_from_json(text.str());
    } catch (const Error &e) {
        fail(e.status(), path, ": ", e.what());
    }
}

void save_profile(const Profile &p, const std::string &path) {
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos && slash > 0 && !make_dirs(path.substr(0, slash)))
        fail(FT_ERR_IO, "profile: cannot create the folder of ", path, ": ", std::strerror(errno));
    const std::string tmp = cat(path, ".tmp.", ::getpid());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << profile_to_json(p);
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            fail(FT_ERR_IO, "profile: cannot write ", tmp, ": ", std::strerror(errno));
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        fail(FT_ERR_IO, "profile: cannot replace ", path, ": ", std::strerror(err));
    }
}

std::optional<Profile> load_usable_profile(const std::string &path, const std::string &serving_gpu) {
    const std::string where = path.empty() ? default_profile_path() : path;
    Profile p;
    try {
        p = load_profile(where);
    } catch (const Error &e) {
        log(e.status() == FT_ERR_IO ? FT_LOG_DEBUG : FT_LOG_WARN, "no usable profile: ", e.what());
        return std::nullopt;
    }
    if (!p.gpu_name.empty() && !serving_gpu.empty() && p.gpu_name != serving_gpu) {
        log(FT_LOG_WARN, "profile ", where, " was measured on ", p.gpu_name, ", not on ", serving_gpu, "; ignoring it");
        return std::nullopt;
    }
    return p;
}

std::optional<std::string> backend_recommendation(const Profile &p, const std::string &key) {
    if (auto it = p.dtypes.find(key); it != p.dtypes.end() && (it->second == "hybrid" || it->second == "offload"))
        return it->second;
    bool any = false, all_hybrid = true;
    for (const WorkloadEntry &w : p.workloads) {
        auto it = w.kernels.find(key);
        if (it == w.kernels.end() || it->second.recommended.empty()) continue;
        any = true;
        if (it->second.recommended == "offload") return std::string("offload");
        all_hybrid &= it->second.recommended == "hybrid";
    }
    if (any && all_hybrid) return std::string("hybrid");
    return std::nullopt;
}

std::optional<double> entry_fetch_fraction(const KernelEntry &e) {
    if (positive(e.pcie_gather_overlap_gbs) && positive(e.cpu_moe_overlap_gbs))
        return std::min(1.0, *e.pcie_gather_overlap_gbs / (*e.pcie_gather_overlap_gbs + *e.cpu_moe_overlap_gbs));
    if (positive(e.pcie_gather_gbs) && positive(e.cpu_moe_gbs)) return std::min(1.0, *e.pcie_gather_gbs / *e.cpu_moe_gbs);
    return std::nullopt;
}

std::optional<double> hybrid_fetch_fraction(const Profile &p, const std::string &key) {
    const auto from = entry_fetch_fraction;
    if (auto it = p.dtype_kernels.find(key); it != p.dtype_kernels.end()) {
        if (auto f = from(it->second)) return f;
    }
    for (const WorkloadEntry &w : p.workloads) {
        if (auto it = w.kernels.find(key); it != w.kernels.end()) {
            if (auto f = from(it->second)) return f;
        }
    }
    return std::nullopt;
}

std::optional<std::string> entry_verdict(const KernelEntry &e, double threshold) {
    if (!positive(e.pcie_gather_gbs)) return std::nullopt;
    if (positive(e.pcie_gather_overlap_gbs) && positive(e.cpu_moe_overlap_gbs))
        return std::string(*e.pcie_gather_overlap_gbs + *e.cpu_moe_overlap_gbs > *e.pcie_gather_gbs ? "hybrid" : "offload");
    if (positive(e.cpu_moe_gbs)) return std::string(*e.cpu_moe_gbs > threshold * *e.pcie_gather_gbs ? "hybrid" : "offload");
    return std::string("offload");
}

}  // namespace ft
