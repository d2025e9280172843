// Scalar kernels of the low-bit GGUF super-block formats q2_k, q3_k and iq4_xs. Each weight row is
// dequantised by the lib/core/formats reference (ft::dequant_row_*), then dotted with the Q8_0
// activation (the q8_0_act_bytes layout of q4_0): per block of 32, d_act * sum(w * q_act), summed
// in fp32. This is the definition the SIMD kernels (quant_gguf_low_avx2.cpp) are tested against.
#include <vector>

#include "ft/dequant.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

using RowDequant = void (*)(const uint8_t *, int64_t, float *);

void superblock_scalar(RowDequant deq, int block_bytes, const QuantMatrix &m, int64_t first, int count,
                       const uint8_t *const *act, int ntok, float *out, size_t ldo) {
    const int64_t K = m.K, nb = K / 32, qbytes = (K + 63) / 64 * 64;
    const int64_t row_bytes = K / kQK * block_bytes;
    std::vector<float> w(static_cast<size_t>(K));
    for (int j = 0; j < count; ++j) {
        deq(m.data + (first + j) * row_bytes, K, w.data());
        for (int t = 0; t < ntok; ++t) {
            const int8_t *q = reinterpret_cast<const int8_t *>(act[t]);
            const float *d = reinterpret_cast<const float *>(act[t] + qbytes);
            float s = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                float bs = 0.0f;
                for (int i = 0; i < 32; ++i) bs += w[size_t(b * 32 + i)] * float(q[b * 32 + i]);
                s += d[b] * bs;
            }
            out[t * ldo + j] = s;
        }
    }
}

}  // namespace

void q2_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    superblock_scalar(dequant_row_q2_k, kQ2_KBlockBytes, m, first, count, act, ntok, out, ldo);
}

void q3_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    superblock_scalar(dequant_row_q3_k, kQ3_KBlockBytes, m, first, count, act, ntok, out, ldo);
}

void iq4_xs_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                   size_t ldo) {
    superblock_scalar(dequant_row_iq4_xs, kIQ4_XSBlockBytes, m, first, count, act, ntok, out, ldo);
}

}  // namespace ft::cpu::detail
