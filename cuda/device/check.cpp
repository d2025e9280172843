// The CUDA error policy (ft/cuda_check.hpp): the sticky-error table, the status mapping and the
// test-only fault injection.
#include "ft/cuda_check.hpp"

#include <mutex>

namespace ft::cuda {

bool sticky_error(cudaError_t e) {
    switch (e) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorAssert:
        case cudaErrorECCUncorrectable:
        case cudaErrorLaunchTimeout:
        case cudaErrorContextIsDestroyed:
        case cudaErrorDevicesUnavailable:
            return true;
        default:
            return false;
    }
}

ft_status status_of(cudaError_t e) {
    if (e == cudaSuccess) return FT_OK;
    if (sticky_error(e)) return FT_ERR_DEVICE_LOST;
    return e == cudaErrorMemoryAllocation ? FT_ERR_OUT_OF_MEMORY : FT_ERR_DEVICE;
}

void throw_cuda(cudaError_t e, const std::string &what) {
    // A non-sticky error stays pending in the runtime until read: clear it so the next checked
    // call is not blamed for it (a sticky one cannot be cleared).
    if (!sticky_error(e)) cudaGetLastError();
    fail(status_of(e), what, ": ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
}

// ---- fault injection (tests only) ---------------------------------------------------------------

namespace {
struct Armed {
    std::mutex mutex;
    cudaError_t error = cudaSuccess;
    std::string site;
    bool fired = false;
};
Armed &armed_state() {
    static Armed a;
    return a;
}
}  // namespace

std::atomic<bool> FaultInjection::armed_{false};

void FaultInjection::arm(cudaError_t error, const char *site) {
    Armed &a = armed_state();
    std::lock_guard<std::mutex> lock(a.mutex);
    a.error = error;
    a.site = site ? site : "";
    a.fired = false;
    armed_.store(error != cudaSuccess, std::memory_order_relaxed);
}

void FaultInjection::disarm() {
    Armed &a = armed_state();
    std::lock_guard<std::mutex> lock(a.mutex);
    a.error = cudaSuccess;
    a.site.clear();
    armed_.store(false, std::memory_order_relaxed);
}

bool FaultInjection::fired() {
    Armed &a = armed_state();
    std::lock_guard<std::mutex> lock(a.mutex);
    return a.fired;
}

cudaError_t FaultInjection::apply(cudaError_t e, const std::string &what) {
    Armed &a = armed_state();
    std::lock_guard<std::mutex> lock(a.mutex);
    if (a.error == cudaSuccess) return e;
    // Once a sticky error has fired, every check fails with it, as on a lost context.
    const bool hit = (a.fired && sticky_error(a.error)) || a.site.empty() || what.find(a.site) != std::string::npos;
    if (!hit) return e;
    const cudaError_t injected = a.error;
    a.fired = true;
    if (!sticky_error(injected)) {
        a.error = cudaSuccess;
        armed_.store(false, std::memory_order_relaxed);
    }
    return injected;
}

}  // namespace ft::cuda
