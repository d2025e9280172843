// The SVG of `ft profile --plot`: the measured bandwidths as bars and, per format with both CPU
// and gather figures, the predicted step time against the fetch fraction. Hand-written SVG, no
// dependencies.
#pragma once

#include <string>
#include <vector>

namespace ft::tool {

struct PlotFormat {
    std::string name;
    double cpu_gbs = 0, gather_gbs = 0;          // standalone; 0: not measured
    double cpu_overlap_gbs = 0, gather_overlap_gbs = 0;  // both running; 0: not measured
    double fetch_fraction = -1;                  // the profile's choice; -1: none
};

struct PlotData {
    std::string title;
    double read_gbs = 0, h2d_gbs = 0, d2h_gbs = 0;
    std::vector<PlotFormat> formats;
};

// The step time of a layer whose misses are B bytes when a fraction f of them is fetched over
// PCIe at `gather` GB/s and the rest computed by the CPU at `cpu` GB/s, both at once:
// max(f B / gather, (1 - f) B / cpu). Seconds per GB of misses.
double step_seconds_per_gb(double f, double cpu_gbs, double gather_gbs);

std::string render_svg(const PlotData &d);

}  // namespace ft::tool
