// cuBLAS resolved at run time. libfreetoken.so must load on machines without the CUDA toolkit, so
// it never links libcublas; the first caller dlopen()s it ($FT_CUBLAS_LIBRARY if set, then
// libcublas.so.13, .so.12, .so, then those in $CUDA_HOME/lib64, $CUDA_PATH/lib64 and
// /usr/local/cuda/lib64) and looks up the few entry points the library uses. Only the types of
// <cublas_v2.h> are used at compile time.
#pragma once

#include <cublas_v2.h>

namespace ft::cuda {

// Entry points of the loaded libcublas. The required ones are never null in a table that
// cublas_api() returns; the optional ones are null when the library is too old to have them.
struct CublasApi {
    using CreateFn = cublasStatus_t (*)(cublasHandle_t *);
    using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
    using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
    using SetWorkspaceFn = cublasStatus_t (*)(cublasHandle_t, void *, size_t);
    using SetMathModeFn = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
    using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void *, const void *, cudaDataType, int, const void *, cudaDataType, int,
                                        const void *, void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    using GemmGroupedBatchedExFn = cublasStatus_t (*)(cublasHandle_t, const cublasOperation_t[],
                                                      const cublasOperation_t[], const int[], const int[], const int[],
                                                      const void *, const void *const[], cudaDataType_t, const int[],
                                                      const void *const[], cudaDataType_t, const int[], const void *,
                                                      void *const[], cudaDataType_t, const int[], int, const int[],
                                                      cublasComputeType_t);

    // Required.
    CreateFn create = nullptr;              // cublasCreate_v2
    DestroyFn destroy = nullptr;            // cublasDestroy_v2
    SetStreamFn set_stream = nullptr;       // cublasSetStream_v2
    SetMathModeFn set_math_mode = nullptr;  // cublasSetMathMode
    GemmExFn gemm_ex = nullptr;             // cublasGemmEx
    // Optional.
    SetWorkspaceFn set_workspace = nullptr;                    // cublasSetWorkspace_v2 (cuBLAS >= 11)
    GemmGroupedBatchedExFn gemm_grouped_batched_ex = nullptr;  // cublasGemmGroupedBatchedEx (cuBLAS >= 12.5)

    const char *library = "";  // the name that was opened, e.g. "libcublas.so.13"
};

// The process-wide table, loaded once (thread-safe); nullptr when no libcublas could be opened or
// it lacks a required entry point (cublas_load_error() then says why). The library stays loaded
// for the life of the process.
const CublasApi *cublas_api();
const char *cublas_load_error();

// cuBLAS status name for messages ("CUBLAS_STATUS_NOT_SUPPORTED"); never null.
const char *cublas_status_name(cublasStatus_t status);

}  // namespace ft::cuda
