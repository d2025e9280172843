// The EP group's topology probe (ft/ep_probe.hpp).
#include <algorithm>
#include <cstring>
#include <sstream>

#include "ft/common.hpp"
#include "ft/ep_probe.hpp"

namespace ft::ep::cuda {

namespace {

constexpr size_t kBusIdBytes = 32;

// Device scratch freed on scope exit (the probe runs once, at creation).
struct Scratch {
    void *p = nullptr;
    explicit Scratch(size_t bytes, const char *what) { check_cuda(cudaMalloc(&p, std::max<size_t>(bytes, 1)), what); }
    ~Scratch() { cudaFree(p); }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
};

struct StreamEvents {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    StreamEvents() {
        check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "EP probe stream");
        check_cuda(cudaEventCreate(&start), "EP probe event");
        check_cuda(cudaEventCreate(&stop), "EP probe event");
    }
    ~StreamEvents() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        cudaStreamDestroy(stream);
    }
};

// Every rank's bus id, through the transport (device memory, as NCCL wants).
std::vector<std::string> gather_bus_ids(Transport &net, const std::string &mine, cudaStream_t st) {
    const int32_t R = net.size();
    char local[kBusIdBytes] = {};
    std::strncpy(local, mine.c_str(), kBusIdBytes - 1);
    Scratch send(kBusIdBytes, "EP probe bus ids"), recv(kBusIdBytes * R, "EP probe bus ids");
    check_cuda(cudaMemcpyAsync(send.p, local, kBusIdBytes, cudaMemcpyHostToDevice, st), "EP probe bus ids");
    net.all_gather(send.p, recv.p, kBusIdBytes, st);
    std::vector<char> all(kBusIdBytes * R);
    check_cuda(cudaMemcpyAsync(all.data(), recv.p, all.size(), cudaMemcpyDeviceToHost, st), "EP probe bus ids");
    check_cuda(cudaStreamSynchronize(st), "EP probe bus ids");
    std::vector<std::string> out;
    for (int32_t r = 0; r < R; ++r) {
        const char *s = all.data() + kBusIdBytes * r;
        out.emplace_back(s, strnlen(s, kBusIdBytes));
    }
    return out;
}

// One grouped exchange of `per_peer` bytes with every peer, timed on the stream; then the
// minimum rate over ranks (all-gathered) so every rank derives the same chunk plan.
void calibrate(Transport &net, size_t total, RankTopology &t, cudaStream_t st, cudaEvent_t start, cudaEvent_t stop) {
    const int32_t R = net.size(), me = net.rank();
    if (R < 2 || total == 0) return;
    const size_t per_peer = std::max<size_t>((total / (R - 1)) / 256 * 256, 256);
    Scratch send(per_peer * R, "EP calibration buffers"), recv(per_peer * R, "EP calibration buffers");
    check_cuda(cudaMemsetAsync(send.p, 0, per_peer * R, st), "EP calibration buffers");
    std::vector<PeerRange> ranges(R);
    auto set = [&](size_t bytes) {
        for (int32_t p = 0; p < R; ++p) {
            const size_t b = p == me ? 0 : bytes;
            ranges[p] = {per_peer * p, b, per_peer * p, b};
        }
    };
    set(std::min<size_t>(per_peer, 1 << 20));  // warm-up: connections and NCCL's first-use setup
    net.exchange(send.p, recv.p, ranges.data(), st);
    set(per_peer);
    check_cuda(cudaEventRecord(start, st), "EP calibration event");
    net.exchange(send.p, recv.p, ranges.data(), st);
    check_cuda(cudaEventRecord(stop, st), "EP calibration event");
    check_cuda(cudaEventSynchronize(stop), "EP calibration exchange");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "EP calibration timing");
    t.calibration_seconds = ms * 1e-3;
    const double mine = ms > 0 ? static_cast<double>(per_peer) / (ms * 1e-3) : 0;
    Scratch rs(sizeof(double), "EP calibration rates"), rr(sizeof(double) * R, "EP calibration rates");
    check_cuda(cudaMemcpyAsync(rs.p, &mine, sizeof mine, cudaMemcpyHostToDevice, st), "EP calibration rates");
    net.all_gather(rs.p, rr.p, sizeof(double), st);
    std::vector<double> rates(R);
    check_cuda(cudaMemcpyAsync(rates.data(), rr.p, sizeof(double) * R, cudaMemcpyDeviceToHost, st), "EP calibration rates");
    check_cuda(cudaStreamSynchronize(st), "EP calibration rates");
    double lo = 0;
    for (double v : rates)
        if (v > 0 && (lo == 0 || v < lo)) lo = v;
    t.calibrated_bytes_per_s = lo;
}

}  // namespace

RankTopology probe_topology(Transport &net, int32_t device, size_t calibration_bytes, const std::string &sys_root) {
    RankTopology t;
    t.device = device;
    const int32_t R = net.size();
    char bus[64] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess) t.bus_id = normalize_pci_bus_id(bus);
    cudaGetLastError();  // a failed query is an unknown, not a sticky error for the next call
    if (!t.bus_id.empty()) t.link = read_pci_link(sys_root, t.bus_id);
    StreamEvents se;
    t.peer_bus = gather_bus_ids(net, t.bus_id, se.stream);
    for (int32_t r = 0; r < R && r < 64; ++r) {
        const uint64_t bit = uint64_t(1) << r;
        if (r == net.rank()) {
            t.p2p_known |= bit;
            t.p2p_mask |= bit;
            continue;
        }
        int peer = -1;
        if (t.peer_bus[r].empty() || cudaDeviceGetByPCIBusId(&peer, t.peer_bus[r].c_str()) != cudaSuccess) {
            cudaGetLastError();
            continue;  // another host or not visible here: unknown
        }
        int can = 0;
        if (peer == device) {
            can = 1;  // ranks sharing one GPU (tests): the memory is the GPU's own
        } else if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        t.p2p_known |= bit;
        if (can) t.p2p_mask |= bit;
    }
    calibrate(net, calibration_bytes, t, se.stream, se.start, se.stop);
    return t;
}

std::string describe(const RankTopology &t, int32_t rank) {
    std::ostringstream o;
    o << "EP rank " << rank << ": device " << t.device << " " << describe_pci_link(t.bus_id, t.link);
    const double bound = pcie_link_bytes_per_s(t.link.speed_gts, t.link.width);
    if (bound > 0) o << " (" << bound / 1e9 << " GB/s payload bound)";
    o << "; P2P to ranks";
    for (size_t r = 0; r < t.peer_bus.size() && r < 64; ++r) {
        const uint64_t bit = uint64_t(1) << r;
        o << " " << r << ":" << (!(t.p2p_known & bit) ? "?" : (t.p2p_mask & bit) ? "yes" : "no");
    }
    if (t.calibrated_bytes_per_s > 0)
        o << "; calibrated " << t.calibrated_bytes_per_s / 1e9 << " GB/s per peer (min over ranks; this rank "
          << t.calibration_seconds * 1e3 << " ms)";
    else
        o << "; not calibrated";
    return o.str();
}

}  // namespace ft::ep::cuda
