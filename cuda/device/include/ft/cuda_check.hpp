// The CUDA error policy of the library: every CUDA call whose failure the host code reports goes
// through check(), which maps cudaError_t to ft_status in one place:
//   sticky faults (the context is unusable: every later call fails the same way, see
//   sticky_error) -> FT_ERR_DEVICE_LOST; cudaErrorMemoryAllocation -> FT_ERR_OUT_OF_MEMORY;
//   any other error -> FT_ERR_DEVICE (cleared first, so later calls are not blamed for it).
// The message is "<what...>: <CUDA's text> (<its name>)". A session backend that sees
// FT_ERR_DEVICE_LOST from any of its paths marks itself lost (ft_session_status).
// Only for translation units compiled with CUDA (ft_cuda_device's check.cpp holds the bodies).
//
// Test-only fault injection (FaultInjection below): compiled in always, inert unless a test arms
// it; then check() sees the armed error instead of cudaSuccess at the chosen call site.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

#include "ft/common.hpp"

namespace ft::cuda {

// True for errors after which the CUDA context cannot be used any more.
bool sticky_error(cudaError_t e);

// The ft_status of a CUDA error (cudaSuccess -> FT_OK), per the policy above.
ft_status status_of(cudaError_t e);

// Throws ft::Error with status_of(e) and "<what>: <text> (<name>)"; clears a non-sticky error.
[[noreturn]] void throw_cuda(cudaError_t e, const std::string &what);

// For tests only. arm(error, site): the next check() whose message contains `site` (every
// check() when site is empty) sees `error`. A sticky error then keeps failing every later check()
// as a lost context does, until disarm(); a non-sticky one fires once. While disarmed check()
// costs one relaxed atomic load.
class FaultInjection {
public:
    static void arm(cudaError_t error, const char *site);
    static void disarm();
    static bool fired();  // whether the armed error has been delivered since arm()
    static bool armed() { return armed_.load(std::memory_order_relaxed); }
    // The error check() reports for a call whose own result is `e` and whose message is `what`.
    static cudaError_t apply(cudaError_t e, const std::string &what);

private:
    static std::atomic<bool> armed_;
};

// Nothing for cudaSuccess; otherwise throws per the policy above, naming `what...`.
template <typename... What>
void check(cudaError_t e, const What &...what) {
    if (FaultInjection::armed()) e = FaultInjection::apply(e, cat(what...));
    if (e != cudaSuccess) throw_cuda(e, cat(what...));
}

// The name the EP and device code used before the policy had one entry point.
template <typename... What>
void check_cuda(cudaError_t e, const What &...what) {
    check(e, what...);
}

}  // namespace ft::cuda
