// AMX-INT8 kernels of q2_k and q3_k for calls of 5 or more tokens (quant_ops' AMX variants where
// quant_amx_available: AMX-INT8 tiles and VBMI), over the Q8_K activation of their other kernels
// (q8_0_act_bytes layout). Both formats' per-element scaled codes are exact bytes:
//   q2_k  w = d * sc * u - dmin * m per 16 elements, u in 0..3, sc and m in 0..15: sc * u <= 45
//         (unsigned);
//   q3_k  w = d * sc * (u - 4), u in 0..7, sc in -32..31: sc * (4 - u) in -128..124 (signed; the
//         sign flipped so that -32 * -4 cannot occur), w = -d * that.
// Per super-block and 16-row tile:
//   A    16 rows x 64 bytes per tile step: the scaled codes of one 2-bit plane (byte b of the 64
//        code bytes, plane p: element 128 (b / 32) + 32 p + b % 32), looked up with `vpermb`
//        (q3_k: `vpermi2b`) in a table of the row's 16 scales times each code;
//   B    the tokens' int8 activations in the same element order, 4 per dword, one column a token;
//   C0   TDPBUSD (q3_k: TDPBSSD) over the 4 planes: the exact int32 sum per row and token;
//   C1   q2_k's mins, sum over sub-blocks of m * S (S: the activation's sum over the 16 elements,
//        in -2032..2032), as one more TDPBUSD: A' = 16 m (<= 240) and m, B' = S >> 4 and S & 15;
// then per row and token: out += d_act * (d * C0 - dmin * C1) (q3_k: -d * C0) in fp32. Integer
// sums are exact, so results differ from the scalar definition only by fp32 rounding and order,
// as the AVX-512 kernels. Calls of fewer than 5 tokens (kMinTokens) and rows past the last 16 go to
// the AVX-512-VNNI kernel.
#include "immintrin_avx512.hpp"

#include <cstring>

#include "ft/dequant.hpp"
#include "kernels.hpp"
#include "quant_kernels.hpp"

namespace ft::cpu::detail {
namespace {

#include "amx_tiles.inc"

#include "gguf_q3_k_scales.inc"

constexpr int kPlanes = 4;      // tile steps per super-block (64 elements each)
constexpr int kChunkSb = 4;     // super-blocks whose B tiles are packed at once
constexpr int kBRows = kTileRows * kPlanes;  // B rows (dword rows) of one super-block's codes
constexpr int kMinRows = 8;                  // B' rows: 4 of S >> 4, 4 of S & 15
// Calls of fewer tokens run the AVX-512-VNNI kernel: its cost grows by about 0.9 x its fixed part
// per token, the tiles' by about 0.06, and at 4 tokens the tiles were 8-10 % slower (H100 host,
// `moe_layer_q2_k` / `q3_k` bs 8 and 32, FT_CPU_AMX 0 / 1, cpu/README "AMX kernels of the
// quantised formats"), so they cross between 4 and 5.
constexpr int kMinTokens = 5;

// Tiles: 0 C0 (16 rows x n4 int32), 1 C1, 2 A (16 x 64 bytes), 3 A' (16 x 32 bytes),
// 4 B (16 dword rows x n4), 5 B' (8 x n4).
void configure(int n4) {
    const int rows[6] = {kTileRows, kTileRows, kTileRows, kTileRows, kTileRows, kMinRows};
    const int colsb[6] = {4 * n4, 4 * n4, 64, 32, 4 * n4, 4 * n4};
    configure_tiles(6, rows, colsb);
}

// Per token of the call and super-block of the chunk: the B rows of the 4 planes (b, kBRows x n4
// dwords per super-block), with `mins` the B' rows of the mins (b1, kMinRows x n4), and the
// activation's d.
void pack_chunk(const uint8_t *const *act, int n, int n4, int64_t K, int64_t sb0, int nsb, bool mins, uint32_t *b,
                uint32_t *b1, float *da) {
    const int64_t qbytes = (K + 63) / 64 * 64;
    for (int g = 0; g < n4; g += 4)
        for (int s = 0; s < nsb; ++s)
            for (int p = 0; p < kPlanes; ++p) {
                __m512i v[4];
                for (int j = 0; j < 4; ++j) {
                    if (g + j >= n) {
                        v[j] = _mm512_setzero_si512();
                        continue;
                    }
                    const uint8_t *q = act[g + j] + (sb0 + s) * kQK + 32 * p;
                    v[j] = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(q))),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + 128)), 1);
                }
                store_b4(v, b + (size_t(s) * kBRows + size_t(p) * kTileRows) * n4 + g, size_t(n4));
            }
    const __m512i bias = _mm512_set1_epi8(char(0x80));
    for (int j = 0; j < n4; ++j)
        for (int s = 0; s < nsb; ++s) {
            uint32_t *d1 = b1 + size_t(s) * kMinRows * n4 + j;
            if (j >= n) {
                for (int k = 0; k < kMinRows; ++k) d1[k * n4] = 0;
                da[s * kMaxTokens + j] = 0.0f;
                continue;
            }
            float dv;
            std::memcpy(&dv, act[j] + qbytes + (sb0 + s) * kQK / 32 * 4, 4);
            da[s * kMaxTokens + j] = dv;
            if (!mins) continue;
            const uint8_t *q = act[j] + (sb0 + s) * kQK;
            // Sums of 8 bytes of q + 128 (`vpsadbw`), two per sub-block of 16.
            alignas(64) uint64_t t[32];
            for (int i = 0; i < 4; ++i)
                _mm512_store_si512(t + 8 * i, _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + 64 * i), bias),
                                                              _mm512_setzero_si512()));
            uint8_t hi[16], lo[16];
            for (int sub = 0; sub < 16; ++sub) {
                const int S = int(t[2 * sub] + t[2 * sub + 1]) - 16 * 128;
                hi[sub] = uint8_t(int8_t(S >> 4));  // -127 .. 127
                lo[sub] = uint8_t(S & 15);
            }
            for (int k = 0; k < 4; ++k) {
                std::memcpy(&d1[k * n4], hi + 4 * k, 4);
                std::memcpy(&d1[(4 + k) * n4], lo + 4 * k, 4);
            }
        }
}

// Byte i of lane_sub: 4 * the sub-block of lane i / 16 in plane 0 (8 (L / 2) + L % 2), times
// kCodes / 4 for the formats with 8 codes.
inline __m512i lane_subs(int codes) {
    alignas(64) int8_t v[64];
    for (int i = 0; i < 64; ++i) {
        const int lane = i / 16;
        v[i] = int8_t(codes * (8 * (lane / 2) + lane % 2));
    }
    return _mm512_load_si512(v);
}

// Byte i: i / r (the scale of table entry i when each scale has r entries), + first.
inline __m512i repeat_idx(int r, int first) {
    alignas(64) int8_t v[64];
    for (int i = 0; i < 64; ++i) v[i] = int8_t(first + i / r);
    return _mm512_load_si512(v);
}

// q2_k (84 bytes): scales[16] (low nibble sc, high nibble m), qs[64], fp16 d, dmin.
struct Q2K {
    static constexpr int kBytes = kQ2_KBlockBytes, kDOffset = 80;
    static constexpr bool kMins = true;
    __m512i rep4 = repeat_idx(4, 0), lane_sub = lane_subs(4);
    // The A rows of the super-block at blk: 4 planes of sc * u (a, 256 bytes) and 16 m, m (a1).
    void decode(const uint8_t *blk, uint8_t *a, uint8_t *a1) const {
        const __m128i sc16 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk));
        // Byte 4 s + v of the table: (sc[s] & 15) * v.
        const __m512i scx = _mm512_and_si512(_mm512_permutexvar_epi8(rep4, _mm512_castsi128_si512(sc16)),
                                             _mm512_set1_epi8(15));
        const __m512i table = _mm512_add_epi8(_mm512_maskz_mov_epi8(__mmask64(0xAAAAAAAAAAAAAAAAull), scx),
                                              _mm512_maskz_mov_epi8(__mmask64(0xCCCCCCCCCCCCCCCCull), _mm512_add_epi8(scx, scx)));
        const __m512i qv = _mm512_loadu_si512(blk + 16);
        for (int p = 0; p < kPlanes; ++p) {
            // Lane L of plane p is sub-block 8 (L / 2) + L % 2 + 2 p: index 4 * sub + u.
            const __m512i u = _mm512_and_si512(_mm512_srli_epi16(qv, 2 * p), _mm512_set1_epi8(3));
            const __m512i idx = _mm512_or_si512(u, _mm512_add_epi8(lane_sub, _mm512_set1_epi8(char(8 * p))));
            _mm512_store_si512(a + 64 * p, _mm512_permutexvar_epi8(idx, table));
        }
        _mm_store_si128(reinterpret_cast<__m128i *>(a1), _mm_and_si128(sc16, _mm_set1_epi8(char(0xf0))));
        _mm_store_si128(reinterpret_cast<__m128i *>(a1 + 16), _mm_and_si128(_mm_srli_epi16(sc16, 4), _mm_set1_epi8(15)));
    }
    // C0 += A . B (tiles 0, 2, 4; the tile numbers must be literals for the intrinsic).
    static void dot() { _tile_dpbusd(0, 2, 4); }
    // The factor of C0 from the row's d (C1's is -dmin).
    static __m512 c0_factor(__m512 d) { return d; }
};

// q3_k (110 bytes): hmask[32], qs[64], scales[12], fp16 d; element 128 h + 32 p + i has its high
// bit in bit 4 h + p of hmask[i].
struct Q3K {
    static constexpr int kBytes = kQ3_KBlockBytes, kDOffset = 108;
    static constexpr bool kMins = false;
    __m512i rep_lo = repeat_idx(8, 0), rep_hi = repeat_idx(8, 8), lane_sub = lane_subs(8);
    void decode(const uint8_t *blk, uint8_t *a, uint8_t *) const {
        const __m512i sc = _mm512_castsi128_si512(q3_k_scales(blk));
        // Byte 8 s + u of the 128-entry table (two vectors): sc[s] * (4 - u), as 4 sc - u sc with
        // wrapping byte sums (the result fits a byte).
        __m512i t[2];
        for (int h = 0; h < 2; ++h) {
            const __m512i s1 = _mm512_permutexvar_epi8(h ? rep_hi : rep_lo, sc);
            const __m512i s2 = _mm512_add_epi8(s1, s1), s4 = _mm512_add_epi8(s2, s2);
            __m512i v = _mm512_mask_sub_epi8(s4, __mmask64(0xAAAAAAAAAAAAAAAAull), s4, s1);  // u & 1
            v = _mm512_mask_sub_epi8(v, __mmask64(0xCCCCCCCCCCCCCCCCull), v, s2);             // u & 2
            t[h] = _mm512_mask_sub_epi8(v, __mmask64(0xF0F0F0F0F0F0F0F0ull), v, s4);          // u & 4
        }
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk));
        // Byte b of hv: hmask[b % 32] >> 4 (b / 32), so bit p is the high bit of plane p.
        const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(hm),
                                              _mm256_and_si256(_mm256_srli_epi16(hm, 4), _mm256_set1_epi8(15)), 1);
        const __m512i qv = _mm512_loadu_si512(blk + 32);
        for (int p = 0; p < kPlanes; ++p) {
            __m512i u = _mm512_and_si512(_mm512_srli_epi16(qv, 2 * p), _mm512_set1_epi8(3));
            const __mmask64 hb = _mm512_test_epi8_mask(hv, _mm512_set1_epi8(char(1 << p)));
            u = _mm512_mask_add_epi8(u, hb, u, _mm512_set1_epi8(4));
            const __m512i idx = _mm512_or_si512(u, _mm512_add_epi8(lane_sub, _mm512_set1_epi8(char(16 * p))));
            _mm512_store_si512(a + 64 * p, _mm512_permutex2var_epi8(t[0], idx, t[1]));
        }
    }
    static void dot() { _tile_dpbssd(0, 2, 4); }
    static __m512 c0_factor(__m512 d) { return _mm512_sub_ps(_mm512_setzero_ps(), d); }
};

// Rows [first, first + 16 * blocks) of m (format F) times tokens act[0 .. n), n <= 16.
template <class F>
void super_block(const QuantMatrix &m, int64_t first, int blocks, const uint8_t *const *act, int n, float *out,
                 size_t ldo, int pf) {
    const F fmt;
    const int64_t K = m.K, nsb_all = K / kQK;
    const size_t rb = size_t(nsb_all) * F::kBytes;
    const int n4 = (n + 3) & ~3, ldc = 4 * n4, nv = n4;  // nv: 16-lane vectors of a 16 x n4 C tile
    alignas(64) uint32_t b[kChunkSb * kBRows * kMaxTokens];
    alignas(64) uint32_t b1[kChunkSb * kMinRows * kMaxTokens];
    alignas(64) float da[kChunkSb * kMaxTokens];
    alignas(64) float acc[kSuperRows / kTileRows][kTileRows * kMaxTokens];
    alignas(64) uint8_t a[kTileRows * kPlanes * 64];
    alignas(64) uint8_t a1[kTileRows * 32];
    alignas(64) int32_t c0[kTileRows * kMaxTokens], c1[kTileRows * kMaxTokens];
    // Lane l of C vector v is row (16 v + l) / n4, token (16 v + l) % n4.
    __m512i ridx[kMaxTokens], tidx[kMaxTokens];
    for (int v = 0; v < nv; ++v) {
        alignas(64) int32_t r[16], t[16];
        for (int l = 0; l < 16; ++l) r[l] = (16 * v + l) / n4, t[l] = (16 * v + l) % n4;
        ridx[v] = _mm512_load_si512(r);
        tidx[v] = _mm512_load_si512(t);
    }
    const __m512i row_off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(int(rb)));
    for (int blk = 0; blk < blocks; ++blk) std::memset(acc[blk], 0, sizeof(float) * kTileRows * n4);
    std::memset(da, 0, sizeof da);
    for (int64_t sb0 = 0; sb0 < nsb_all; sb0 += kChunkSb) {
        const int nsb = int(nsb_all - sb0 < kChunkSb ? nsb_all - sb0 : kChunkSb);
        pack_chunk(act, n, n4, K, sb0, nsb, F::kMins, b, b1, da);
        for (int blk = 0; blk < blocks; ++blk) {
            const uint8_t *rows = m.data + size_t(first + int64_t(blk) * kTileRows) * rb;
            for (int s = 0; s < nsb; ++s) {
                const size_t off = size_t(sb0 + s) * F::kBytes;
                for (int r = 0; r < kTileRows; ++r) {
                    const uint8_t *p = rows + r * rb + off;
                    if (pf) {
                        _mm_prefetch(reinterpret_cast<const char *>(p) + pf, _MM_HINT_T0);
                        _mm_prefetch(reinterpret_cast<const char *>(p) + 64 + pf, _MM_HINT_T0);
                    }
                    fmt.decode(p, a + r * kPlanes * 64, a1 + r * 32);
                }
                _tile_zero(0);
                for (int p = 0; p < kPlanes; ++p) {
                    _tile_loadd(2, a + 64 * p, kPlanes * 64);
                    _tile_loadd(4, b + (size_t(s) * kBRows + size_t(p) * kTileRows) * n4, ldc);
                    F::dot();
                }
                _tile_stored(0, c0, ldc);
                if constexpr (F::kMins) {
                    _tile_zero(1);
                    _tile_loadd(3, a1, 32);
                    _tile_loadd(5, b1 + size_t(s) * kMinRows * n4, ldc);
                    _tile_dpbusd(1, 3, 5);
                    _tile_stored(1, c1, ldc);
                }
                // d (and dmin): fp16 at kDOffset (+ 2) of each row's super-block.
                const __m512i dd = _mm512_i32gather_epi32(row_off, rows + off + F::kDOffset, 1);
                const __m512 dw = F::c0_factor(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
                const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
                const __m512 dav = _mm512_load_ps(da + s * kMaxTokens);
                for (int v = 0; v < nv; ++v) {
                    __m512 w = _mm512_mul_ps(_mm512_permutexvar_ps(ridx[v], dw),
                                             _mm512_cvtepi32_ps(_mm512_load_si512(c0 + 16 * v)));
                    if constexpr (F::kMins)
                        w = _mm512_fnmadd_ps(_mm512_permutexvar_ps(ridx[v], dm),
                                             _mm512_cvtepi32_ps(_mm512_load_si512(c1 + 16 * v)), w);
                    float *o = acc[blk] + 16 * v;
                    _mm512_store_ps(o, _mm512_fmadd_ps(_mm512_permutexvar_ps(tidx[v], dav), w, _mm512_load_ps(o)));
                }
            }
        }
    }
    for (int blk = 0; blk < blocks; ++blk)
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < kTileRows; ++i) out[j * ldo + blk * kTileRows + i] = acc[blk][i * n4 + j];
}

// Whole 16-row tiles of tokens in passes of 16; calls of fewer than kMinTokens and the rows left
// to `rest`.
template <class F>
void amx_gemv(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
              size_t ldo, QuantGemv rest) {
    const int tiled = count - count % kTileRows;
    if (ntok < kMinTokens || tiled == 0) {
        rest(m, first, count, act, ntok, out, ldo);
        return;
    }
    const int pf = gguf_prefetch_bytes();
    for_tile_passes(ntok, tiled, configure, [&](int t0, int n, int r0, int nr) {
        super_block<F>(m, first + r0, nr / kTileRows, act + t0, n, out + t0 * ldo + r0, ldo, pf);
    });
    if (tiled < count) rest(m, first + tiled, count - tiled, act, ntok, out + tiled, ldo);
}

}  // namespace

void q2_k_amx(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
              size_t ldo) {
    amx_gemv<Q2K>(m, first, count, act, ntok, out, ldo, q2_k_avx512vnni);
}

void q3_k_amx(const QuantMatrix &m, int64_t first, int count, const uint8_t *const *act, int ntok, float *out,
              size_t ldo) {
    amx_gemv<Q3K>(m, first, count, act, ntok, out, ldo, q3_k_avx512vnni);
}

}  // namespace ft::cpu::detail
