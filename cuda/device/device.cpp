#include "ft/cuda_device.hpp"

#include "ft/common.hpp"

#ifdef FT_HAVE_CUDA
#include <cuda_runtime_api.h>
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

#else

bool built_with_cuda() { return false; }
int runtime_version() { return 0; }
const char *architectures() { return ""; }
int device_count() { return 0; }
std::string device_name(int device) { fail(FT_ERR_NO_DEVICE, "this build of FreeToken has no CUDA support"); }
HostRegistration::HostRegistration(int, void *, size_t) {
    fail(FT_ERR_NO_DEVICE, "this build of FreeToken has no CUDA support");
}
HostRegistration::~HostRegistration() = default;

#endif

HostRegistration::HostRegistration(HostRegistration &&other) noexcept : data_(other.data_) { other.data_ = nullptr; }

}  // namespace ft::cuda
