#include "plot.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace ft::tool {

namespace {

// One colour per expert format (13), so no two formats of a full profile share one.
const char *kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
                         "#5254a3", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39"};
constexpr size_t kNumColors = sizeof kColors / sizeof kColors[0];

std::string escape(const std::string &s) {
    std::string out;
    for (char c : s) {
        if (c == '&') out += "&amp;";
        else if (c == '<') out += "&lt;";
        else if (c == '>') out += "&gt;";
        else if (c == '"') out += "&quot;";
        else out += c;
    }
    return out;
}

std::string num(double v, const char *fmt = "%.1f") {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return buf;
}

std::string text(double x, double y, const std::string &s, const char *extra = "") {
    return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + extra + ">" + escape(s) + "</text>\n";
}

// The pair the fetch fraction is chosen from: overlapped figures when both exist (they include
// the two sides' contention for DRAM), else the standalone ones.
bool curve_rates(const PlotFormat &f, double *cpu, double *gather) {
    if (f.cpu_overlap_gbs > 0 && f.gather_overlap_gbs > 0) {
        *cpu = f.cpu_overlap_gbs;
        *gather = f.gather_overlap_gbs;
        return true;
    }
    *cpu = f.cpu_gbs;
    *gather = f.gather_gbs;
    return f.cpu_gbs > 0 && f.gather_gbs > 0;
}

}  // namespace

double step_seconds_per_gb(double f, double cpu_gbs, double gather_gbs) {
    return std::max(f / gather_gbs, (1.0 - f) / cpu_gbs);
}

namespace {

struct Bar {
    std::string label;
    double gbs;
    const char *color;
};

// Every bandwidth of the profile: the machine's three, then each format's CPU and gather figures.
std::vector<Bar> bandwidth_bars(const PlotData &d) {
    std::vector<Bar> bars = {{"CPU read", d.read_gbs, "#555555"}, {"H2D pinned", d.h2d_gbs, "#888888"}, {"D2H pinned", d.d2h_gbs, "#aaaaaa"}};
    for (size_t i = 0; i < d.formats.size(); ++i) {
        const char *c = kColors[i % kNumColors];
        bars.push_back({d.formats[i].name + " CPU", d.formats[i].cpu_gbs, c});
        if (d.formats[i].gather_gbs > 0) bars.push_back({d.formats[i].name + " gather", d.formats[i].gather_gbs, c});
    }
    return bars;
}

// The bars, one `row` apart from bars_top down, scaled to the largest.
std::string bars_svg(const std::vector<Bar> &bars, double bars_top, double row) {
    const double bar_x = 170, bar_w = 480;
    double max_gbs = 1e-9;
    for (const Bar &b : bars) max_gbs = std::max(max_gbs, b.gbs);
    std::string s;
    for (size_t i = 0; i < bars.size(); ++i) {
        const double y = bars_top + row * i;
        s += text(10, y + 15, bars[i].label);
        if (bars[i].gbs > 0) {
            const double w = bar_w * bars[i].gbs / max_gbs;
            s += "<rect x=\"" + num(bar_x) + "\" y=\"" + num(y + 3) + "\" width=\"" + num(w) + "\" height=\"" + num(row - 6) +
                 "\" fill=\"" + bars[i].color + "\"/>\n";
            s += text(bar_x + w + 6, y + 15, num(bars[i].gbs));
        } else {
            s += text(bar_x, y + 15, "not measured", " fill=\"#999999\"");
        }
    }
    return s;
}

// The step-time chart from chart_top down (chart_h high): one curve per format with both a CPU and
// a gather figure, or a note saying why there is none.
std::string curves_svg(const PlotData &d, double chart_top, double chart_h) {
    std::string s;
    s += text(10, chart_top - 12, "Predicted MoE step time against the fetch fraction f (share of misses fetched over PCIe)",
              " font-weight=\"bold\"");
    std::vector<size_t> curves;
    double ymax = 0;
    for (size_t i = 0; i < d.formats.size(); ++i) {
        double c, g;
        if (!curve_rates(d.formats[i], &c, &g)) continue;
        curves.push_back(i);
        ymax = std::max({ymax, step_seconds_per_gb(0.0, c, g), step_seconds_per_gb(1.0, c, g),
                         d.formats[i].gather_gbs > 0 ? 1.0 / d.formats[i].gather_gbs : 0.0});
    }
    if (curves.empty()) {
        s += text(10, chart_top + 20, "No curve: no format has both a CPU and a gather figure.", " fill=\"#aa0000\"");
        s += text(10, chart_top + 38, "The profile was measured without a GPU (--no-gpu, no device, or a build without CUDA), so",
                  " fill=\"#aa0000\"");
        s += text(10, chart_top + 56, "it has no gather bandwidth and no fetch fraction; the step time t(f) = max(f B / gather,",
                  " fill=\"#aa0000\"");
        s += text(10, chart_top + 74, "(1 - f) B / cpu) cannot be predicted.", " fill=\"#aa0000\"");
        return s;
    }
    const double x0 = 70, x1 = 620, y0 = chart_top + chart_h, y1 = chart_top + 10;
    ymax *= 1e3 * 1.05;  // ms per GB, with headroom
    auto X = [&](double f) { return x0 + (x1 - x0) * f; };
    auto Y = [&](double ms) { return y0 - (y0 - y1) * ms / ymax; };
    s += "<line x1=\"" + num(x0) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x1) + "\" y2=\"" + num(y0) + "\" stroke=\"black\"/>\n";
    s += "<line x1=\"" + num(x0) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x0) + "\" y2=\"" + num(y1) + "\" stroke=\"black\"/>\n";
    for (int t = 0; t <= 4; ++t) {
        const double f = t / 4.0, ms = ymax * t / 4.0;
        s += text(X(f) - 10, y0 + 16, num(f, "%.2f"));
        s += text(8, Y(ms) + 4, num(ms, "%.0f"));
    }
    s += text((x0 + x1) / 2 - 60, y0 + 34, "fetch fraction f");
    s += text(8, y1 - 2, "ms per GB of misses");
    for (size_t n = 0; n < curves.size(); ++n) {
        const PlotFormat &f = d.formats[curves[n]];
        const char *color = kColors[curves[n] % kNumColors];
        double c, g;
        curve_rates(f, &c, &g);
        std::string pts;
        for (int i = 0; i <= 100; ++i) {
            const double fr = i / 100.0;
            pts += num(X(fr)) + "," + num(Y(step_seconds_per_gb(fr, c, g) * 1e3)) + " ";
        }
        s += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
        // Offload: every miss fetched by the gather alone (no CPU beside it), for comparison.
        if (f.gather_gbs > 0) {
            const double yo = Y(1e3 / f.gather_gbs);
            s += "<line x1=\"" + num(x0) + "\" y1=\"" + num(yo) + "\" x2=\"" + num(x1) + "\" y2=\"" + num(yo) + "\" stroke=\"" + color +
                 "\" stroke-dasharray=\"6,4\"/>\n";
        }
        if (f.fetch_fraction >= 0) {
            const double fr = f.fetch_fraction;
            s += "<circle cx=\"" + num(X(fr)) + "\" cy=\"" + num(Y(step_seconds_per_gb(fr, c, g) * 1e3)) + "\" r=\"5\" fill=\"" + color +
                 "\"/>\n";
        }
        s += "<line x1=\"640\" y1=\"" + num(y1 + 10 + 18 * n) + "\" x2=\"660\" y2=\"" + num(y1 + 10 + 18 * n) + "\" stroke=\"" + color +
             "\" stroke-width=\"2\"/>\n";
        s += text(665, y1 + 14 + 18 * n, f.name + (f.fetch_fraction >= 0 ? " f=" + num(f.fetch_fraction, "%.2f") : ""));
    }
    s += text(10, y0 + 58, "t(f) = max(f B / gather, (1 - f) B / cpu); dots: the fetch fraction the profile chooses;",
              " fill=\"#555555\"");
    s += text(10, y0 + 74, "dashed: offload (all misses by the gather alone). Hybrid wins where its dot lies below the dashes.",
              " fill=\"#555555\"");
    return s;
}

}  // namespace

std::string render_svg(const PlotData &d) {
    const std::vector<Bar> bars = bandwidth_bars(d);
    const double W = 760, row = 24, bars_top = 60;
    const double chart_top = bars_top + row * bars.size() + 40, chart_h = 260;
    const double H = chart_top + chart_h + 106;
    std::string s;
    s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W, "%.0f") + "\" height=\"" + num(H, "%.0f") +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    s += text(10, 22, d.title, " font-size=\"15\" font-weight=\"bold\"");
    s += text(10, 44, "Bandwidths (GB/s = 1e9 B/s)", " font-weight=\"bold\"");
    s += bars_svg(bars, bars_top, row);
    s += curves_svg(d, chart_top, chart_h);
    s += "</svg>\n";
    return s;
}

}  // namespace ft::tool
