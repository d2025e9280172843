// Shared pieces of the slot cache's device tests (test_slotcache_gpu*.cpp): a device copy of a
// host cache compared bit for bit with the mirror, device id arrays, random and crafted admission
// calls run on both sides (slotcache_gpu_check.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ft/cuda_memory.hpp"
#include "ft/slotcache.hpp"
#include "ft/slotcache_cuda.hpp"
#include "slotcache_steps.hpp"

#define SKIP_WITHOUT_GPU()                                                    \
    do {                                                                      \
        int n_ = 0;                                                           \
        const cudaError_t e_ = cudaGetDeviceCount(&n_);                       \
        if (e_ != cudaSuccess) {                                              \
            cudaGetLastError();                                               \
            GTEST_SKIP() << "no CUDA device: " << cudaGetErrorString(e_);     \
        }                                                                     \
        if (n_ == 0) GTEST_SKIP() << "no CUDA device";                        \
    } while (0)

#define CUDA_OK(expr)                                                                                   \
    do {                                                                                                \
        const cudaError_t e_ = (expr);                                                                  \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
    } while (0)

namespace slotcache_gpu {

using ft::FetchOrder;
using ft::HostSlotCache;
using ft::HybridFetch;
using ft::SlotCacheShape;
using ft::SlotCacheState;

inline SlotCacheShape shape(int32_t layers, int32_t experts, int32_t slots, int32_t plan) {
    SlotCacheShape s;
    s.layers = layers;
    s.experts = experts;
    s.slots = slots;
    s.plan_capacity = plan;
    return s;
}

inline std::string describe(const SlotCacheShape &s) {
    return "L=" + std::to_string(s.layers) + " E=" + std::to_string(s.experts) + " S=" + std::to_string(s.slots) +
           " plan=" + std::to_string(s.plan_capacity);
}

// A device copy of a host cache, in the same layout.
class DeviceCache {
public:
    explicit DeviceCache(const HostSlotCache &host) : bytes_(host.bytes()) {
        try {
            buffer_ = ft::cuda::DeviceBuffer(bytes_);
        } catch (const ft::Error &) {
            return;
        }
        if (cudaMemcpy(buffer_.get(), host.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            buffer_ = ft::cuda::DeviceBuffer();
            return;
        }
        state_ = ft::slot_cache_bind(host.state().shape, buffer_.get());
    }

    bool ok() const { return buffer_.get() != nullptr; }
    const SlotCacheState &state() const { return state_; }

    // Bit-for-bit comparison with the mirror; the message names every array that differs.
    ::testing::AssertionResult matches(const HostSlotCache &mirror) const {
        HostSlotCache copy(state_.shape);
        const cudaError_t e = cudaMemcpy(const_cast<void *>(copy.data()), buffer_.get(), bytes_, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return ::testing::AssertionFailure() << "download: " << cudaGetErrorString(e);
        if (std::memcmp(copy.data(), mirror.data(), bytes_) == 0) return ::testing::AssertionSuccess();
        const std::string diff = ft::test::describe_difference(mirror.state(), copy.state());
        return ::testing::AssertionFailure() << "device state differs from the mirror:\n"
                                             << (diff.empty() ? std::string("(padding bytes only)\n") : diff);
    }

private:
    ft::cuda::DeviceBuffer buffer_;
    size_t bytes_ = 0;
    SlotCacheState state_;
};

template <typename T>
class DeviceArray {
public:
    // p_ stays null when the allocation fails (the tests assert on get()).
    explicit DeviceArray(size_t n) : n_(n) {
        try {
            buf_ = ft::cuda::DeviceBuffer(std::max<size_t>(n, 1) * sizeof(T));
            p_ = buf_.get<T>();
        } catch (const ft::Error &) {
        }
    }
    T *get() const { return p_; }
    // Waits for the whole device: a pageable cudaMemcpy may return before its DMA lands, and the
    // kernels that read these ids may run on a non-blocking stream.
    cudaError_t upload(const std::vector<T> &v, size_t at = 0) const {
        const cudaError_t e = cudaMemcpy(p_ + at, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
        return e != cudaSuccess ? e : cudaDeviceSynchronize();
    }
    cudaError_t download(std::vector<T> &v, size_t at = 0) const {
        return cudaMemcpy(v.data(), p_ + at, v.size() * sizeof(T), cudaMemcpyDeviceToHost);
    }

private:
    ft::cuda::DeviceBuffer buf_;
    T *p_ = nullptr;
    size_t n_;
};

std::string first_route_difference(const std::vector<int32_t> &ids, const std::vector<int32_t> &want,
                                   const std::vector<int32_t> &got);

std::string describe(const ft::test::Step &s);

// Runs `steps` random calls on the mirror and the device, comparing routes and every array after
// each call. Odd steps rewrite the ids in place on the device.
void run_random(const SlotCacheShape &s, bool hybrid, int steps, uint32_t seed, int32_t max_ids = 256);

struct RandomCase {
    SlotCacheShape shape;
    int steps;
};

// The shapes of the random runs (register and global-memory paths, S = E up to S = L * E).
std::vector<RandomCase> random_cases();

// One call on the mirror and on the device (in place or into a separate output), then routes and
// every array compared.
::testing::AssertionResult same_call(const HostSlotCache &mirror, const DeviceCache &device,
                                     const DeviceArray<int32_t> &d_ids, const DeviceArray<int32_t> &d_out,
                                     const ft::test::Step &step, bool in_place);

// Fills a reset mirror: every slot holds a random flat id (L * E >= S) or, with probability
// `empty`, nothing; usages take only `distinct_usages` values, so ties are everywhere and the slot
// index decides; the clock stands just above them; recency takes few values too (ties by id).
void craft_state(const HostSlotCache &mirror, std::mt19937 &rng, int32_t distinct_usages, double empty);

// Routing of `tokens` x `k` ids for `layer` with exactly `misses` distinct non-resident experts and
// up to `hits` distinct resident ones (fewer if the layer lacks them), shuffled, duplicates
// included when tokens * k exceeds the distinct experts.
std::vector<int32_t> controlled_ids(const SlotCacheState &st, int32_t layer, int32_t hits, int32_t misses,
                                    int32_t count, std::mt19937 &rng);

HybridFetch fetch_rule(double fraction, int32_t cap, FetchOrder order);

SlotCacheShape with_frequency(SlotCacheShape s, int64_t half_life);

}  // namespace slotcache_gpu
