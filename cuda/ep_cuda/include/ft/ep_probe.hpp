// Topology probe at EP group creation (issue 7 item 4): this rank's GPU on PCIe (bus id, NUMA
// node, current link generation and width from sysfs), the P2P status towards every other rank's
// GPU, and a short bandwidth calibration through the group's own transport that feeds the chunk
// plan instead of a constant. Collective: every rank of the transport calls it together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ft/ep_cuda.hpp"
#include "ft/ep_topology.hpp"

namespace ft::ep::cuda {

struct RankTopology {
    int32_t device = -1;
    std::string bus_id;                 // normalised ("0000:3b:00.0"), "" unknown
    PciLink link;                       // this GPU's link (unknown fields as in PciLink)
    std::vector<std::string> peer_bus;  // [ranks] every rank's bus id (all-gathered)
    // bit r: the P2P status towards rank r is known (rank r's GPU is visible to this process)
    // and, in p2p_mask, cudaDeviceCanAccessPeer says yes. The own bit is set in both.
    uint64_t p2p_known = 0, p2p_mask = 0;
    // Per-peer payload rate of the calibration exchange, the minimum over ranks (so every rank
    // plans the same chunks); 0 when not measured (one rank, or calibration off).
    double calibrated_bytes_per_s = 0;
    double calibration_seconds = 0;  // this rank's timed exchange
};

// calibration_bytes: bytes each rank sends in the timed exchange, split evenly over its peers
// (0: no calibration). sys_root: "/sys" outside tests. Needs the rank's device current.
RankTopology probe_topology(Transport &net, int32_t device, size_t calibration_bytes,
                            const std::string &sys_root = "/sys");

std::string describe(const RankTopology &t, int32_t rank);

}  // namespace ft::ep::cuda
