#include "profile_cmd.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "freetoken.h"
#include "ft/common.hpp"
#include "ft/profile.hpp"
#include "ft/selector.hpp"
#include "plot.hpp"
#include "progress.hpp"

namespace ft::tool {

namespace {

struct FormatName {
    const char *name;
    int32_t format;
};
// The library's names, plus the original bench's keys and aliases.
const FormatName kFormats[] = {{"bf16", FT_FORMAT_BF16},     {"fp8_block", FT_FORMAT_FP8_BLOCK}, {"fp8", FT_FORMAT_FP8_BLOCK},
                               {"nvfp4", FT_FORMAT_NVFP4},   {"mxfp4", FT_FORMAT_MXFP4},         {"mxfp4_triton", FT_FORMAT_MXFP4},
                               {"ds_fp4", FT_FORMAT_DS_FP4}, {"q4_0", FT_FORMAT_Q4_0},           {"q8_0", FT_FORMAT_Q8_0},
                               {"q2_k", FT_FORMAT_Q2_K},     {"q3_k", FT_FORMAT_Q3_K},           {"q4_k", FT_FORMAT_Q4_K},
                               {"q5_k", FT_FORMAT_Q5_K},     {"q6_k", FT_FORMAT_Q6_K},           {"iq4_xs", FT_FORMAT_IQ4_XS}};

// The profile's rows: every format, in FT_FORMAT_* order.
constexpr int32_t kFirstFormat = FT_FORMAT_BF16, kLastFormat = FT_FORMAT_IQ4_XS;

const char *format_label(int32_t f) {
    static const char *names[] = {"?",    "bf16", "fp8_block", "nvfp4", "mxfp4", "ds_fp4", "q4_0",
                                  "q8_0", "q2_k", "q3_k",      "q4_k",  "q5_k",  "q6_k",   "iq4_xs"};
    static_assert(sizeof names / sizeof names[0] == kLastFormat + 1, "a label per format");
    return f >= kFirstFormat && f <= kLastFormat ? names[f] : "?";
}

bool parse_formats(const std::string &list, uint32_t *mask) {
    *mask = 0;
    std::stringstream in(list);
    std::string item;
    while (std::getline(in, item, ',')) {
        if (item.empty()) continue;
        bool found = false;
        for (const FormatName &f : kFormats) {
            if (item == f.name) {
                *mask |= 1u << f.format;
                found = true;
            }
        }
        if (!found) {
            std::fprintf(stderr, "ft: unknown format '%s' in --formats (bf16, fp8_block, nvfp4, mxfp4, ds_fp4, q4_0, "
                                 "q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs)\n"
                                 "see 'ft profile --help'\n", item.c_str());
            return false;
        }
    }
    return true;
}

// One progress bar per phase ("read", "pcie", then each format), on standard error.
struct PhaseBars {
    std::string phase;
    std::unique_ptr<ProgressBar> bar;
};

bool on_progress(void *user, const char *phase, uint64_t done, uint64_t total) {
    auto *b = static_cast<PhaseBars *>(user);
    if (!b->bar || b->phase != phase) {
        if (b->bar) b->bar->finish();
        b->phase = phase;
        b->bar = std::make_unique<ProgressBar>(std::string("profile ") + phase);
    }
    b->bar->update(done, total);
    return true;
}

// The hit rate of the slot cache below which the CPU beats the best GPU-side backend for this
// format (the selector's step model: misses at the gather rate, or at the overlapped pair's sum
// for hybrid, hits at the GPU memory's rate); -1 without the figures.
double cpu_below_hit_rate(const ft_profile_format &e) {
    if (!(e.cpu_gbs > 0) || !(e.gather_gbs > 0)) return -1.0;
    const double miss_gbs = std::max(e.gather_gbs, e.cpu_overlap_gbs + e.gather_overlap_gbs);
    const double hbm = ft::kDefaultHbmGbs;
    if (miss_gbs >= e.cpu_gbs) return 0.0;
    return std::clamp((1.0 / miss_gbs - 1.0 / e.cpu_gbs) / (1.0 / miss_gbs - 1.0 / hbm), 0.0, 1.0);
}

std::string figure(double v, const char *fmt = "%.1f") {
    if (!(v > 0)) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, fmt, v);
    return buf;
}

// The profile as the table `ft profile` prints (and the verdicts of the file saved at `path`).
void print_profile_table(const ft_profile_machine &m, const std::vector<ft_profile_format> &rows, const std::string &path) {
    std::printf("cpu         %s, %d physical cores, %d threads measured\n", *m.cpu_model ? m.cpu_model : "unknown CPU",
                m.physical_cores, m.threads_used);
    std::printf("memory      %.1f GB/s read\n", m.cpu_read_gbs);
    if (*m.gpu_name)
        std::printf("gpu         %s: %.1f GB/s host-to-device, %.1f GB/s device-to-host (pinned)\n", m.gpu_name, m.h2d_gbs, m.d2h_gbs);
    else
        std::printf("gpu         none measured\n");
    // The verdicts as the saved file holds them (what the original engine reads too).
    ft::Profile saved;
    try {
        saved = ft::load_profile(path);
    } catch (const ft::Error &) {
    }
    std::printf("\n%-10s %9s %9s %9s %17s %6s %8s %8s %9s  %s\n", "format", "expert MB", "CPU GB/s", "gather", "overlap cpu+gather",
                "fetch", "vs read", "backend", "cpu if h<", "CPU kernel");
    for (const ft_profile_format &e : rows) {
        const std::string overlap = e.cpu_overlap_gbs > 0 && e.gather_overlap_gbs > 0
                                        ? figure(e.cpu_overlap_gbs) + " + " + figure(e.gather_overlap_gbs)
                                        : "-";
        const auto verdict = ft::backend_recommendation(saved, ft::profile_format_key(static_cast<ft::Format>(e.format)));
        const double below = cpu_below_hit_rate(e);
        std::printf("%-10s %9.2f %9s %9s %17s %6s %8s %8s %9s  %s\n", format_label(e.format), e.expert_bytes / 1e6,
                    figure(e.cpu_gbs).c_str(), figure(e.gather_gbs).c_str(), overlap.c_str(),
                    e.fetch_fraction >= 0 ? figure(e.fetch_fraction, "%.2f").c_str() : "-",
                    m.cpu_read_gbs > 0 && e.cpu_gbs > 0 ? figure(e.cpu_gbs / m.cpu_read_gbs, "%.2f").c_str() : "-",
                    verdict ? verdict->c_str() : (*m.gpu_name ? "-" : "cpu"),
                    below >= 0 ? (below > 0 ? figure(100 * below, "%.0f%%").c_str() : "never") : "-", e.cpu_kernel);
    }
    std::printf("\nbackend: hybrid when the CPU and the gather running together move missed experts faster than the\n"
                "          gather alone, else offload; without all experts on the GPU, `auto` also weighs the cpu,\n"
                "          which wins while the slot cache's hit rate h stays below 'cpu if h<'\n"
                "          (see ft_session_backend_reason)\n");
    std::printf("saved       %s\n", path.c_str());
}

// Draws the profile as SVG into o.plot; 1 if the file cannot be written.
int write_plot(const ProfileOptions &o, const ft_profile_machine &m, const std::vector<ft_profile_format> &rows) {
    PlotData d;
    d.title = std::string("FreeToken bandwidth profile: ") + (*m.cpu_model ? m.cpu_model : "CPU") + (*m.gpu_name ? std::string(", ") + m.gpu_name : "");
    d.read_gbs = m.cpu_read_gbs;
    d.h2d_gbs = m.h2d_gbs;
    d.d2h_gbs = m.d2h_gbs;
    for (const ft_profile_format &e : rows) {
        d.formats.push_back({format_label(e.format), e.cpu_gbs, e.gather_gbs, e.cpu_overlap_gbs, e.gather_overlap_gbs, e.fetch_fraction});
    }
    std::ofstream out(o.plot);
    out << render_svg(d);
    out.flush();
    if (!out) {
        std::fprintf(stderr, "ft: cannot write %s: %s\n", o.plot.c_str(), std::strerror(errno));
        return 1;
    }
    std::fprintf(o.json ? stderr : stdout, "plot        %s\n", o.plot.c_str());
    return 0;
}

}  // namespace

int cmd_profile(const ProfileOptions &o) {
    ft_profile_params p;
    ft_profile_params_init(&p);
    if (!parse_formats(o.formats, &p.formats)) return 2;
    p.cpu_threads = o.threads;
    p.max_seconds = o.seconds;
    if (o.no_gpu) p.device = FT_DEVICE_NONE;
    PhaseBars bars;
    p.progress = on_progress;
    p.progress_user_data = &bars;

    ft_profile *prof = nullptr;
    char err[1024];
    const ft_status s = ft_profile_bandwidth(&p, &prof, err, sizeof err);
    if (bars.bar) bars.bar->finish();
    if (s != FT_OK) {
        std::fprintf(stderr, "ft: profiling failed: %s: %s\n", ft_status_string(s), err);
        return 1;
    }
    std::unique_ptr<ft_profile, void (*)(ft_profile *)> guard(prof, ft_profile_free);

    const std::string path = o.out.empty() ? ft::default_profile_path() : o.out;
    if (ft_profile_save(prof, path.c_str(), err, sizeof err) != FT_OK) {
        std::fprintf(stderr, "ft: saving the profile failed: %s\n", err);
        return 1;
    }

    ft_profile_machine m;
    m.struct_size = sizeof m;
    ft_profile_get_machine(prof, &m);
    std::vector<ft_profile_format> rows;
    for (int32_t f = kFirstFormat; f <= kLastFormat; ++f) {
        ft_profile_format e;
        e.struct_size = sizeof e;
        if (ft_profile_get_format(prof, f, &e) == FT_OK) rows.push_back(e);
    }

    if (o.json) {
        // The saved file is the JSON: printing it keeps one writer.
        std::ifstream in(path);
        std::fputs(std::string(std::istreambuf_iterator<char>(in), {}).c_str(), stdout);
    } else {
        print_profile_table(m, rows, path);
    }

    if (!o.plot.empty() && write_plot(o, m, rows)) return 1;
    return 0;
}

ProfileStatus profile_status(const char *device_name, const std::vector<FormatShare> &shares) {
    ProfileStatus r;
    r.path = ft::default_profile_path();
    for (const FormatShare &f : shares) r.formats.push_back({f.format, f.share});
    ft_profile *prof = nullptr;
    char err[1024];
    const ft_status s = ft_profile_load(nullptr, &prof, err, sizeof err);
    if (s == FT_ERR_IO) {
        r.state = "none";
        return r;
    }
    if (s != FT_OK) {
        r.state = "unusable";
        r.detail = err;
        return r;
    }
    std::unique_ptr<ft_profile, void (*)(ft_profile *)> guard(prof, ft_profile_free);
    ft_profile_machine m;
    m.struct_size = sizeof m;
    ft_profile_get_machine(prof, &m);
    // A profile measured on another GPU does not apply; either name unknown means it does.
    if (*m.gpu_name && device_name && *device_name && std::strcmp(m.gpu_name, device_name) != 0) {
        r.state = "other_gpu";
        r.detail = std::string("measured on ") + m.gpu_name + ", this engine uses " + device_name;
        return r;
    }
    double seconds_per_byte = 0.0;
    bool all_cpu = true;
    r.state = "applies";
    for (ProfileFigures &f : r.formats) {
        ft_profile_format e;
        e.struct_size = sizeof e;
        if (ft_profile_get_format(prof, f.format, &e) != FT_OK) {
            r.state = "no_figures";
            all_cpu = false;
            continue;
        }
        f.measured = true;
        f.cpu_gbs = e.cpu_gbs;
        f.fetch_fraction = e.fetch_fraction;
        if (e.cpu_gbs > 0) seconds_per_byte += f.share / e.cpu_gbs;
        else all_cpu = false;
    }
    if (all_cpu && seconds_per_byte > 0) r.cpu_gbs = 1.0 / seconds_per_byte;
    if (r.formats.size() == 1) r.fetch_fraction = r.formats[0].fetch_fraction;
    return r;
}

std::string profile_text(const ProfileStatus &p) {
    if (p.state == "none") return "none at " + p.path + " (`ft profile` measures this machine)";
    if (p.state == "unusable") return p.path + " is not usable: " + p.detail;
    if (p.state == "other_gpu") return p.path + " ignored: " + p.detail;
    const bool mixed = p.formats.size() > 1;
    std::string mix;  // "q4_k 77% + q6_k 23% of the expert bytes"
    for (const ProfileFigures &f : p.formats)
        mix += (mix.empty() ? "" : " + ") + std::string(format_label(f.format)) + " " + figure(100 * f.share, "%.0f%%");
    mix += " of the expert bytes";
    if (p.state == "no_figures") {
        std::string missing;
        for (const ProfileFigures &f : p.formats)
            if (!f.measured) missing += (missing.empty() ? "" : ", ") + std::string(format_label(f.format));
        return p.path + " applies, but has no figures for " + missing + (mixed ? " (the model: " + mix + ")" : "");
    }
    if (!mixed) {
        std::string t = p.path + ": " + format_label(p.formats[0].format) + " CPU " + figure(p.cpu_gbs) + " GB/s";
        if (p.fetch_fraction >= 0) t += ", hybrid fetch fraction " + figure(p.fetch_fraction, "%.2f");
        return t;
    }
    // A mix: the blended rate, then each format's own figures.
    std::string t = p.path + ": " + mix + ": CPU " + figure(p.cpu_gbs) + " GB/s blended (";
    std::string fetch;
    for (size_t i = 0; i < p.formats.size(); ++i) {
        const ProfileFigures &f = p.formats[i];
        t += (i ? ", " : "") + std::string(format_label(f.format)) + " " + figure(f.cpu_gbs);
        if (f.fetch_fraction >= 0)
            fetch += (fetch.empty() ? "" : ", ") + std::string(format_label(f.format)) + " " + figure(f.fetch_fraction, "%.2f");
    }
    t += ")";
    if (!fetch.empty()) t += ", hybrid fetch fraction " + fetch;
    return t;
}

}  // namespace ft::tool
