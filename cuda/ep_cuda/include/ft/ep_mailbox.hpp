// A Transport through mailboxes in pinned host memory, for the GPUs of one process that have no
// peer-to-peer path (PCIe consumer cards, or NCCL_P2P_DISABLE=1), built for decode-size steps.
//
// Why: at 1..64 tokens a latency-mode EP step is two small exchanges, and NCCL's grouped
// send/recv through its SHM transport costs ~25 us each on an H200 pair however few bytes move
// (its proxy thread and staging buffers), more than a bf16 all-gather + reduce-scatter of the
// whole batch. Here one kernel per exchange on the caller's stream does the whole exchange:
// it writes this rank's messages straight into the receivers' mailboxes (GPU stores over PCIe
// into mapped host memory), raises a flag per receiver, waits for the flags of the ranks it
// expects bytes from, and copies their messages out. No host thread, no host synchronisation, so
// a CUDA graph can hold it.
//
// Protocol (all words in mapped host memory, one 128-byte line each):
//   - every rank counts its exchanges in a device word; all ranks make the same sequence of
//     calls (the Transport contract), so exchange n has the same number s on every rank;
//   - the message of src for dst in exchange s lives in box (src, dst, s % 2);
//   - ready[dst][src] = s once src's messages of exchange s are written (fenced first);
//   - done[src][dst] = s once dst has finished exchange s (read everything it expected);
//   - before writing box (src, dst, s % 2) a sender waits for done[src][dst] >= s - 2, the last
//     exchange that used the same box.
// Each wait gives up after a timeout (create_local's argument, else FT_EP_MAILBOX_TIMEOUT_MS, else
// 10 s): the kernel then
// marks the group faulted and returns without copying, so a missing peer never hangs the GPU;
// every later call fails with FT_ERR_DEVICE.
//
// Limits: ranks in one process (cross-process mailboxes would need shared memory registered with
// CUDA; not built), at most kMaxMailboxRanks, each message of a pair at most max_message_bytes.
// Each rank's stream must progress independently of the others': a single stream serialising all
// ranks (the one-thread test driver) would make a rank's exchange wait for a kernel queued behind
// it, and time out.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ft/ep_cuda.hpp"

namespace ft::ep::cuda {

inline constexpr int32_t kMaxMailboxRanks = 16;

class HostMailboxTransport : public Transport {
public:
    // One transport per entry of `devices` (rank i on devices[i]), sharing one pinned mapping.
    // max_message_bytes: the largest range one rank sends another in one exchange (a latency-mode
    // EpRank needs latency_peer_bytes(H, K, dtype, max_tokens) and max_tokens * H * 2).
    // timeout_ms: how long a wait for a peer may last; 0 = FT_EP_MAILBOX_TIMEOUT_MS or 10000.
    static std::vector<std::unique_ptr<HostMailboxTransport>> create_local(const std::vector<int32_t> &devices,
                                                                           size_t max_message_bytes,
                                                                           uint32_t timeout_ms = 0);
    ~HostMailboxTransport() override;
    HostMailboxTransport(const HostMailboxTransport &) = delete;
    HostMailboxTransport &operator=(const HostMailboxTransport &) = delete;

    int32_t rank() const override { return rank_; }
    int32_t size() const override { return size_; }
    void all_gather(const void *send, void *recv, size_t bytes, cudaStream_t stream) override;
    void exchange(const void *send, void *recv, const PeerRange *ranges, cudaStream_t stream) override;
    std::string describe() const override;

    size_t max_message_bytes() const;
    // True once any exchange of the group timed out waiting for a peer (read from host memory).
    bool faulted() const;

    struct Shared;  // the pinned mapping and its geometry (ep_mailbox.cu)

private:
    HostMailboxTransport(std::shared_ptr<Shared> shared, int32_t rank, int32_t device);

    std::shared_ptr<Shared> shared_;
    int32_t rank_ = 0, size_ = 0, device_ = 0;
    void *counters_ = nullptr;  // device: exchange count, block arrival counters
};

}  // namespace ft::ep::cuda
