// Test double of the EP Transport: R ranks simulated on ONE GPU, the exchange done by device
// copies between the ranks' buffers. Never shipped as a transport; it stands where NCCL stands in
// production, behind the same interface, so the EP code under test is the code that ships.
//
// Two ways to drive it:
//  - threaded: one host thread per rank, each with its own streams. A collective blocks until every
//    rank has posted it; the last poster's stream waits for every poster's stream (events), does
//    all the copies, and every rank's stream then waits for those copies.
//  - single-threaded: one thread calls the ranks in turn, all on ONE stream (needed for a graph
//    capture that spans every rank). A collective's copies are enqueued when its last rank posts;
//    the driver must post every rank's half of a collective before enqueueing work that needs it.
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ft/ep_cuda.hpp"

namespace ft::test {

class SimHub {
public:
    SimHub(int32_t ranks, bool threaded) : ranks_(ranks), threaded_(threaded), posts_(ranks), posted_(ranks) {
        events_.resize(ranks);
        for (cudaEvent_t &e : events_) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    }
    ~SimHub() {
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
        cudaEventDestroy(done_);
    }
    SimHub(const SimHub &) = delete;
    SimHub &operator=(const SimHub &) = delete;

    // A rank that failed will never post again: wake everyone waiting so they fail too.
    void abort(const std::string &why) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (error_.empty()) error_ = why;
        cv_.notify_all();
    }

    int32_t ranks() const { return ranks_; }
    size_t remote_bytes() const { return remote_bytes_; }
    int64_t collectives() const { return collectives_; }

    void all_gather(int32_t rank, const void *send, void *recv, size_t bytes, cudaStream_t stream) {
        Post p;
        p.gather = true;
        p.send = send;
        p.recv = recv;
        p.bytes = bytes;
        p.stream = stream;
        post(rank, std::move(p));
    }
    void exchange(int32_t rank, const void *send, void *recv, const ep::cuda::PeerRange *ranges, cudaStream_t stream) {
        Post p;
        p.send = send;
        p.recv = recv;
        p.ranges.assign(ranges, ranges + ranks_);
        p.stream = stream;
        post(rank, std::move(p));
    }

private:
    struct Post {
        bool gather = false;
        const void *send = nullptr;
        void *recv = nullptr;
        size_t bytes = 0;
        std::vector<ep::cuda::PeerRange> ranges;
        cudaStream_t stream = nullptr;
    };

    void post(int32_t rank, Post p) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!error_.empty()) throw std::runtime_error(error_);
        if (rank < 0 || rank >= ranks_ || posted_[rank]) fail_locked("sim transport: rank " + std::to_string(rank) + " posted twice");
        if (threaded_) cudaEventRecord(events_[rank], p.stream);
        const cudaStream_t stream = p.stream;
        posts_[rank] = std::move(p);
        posted_[rank] = 1;
        if (++arrived_ < ranks_) {
            if (!threaded_) return;
            const int64_t gen = generation_;
            cv_.wait(lock, [&] { return generation_ != gen || !error_.empty(); });
            if (!error_.empty()) throw std::runtime_error(error_);
            cudaStreamWaitEvent(stream, done_, 0);
            return;
        }
        execute(stream);
        for (auto &q : posted_) q = 0;
        arrived_ = 0;
        ++generation_;
        ++collectives_;
        cv_.notify_all();
    }

    [[noreturn]] void fail_locked(const std::string &why) {
        error_ = why;
        cv_.notify_all();
        throw std::runtime_error(why);
    }

    void copy(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
        if (bytes == 0) return;
        const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess) fail_locked(std::string("sim transport copy: ") + cudaGetErrorString(e));
    }

    void execute(cudaStream_t stream) {
        for (int32_t r = 0; r < ranks_; ++r)
            if (posts_[r].gather != posts_[0].gather) fail_locked("sim transport: ranks posted different collectives");
        if (threaded_)
            for (int32_t r = 0; r < ranks_; ++r) cudaStreamWaitEvent(stream, events_[r], 0);
        if (posts_[0].gather) {
            for (int32_t r = 0; r < ranks_; ++r)
                if (posts_[r].bytes != posts_[0].bytes) fail_locked("sim transport: all-gather sizes differ");
            for (int32_t d = 0; d < ranks_; ++d)
                for (int32_t s = 0; s < ranks_; ++s) {
                    copy(static_cast<uint8_t *>(posts_[d].recv) + s * posts_[0].bytes, posts_[s].send, posts_[0].bytes,
                         stream);
                    if (s != d) remote_bytes_ += posts_[0].bytes;
                }
        } else {
            for (int32_t s = 0; s < ranks_; ++s)
                for (int32_t d = 0; d < ranks_; ++d) {
                    const ep::cuda::PeerRange &out = posts_[s].ranges[d], &in = posts_[d].ranges[s];
                    if (out.send_bytes != in.recv_bytes)
                        fail_locked("sim transport: rank " + std::to_string(s) + " sends " + std::to_string(out.send_bytes) +
                                    " bytes to " + std::to_string(d) + ", which expects " + std::to_string(in.recv_bytes));
                    copy(static_cast<uint8_t *>(posts_[d].recv) + in.recv_offset,
                         static_cast<const uint8_t *>(posts_[s].send) + out.send_offset, out.send_bytes, stream);
                    if (s != d) remote_bytes_ += out.send_bytes;
                }
        }
        if (threaded_) cudaEventRecord(done_, stream);
    }

    int32_t ranks_;
    bool threaded_;
    std::vector<Post> posts_;
    std::vector<uint8_t> posted_;
    std::vector<cudaEvent_t> events_;
    cudaEvent_t done_ = nullptr;
    std::mutex mutex_;
    std::condition_variable cv_;
    int32_t arrived_ = 0;
    int64_t generation_ = 0, collectives_ = 0;
    size_t remote_bytes_ = 0;
    std::string error_;
};

class SimTransport : public ep::cuda::Transport {
public:
    SimTransport(SimHub &hub, int32_t rank) : hub_(hub), rank_(rank) {}
    int32_t rank() const override { return rank_; }
    int32_t size() const override { return hub_.ranks(); }
    void all_gather(const void *send, void *recv, size_t bytes, cudaStream_t stream) override {
        hub_.all_gather(rank_, send, recv, bytes, stream);
    }
    void exchange(const void *send, void *recv, const ep::cuda::PeerRange *ranges, cudaStream_t stream) override {
        hub_.exchange(rank_, send, recv, ranges, stream);
    }
    std::string describe() const override { return "simulated rank " + std::to_string(rank_) + " (device copies)"; }

private:
    SimHub &hub_;
    int32_t rank_;
};

}  // namespace ft::test
