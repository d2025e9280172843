// The integer-dot decode kernel of the GGUF block formats q4_0, q8_0, q2_k .. q6_k, iq4_xs
// (launch_simt_projection, decode_simt.cu, picks it). Each CTA quantises the activations of the
// routes it serves to int8 in shared memory as the CPU kernels do (ft::format_act_block: Q8_0 per
// 32 elements for q4_0 and q8_0, Q8_K per 256 for the others) while its weight rows are copied
// into shared memory where they fit (in multi-route calls prefetched into L2 otherwise); each
// warp serves pairs of weight rows, 8, 16 or 32 lanes to a pair, and its lanes take 32-weight
// chunks (in one-route calls a group at once, kGroup: the chunks that share code bytes, or two
// neighbours), unpacked to int8 codes 4 to a word and dotted with __dp4a, the block scales applied
// once per 16 weights. One-route calls of
// long rows take dp4a_stream_kernel: the same dots on rows each warp streams through its own
// shared-memory ring.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "decode_kernels.cuh"
#include "ft/cuda_gguf.cuh"
#include "ft/cuda_launch.cuh"

namespace ft::cuda::decode {
namespace {

// Generic loads: a row is read from global memory or from its copy in shared memory.
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return *reinterpret_cast<const unsigned int *>(p); }
__device__ __forceinline__ uint32_t ld16(const uint8_t *p) { return *reinterpret_cast<const unsigned short *>(p); }
__device__ __forceinline__ float f16_at(const uint8_t *p) { return f16_to_f32(uint16_t(ld16(p))); }

// N words from p (2-byte aligned; every field of these blocks is): aligned loads, shifted by two
// bytes where p is not 4-byte aligned, then the last word's high half comes from a 2-byte load, so
// nothing at or past p + 4N is read (the 2 bytes before p share p's aligned word: same allocation).
template <int N>
__device__ __forceinline__ void load_words(const uint8_t *p, uint32_t *w) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (N % 4 == 0 && (a & 15) == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            const uint4 v = reinterpret_cast<const uint4 *>(p)[i];
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if ((a & 3) == 0) {
#pragma unroll
        for (int i = 0; i < N; ++i) w[i] = ld32(p + 4 * i);
    } else {
        const uint8_t *b = p - 2;
        uint32_t prev = ld32(b);
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const uint32_t next = i + 1 < N ? ld32(b + 4 * (i + 1)) : ld16(b + 4 * N);
            w[i] = __funnelshift_r(prev, next, 16);
            prev = next;
        }
    }
}

// Four 4-bit IQ4_NL codes (one per byte) -> their four int8 values (table in gguf_detail::iq4nl).
__device__ __forceinline__ uint32_t iq4nl4(uint32_t codes) {
    const uint32_t c7 = codes & 0x07070707u, x = c7 | (c7 >> 4);
    const uint32_t sel = (x & 0xffu) | ((x >> 8) & 0xff00u);  // byte i's low 3 bits in nibble i
    const uint32_t lo = __byte_perm(0xbfad9881u, 0xf6eaddcfu, sel), hi = __byte_perm(0x26190d01u, 0x71594535u, sel);
    const uint32_t m = ((codes >> 3) & 0x01010101u) * 0xffu;
    return (hi & m) | (lo & ~m);
}

// Code offset subtracted from every weight's code (the value is code - off).
template <Format F>
constexpr int kOff = F == Format::q6_k ? 32 : F == Format::q4_0 ? 8 : F == Format::q3_k ? 4 : 0;

// Formats whose 32-weight chunks have 16 code bytes of their own (q4_0 blocks, iq4_xs
// sub-blocks): a group is two neighbours, loaded at once for more bytes in flight per lane (not
// q8_0: its 34-byte blocks measured slower in pairs).
template <Format F>
constexpr bool kPairs = F == Format::q4_0 || F == Format::iq4_xs;

// Chunks a lane takes at once in one-route calls: those that share their code bytes (q2_k, q3_k:
// the four 2-bit planes of 32 bytes; q4_k, q5_k and q6_k's ql: the two nibbles), so each byte is
// loaded once, or a pair (kPairs).
template <Format F>
constexpr int kGroup = F == Format::q2_k || F == Format::q3_k ? 4 : F == Format::q8_0 ? 1 : 2;

// Chunk i of group g (chunk c holds elements 32c .. 32c + 31 of the row).
template <Format F>
__device__ __forceinline__ int group_chunk(int g, int i) {
    if constexpr (F == Format::q6_k)
        return (g / 4) * 8 + 4 * ((g % 4) / 2) + (g % 2) + 2 * i;  // quarters q and q + 2 of a half
    else
        return kGroup<F> * g + i;
}

// The bytes of one group: codes (q), the q3_k / q5_k / q6_k high bits (x), scale bytes (s), the
// super-block's d and dmin (kPairs: d and dmin are the two chunks' scales). Layouts in
// docs/formats.md and lib/core/formats (dequant.cpp for q4_0, dequant_gguf.cpp).
struct Group {
    uint32_t q[8], x[8], s[3];
    float d, dmin;
    int sel;  // which part of its super-block the group is
};

__device__ __forceinline__ uint32_t byte_of(uint32_t w, int b) { return (w >> (8 * b)) & 0xffu; }

// Group g (kPairs with P = 1: chunk g alone, as chunk 0 of its group).
template <Format F, int P = 2>
__device__ __forceinline__ Group load_group(const uint8_t *row, int g) {
    using namespace gguf_detail;
    Group w;
    w.dmin = 0.0f;
    if constexpr (F == Format::q4_0) {
        const uint8_t *blk = row + int64_t(P * g) * kQ4_0BlockBytes;
        w.d = f16_at(blk);
        load_words<4>(blk + 2, w.q);
        if constexpr (P == 2) {
            w.dmin = f16_at(blk + kQ4_0BlockBytes);
            load_words<4>(blk + kQ4_0BlockBytes + 2, w.q + 4);
        }
    } else if constexpr (F == Format::q8_0) {
        const uint8_t *blk = row + int64_t(g) * kQ8_0BlockBytes;
        w.d = f16_at(blk);
        load_words<8>(blk + 2, w.q);
    } else if constexpr (F == Format::iq4_xs) {
        const int ib = (P * g) % 8;  // the (first) sub-block
        const uint8_t *blk = row + int64_t(P * g / 8) * kIQ4_XSBlockBytes;
        const uint32_t sh = ld16(blk + 2), sl = blk[4 + ib / 2];  // ib even with P = 2: both nibbles
        const float d = f16_at(blk);
        const int ls0 = ((sl >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
        w.d = d * float(ls0 - 32);
        load_words<4 * P>(blk + 8 + 16 * ib, w.q);
        if constexpr (P == 2) w.dmin = d * float(int((sl >> 4) | (((sh >> (2 * ib + 2)) & 3) << 4)) - 32);
    } else if constexpr (F == Format::q2_k || F == Format::q3_k) {
        w.sel = g % 2;  // the half of the super-block
        const uint8_t *sb = row + int64_t(g / 2) * gguf_row_bytes<F>(kQK);
        if constexpr (F == Format::q2_k) {
            uint32_t dm;
            load_words<8>(sb + 16 + 32 * w.sel, w.q);
            load_words<2>(sb + 8 * w.sel, w.s);
            load_words<1>(sb + 80, &dm);
            w.d = f16_to_f32(uint16_t(dm & 0xffffu));
            w.dmin = f16_to_f32(uint16_t(dm >> 16));
        } else {
            load_words<8>(sb + 32 + 32 * w.sel, w.q);
            load_words<8>(sb, w.x);
            uint32_t s6[3];
            load_words<3>(sb + 96, s6);
            w.s[0] = s6[0], w.s[1] = s6[1], w.s[2] = s6[2];
            w.d = f16_at(sb + 108);
        }
    } else if constexpr (F == Format::q4_k || F == Format::q5_k) {
        w.sel = g % 4;  // sub-blocks 2 sel and 2 sel + 1
        const uint8_t *sb = row + int64_t(g / 4) * gguf_row_bytes<F>(kQK);
        uint32_t dm;
        load_words<1>(sb, &dm);
        w.d = f16_to_f32(uint16_t(dm & 0xffffu));
        w.dmin = f16_to_f32(uint16_t(dm >> 16));
        // Scale bytes 2 sel .. +1 (A), 2 sel + 4 .. +5 (B) and 2 sel - 4 .. -3 (C; sel >= 2 only)
        // of the 12 at sb + 4: what gguf_detail::scale_min_k4 reads for sub-blocks 2 sel and
        // 2 sel + 1, loaded once for both (group_chunk_codes decodes them from registers).
        w.s[0] = ld16(sb + 4 + 2 * w.sel);
        w.s[1] = ld16(sb + 8 + 2 * w.sel);
        w.s[2] = ld16(sb + 4 + (2 * w.sel + 8) % 12);
        constexpr int qs_at = F == Format::q4_k ? 16 : 48;
        load_words<8>(sb + qs_at + 32 * w.sel, w.q);
        if constexpr (F == Format::q5_k) load_words<8>(sb + 16, w.x);
    } else if constexpr (F == Format::q6_k) {
        w.sel = g % 4;  // half sel / 2, ql nibbles of quarters sel % 2 and sel % 2 + 2
        const int half = w.sel / 2, lo = w.sel % 2;
        const uint8_t *sb = row + int64_t(g / 4) * gguf_row_bytes<F>(kQK);
        load_words<8>(sb + 64 * half + 32 * lo, w.q);
        load_words<8>(sb + 128 + 32 * half, w.x);
        w.s[0] = ld16(sb + 192 + 8 * half + 2 * lo);
        w.s[1] = ld16(sb + 196 + 8 * half + 2 * lo);
        w.d = f16_at(sb + 208);
    }
    return w;
}

// 32 weights of a row: int8 codes q (element order, 4 to a word) and, per half of 16, the factor
// of the codes and of the activation sum: sum_i w_i x_i = da * sum_h (mult[h] * (sum q a - off *
// sum a) - minv[h] * sum a) over the half's int8 activations a (x = da * a).
struct Chunk {
    uint32_t q[8];
    float mult[2], minv[2];
};

// Chunk I (< kGroup<F>) of a loaded group: constant where the caller unrolls over a group, else
// per lane, so word choices are selects, never an indexed register array (local memory).
template <Format F>
__device__ __forceinline__ Chunk group_chunk_codes(const Group &w, int I) {
    Chunk k;
    k.minv[0] = k.minv[1] = 0.0f;
    if constexpr (F == Format::q4_0) {  // byte j: element j (low nibble), j + 16 (high)
        k.mult[0] = k.mult[1] = I == 0 ? w.d : w.dmin;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = I == 0 ? w.q[i] : w.q[4 + i];
            k.q[i] = b & 0x0f0f0f0fu;
            k.q[4 + i] = (b >> 4) & 0x0f0f0f0fu;
        }
    } else if constexpr (F == Format::q8_0) {
        k.mult[0] = k.mult[1] = w.d;
#pragma unroll
        for (int i = 0; i < 8; ++i) k.q[i] = w.q[i];
    } else if constexpr (F == Format::iq4_xs) {
        k.mult[0] = k.mult[1] = I == 0 ? w.d : w.dmin;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = I == 0 ? w.q[i] : w.q[4 + i];
            k.q[i] = iq4nl4(b & 0x0f0f0f0fu);
            k.q[4 + i] = iq4nl4((b >> 4) & 0x0f0f0f0fu);
        }
    } else if constexpr (F == Format::q2_k) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t sc = byte_of(I < 2 ? w.s[0] : w.s[1], (2 * I + r) % 4);
            k.mult[r] = w.d * float(sc & 0xf);
            k.minv[r] = w.dmin * float(sc >> 4);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) k.q[i] = (w.q[i] >> (2 * I)) & 0x03030303u;
    } else if constexpr (F == Format::q3_k) {
        // gguf_detail::scale_q3_k of sub-block 8 half + 2 I + r on the 12 bytes in registers: low
        // 4 bits from byte 2 I + r (low nibble in the first half, high in the second), high 2 bits
        // from byte 8 + (2 I + r) % 4 at 2 (2 half + (2 I + r) / 4).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t lo = (byte_of(I < 2 ? w.s[0] : w.s[1], (2 * I + r) % 4) >> (4 * w.sel)) & 0xf;
            const uint32_t hi = (byte_of(w.s[2], (2 * I + r) % 4) >> (2 * (2 * w.sel + (2 * I + r) / 4))) & 3;
            k.mult[r] = w.d * float(int(lo | (hi << 4)) - 32);
        }
        const int hb = 4 * w.sel + I;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            k.q[i] = ((w.q[i] >> (2 * I)) & 0x03030303u) | (((w.x[i] >> hb) & 0x01010101u) << 2);
    } else if constexpr (F == Format::q4_k || F == Format::q5_k) {
        const uint32_t a = byte_of(w.s[0], I), b = byte_of(w.s[1], I), c = byte_of(w.s[2], I);
        const bool low = w.sel < 2;  // sub-blocks 0..3 keep 6-bit scale and min in bytes j and j + 4
        const uint32_t sc = low ? a & 63 : (b & 0xf) | ((c >> 6) << 4);
        const uint32_t mn = low ? b & 63 : (b >> 4) | ((a >> 6) << 4);
        k.mult[0] = k.mult[1] = w.d * float(sc);
        k.minv[0] = k.minv[1] = w.dmin * float(mn);
#pragma unroll
        for (int i = 0; i < 8; ++i) k.q[i] = (w.q[i] >> (4 * I)) & 0x0f0f0f0fu;
        if constexpr (F == Format::q5_k) {
            const int sub = 2 * w.sel + I;
#pragma unroll
            for (int i = 0; i < 8; ++i) k.q[i] |= ((w.x[i] >> sub) & 0x01010101u) << 4;
        }
    } else if constexpr (F == Format::q6_k) {
        const int quarter = w.sel % 2 + 2 * I;
#pragma unroll
        for (int r = 0; r < 2; ++r) k.mult[r] = w.d * float(int8_t(byte_of(I == 0 ? w.s[0] : w.s[1], r)));
#pragma unroll
        for (int i = 0; i < 8; ++i)
            k.q[i] = ((w.q[i] >> (4 * I)) & 0x0f0f0f0fu) | (((w.x[i] >> (2 * quarter)) & 0x03030303u) << 4);
    }
    return k;
}

// The shared-memory activations of a chunk of routes: int8 codes [route][K], scales
// [route][K / 32], code sums per 16 [route][K / 32][2].
struct ActQ {
    const int8_t *q;
    const float *d;
    const int2 *sum;
    int K, nc;
};

// The chunk's dot with route j's activations (their scale applied).
template <Format F>
__device__ __forceinline__ float chunk_dot(const Chunk &k, const ActQ &a, int j, int c) {
    const int4 *ap = reinterpret_cast<const int4 *>(a.q + int64_t(j) * a.K + 32 * c);
    const int4 a0 = ap[0], a1 = ap[1];
    int lo = __dp4a(int(k.q[0]), a0.x, 0), hi = __dp4a(int(k.q[4]), a1.x, 0);
    lo = __dp4a(int(k.q[1]), a0.y, lo), hi = __dp4a(int(k.q[5]), a1.y, hi);
    lo = __dp4a(int(k.q[2]), a0.z, lo), hi = __dp4a(int(k.q[6]), a1.z, hi);
    lo = __dp4a(int(k.q[3]), a0.w, lo), hi = __dp4a(int(k.q[7]), a1.w, hi);
    const int2 s = a.sum[j * a.nc + c];
    float v = k.mult[0] * float(lo - kOff<F> * s.x) + k.mult[1] * float(hi - kOff<F> * s.y);
    v -= k.minv[0] * float(s.x) + k.minv[1] * float(s.y);
    return v * a.d[j * a.nc + c];
}

// Group g and chunk i of chunk c: the inverse of group_chunk.
template <Format F>
__device__ __forceinline__ void chunk_group(int c, int &g, int &i) {
    if constexpr (F == Format::q6_k) {
        const int sub = c % 8;
        g = (c / 8) * 4 + 2 * (sub / 4) + sub % 2;
        i = (sub % 4) / 2;
    } else {
        g = c / kGroup<F>;
        i = c % kGroup<F>;
    }
}

// Work item t of a lane on two rows (r1 = r0 where the second row is missing: !has1): group t
// (G = kGroup<F>: every chunk of the group) or chunk t (G = 1), dotted with the first nr of RC
// routes' activations and added to the rows' accumulators. r0 and r1 point at the rows' group
// gbase (a multiple of 32: where a streamed pass starts; 0 for whole rows).
template <Format F, int G, int RC>
__device__ __forceinline__ void lane_dots(const uint8_t *r0, const uint8_t *r1, bool has1, const ActQ &act, int t,
                                          int nr, float (&acc0)[RC], float (&acc1)[RC], int gbase = 0) {
    int g = t, i0 = 0;
    if constexpr (G == 1 && !kPairs<F>) chunk_group<F>(t, g, i0);
    constexpr int P = G == 1 && kPairs<F> ? 1 : 2;  // a pair format's lone chunk is its own group
    const Group w0 = load_group<F, P>(r0, g - gbase);
    const Group w1 = has1 ? load_group<F, P>(r1, g - gbase) : w0;
#pragma unroll
    for (int i = 0; i < G; ++i) {
        const int ii = G == 1 ? i0 : i, c = G == 1 ? t : group_chunk<F>(g, i);
        const Chunk k0 = group_chunk_codes<F>(w0, ii), k1 = group_chunk_codes<F>(w1, ii);
#pragma unroll
        for (int j = 0; j < RC; ++j) {
            if (j < nr) {
                acc0[j] += chunk_dot<F>(k0, act, j, c);
                if (has1) acc1[j] += chunk_dot<F>(k1, act, j, c);
            }
        }
    }
}

// Activation chunks of 32 that share one int8 scale (format_act_block: Q8_0 or Q8_K, the CPU's).
template <Format F>
constexpr int kActChunks = format_act_block(F) / 32;

// Thread t of the CTA quantises activation chunks t, t + kThreads, ... of the nr routes' rows. With
// SB = 8, the 8 chunks of a super-block are 8 neighbouring lanes (K / 32 and kThreads are
// multiples of 8), which share their largest magnitude and finiteness by shuffles; d then holds
// the super-block's scale once per chunk.
template <int SB>
__device__ __forceinline__ void quantize_routes(const uint16_t *const *arow, int nr, int K, int8_t *q, float *d,
                                                int2 *sum) {
    static_assert(SB == 1 || SB == 8, "Q8_0 or Q8_K");
    const int nc = K / 32;
    for (int task = threadIdx.x; task < nr * nc; task += kThreads) {
        const int j = task / nc, c = task % nc;
        const uint4 *src = reinterpret_cast<const uint4 *>(arow[j] + 32 * c);
        float x[32];
#pragma unroll
        for (int i = 0; i < 4; ++i) bf16x8_to_f32(__ldg(src + i), x + 8 * i);
        // The Q8_0 rule of the CPU kernels (ft::quantize_q8_0): scale amax / 127 (1 below
        // kQ8MinAmax), codes rounded half away from zero; a non-finite block gives codes 0, scale NaN.
        float amax = 0.0f;
        bool finite = true;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            finite &= isfinite(x[i]);
            amax = fmaxf(amax, fabsf(x[i]));
        }
        if constexpr (SB > 1) {
            const unsigned lanes = __activemask();  // whole groups of SB: nr * nc is a multiple of SB
#pragma unroll
            for (int o = 1; o < SB; o <<= 1) {
                amax = fmaxf(amax, __shfl_xor_sync(lanes, amax, o));
                finite = __shfl_xor_sync(lanes, int(finite), o) != 0 && finite;
            }
        }
        const float scale = !finite ? __int_as_float(0x7fc00000) : amax >= kQ8MinAmax ? amax / 127.0f : 1.0f;
        const float inv = finite ? 1.0f / scale : 0.0f;
        uint32_t w[8];
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            uint32_t word = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int v = int(fminf(fmaxf(roundf(x[4 * i + b] * inv), -127.0f), 127.0f));
                word |= uint32_t(v & 0xff) << (8 * b);
                if (i < 4)
                    s0 += v;
                else
                    s1 += v;
            }
            w[i] = word;
        }
        uint4 *dst = reinterpret_cast<uint4 *>(q + int64_t(j) * K + 32 * c);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        d[j * nc + c] = scale;
        sum[j * nc + c] = make_int2(s0, s1);
    }
}

// L2 prefetch of [p, p + bytes): one 128-byte line per thread in turn.
__device__ __forceinline__ void prefetch_l2(const uint8_t *p, int64_t bytes) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes);
    for (uintptr_t a = (reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127)) + 128 * threadIdx.x; a < end;
         a += 128 * kThreads)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// [src, src + bytes) into shared memory at dst + (src % 16), by 16-byte cp.async from the
// aligned-down address (the last copy reads only up to src + bytes and zero-fills the rest),
// thread t of nt copying pieces t, t + nt, ... Returns the copy of src. Completed by cp_async_wait().
__device__ __forceinline__ const uint8_t *stage(uint8_t *dst, const uint8_t *src, int64_t bytes, int t, int nt) {
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15);
    const uintptr_t end = reinterpret_cast<uintptr_t>(src) + uintptr_t(bytes);
    for (uintptr_t a = a0 + 16 * unsigned(t); a < end; a += 16 * unsigned(nt)) {
        uint8_t *d = dst + (a - a0);
        const unsigned len = end - a < 16 ? unsigned(end - a) : 16u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(unsigned(__cvta_generic_to_shared(d))),
                     "l"(a), "r"(len));
#else
        for (unsigned i = 0; i < 16; ++i) d[i] = i < len ? reinterpret_cast<const uint8_t *>(a)[i] : 0;
#endif
    }
    return dst + (reinterpret_cast<uintptr_t>(src) - a0);
}
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
#endif
}
// The copies this thread issued since the last commit form one group; then wait until at most N
// of its groups are in flight.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Units of one CTA of dp4a_kernel: upw per sub-warp, 32 / unit_lanes sub-warps per warp.
__device__ __forceinline__ int cta_units(const ProjArgs &p) { return p.units_per_warp * kWarps * (32 / p.unit_lanes); }

// The rows CTA x reads of one slot's matrix at `base` (units u0 = x * n on, n = cta_units of
// them): gate_up two ranges (gate rows u0.., up rows I + u0..), down one (rows 2 u0..).
struct CtaRows {
    const uint8_t *src[2];
    int64_t bytes;
    int first[2];  // the first row of each range
    int ranges;
};
template <bool GATE_UP>
__device__ __forceinline__ CtaRows cta_rows(const ProjArgs &p, const uint8_t *base, int64_t rb) {
    CtaRows r{};
    const int units = cta_units(p), u0 = blockIdx.x * units;
    if (GATE_UP) {
        const int n = max(0, min(units, p.inter - u0));
        r = CtaRows{{base + int64_t(u0) * rb, base + int64_t(p.inter + u0) * rb}, n * rb, {u0, p.inter + u0}, 2};
    } else {
        const int n = max(0, min(2 * units, p.N - 2 * u0));
        r = CtaRows{{base + int64_t(2 * u0) * rb, nullptr}, n * rb, {2 * u0, 0}, 1};
    }
    return r;
}

// Routes whose activations a CTA quantises at once and whose accumulators live in registers
// (RC): a group rarely has more routes than the call has tokens (a token's top_k experts are
// distinct; more routes take more chunks), so one-token calls take 1, calls of up to kRouteChunk
// (4) tokens kRouteChunk, larger ones 8 where their activations fit.
constexpr int kDp4aMaxRoutes = 8;

// Chunks a lane takes at once: a whole group (kGroup) in one-route calls, where the loads bound
// the kernel; one chunk with more routes, where the dots do and fewer registers keep more warps.
template <Format F, int RC>
constexpr int kLaneGroup = RC == 1 ? kGroup<F> : 1;

// CTAs per SM the register cap is set for: one-route calls wait on their loads, so more warps per
// SM read faster. 4 (64 registers) for the one-route kernels of q4_0, q8_0, q4_k and iq4_xs, which
// fit without spilling; 3 elsewhere (q3_k, q5_k and q6_k spill at 64 and ran slower, q2_k fits but
// ran slower too).
template <Format F, int RC>
constexpr int kMinCtas =
    RC == 1 && (F == Format::q4_0 || F == Format::q8_0 || F == Format::q4_k || F == Format::iq4_xs) ? 4 : 3;

// Shared-memory bytes of the activations of rc routes, rounded up to 16 (the staged rows follow).
__host__ __device__ constexpr size_t dp4a_smem_bytes(int K, int rc) {
    return (size_t(rc) * (size_t(K) + size_t(K / 32) * (sizeof(int2) + sizeof(float))) + 15) / 16 * 16;
}

// Shared-memory bytes of one staged range of `rows` rows of rb bytes (16 of alignment slack).
__host__ __device__ constexpr int64_t staged_range_bytes(int64_t rows, int64_t rb) {
    return (rows * rb + 31) / 16 * 16;
}

// Sub-warp `sub` (S = p.unit_lanes lanes) of warp w of CTA x owns units ((x * upw + u) * kWarps +
// w) * (32 / S) + sub, u < upw = p.units_per_warp; gate_up (GATE_UP): unit j is rows j (gate) and
// I + j (up); down: rows 2j and 2j + 1 of the N = H outputs. Per group, the CTA's rows are copied
// into shared memory (p.stage_rows) or, with several routes, prefetched into L2 before the routes'
// activations are quantised, so that their loads overlap that work (one-route calls skip the
// prefetch: it brought rows that did not fit L2 in twice); the activations of a chunk of routes
// are quantised once for all units. kMinCtas CTAs per SM at least (registers capped to match).
// Shared memory: dp4a_smem_bytes(K, RC), then the staged rows.
template <Format F, bool GATE_UP, int RC>
__global__ void __launch_bounds__(kThreads, kMinCtas<F, RC>) dp4a_kernel(ProjArgs p) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int K = p.K, nc = K / 32;
    const int64_t rb = gguf_row_bytes<F>(K);
    // down: the first kWarps * (32 / unit_lanes) of the CTA's units, every CTA (launch_dp4a makes
    // a call with top_k groups one wave).
    if (!GATE_UP)
        early_prefetch_down(p, rb, blockIdx.x * cta_units(p), kWarps * (32 / p.unit_lanes), INT_MAX);
    pdl_wait();  // launched by launch_pdl: nothing before this reads earlier kernels' output
    pdl_trigger();  // the next projection's CTAs may be scheduled (early_prefetch_down)
    int8_t *aq = reinterpret_cast<int8_t *>(smem);
    int2 *as = reinterpret_cast<int2 *>(smem + size_t(RC) * K);
    float *ad = reinterpret_cast<float *>(as + RC * nc);
    const ActQ act{aq, ad, as, K, nc};
    uint8_t *wsm = smem + dp4a_smem_bytes(K, RC);  // the staged rows

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Each warp serves `subs` units at once, S = 32 / subs lanes each (lane sl of sub-warp sub).
    const int S = p.unit_lanes, subs = 32 / S, sl = lane % S, sub = lane / S;
    constexpr int G = kLaneGroup<F, RC>;
    const int ngroups = *p.g.num;
    for (int gi = blockIdx.y; gi < ngroups; gi += gridDim.y) {
        const uint8_t *base = p.data + size_t(p.g.slot[gi]) * p.data_rb;
        const CtaRows r = cta_rows<GATE_UP>(p, base, rb);
        const uint8_t *rows[2] = {r.src[0], r.src[1]};
        if (p.stage_rows) {
            __syncthreads();  // the previous group's rows are no longer read
            const int64_t range = staged_range_bytes(r.bytes / rb, rb);
            for (int i = 0; i < r.ranges; ++i)
                rows[i] = stage(wsm + i * range, r.src[i], r.bytes, threadIdx.x, kThreads);
        } else if (RC > 1) {
            for (int i = 0; i < r.ranges; ++i) prefetch_l2(r.src[i], r.bytes);
        }
        const int first = p.g.start[gi], count = p.g.count[gi];
        for (int r0 = 0; r0 < count; r0 += RC) {
            const int nr = min(RC, count - r0);
            const uint16_t *arow[RC];
            int route[RC];
            route_rows<RC>(p, first + r0, nr, route, arow);
            __syncthreads();  // the previous chunk's activations are no longer read
            quantize_routes<kActChunks<F>>(arow, nr, K, aq, ad, as);
            if (p.stage_rows && r0 == 0) cp_async_wait();
            __syncthreads();
            for (int u = 0; u < p.units_per_warp; ++u) {
                const int unit = ((blockIdx.x * p.units_per_warp + u) * kWarps + warp) * subs + sub;
                int n0, n1;
                bool has1;
                const bool valid = unit_rows<GATE_UP>(p, unit, n0, n1, has1);
                if (!__any_sync(0xffffffffu, valid)) break;  // later units lie further out
                float acc0[RC] = {}, acc1[RC] = {};
                if (valid) {
                    // Row n of range i is at rows[i] + (n - first[i]) * rb.
                    const uint8_t *r0p = rows[0] + (n0 - r.first[0]) * rb;
                    const uint8_t *r1p = GATE_UP ? rows[1] + (n1 - r.first[1]) * rb : r0p + (has1 ? rb : 0);
                    for (int t = sl; t < nc / G; t += S) lane_dots<F, G>(r0p, r1p, has1, act, t, nr, acc0, acc1);
                    // An odd chunk count of a pair format: the last chunk alone, on the lane next in turn.
                    if (kPairs<F> && G == 2 && nc % 2 != 0 && sl == (nc / 2) % S)
                        lane_dots<F, 1>(r0p, r1p, has1, act, nc - 1, nr, acc0, acc1);
                }
#pragma unroll
                for (int j = 0; j < RC; ++j) {
                    if (j < nr) {
                        const float v0 = warp_sum(acc0[j], S), v1 = warp_sum(acc1[j], S);
                        if (valid && sl == j) store_route<GATE_UP>(p, route[j], unit, n0, n1, has1, v0, v1);
                    }
                }
            }
        }
    }
}


// ---- one-route calls of long rows: rows streamed through a per-warp ring ---------------------

// Stages of each warp's ring: while the warp dots one stage's rows, the next stage's copy is in flight.
constexpr int kStreamStages = 2;

// Bytes of one pass of a row: the 32 groups the warp's 32 lanes take at once (pass k holds groups
// 32k .. 32k + 31, bytes k * PB .. of the row; the last pass may be shorter).
template <Format F>
__host__ __device__ constexpr int64_t stream_pass_bytes() {
    return gguf_row_bytes<F>(32 * 32 * kGroup<F>);
}

// Shared-memory bytes of the streaming kernel: the activations of one route, then kWarps rings of
// kStreamStages stages of two rows' passes (staged_range_bytes: 16 of alignment slack each).
template <Format F>
__host__ __device__ constexpr size_t stream_smem_bytes(int K) {
    return dp4a_smem_bytes(K, 1) + size_t(kWarps) * kStreamStages * 2 * staged_range_bytes(1, stream_pass_bytes<F>());
}

// Formats whose ring fits beside the activations at the shortest row that streams (17 groups);
// q3_k and q6_k passes never do, so they get no streaming kernel.
template <Format F>
constexpr bool kStreamFits = stream_smem_bytes<F>(32 * kGroup<F> * 17) <= 48 * 1024;

// Whether a one-route call takes the streaming kernel: its units have 32 lanes (K of more than 16
// groups), every chunk belongs to a whole group (no lone last chunk of a pair format), its shared
// memory fits the 48 KiB a launch gets without opting in, and it measured faster there: iq4_xs
// rows longer than 2048 keep the other kernel (3 % faster on 4096 x 1536 experts).
template <Format F>
bool stream_usable(int K) {
    return K / 32 / kGroup<F> > 16 && (K / 32) % kGroup<F> == 0 && stream_smem_bytes<F>(K) <= 48 * 1024 &&
           (F != Format::iq4_xs || K <= 2048);
}

// The one-route kernel for rows read from global memory: each warp streams its units' rows pass
// by pass through its own ring of shared-memory stages with cp.async (kStreamStages - 1 passes in
// flight while it dots one; the first before the activations are quantised), so a warp keeps a
// pass of two rows in flight without holding it in registers. Lane l dots group 32k + l of pass
// k; a unit's sums are reduced after its last pass. Units as dp4a_kernel with unit_lanes 32.
// Shared memory: stream_smem_bytes<F>(K).
template <Format F, bool GATE_UP>
__global__ void __launch_bounds__(kThreads, kMinCtas<F, 1>) dp4a_stream_kernel(ProjArgs p) {
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int G = kGroup<F>;
    constexpr int64_t PB = stream_pass_bytes<F>(), SR = staged_range_bytes(1, PB);
    const int K = p.K, nc = K / 32, ng = nc / G, passes = (ng + 31) / 32;
    const int64_t rb = gguf_row_bytes<F>(K);
    // down: the first unit of each warp, every CTA (one wave, as launch_dp4a_stream sizes it).
    if (!GATE_UP) early_prefetch_down(p, rb, blockIdx.x * p.units_per_warp * kWarps, kWarps, INT_MAX);
    pdl_wait();  // launched by launch_pdl: nothing before this reads earlier kernels' output
    pdl_trigger();  // the next projection's CTAs may be scheduled (early_prefetch_down)
    int8_t *aq = reinterpret_cast<int8_t *>(smem);
    int2 *as = reinterpret_cast<int2 *>(smem + K);
    float *ad = reinterpret_cast<float *>(as + nc);
    const ActQ act{aq, ad, as, K, nc};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *ring = smem + dp4a_smem_bytes(K, 1) + size_t(warp) * kStreamStages * 2 * SR;
    const int upw = p.units_per_warp, items = upw * passes;
    // Item s of the warp: pass s % passes of its unit item_unit(s), held in stage s % kStreamStages.
    const auto item_unit = [&](int s) { return (blockIdx.x * upw + s / passes) * kWarps + warp; };
    const int ngroups = *p.g.num;
    for (int gi = blockIdx.y; gi < ngroups; gi += gridDim.y) {
        const uint8_t *base = p.data + size_t(p.g.slot[gi]) * p.data_rb;
        // Item s's copy (nothing past the last item or unit); one commit group per item either way.
        const auto issue = [&](int s) {
            int n0, n1;
            bool has1;
            if (s < items && unit_rows<GATE_UP>(p, item_unit(s), n0, n1, has1)) {
                const int64_t off = (s % passes) * PB, bytes = min(PB, rb - off);
                uint8_t *buf = ring + (s % kStreamStages) * 2 * SR;
                stage(buf, base + n0 * rb + off, bytes, lane, 32);
                if (has1) stage(buf + SR, base + n1 * rb + off, bytes, lane, 32);
            }
            cp_async_commit();
        };
        const int first = p.g.start[gi], count = p.g.count[gi];
        for (int r0 = 0; r0 < count; ++r0) {
            const uint16_t *arow[1];
            int route[1];
            route_rows<1>(p, first + r0, 1, route, arow);
            for (int s = 0; s < kStreamStages - 1; ++s) issue(s);
            __syncthreads();  // the previous route's activations are no longer read
            quantize_routes<kActChunks<F>>(arow, 1, K, aq, ad, as);
            __syncthreads();
            float acc0[1] = {0.0f}, acc1[1] = {0.0f};
            for (int s = 0; s < items; ++s) {
                issue(s + kStreamStages - 1);  // into the stage the warp finished with last item
                const int unit = item_unit(s);
                int n0, n1;
                bool has1;
                if (!unit_rows<GATE_UP>(p, unit, n0, n1, has1)) break;  // later units lie further out: empty copies
                cp_async_wait_pending<kStreamStages - 1>();
                __syncwarp();  // every lane's copies of item s have landed
                const int k = s % passes, t = 32 * k + lane;
                const int64_t off = k * PB;
                const uint8_t *buf = ring + (s % kStreamStages) * 2 * SR;
                const uint8_t *r0p = buf + (reinterpret_cast<uintptr_t>(base + n0 * rb + off) & 15);
                const uint8_t *r1p = has1 ? buf + SR + (reinterpret_cast<uintptr_t>(base + n1 * rb + off) & 15) : r0p;
                if (t < ng) lane_dots<F, G>(r0p, r1p, has1, act, t, 1, acc0, acc1, 32 * k);
                __syncwarp();  // the stage is refilled next item
                if (k == passes - 1) {
                    const float v0 = warp_sum(acc0[0]), v1 = warp_sum(acc1[0]);
                    if (lane == 0) store_route<GATE_UP>(p, route[0], unit, n0, n1, has1, v0, v1);
                    acc0[0] = acc1[0] = 0.0f;
                }
            }
        }
    }
}

// CTAs of one launch resident per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor), cached per
// shared-memory size: each launch asks for two sizes, and a process sees a few K, so 8 entries
// (searched in full, filled first-free, then by hash) keep the query off the decode path.
template <Format F, bool GATE_UP, int RC, bool STREAM = false>
int blocks_per_sm(size_t smem) {
    static std::atomic<uint64_t> cache[8];  // smem << 16 | blocks; 0 = empty
    std::atomic<uint64_t> *free_slot = nullptr;
    for (std::atomic<uint64_t> &e : cache) {
        const uint64_t c = e.load(std::memory_order_relaxed);
        if (c == 0 && !free_slot) free_slot = &e;
        if (c != 0 && (c >> 16) == smem) return int(c & 0xffff);
    }
    int n = 0;
    void (*kernel)(ProjArgs) = dp4a_kernel<F, GATE_UP, RC>;
    if constexpr (STREAM) kernel = dp4a_stream_kernel<F, GATE_UP>;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    n = std::max(n, 1);
    std::atomic<uint64_t> &slot = free_slot ? *free_slot : cache[(smem / 16) % 8];
    slot.store(uint64_t(smem) << 16 | uint64_t(n), std::memory_order_relaxed);
    return n;
}

// The streaming kernel of a one-route call (stream_usable): units of 32 lanes, upw as launch_dp4a
// for its own occupancy.
template <Format F, bool GATE_UP>
cudaError_t launch_dp4a_stream(dim3 grid, ProjArgs p, cudaStream_t s) {
    const size_t smem = stream_smem_bytes<F>(p.K);
    const int64_t groups = std::min<int64_t>(grid.y, std::max(p.top_k, 1));
    const int64_t wave = int64_t(blocks_per_sm<F, GATE_UP, 1, true>(smem)) * std::max(p.sms, 1);
    const int upw = int(std::max<int64_t>((int64_t(grid.x) * groups + wave - 1) / wave, 1));
    p.unit_lanes = 32;
    p.units_per_warp = upw;
    p.stage_rows = false;
    grid.x = (grid.x + upw - 1) / upw;
    return launch_pdl(dp4a_stream_kernel<F, GATE_UP>, grid, dim3(kThreads), smem, s, p);
}

// Lanes per unit, units per warp and staging: a unit gets 8, 16 or 32 lanes, enough for a row's
// chunks (or groups) in one pass where it has few (small K); upw is the fewest units per sub-warp
// that make the CTAs of a call with top_k groups one wave, however many that takes (grid.x counts
// CTAs of one unit per warp). The rows are staged in shared memory where upw units' rows fit
// beside the activations in the 48 KiB a launch gets without opting in and as many CTAs stay
// resident, else read from global memory (staging fewer units, so more waves, lost to that on the H200).
template <Format F, bool GATE_UP, int RC>
cudaError_t launch_dp4a(dim3 grid, ProjArgs p, cudaStream_t s) {
    const int ng = p.K / 32 / kLaneGroup<F, RC>;
    p.unit_lanes = ng > 16 ? 32 : ng > 8 ? 16 : 8;
    const int subs = 32 / p.unit_lanes;
    grid.x = (grid.x + subs - 1) / subs;  // CTAs of one unit per sub-warp
    const size_t act_smem = dp4a_smem_bytes(p.K, RC);
    const int64_t groups = std::min<int64_t>(grid.y, std::max(p.top_k, 1));
    const int per_sm = blocks_per_sm<F, GATE_UP, RC>(act_smem);
    const int64_t wave = int64_t(per_sm) * std::max(p.sms, 1);
    const int upw = int(std::max<int64_t>((int64_t(grid.x) * groups + wave - 1) / wave, 1));
    const int64_t rows = int64_t(upw) * kWarps * subs * (GATE_UP ? 1 : 2);
    const size_t staged = size_t((GATE_UP ? 2 : 1) * staged_range_bytes(rows, gguf_row_bytes<F>(p.K)));
    p.units_per_warp = upw;
    p.stage_rows = act_smem + staged <= 48 * 1024 && blocks_per_sm<F, GATE_UP, RC>(act_smem + staged) >= per_sm;
    grid.x = (grid.x + upw - 1) / upw;
    return launch_pdl(dp4a_kernel<F, GATE_UP, RC>, grid, dim3(kThreads), act_smem + (p.stage_rows ? staged : 0), s, p);
}

template <Format F, bool GATE_UP>
cudaError_t launch_dp4a(dim3 grid, const ProjArgs &p, cudaStream_t s) {
    if constexpr (kStreamFits<F>)
        if (p.tokens == 1 && stream_usable<F>(p.K)) return launch_dp4a_stream<F, GATE_UP>(grid, p, s);
    if (p.tokens == 1) return launch_dp4a<F, GATE_UP, 1>(grid, p, s);
    if (p.tokens > kRouteChunk && dp4a_smem_bytes(p.K, kDp4aMaxRoutes) <= 48 * 1024)
        return launch_dp4a<F, GATE_UP, kDp4aMaxRoutes>(grid, p, s);
    return launch_dp4a<F, GATE_UP, kRouteChunk>(grid, p, s);
}

template <Format F>
cudaError_t launch_dp4a(bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    return gate_up ? launch_dp4a<F, true>(grid, p, s) : launch_dp4a<F, false>(grid, p, s);
}

}  // namespace

bool dp4a_usable(const ProjArgs &p) {
    // Rows must keep every field 2-byte aligned; the activations of kRouteChunk routes must fit
    // the 48 KiB of shared memory a launch gets without opting in.
    return dp4a_fits(p.K) && (reinterpret_cast<uintptr_t>(p.data) % 2) == 0 && p.data_rb % 2 == 0;
}

bool dp4a_fits(int32_t K) { return K > 0 && K % 32 == 0 && dp4a_smem_bytes(K, kRouteChunk) <= 48 * 1024; }

cudaError_t launch_dp4a_projection(Format f, bool gate_up, dim3 grid, const ProjArgs &p, cudaStream_t s) {
    switch (f) {
        case Format::q4_0: return launch_dp4a<Format::q4_0>(gate_up, grid, p, s);
        case Format::q8_0: return launch_dp4a<Format::q8_0>(gate_up, grid, p, s);
        case Format::q2_k: return launch_dp4a<Format::q2_k>(gate_up, grid, p, s);
        case Format::q3_k: return launch_dp4a<Format::q3_k>(gate_up, grid, p, s);
        case Format::q4_k: return launch_dp4a<Format::q4_k>(gate_up, grid, p, s);
        case Format::q5_k: return launch_dp4a<Format::q5_k>(gate_up, grid, p, s);
        case Format::q6_k: return launch_dp4a<Format::q6_k>(gate_up, grid, p, s);
        case Format::iq4_xs: return launch_dp4a<Format::iq4_xs>(gate_up, grid, p, s);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace ft::cuda::decode
