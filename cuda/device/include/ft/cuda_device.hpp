// The CUDA device as the rest of the library sees it: whether one is usable, its name, and
// page-locking of host memory so the GPU can read expert banks directly. Every function works
// in a build without CUDA and then reports that no device exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ft::cuda {

bool built_with_cuda();
int runtime_version();       // e.g. 13000; 0 without CUDA
const char *architectures(); // e.g. "86;89;90;120"; "" without CUDA

// Number of usable devices; 0 without a driver or a GPU (never throws).
int device_count();

// Name of `device`; throws FT_ERR_NO_DEVICE if it is not usable.
std::string device_name(int device);

// Page-locks [data, data + bytes) for `device` (portable + mapped, so kernels can read it) and
// unlocks it on destruction. Throws FT_ERR_DEVICE with CUDA's message on failure.
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
