// Owning handles of CUDA resources, one set for every GPU module, test and benchmark: device
// memory, page-locked host memory, streams, events, and a scope that makes a device current.
// Constructors report failures through check() (ft/cuda_check.hpp: FT_ERR_OUT_OF_MEMORY,
// FT_ERR_DEVICE or FT_ERR_DEVICE_LOST); destructors release and never throw. Only for translation
// units compiled with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "ft/cuda_check.hpp"

namespace ft::cuda {

// Owning device allocation.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes, const char *what = "allocating device memory") : bytes_(bytes) {
        if (bytes) check(cudaMalloc(&p_, bytes), what);
    }
    ~DeviceBuffer() {
        if (p_) cudaFree(p_);
    }
    DeviceBuffer(DeviceBuffer &&o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    template <typename T = uint8_t>
    T *get() const { return static_cast<T *>(p_); }
    size_t bytes() const { return bytes_; }

private:
    void *p_ = nullptr;
    size_t bytes_ = 0;
};

// Owning page-locked host allocation.
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    // Page-locked with cudaHostAlloc `flags` (default portable and mapped); when mapped, device()
    // is the address kernels use for the same bytes, else nullptr.
    explicit PinnedBuffer(size_t bytes, const char *what = "allocating page-locked memory",
                          unsigned flags = cudaHostAllocPortable | cudaHostAllocMapped) {
        if (!bytes) return;
        check(cudaHostAlloc(&p_, bytes, flags), what);
        if (!(flags & cudaHostAllocMapped)) return;
        const cudaError_t e = cudaHostGetDevicePointer(&d_, p_, 0);
        if (e != cudaSuccess) {
            cudaFreeHost(p_);
            p_ = nullptr;
            check(e, what);
        }
    }
    ~PinnedBuffer() {
        if (p_) cudaFreeHost(p_);
    }
    PinnedBuffer(PinnedBuffer &&o) noexcept : p_(o.p_), d_(o.d_) { o.p_ = o.d_ = nullptr; }
    PinnedBuffer &operator=(PinnedBuffer &&o) noexcept {
        std::swap(p_, o.p_);
        std::swap(d_, o.d_);
        return *this;
    }
    template <typename T = uint8_t>
    T *get() const { return static_cast<T *>(p_); }
    template <typename T = uint8_t>
    T *device() const { return static_cast<T *>(d_); }

private:
    void *p_ = nullptr;
    void *d_ = nullptr;
};

class Stream {
public:
    Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "creating a CUDA stream"); }
    ~Stream() {
        if (s_) cudaStreamDestroy(s_);
    }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    cudaStream_t get() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

class Event {
public:
    explicit Event(bool timing = false) {
        check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming), "creating a CUDA event");
    }
    ~Event() {
        if (e_) cudaEventDestroy(e_);
    }
    Event(const Event &) = delete;
    Event &operator=(const Event &) = delete;
    cudaEvent_t get() const { return e_; }

private:
    cudaEvent_t e_ = nullptr;
};

// Makes `device` current for the scope of one call (the caller's thread may have another).
class DeviceScope {
public:
    explicit DeviceScope(int device) {
        check(cudaGetDevice(&previous_), "cudaGetDevice");
        if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
        device_ = device;
    }
    ~DeviceScope() {
        if (previous_ != device_) cudaSetDevice(previous_);
    }

private:
    int previous_ = 0, device_ = 0;
};

}  // namespace ft::cuda
