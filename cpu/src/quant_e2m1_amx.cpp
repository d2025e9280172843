// AMX-BF16 kernels of mxfp4 and ds_fp4 (bf16 activations as their AVX-512-BF16 kernels') for calls
// of several tokens; quant_ops' AMX variants where quant_amx_available (AMX-BF16 and VBMI). Each
// weight is decoded to bf16 with its e8m0 factor applied as an exponent increment (exact for the
// codes in [kMinCode, kMaxCode]), so TDPBF16PS multiplies exactly, C tiles sum in fp32 over all of
// K and no block sum is stored; only the summation order differs from the AVX-512-BF16 kernels,
// which take the one-token calls and what the tiles leave (mxfp4 lines, ds_fp4 rows holding
// another code; the last count % 16 ds_fp4 rows):
//   mxfp4   the weights are the B tiles: K row kb holds per column the pair (W[n, 2kb],
//           W[n, 2kb + 1]), so the VBMI kernel's two shuffles per 16 columns (vpmultishiftqb,
//           vpermw) give a B row in that kernel's lane order (mxfp4_vbmi_column); the tokens'
//           activations, packed per chunk of K, are the A rows;
//   ds_fp4  16-row A tiles in the activation's 4-phase order, as the AVX-512-BF16 kernel decodes
//           them; the activations are packed into B tiles (pack_b).
#include "immintrin_avx512.hpp"

#include <cstring>

#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "amx_tiles.inc"

#include "tier_avx512.inc"

constexpr int kLine = 64;         // columns per line (one cache line of a K row)
constexpr int kGroups = 4;        // 16-column groups per line (one B / C tile each)
constexpr int kBlockRows = 16;    // K-pair rows per 32-K block
constexpr int kChunk = 512;       // K elements of the tokens' activations packed at once
constexpr int kSuperLines = 4;    // lines sharing one packed chunk (their sums kept in memory)
// The e8m0 codes folded into the weights' bf16 exponents: 2^-63 .. 2^63, so every weight stays a
// normal bf16 and products and sums far from fp32's limits. Lines holding other codes (none in
// real checkpoints; 0 and 255 = NaN among them) run mxfp4_avx512vbmi.
constexpr int kMinCode = 64, kMaxCode = 190;

// Tiles 0-3: C of the four groups (n rows x 16 fp32); 4: A (n rows x 32 bf16); 5, 6: B (16 K pairs
// x 16 columns).
void configure(int n) {
    const int rows[7] = {n, n, n, n, n, kBlockRows, kBlockRows};
    const int colsb[7] = {64, 64, 64, 64, 64, 64, 64};
    configure_tiles(7, rows, colsb);
}

// One block's products of the A tile (tile 4) and the decoded groups in b, added to C tiles 0-3.
// Literal tile numbers: GCC pastes them into the instructions.
void block_tiles(const uint16_t *b) {
    _tile_loadd(5, b + 0 * kBlockRows * 32, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, b + 1 * kBlockRows * 32, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, b + 2 * kBlockRows * 32, 64);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(6, b + 3 * kBlockRows * 32, 64);
    _tile_dpbf16ps(3, 4, 6);
}

void load_c(const float *c) {
    _tile_loadd(0, c + 0 * 256, 64);
    _tile_loadd(1, c + 1 * 256, 64);
    _tile_loadd(2, c + 2 * 256, 64);
    _tile_loadd(3, c + 3 * 256, 64);
}

void store_c(float *c) {
    _tile_stored(0, c + 0 * 256, 64);
    _tile_stored(1, c + 1 * 256, 64);
    _tile_stored(2, c + 2 * 256, 64);
    _tile_stored(3, c + 3 * 256, 64);
}

// (code - 127) << 7 in each 16-bit word holding an e8m0 code: its factor as an increment of a
// bf16 exponent.
inline __m512i e8m0_exponent_step(__m512i code_words) {
    return _mm512_slli_epi16(_mm512_sub_epi16(code_words, _mm512_set1_epi16(127)), 7);
}

// The bf16 weights w times their factors (steps from e8m0_exponent_step); zeros (codes 0 and 8) stay
// zero. Exact while every code is in the window.
inline __m512i scale_bf16(__m512i w, __m512i step) {
    return _mm512_mask_add_epi16(w, _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x7fff)), w, step);
}

// Whether every code in the masked bytes of `rows` vectors of 64 at p, `stride` apart, lies in
// [kMinCode, kMaxCode]; the last vector's mask is `last` (the others `mask`).
bool codes_in_window(const uint8_t *p, int64_t rows, int64_t stride, __mmask64 mask, __mmask64 last) {
    __m512i mn = _mm512_set1_epi8(-1), mx = _mm512_setzero_si512();
    for (int64_t r = 0; r < rows; ++r) {
        const __mmask64 k = r + 1 < rows ? mask : last;
        const __m512i v = _mm512_maskz_loadu_epi8(k, p + r * stride);
        mn = _mm512_mask_min_epu8(mn, k, mn, v);
        mx = _mm512_max_epu8(mx, v);
    }
    return !_mm512_cmplt_epu8_mask(mn, _mm512_set1_epi8(char(kMinCode))) &&
           !_mm512_cmpgt_epu8_mask(mx, _mm512_set1_epi8(char(kMaxCode)));
}

// Columns [first, first + count) (count <= kSuperLines * kLine) times tokens x[0 .. n), n <= 16;
// lines with a code outside the window are left to mxfp4_avx512vbmi (returned: bit l for line l).
// Per chunk of K the activations are packed into A rows; per line the C tiles are reloaded, and
// per block its 16 K-pair rows decoded with the scale folded into the exponent, then multiplied.
unsigned super_block(const QuantMatrix &m, int64_t first, int count, const uint16_t *const *x, int n, float *out,
                     size_t ldo, int pf_rows) {
    const int64_t K = m.K, N = m.N;
    const int lines = (count + kLine - 1) / kLine;
    const __m512i lut = _mm512_loadu_si512(g_e2m1_bf16x32);
    __m512i ctrl[kGroups], eidx[kGroups];
    for (int g = 0; g < kGroups; ++g) {
        __m512i sidx;
        mxfp4_vbmi_group(g, ctrl[g], sidx);
        // The scale byte of lane l's column into bytes 4l and 4l + 2 (both words of the lane).
        eidx[g] = _mm512_or_si512(sidx, _mm512_slli_epi32(sidx, 16));
    }
    __mmask64 mask[kSuperLines];
    unsigned fallback = 0;
    for (int l = 0; l < lines; ++l) {
        const int cl = count - l * kLine;
        mask[l] = cl >= kLine ? ~__mmask64(0) : (__mmask64(1) << cl) - 1;
        if (!codes_in_window(m.scale + first + l * kLine, K / 32, N, mask[l], mask[l])) fallback |= 1u << l;
    }
    if (fallback == (1u << lines) - 1) return fallback;
    alignas(64) uint16_t a[kMaxTokens * kChunk];
    alignas(64) uint16_t b[kGroups * kBlockRows * 32];
    alignas(64) float c[kSuperLines][kGroups * 256];
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int kc = K - k0 < kChunk ? int(K - k0) : kChunk;  // a multiple of 32
        for (int t = 0; t < n; ++t) std::memcpy(a + t * kChunk, x[t] + k0, size_t(kc) * 2);
        for (int l = 0; l < lines; ++l) {
            if (fallback >> l & 1) continue;
            const int64_t col = first + l * kLine;
            if (k0 == 0) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            } else {
                load_c(c[l]);
            }
            for (int kk = 0; kk < kc; kk += 32) {
                const int64_t kb0 = (k0 + kk) / 2;
                // Per group, the step of each lane's code in both its words.
                const __m512i sv = _mm512_maskz_loadu_epi8(mask[l], m.scale + ((k0 + kk) / 32) * N + col);
                __m512i e[kGroups];
                #pragma GCC unroll 4
                for (int g = 0; g < kGroups; ++g)
                    e[g] = e8m0_exponent_step(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, eidx[g], sv));
                const uint8_t *row = m.data + kb0 * N + col;
                for (int p = 0; p < kBlockRows; ++p, row += N) {
                    if (pf_rows && kb0 + p + pf_rows < K / 2)
                        _mm_prefetch(reinterpret_cast<const char *>(row + pf_rows * N), _MM_HINT_T1);
                    const __m512i v = _mm512_maskz_loadu_epi8(mask[l], row);
                    #pragma GCC unroll 4
                    for (int g = 0; g < kGroups; ++g) {
                        const __m512i w = _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(ctrl[g], v), lut);
                        _mm512_store_si512(b + (g * kBlockRows + p) * 32, scale_bf16(w, e[g]));
                    }
                }
                _tile_loadd(4, a + kk, kChunk * 2);
                block_tiles(b);
            }
            store_c(c[l]);
        }
    }
    for (int l = 0; l < lines; ++l) {
        if (fallback >> l & 1) continue;
        for (int g = 0; g < kGroups; ++g)
            for (int j = 0; j < 16; ++j) {
                const int cc = l * kLine + mxfp4_vbmi_column(g, j);
                if (cc < count)
                    for (int t = 0; t < n; ++t) out[t * ldo + cc] = c[l][g * 256 + t * 16 + j];
            }
    }
    return fallback;
}

// ---- ds_fp4: row-major e2m1 with e8m0 per 32, activations bf16 in 4 phases per 128 -----------
//
// The weights are the A tiles, 16 rows x 32 bf16 per tile step, in the activation's order (phase
// r of each 128: word m = element 4m + r, block m / 8), decoded as the AVX-512-BF16 kernel does
// (the 64 bytes of 128 elements shifted by 0, 4, 8, 12 bits, one `vpermw` each) with the block's
// code folded into the exponent as for mxfp4; the activations are packed into B tiles (pack_b).
// Rows holding a code outside [kMinCode, kMaxCode] are computed again by the AVX-512-BF16 kernel.

constexpr int kDsBlock = 32;             // elements per e8m0 code
constexpr int kDsChunk = 128;            // elements per decoded A chunk (4 tile steps)
constexpr int kDsPackSteps = 16;         // tile steps whose B tiles are packed at once (512 elements)

// Rows [row0, row0 + 16 * blocks) (blocks <= 8) times tokens x[0 .. n), n <= 16: per chunk of
// kDsPackSteps steps the B tiles are packed once, then each 16-row block's C tile accumulates the
// chunk (kept in c between chunks).
void ds_super_block(const QuantMatrix &m, int64_t row0, int blocks, const uint16_t *const *x, int n, float *out,
                    size_t ldo, int pf) {
    const int64_t K = m.K;
    const int n4 = (n + 3) & ~3, ldc = 4 * n4;
    const int steps = int(K / kBf16Step);
    const __m512i lut = _mm512_loadu_si512(g_e2m1_bf16x32);
    // Word m of a phase vector (128-bit lane m / 8) takes byte m / 8 of the chunk's 4 codes.
    const __m512i cidx = _mm512_set_epi64(0x8003800380038003ll, 0x8003800380038003ll, 0x8002800280028002ll,
                                          0x8002800280028002ll, 0x8001800180018001ll, 0x8001800180018001ll,
                                          0x8000800080008000ll, 0x8000800080008000ll);
    alignas(64) uint32_t b[kDsPackSteps * kTileRows * kMaxTokens];
    alignas(64) float c[kSuperRows / kTileRows][kTileRows * kMaxTokens];
    alignas(64) uint16_t a[kTileRows * kDsChunk];
    for (int s0 = 0; s0 < steps; s0 += kDsPackSteps) {
        const int ns = steps - s0 < kDsPackSteps ? steps - s0 : kDsPackSteps;  // a multiple of 4 (K % 128 == 0)
        pack_b(x, n, n4, s0, ns, b);
        for (int blk = 0; blk < blocks; ++blk) {
            const int64_t r0 = row0 + int64_t(blk) * kTileRows;
            if (s0 == 0) _tile_zero(0);
            else _tile_loadd(0, c[blk], ldc);
            for (int q = 0; q < ns; q += kDsChunk / kBf16Step) {
                const int64_t k = int64_t(s0 + q) * kBf16Step;
                for (int r = 0; r < kTileRows; ++r) {
                    const uint8_t *p = m.data + (r0 + r) * (K / 2) + k / 2;
                    if (pf) _mm_prefetch(reinterpret_cast<const char *>(p) + pf, _MM_HINT_T0);
                    uint32_t codes;
                    std::memcpy(&codes, m.scale + (r0 + r) * (K / kDsBlock) + k / kDsBlock, 4);
                    const __m512i e = e8m0_exponent_step(_mm512_shuffle_epi8(_mm512_set1_epi32(int(codes)), cidx));
                    const __m512i v = _mm512_loadu_si512(p);
                    #pragma GCC unroll 4
                    for (int ph = 0; ph < 4; ++ph) {
                        const __m512i w = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4 * ph), lut);
                        _mm512_store_si512(a + r * kDsChunk + 32 * ph, scale_bf16(w, e));
                    }
                }
                #pragma GCC unroll 4
                for (int v = 0; v < kDsChunk / kBf16Step; ++v) {
                    _tile_loadd(2, a + v * kBf16Step, kDsChunk * 2);
                    _tile_loadd(4, b + size_t(q + v) * kTileRows * n4, ldc);
                    _tile_dpbf16ps(0, 2, 4);
                }
            }
            _tile_stored(0, c[blk], ldc);
        }
    }
    for (int blk = 0; blk < blocks; ++blk)
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < kTileRows; ++i) out[j * ldo + blk * kTileRows + i] = c[blk][i * n4 + j];
}

}  // namespace

void mxfp4_amx(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
               size_t ldo) {
    if (ntok < 2) {
        mxfp4_avx512vbmi(m, first, count, act, ntok, out, ldo);
        return;
    }
    const int pf_rows = g_prefetch_bytes / 8;
    constexpr int kSuper = kSuperLines * kLine;
    for (int t0 = 0; t0 < ntok; t0 += kMaxTokens) {
        const int n = ntok - t0 < kMaxTokens ? ntok - t0 : kMaxTokens;
        configure(n);
        const uint16_t *x[kMaxTokens];
        for (int j = 0; j < n; ++j) x[j] = reinterpret_cast<const uint16_t *>(act[t0 + j]);
        for (int c0 = 0; c0 < count; c0 += kSuper) {
            const int cs = count - c0 < kSuper ? count - c0 : kSuper;
            const unsigned fallback = super_block(m, first + c0, cs, x, n, out + t0 * ldo + c0, ldo, pf_rows);
            for (int l = 0; l * kLine < cs; ++l)
                if (fallback >> l & 1) {
                    const int c1 = c0 + l * kLine;
                    mxfp4_avx512vbmi(m, first + c1, cs - l * kLine < kLine ? cs - l * kLine : kLine, act + t0, n,
                                     out + t0 * ldo + c1, ldo);
                }
        }
    }
    _tile_release();
}

void ds_fp4_amx(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
                size_t ldo) {
    const int tiled = count - count % kTileRows;
    if (ntok < 2 || tiled == 0) {
        ds_fp4_avx512bf16_rowexp(m, first, count, act, ntok, out, ldo);
        return;
    }
    const int pf = g_prefetch_bytes;
    // The tiles of configure_bf16 (C in tile 0, A in 2, B in 4).
    for_bf16_tile_passes(act, ntok, tiled, [&](const uint16_t *const *x, int t0, int n, int r0, int nr) {
        ds_super_block(m, first + r0, nr / kTileRows, x, n, out + t0 * ldo + r0, ldo, pf);
    });
    if (tiled < count) ds_fp4_avx512bf16_rowexp(m, first + tiled, count - tiled, act, ntok, out + tiled, ldo);
    // Rows holding a code outside the window: again by the AVX-512-BF16 kernel.
    for (int j = 0; j < tiled; ++j)
        if (const int64_t n = m.K / kDsBlock;
            !codes_in_window(m.scale + (first + j) * n, (n + 63) / 64, 64, ~__mmask64(0),
                             n % 64 ? (__mmask64(1) << (n % 64)) - 1 : ~__mmask64(0)))
            ds_fp4_avx512bf16_rowexp(m, first + j, 1, act, ntok, out + j, ldo);
}

}  // namespace ft::cpu::detail
