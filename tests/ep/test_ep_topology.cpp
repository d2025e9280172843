// The sysfs side of the EP topology probe against a fake /sys tree: bus id spelling, link speed
// and width parsing, absent or odd files as unknown, and the PCIe payload bandwidth.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "ft/ep_topology.hpp"

namespace {

namespace fs = std::filesystem;
using namespace ft::ep;

class FakeSys {
public:
    FakeSys() {
        root_ = fs::temp_directory_path() / ("ft_ep_topology_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(root_);
        fs::create_directories(root_);
    }
    ~FakeSys() {
        std::error_code ec;
        fs::remove_all(root_, ec);
    }
    void write(const std::string &bus_id, const std::string &file, const std::string &text) {
        const fs::path dir = root_ / "bus/pci/devices" / bus_id;
        fs::create_directories(dir);
        std::ofstream(dir / file) << text;
    }
    std::string root() const { return root_.string(); }

private:
    fs::path root_;
};

TEST(EpTopology, NormalisesBusIds) {
    EXPECT_EQ(normalize_pci_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
    EXPECT_EQ(normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
    EXPECT_EQ(normalize_pci_bus_id("0001:c1:1f.7"), "0001:c1:1f.7");
    EXPECT_EQ(normalize_pci_bus_id("0:3:0.1"), "0000:03:00.1");
    EXPECT_EQ(normalize_pci_bus_id("00010000:3B:00.0"), "");  // domain wider than 4 digits
    EXPECT_EQ(normalize_pci_bus_id("0000:3G:00.0"), "");
    EXPECT_EQ(normalize_pci_bus_id("0000:3b:00"), "");
    EXPECT_EQ(normalize_pci_bus_id(""), "");
}

TEST(EpTopology, ParsesLinkSpeeds) {
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("16.0 GT/s PCIe"), 16.0);
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("32.0 GT/s PCIe"), 32.0);
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("8 GT/s"), 8.0);
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("2.5 GT/s"), 2.5);
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("Unknown"), 0.0);
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("Unknown speed"), 0.0);
    EXPECT_DOUBLE_EQ(parse_link_speed_gts("16"), 0.0);  // no unit
    EXPECT_DOUBLE_EQ(parse_link_speed_gts(""), 0.0);
}

TEST(EpTopology, ReadsAFakeSysTree) {
    FakeSys sys;
    sys.write("0000:3b:00.0", "numa_node", "1\n");
    sys.write("0000:3b:00.0", "current_link_speed", "16.0 GT/s PCIe\n");
    sys.write("0000:3b:00.0", "current_link_width", "16\n");
    // CUDA's spelling of the same device finds the lower-case sysfs folder.
    PciLink l = read_pci_link(sys.root(), "00000000:3B:00.0");
    EXPECT_EQ(l.numa_node, 1);
    EXPECT_DOUBLE_EQ(l.speed_gts, 16.0);
    EXPECT_EQ(l.width, 16);
    EXPECT_EQ(describe_pci_link("0000:3b:00.0", l), "0000:3b:00.0 numa 1 PCIe 16 GT/s x16");

    // The kernel's "no NUMA information" and an unknown width: both unknown.
    sys.write("0000:5e:00.0", "numa_node", "-1\n");
    sys.write("0000:5e:00.0", "current_link_speed", "Unknown\n");
    sys.write("0000:5e:00.0", "current_link_width", "0\n");
    l = read_pci_link(sys.root(), "0000:5E:00.0");
    EXPECT_EQ(l.numa_node, -1);
    EXPECT_DOUBLE_EQ(l.speed_gts, 0.0);
    EXPECT_EQ(l.width, 0);
    EXPECT_EQ(describe_pci_link("0000:5e:00.0", l), "0000:5e:00.0 numa ? PCIe ? GT/s x?");

    // Only some files present; a missing device; a bad id.
    sys.write("0000:af:00.0", "current_link_width", "8");
    l = read_pci_link(sys.root(), "0000:af:00.0");
    EXPECT_EQ(l.numa_node, -1);
    EXPECT_DOUBLE_EQ(l.speed_gts, 0.0);
    EXPECT_EQ(l.width, 8);
    l = read_pci_link(sys.root(), "0000:01:00.0");
    EXPECT_EQ(l.numa_node, -1);
    EXPECT_EQ(l.width, 0);
    l = read_pci_link(sys.root(), "not a bus id");
    EXPECT_EQ(l.numa_node, -1);
    sys.write("0000:02:00.0", "numa_node", "zero\n");
    sys.write("0000:02:00.0", "current_link_width", "255\n");
    l = read_pci_link(sys.root(), "0000:02:00.0");
    EXPECT_EQ(l.numa_node, -1);
    EXPECT_EQ(l.width, 0);
}

TEST(EpTopology, PayloadBandwidthOfALink) {
    // Gen4 x16: 16 GT/s * 128/130 / 8 * 16 = 31.5 GB/s; Gen3 x8 7.88 GB/s; Gen2 x16 8 GB/s (8b/10b).
    EXPECT_NEAR(pcie_link_bytes_per_s(16, 16), 31.508e9, 0.01e9);
    EXPECT_NEAR(pcie_link_bytes_per_s(8, 8), 7.877e9, 0.01e9);
    EXPECT_NEAR(pcie_link_bytes_per_s(5, 16), 8.0e9, 0.01e9);
    EXPECT_EQ(pcie_link_bytes_per_s(0, 16), 0.0);
    EXPECT_EQ(pcie_link_bytes_per_s(16, 0), 0.0);
}

}  // namespace
