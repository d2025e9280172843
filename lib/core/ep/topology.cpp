// sysfs side of the EP topology probe (ft/ep_topology.hpp).
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "ft/common.hpp"
#include "ft/ep_topology.hpp"

namespace ft::ep {

namespace {

bool read_first_line(const std::string &path, std::string &out) {
    std::ifstream f(path);
    if (!f) return false;
    if (!std::getline(f, out)) return false;
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
    return true;
}

bool all_hex(const std::string &s) {
    if (s.empty()) return false;
    for (char c : s)
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    return true;
}

}  // namespace

std::string normalize_pci_bus_id(const std::string &bus_id) {
    // domain:bus:device.function, hex; CUDA may print an 8-digit domain, sysfs uses 4.
    const size_t c1 = bus_id.find(':'), c2 = bus_id.find(':', c1 == std::string::npos ? 0 : c1 + 1);
    const size_t dot = bus_id.find('.', c2 == std::string::npos ? 0 : c2 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos || dot == std::string::npos) return "";
    std::string dom = bus_id.substr(0, c1), bus = bus_id.substr(c1 + 1, c2 - c1 - 1),
                dev = bus_id.substr(c2 + 1, dot - c2 - 1), fn = bus_id.substr(dot + 1);
    if (!all_hex(dom) || !all_hex(bus) || !all_hex(dev) || !all_hex(fn) || bus.size() > 2 || dev.size() > 2 ||
        fn.size() != 1)
        return "";
    while (dom.size() > 4 && dom[0] == '0') dom.erase(0, 1);
    if (dom.size() > 4) return "";
    auto pad = [](std::string s, size_t n) { return std::string(n - s.size(), '0') + s; };
    std::string out = pad(dom, 4) + ":" + pad(bus, 2) + ":" + pad(dev, 2) + "." + fn;
    for (char &c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

double parse_link_speed_gts(const std::string &text) {
    const char *s = text.c_str();
    char *end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s || !(v > 0) || v > 1000) return 0;
    // The unit must follow: "GT/s" (sysfs) after optional spaces.
    while (*end == ' ') ++end;
    if (std::string(end).rfind("GT/s", 0) != 0) return 0;
    return v;
}

PciLink read_pci_link(const std::string &sys_root, const std::string &bus_id) {
    PciLink link;
    const std::string id = normalize_pci_bus_id(bus_id);
    if (id.empty()) return link;
    const std::string dir = sys_root + "/bus/pci/devices/" + id + "/";
    std::string line;
    if (read_first_line(dir + "numa_node", line)) {
        char *end = nullptr;
        const long v = std::strtol(line.c_str(), &end, 10);
        if (end != line.c_str() && *end == '\0' && v >= -1 && v < 4096) link.numa_node = static_cast<int32_t>(v);
    }
    if (read_first_line(dir + "current_link_speed", line)) link.speed_gts = parse_link_speed_gts(line);
    if (read_first_line(dir + "current_link_width", line)) {
        char *end = nullptr;
        const long v = std::strtol(line.c_str(), &end, 10);
        // The kernel reports 0 (and some bridges 255) when the width is not known.
        if (end != line.c_str() && *end == '\0' && v > 0 && v <= 32) link.width = static_cast<int32_t>(v);
    }
    return link;
}

double pcie_link_bytes_per_s(double speed_gts, int32_t width) {
    if (!(speed_gts > 0) || width <= 0) return 0;
    const double code = speed_gts < 8 ? 8.0 / 10.0 : 128.0 / 130.0;
    return speed_gts * 1e9 * code / 8.0 * width;
}

std::string describe_pci_link(const std::string &bus_id, const PciLink &link) {
    std::ostringstream o;
    o << (bus_id.empty() ? "unknown bus id" : bus_id) << " numa ";
    if (link.numa_node >= 0)
        o << link.numa_node;
    else
        o << "?";
    o << " PCIe ";
    if (link.speed_gts > 0)
        o << link.speed_gts << " GT/s";
    else
        o << "? GT/s";
    o << " x";
    if (link.width > 0)
        o << link.width;
    else
        o << "?";
    return o.str();
}

}  // namespace ft::ep
