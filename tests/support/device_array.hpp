// Host-side CUDA helpers of the EP tests (plain C++: the .cpp tests include it too): a thrown
// error for a failed CUDA call, an owning device array, and a device-to-host fetch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ft::test {

inline void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
struct DeviceArray {
    T *ptr = nullptr;
    size_t n = 0;
    DeviceArray() = default;
    explicit DeviceArray(size_t count) : n(count) { cuda_ok(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc"); }
    explicit DeviceArray(const std::vector<T> &v) : DeviceArray(v.size()) { upload(v); }
    ~DeviceArray() { cudaFree(ptr); }
    DeviceArray(const DeviceArray &) = delete;
    DeviceArray &operator=(const DeviceArray &) = delete;
    DeviceArray(DeviceArray &&o) noexcept : ptr(o.ptr), n(o.n) { o.ptr = nullptr; o.n = 0; }
    DeviceArray &operator=(DeviceArray &&o) noexcept {
        std::swap(ptr, o.ptr);
        std::swap(n, o.n);
        return *this;
    }
    void upload(const std::vector<T> &v) {
        if (!v.empty()) cuda_ok(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    }
    std::vector<T> download(size_t count) const {
        std::vector<T> v(count);
        if (count) cuda_ok(cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
        return v;
    }
};

template <typename T>
std::vector<T> fetch(const T *device, size_t count) {
    std::vector<T> v(count);
    if (count) cuda_ok(cudaMemcpy(v.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), "fetch");
    return v;
}

}  // namespace ft::test
