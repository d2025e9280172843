// The CUDA device as the rest of the library sees it: whether one is usable, its name, and
// page-locking of host memory so the GPU can read expert banks directly, and the linear copy
// bandwidth of the bus. Every function works in a build without CUDA and then reports that no
// device exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ft::cuda {

bool built_with_cuda();
int runtime_version();       // e.g. 13000; 0 without CUDA
const char *architectures(); // e.g. "86;89;90;120"; "" without CUDA

// Whether the kernel chains may use programmatic dependent launch (cuda_launch.cuh). Process-wide,
// true by default; each engine sets it at its creation from FT_CUDA_PDL.
void set_pdl_allowed(bool allowed);
bool pdl_allowed();

// Number of usable devices; 0 without a driver or a GPU (never throws).
int device_count();

// Name of `device`; throws FT_ERR_NO_DEVICE if it is not usable.
std::string device_name(int device);

// Free and total memory of `device` in bytes; zeros without CUDA or for an unusable device.
struct MemoryInfo {
    uint64_t free_bytes = 0, total_bytes = 0;
};
MemoryInfo memory_info(int device);

// Page-locks [data, data + bytes) for `device` (portable + mapped, so kernels can read it) and
// unlocks it on destruction. Throws per ft/cuda_check.hpp (FT_ERR_DEVICE, or FT_ERR_DEVICE_LOST for
// a sticky fault) with CUDA's message on failure.
enum class CopyDirection { host_to_device, device_to_host };

// Linear copy bandwidth between page-locked host memory and `device` in bytes/s (docs/formulas.md,
// "Bandwidth profile"): one cudaHostAlloc'd buffer (portable + mapped) and one device buffer of `bytes`; 3 untimed copies,
// then `iters` back-to-back cudaMemcpyAsync on one stream bracketed by CUDA events. 0 in a build
// without CUDA; otherwise FT_ERR_NO_DEVICE if `device` is not usable (no GPU or no driver),
// FT_ERR_OUT_OF_MEMORY if a buffer cannot be allocated, FT_ERR_DEVICE (FT_ERR_DEVICE_LOST for a
// sticky fault) with CUDA's message for
// any other CUDA failure. Allocates and frees its buffers on every call.
double measure_copy_bandwidth(int device, CopyDirection dir, size_t bytes, int iters);

class HostRegistration {
public:
    HostRegistration(int device, void *data, size_t bytes);
    ~HostRegistration();
    HostRegistration(HostRegistration &&other) noexcept;
    HostRegistration &operator=(HostRegistration &&) = delete;
    HostRegistration(const HostRegistration &) = delete;

private:
    void *data_ = nullptr;
};

}  // namespace ft::cuda
