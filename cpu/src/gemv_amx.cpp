// AMX-BF16 kernels for calls of several tokens: the bf16 GEMV (bf16 experts and the quantised
// formats' batched path) and fp8_block (each 16-row tile decoded to bf16 per 128-K block, see
// fp8_super_block). The bf16 GEMV reads weight rows as A tiles in place (16 rows x 32 bf16, the
// row stride as tile stride); the tokens' activations are packed once per call into B tiles (16 K pairs x up to 16
// tokens); C tiles hold 16 rows x tokens in fp32. TDPBF16PS multiplies bf16 pairs exactly and adds
// in fp32, as vdpbf16ps does, so only the summation order differs from the AVX-512-BF16 kernel.
// One TDPBF16PS covers 16 x 32 weights for all the tokens at once, so the cost per weight does not
// grow with the token count. Calls of one token, rows past the last 16 and K not a multiple of 32
// go to gemv_avx512bf16 (fp8_block: to fp8_block_avx512bf16, also where the first row is not a
// multiple of 16).
#include "immintrin_avx512.hpp"

#include <algorithm>
#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "amx_tiles.inc"

constexpr int kStep = kBf16Step;   // K elements per tile step
constexpr int kChunkSteps = 16;    // K steps whose B tiles are packed at once (512 elements)
constexpr int kFp8Block = 128;     // fp8_block's scale block: 128 rows x 128 K
constexpr int kFp8Steps = kFp8Block / kStep;  // tile steps per scale block
constexpr int kFp8ChunkSteps = 32;            // fp8_block: K steps packed at once (1024 K, 1 KB of a row)

void prefetch_rows(const uint16_t *w, size_t ldw, int64_t k, int pf) {
    for (int r = 0; r < kTileRows; ++r)
        _mm_prefetch(reinterpret_cast<const char *>(w + r * ldw + k) + pf, _MM_HINT_T0);
}

// Rows [0, rows) (a multiple of 16, at most kSuperRows) of w times tokens x[0 .. n), n <= 16,
// cols a multiple of 32: C tiles accumulate over the chunks in c (16 x n4 floats per row block).
void super_block(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x, int n, float *out,
                 size_t ldo, int pf) {
    const int n4 = (n + 3) & ~3;
    const int blocks = rows / kTileRows;
    const int steps = cols / kStep;
    alignas(64) uint32_t b[kChunkSteps * kTileRows * kMaxTokens];
    alignas(64) float c[kSuperRows / kTileRows][kTileRows * kMaxTokens];
    const size_t ldb = ldw * 2;  // A tile stride in bytes
    const int ldc = 4 * n4;
    for (int s0 = 0; s0 < steps; s0 += kChunkSteps) {
        const int ns = steps - s0 < kChunkSteps ? steps - s0 : kChunkSteps;
        pack_b(x, n, n4, s0, ns, b);
        for (int blk = 0; blk < blocks; blk += 2) {
            const bool two = blk + 1 < blocks;
            const uint16_t *w0 = w + int64_t(blk) * kTileRows * ldw;
            const uint16_t *w1 = w0 + int64_t(kTileRows) * ldw;
            if (s0 == 0) {
                _tile_zero(0);
                _tile_zero(1);
            } else {
                _tile_loadd(0, c[blk], ldc);
                if (two) _tile_loadd(1, c[blk + 1], ldc);
            }
            for (int s = 0; s < ns; ++s) {
                const int64_t k = int64_t(s0 + s) * kStep;
                if (pf) {
                    prefetch_rows(w0, ldw, k, pf);
                    if (two) prefetch_rows(w1, ldw, k, pf);
                }
                _tile_loadd(4, b + size_t(s) * kTileRows * n4, ldc);
                _tile_loadd(2, w0 + k, ldb);
                _tile_dpbf16ps(0, 2, 4);
                if (two) {
                    _tile_loadd(3, w1 + k, ldb);
                    _tile_dpbf16ps(1, 3, 4);
                }
            }
            _tile_stored(0, c[blk], ldc);
            if (two) _tile_stored(1, c[blk + 1], ldc);
        }
    }
    for (int blk = 0; blk < blocks; ++blk)
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < kTileRows; ++i) out[j * ldo + blk * kTileRows + i] = c[blk][i * n4 + j];
}

#include "e4m3_avx512.inc"

// fp8_block: rows [first, first + 16 * blocks) of m (first a multiple of 16, so each 16-row tile
// lies in one 128-row scale band) times tokens x[0 .. n), n <= 16. Per 128-K block each tile's rows
// are decoded to bf16 (a: 16 x 128, exact), its four steps accumulate into a fresh C tile, and C
// times the block's scale is added to the tile's fp32 sums, as the AVX-512-BF16 kernel scales its
// block sums.
void fp8_super_block(const QuantMatrix &m, int64_t first, int blocks, const uint16_t *const *x, int n, float *out,
                     size_t ldo, int pf) {
    const int64_t K = m.K;
    const int n4 = (n + 3) & ~3, ldc = 4 * n4, cn = kTileRows * n4;
    const int steps = int(K / kStep);
    alignas(64) uint32_t b[kFp8ChunkSteps * kTileRows * kMaxTokens];
    alignas(64) float acc[kSuperRows / kTileRows][kTileRows * kMaxTokens];
    alignas(64) uint16_t a[kTileRows * kFp8Block];
    alignas(64) float c[kTileRows * kMaxTokens];
    const __m512i sub_lut = _mm512_loadu_si512(g_e4m3_sub_bf16x32);
    for (int blk = 0; blk < blocks; ++blk) std::fill(acc[blk], acc[blk] + cn, 0.0f);
    for (int s0 = 0; s0 < steps; s0 += kFp8ChunkSteps) {
        const int ns = std::min(kFp8ChunkSteps, steps - s0);  // a multiple of kFp8Steps (K % 128 == 0)
        pack_b(x, n, n4, s0, ns, b);
        for (int blk = 0; blk < blocks; ++blk) {
            const int64_t row0 = first + int64_t(blk) * kTileRows;
            const uint8_t *w = m.data + row0 * K;
            const uint8_t *band = m.scale + (row0 / kFp8Block) * (K / kFp8Block) * 2;
            for (int q = 0; q < ns; q += kFp8Steps) {
                const int64_t k = int64_t(s0 + q) * kStep;
                for (int r = 0; r < kTileRows; ++r) {
                    const uint8_t *wr = w + r * K + k;
                    if (pf) {
                        _mm_prefetch(reinterpret_cast<const char *>(wr) + pf, _MM_HINT_T0);
                        _mm_prefetch(reinterpret_cast<const char *>(wr) + 64 + pf, _MM_HINT_T0);
                    }
                    for (int v = 0; v < kFp8Steps; ++v) {
                        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(wr + v * kStep));
                        _mm512_store_si512(a + r * kFp8Block + v * kStep, e4m3x32_bf16(bytes, sub_lut));
                    }
                }
                _tile_zero(0);
                for (int v = 0; v < kFp8Steps; ++v) {
                    _tile_loadd(2, a + v * kStep, kFp8Block * 2);
                    _tile_loadd(4, b + size_t(q + v) * kTileRows * n4, ldc);
                    _tile_dpbf16ps(0, 2, 4);
                }
                _tile_stored(0, c, ldc);
                uint16_t sbits;
                std::memcpy(&sbits, band + (k / kFp8Block) * 2, 2);
                const __m512 s = _mm512_castsi512_ps(_mm512_set1_epi32(int(uint32_t(sbits) << 16)));
                for (int i = 0; i < cn; i += 16)
                    _mm512_store_ps(acc[blk] + i, _mm512_fmadd_ps(_mm512_load_ps(c + i), s, _mm512_load_ps(acc[blk] + i)));
            }
        }
    }
    for (int blk = 0; blk < blocks; ++blk)
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < kTileRows; ++i) out[j * ldo + blk * kTileRows + i] = acc[blk][i * n4 + j];
}

}  // namespace

void gemv_amx_bf16(const uint16_t *w, size_t ldw, int rows, int cols, const uint16_t *const *x, int ntok,
                   float *out, size_t ldo) {
    const int tiled = rows - rows % kTileRows;
    if (ntok < 2 || cols % kStep != 0 || tiled == 0) {
        gemv_avx512bf16(w, ldw, rows, cols, x, ntok, out, ldo);
        return;
    }
    const int pf = g_prefetch_bytes;
    for_tile_passes(ntok, tiled, configure_bf16, [&](int t0, int n, int r0, int nr) {
        super_block(w + int64_t(r0) * ldw, ldw, nr, cols, x + t0, n, out + t0 * ldo + r0, ldo, pf);
    });
    if (tiled < rows) gemv_avx512bf16(w + int64_t(tiled) * ldw, ldw, rows - tiled, cols, x, ntok, out + tiled, ldo);
}

void fp8_block_amx(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                   size_t ldo) {
    const int tiled = first % kTileRows == 0 ? count - count % kTileRows : 0;
    if (ntok < 2 || tiled == 0) {
        fp8_block_avx512bf16(m, first, count, act, ntok, out, ldo);
        return;
    }
    const int pf = g_prefetch_bytes;
    for_bf16_tile_passes(act, ntok, tiled, [&](const uint16_t *const *x, int t0, int n, int r0, int nr) {
        fp8_super_block(m, first + r0, nr / kTileRows, x, n, out + t0 * ldo + r0, ldo, pf);
    });
    if (tiled < count) fp8_block_avx512bf16(m, first + tiled, count - tiled, act, ntok, out + tiled, ldo);
}

}  // namespace ft::cpu::detail
