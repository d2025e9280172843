#include "ft/cuda_device.hpp"

#include <atomic>
#include <cstring>

#include "ft/common.hpp"

#ifdef FT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ft/cuda_check.hpp"
#include "ft/cuda_memory.hpp"
#endif

namespace ft::cuda {

#ifdef FT_HAVE_CUDA

namespace {
[[noreturn]] void fail_cuda(cudaError_t e, const char *what) { throw_cuda(e, what); }
}  // namespace

bool built_with_cuda() { return true; }
int runtime_version() {
    int v = 0;
    return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}
const char *architectures() { return FT_CUDA_ARCHS; }

int device_count() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear, so later calls do not see this as a sticky error
        log(FT_LOG_DEBUG, "no CUDA device: ", cudaGetErrorString(e));
        return 0;
    }
    return n;
}

std::string device_name(int device) {
    if (device < 0 || device >= device_count()) fail(FT_ERR_NO_DEVICE, "CUDA device ", device, " is not usable");
    cudaDeviceProp prop{};
    const cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) fail_cuda(e, "cudaGetDeviceProperties");
    return prop.name;
}

HostRegistration::HostRegistration(int device, void *data, size_t bytes) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) fail_cuda(e, "cudaSetDevice");
    e = cudaHostRegister(data, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail_cuda(e, "cudaHostRegister of an expert bank");
    }
    data_ = data;
}

HostRegistration::~HostRegistration() {
    if (data_) cudaHostUnregister(data_);
}

double measure_copy_bandwidth(int device, CopyDirection dir, size_t bytes, int iters) {
    if (device < 0 || device >= device_count()) fail(FT_ERR_NO_DEVICE, "CUDA device ", device, " is not usable");
    if (bytes == 0 || iters <= 0) fail(FT_ERR_INVALID_ARGUMENT, "copy measurement needs bytes > 0 and iters > 0");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    const PinnedBuffer host(bytes, "cudaHostAlloc");
    const DeviceBuffer dev(bytes, "cudaMalloc");
    // Touch both buffers so no first-use cost lands in the timed copies.
    std::memset(host.get(), 1, bytes);
    check_cuda(cudaMemset(dev.get(), 1, bytes), "cudaMemset");
    const Stream stream;
    const Event start(true), stop(true);

    const bool h2d = dir == CopyDirection::host_to_device;
    void *dst = h2d ? dev.get() : host.get();
    const void *src = h2d ? host.get() : dev.get();
    const cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (int i = 0; i < 3; ++i) check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream.get()), "cudaMemcpyAsync (warm-up)");
    check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    check_cuda(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream.get()), "cudaMemcpyAsync");
    check_cuda(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
    if (!(ms > 0.0f)) return 0.0;
    return static_cast<double>(bytes) * iters / (ms * 1e-3);
}

MemoryInfo memory_info(int device) {
    MemoryInfo m;
    int previous = 0;
    if (device < 0 || cudaGetDevice(&previous) != cudaSuccess) {
        cudaGetLastError();
        return m;
    }
    if (previous == device || cudaSetDevice(device) == cudaSuccess) {
        size_t f = 0, t = 0;
        if (cudaMemGetInfo(&f, &t) == cudaSuccess) m = {f, t};
        if (previous != device) cudaSetDevice(previous);
    }
    cudaGetLastError();
    return m;
}

#else

MemoryInfo memory_info(int) { return {}; }
bool built_with_cuda() { return false; }
int runtime_version() { return 0; }
const char *architectures() { return ""; }
int device_count() { return 0; }
std::string device_name(int device) { fail(FT_ERR_NO_DEVICE, "this build of FreeToken has no CUDA support"); }
double measure_copy_bandwidth(int, CopyDirection, size_t, int) { return 0.0; }
HostRegistration::HostRegistration(int, void *, size_t) {
    fail(FT_ERR_NO_DEVICE, "this build of FreeToken has no CUDA support");
}
HostRegistration::~HostRegistration() = default;

#endif

HostRegistration::HostRegistration(HostRegistration &&other) noexcept : data_(other.data_) { other.data_ = nullptr; }

namespace {
std::atomic<bool> g_pdl_allowed{true};
}  // namespace

void set_pdl_allowed(bool allowed) { g_pdl_allowed.store(allowed, std::memory_order_relaxed); }
bool pdl_allowed() { return g_pdl_allowed.load(std::memory_order_relaxed); }

}  // namespace ft::cuda
