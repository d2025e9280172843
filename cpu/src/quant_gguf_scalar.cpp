// Scalar kernels of the GGUF block formats beyond q4_0 (q8_0, q2_k .. q6_k, iq4_xs): the definition the
// SIMD kernels are tested against. Weights are the reference dequantisation (ft::dequant_row_block,
// fp32), activations in the Q8_0 layout of q4_0 (q8_0_act_bytes: int8 q[K] padded to 64, float
// d[K/32]; Q8_0 values for q8_0, Q8_K for the others); the output is the sum over 32-blocks b of d[b] * (sum over k in b of w[k] * q[k]), each
// block's inner sum in fp32 in element order.
#include <algorithm>

#include "ft/dequant.hpp"
#include "ft/formats.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

constexpr int kTokTile = 32;  // tokens whose sums stay on the stack while a block is reused

void block_format_scalar(Format f, const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act,
                         int ntok, float *out, size_t ldo) {
    const int64_t K = m.K, qbytes = (K + 63) / 64 * 64;
    const int64_t bk = format_block(f);                           // elements per format block (32 or 256)
    const size_t bb = size_t(block_bytes(f)), rb = block_row_bytes(f, K);
    float w[kQK];
    for (int j = 0; j < count; ++j) {
        const uint8_t *row = m.data + size_t(first + j) * rb;
        for (int t0 = 0; t0 < ntok; t0 += kTokTile) {
            const int nt = std::min(kTokTile, ntok - t0);
            float s[kTokTile] = {};
            for (int64_t b = 0; b < K / bk; ++b) {
                dequant_row_block(f, row + size_t(b) * bb, bk, w);
                for (int t = 0; t < nt; ++t) {
                    const int8_t *q = reinterpret_cast<const int8_t *>(act[t0 + t]);
                    const float *d = reinterpret_cast<const float *>(act[t0 + t] + qbytes);
                    for (int64_t c = 0; c < bk; c += 32) {
                        const int64_t k0 = b * bk + c;
                        float inner = 0.0f;
                        for (int i = 0; i < 32; ++i) inner += w[c + i] * float(q[k0 + i]);
                        s[t] += d[k0 / 32] * inner;
                    }
                }
            }
            for (int t = 0; t < nt; ++t) out[(t0 + t) * ldo + j] = s[t];
        }
    }
}

}  // namespace

void q8_0_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::q8_0, m, first, count, act, ntok, out, ldo);
}
void q4_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::q4_k, m, first, count, act, ntok, out, ldo);
}
void q5_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::q5_k, m, first, count, act, ntok, out, ldo);
}
void q6_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::q6_k, m, first, count, act, ntok, out, ldo);
}

void q2_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::q2_k, m, first, count, act, ntok, out, ldo);
}

void q3_k_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::q3_k, m, first, count, act, ntok, out, ldo);
}

void iq4_xs_scalar(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                 size_t ldo) {
    block_format_scalar(Format::iq4_xs, m, first, count, act, ntok, out, ldo);
}

}  // namespace ft::cpu::detail
