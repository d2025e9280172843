#include "ft/cuda_device.hpp"

#include <atomic>
#include <cstring>

#include "ft/common.hpp"

#ifdef FT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ft/cuda_check.hpp"
#endif

namespace ft::cuda {

#ifdef FT_HAVE_CUDA

namespace {
[[noreturn]] void fail_cuda(cudaError_t e, const char *what) {
    fail(FT_ERR_DEVICE, what, ": ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
}
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

namespace {

// Owns what one copy measurement creates, so every exit path releases it.
struct CopyRig {
    void *host = nullptr, *dev = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    ~CopyRig() {
        if (stop) cudaEventDestroy(stop);
        if (start) cudaEventDestroy(start);
        if (stream) cudaStreamDestroy(stream);
        if (dev) cudaFree(dev);
        if (host) cudaFreeHost(host);
    }
};

}  // namespace

double measure_copy_bandwidth(int device, CopyDirection dir, size_t bytes, int iters) {
    if (device < 0 || device >= device_count()) fail(FT_ERR_NO_DEVICE, "CUDA device ", device, " is not usable");
    if (bytes == 0 || iters <= 0) fail(FT_ERR_INVALID_ARGUMENT, "copy measurement needs bytes > 0 and iters > 0");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    CopyRig rig;
    check_cuda(cudaHostAlloc(&rig.host, bytes, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc");
    check_cuda(cudaMalloc(&rig.dev, bytes), "cudaMalloc");
    // Touch both buffers so no first-use cost lands in the timed copies.
    std::memset(rig.host, 1, bytes);
    check_cuda(cudaMemset(rig.dev, 1, bytes), "cudaMemset");
    check_cuda(cudaStreamCreateWithFlags(&rig.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreate(&rig.start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&rig.stop), "cudaEventCreate");

    const bool h2d = dir == CopyDirection::host_to_device;
    void *dst = h2d ? rig.dev : rig.host;
    const void *src = h2d ? rig.host : rig.dev;
    const cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (int i = 0; i < 3; ++i) check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, rig.stream), "cudaMemcpyAsync (warm-up)");
    check_cuda(cudaStreamSynchronize(rig.stream), "cudaStreamSynchronize");
    check_cuda(cudaEventRecord(rig.start, rig.stream), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, rig.stream), "cudaMemcpyAsync");
    check_cuda(cudaEventRecord(rig.stop, rig.stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(rig.stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, rig.start, rig.stop), "cudaEventElapsedTime");
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
