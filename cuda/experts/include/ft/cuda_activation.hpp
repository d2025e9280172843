// The activation parameters the GPU expert kernels take, as plain data a host compiler can see
// (ft/cuda_numerics.cuh holds the device code that applies them).
#pragma once

#include <cstdint>

#include "freetoken.h"

namespace ft::cuda {

// Activation parameters (the CPU executor's ft::cpu::ActivationSpec, as plain data).
struct DeviceActivation {
    int32_t kind = FT_ACT_SILU;
    float alpha = 1.702f;
    float limit = 7.0f;
};

}  // namespace ft::cuda
