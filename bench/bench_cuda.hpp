// Shared by the CUDA benchmark programs: a failed CUDA call ends the benchmark with the call and
// CUDA's message (state.SkipWithError) instead of aborting the run.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#define BENCH_CUDA(expr)                                                                       \
    do {                                                                                       \
        const cudaError_t e_ = (expr);                                                         \
        if (e_ != cudaSuccess) {                                                               \
            state.SkipWithError((std::string(#expr) + ": " + cudaGetErrorString(e_)).c_str()); \
            return;                                                                            \
        }                                                                                      \
    } while (0)
