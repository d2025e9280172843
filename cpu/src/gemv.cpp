// Scalar GEMV tier and the run-time choice of kernel.
#include <cstdlib>

#include "ft/common.hpp"
#include "ft/cpu.hpp"
#include "kernels.hpp"

namespace ft::cpu {
namespace detail {

// 512 bytes ahead, the FT_CPU_PREFETCH default; set_prefetch_bytes() changes it.
int g_prefetch_bytes = 512;

void gemv_scalar(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x,
                 int ntok, float *out, size_t ldo) {
    for (int t = 0; t < ntok; ++t)
        for (int r = 0; r < rows; ++r) {
            const uint16_t *wr = w + r * ldw;
            float s = 0.0f;
            for (int c = 0; c < cols; ++c) s += bf16_to_f32(wr[c]) * bf16_to_f32(x[t][c]);
            out[t * ldo + r] = s;
        }
}

}  // namespace detail

void set_prefetch_bytes(int bytes) { detail::g_prefetch_bytes = bytes < 0 ? 0 : bytes; }

GemvFn gemv_kernel(Isa isa) {
    if (static_cast<int>(isa) > static_cast<int>(cpu_best_isa()))
        fail(FT_ERR_UNSUPPORTED, "CPU kernel tier ", isa_name(isa), " is not supported by this CPU (best: ",
             isa_name(cpu_best_isa()), ")");
    switch (isa) {
        case Isa::scalar: return detail::gemv_scalar;
#if defined(FT_CPU_X86_KERNELS)
        case Isa::avx2: return detail::gemv_avx2;
        case Isa::avx512: return detail::gemv_avx512;
        case Isa::avx512bf16: return detail::gemv_avx512bf16;
#endif
        default: break;
    }
    fail(FT_ERR_UNSUPPORTED, "CPU kernel tier ", isa_name(isa), " is not built into this library");
}

GemvFn gemv_kernel_amx() {
#if defined(FT_CPU_X86_KERNELS)
    if (cpu_best_isa() == Isa::avx512bf16 && amx_bf16_available()) return detail::gemv_amx_bf16;
#endif
    return nullptr;
}

}  // namespace ft::cpu
