// Host side of the EP topology probe (issue 7 item 4): where a GPU sits on PCIe, read from
// sysfs. Kept apart from the CUDA calls so the parsing is tested on the CPU against a fake root.
#pragma once

#include <cstdint>
#include <string>

namespace ft::ep {

struct PciLink {
    int32_t numa_node = -1;   // -1: unknown (absent file, or the kernel's own -1)
    double speed_gts = 0;     // current link speed per lane in GT/s; 0: unknown
    int32_t width = 0;        // current lanes; 0: unknown
};

// "00000000:3B:00.0" / "0000:3B:00.0" -> "0000:3b:00.0" (lower case, 4-digit domain), the name
// of the device's folder under /sys/bus/pci/devices. "" for text that is not a bus id.
std::string normalize_pci_bus_id(const std::string &bus_id);

// "16.0 GT/s PCIe" -> 16; "8 GT/s" -> 8; "2.5 GT/s" -> 2.5; "Unknown" or garbage -> 0.
double parse_link_speed_gts(const std::string &text);

// <sys_root>/bus/pci/devices/<bus id>/{numa_node,current_link_speed,current_link_width}; each
// absent or unreadable file leaves its field unknown. sys_root is "/sys" outside tests.
PciLink read_pci_link(const std::string &sys_root, const std::string &bus_id);

// Payload bandwidth of one direction of a link of that speed and width, in bytes/s, after the
// line code (8b/10b up to 5 GT/s, 128b/130b from 8 GT/s); 0 when either is unknown. An upper
// bound: packet headers and flow control take another 10-20 %.
double pcie_link_bytes_per_s(double speed_gts, int32_t width);

// One line for logs: "0000:3b:00.0 numa 0 PCIe 16 GT/s x16".
std::string describe_pci_link(const std::string &bus_id, const PciLink &link);

}  // namespace ft::ep
