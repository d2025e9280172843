// Run-time loading of libcublas (see ft/cublas_loader.hpp).
#include "ft/cublas_loader.hpp"
#include "ft/knobs.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace ft::cuda {
namespace {

struct Loaded {
    CublasApi api;
    std::string library;  // backs api.library
    bool ok = false;
    std::string error;
};

template <typename Fn>
void resolve(void *lib, const char *name, Fn &slot) {
    slot = reinterpret_cast<Fn>(dlsym(lib, name));
}

Loaded load() {
    Loaded r;
    // FT_CUBLAS_LIBRARY (a path) first; then the sonames, newest first (a process that already has
    // one loaded gets that one back); then the toolkit's own directories, for machines whose loader
    // path lacks them.
    std::vector<std::string> names;
    if (const std::string first = read_tuning(false).cublas_library; !first.empty()) names.push_back(first);
    for (const char *n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) names.push_back(n);
    std::vector<std::string> dirs;
    for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
        if (const char *v = std::getenv(env); v && *v) dirs.push_back(std::string(v) + "/lib64");
    dirs.push_back("/usr/local/cuda/lib64");
    for (const std::string &d : dirs)
        for (const char *n : {"libcublas.so.13", "libcublas.so.12"}) names.push_back(d + "/" + n);
    void *lib = nullptr;
    std::string tried;
    for (const std::string &name : names) {
        lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            r.library = name;
            break;
        }
        const char *err = dlerror();
        tried += (tried.empty() ? "" : "; ") + (err ? std::string(err) : name);
    }
    if (!lib) {
        r.error = "cuBLAS is not installed (" + tried + ")";
        return r;
    }
    CublasApi &a = r.api;
    resolve(lib, "cublasCreate_v2", a.create);
    resolve(lib, "cublasDestroy_v2", a.destroy);
    resolve(lib, "cublasSetStream_v2", a.set_stream);
    resolve(lib, "cublasSetMathMode", a.set_math_mode);
    resolve(lib, "cublasGemmEx", a.gemm_ex);
    resolve(lib, "cublasSetWorkspace_v2", a.set_workspace);
    resolve(lib, "cublasGemmGroupedBatchedEx", a.gemm_grouped_batched_ex);
    if (!a.create || !a.destroy || !a.set_stream || !a.set_math_mode || !a.gemm_ex) {
        r.error = r.library +
                  " lacks cublasCreate_v2/cublasDestroy_v2/cublasSetStream_v2/"
                  "cublasSetMathMode/cublasGemmEx";
        dlclose(lib);
        return r;
    }
    r.ok = true;
    return r;
}

const Loaded &loaded() {
    static std::once_flag once;
    static Loaded *state = nullptr;
    // Never destroyed: handles may be released from static destructors of other modules.
    std::call_once(once, [] {
        state = new Loaded(load());
        state->api.library = state->library.c_str();  // set here: a moved short string changes address
    });
    return *state;
}

}  // namespace

const CublasApi *cublas_api() {
    const Loaded &l = loaded();
    return l.ok ? &l.api : nullptr;
}

const char *cublas_load_error() {
    return loaded().error.c_str();
}

const char *cublas_status_name(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "CUBLAS_STATUS_LICENSE_ERROR";
        default:
            return "CUBLAS_STATUS_UNKNOWN";
    }
}

}  // namespace ft::cuda
