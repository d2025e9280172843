// EP FP8 combine on the device (ft/ep_cuda.hpp): encode_combine_row with the dispatch quantiser
// and its error gate, combine_at_source_wire, and the gate word of the count exchange.
#include "ft/common.hpp"
#include "kernels_common.cuh"

namespace ft::ep::cuda {
namespace {

using namespace detail;

// ---- FP8 combine -------------------------------------------------------------------------------

constexpr int kEncodeThreads = 128;  // 4 warps; each warp encodes one 128-channel block at a time

// encode_combine_row() for the records of chunk c not from `me` (positions prefix[s] + i), with the
// dispatch quantiser, and the gate's measure: per row ||dequant - x|| / ||x|| in double (0 for a
// zero row, +Inf with a non-finite value), max-ed into *max_bits as fp32 bits.
__global__ void __launch_bounds__(kEncodeThreads)
encode_combine_kernel(const int64_t *count, const int64_t *prefix, int32_t R, int32_t me, int32_t c, int32_t C,
                      int64_t hidden, WireDtype dtype, uint32_t row_bytes, const uint16_t *partial, uint8_t *wire,
                      uint32_t *max_bits) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    constexpr int kWarps = kEncodeThreads / 32;
    __shared__ ChunkTable tab;
    __shared__ double err_w[kWarps], norm_w[kWarps];
    __shared__ int bad_w[kWarps];
    load_chunk_table(tab, count, prefix, R, c, C);
    const RecvGeom rg{nullptr, 0, 0, 0};
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t total = tab.vstart[R], blocks = hidden / kWireBlock;
    const uint32_t sb = dtype == WireDtype::Fp8Fp32 ? 4 : 1;
    const uint32_t used = static_cast<uint32_t>(hidden + blocks * sb);
    for (int64_t v = blockIdx.x; v < total; v += gridDim.x) {
        int32_t source;
        const int64_t pos = position_of(tab, R, rg, v, source);
        if (source == me) continue;  // the source's own rows stay bf16 (same v for the whole block)
        const uint16_t *row = partial + pos * hidden;
        uint8_t *out = wire + pos * row_bytes;
        double err = 0, norm = 0;
        int bad = 0;
        for (int64_t b = warp; b < blocks; b += kWarps) {
            float x[4];
            uint32_t word;
            const float scale = quantise_block(row + b * kWireBlock, out + b * kWireBlock, out + hidden + b * sb,
                                               dtype, lane, x, word);
            float back[4];
            dequant4(word, scale, back);
            for (int i = 0; i < 4; ++i) {
                bad |= !isfinite(x[i]);
                const double d = static_cast<double>(back[i]) - static_cast<double>(x[i]);
                err += d * d;
                norm += static_cast<double>(x[i]) * x[i];
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            err += __shfl_xor_sync(0xffffffffu, err, o);
            norm += __shfl_xor_sync(0xffffffffu, norm, o);
        }
        bad = __any_sync(0xffffffffu, bad);
        if (lane == 0) {
            err_w[warp] = err;
            norm_w[warp] = norm;
            bad_w[warp] = bad;
        }
        for (uint32_t at = used + threadIdx.x; at < row_bytes; at += blockDim.x) out[at] = 0;
        __syncthreads();
        if (threadIdx.x == 0) {
            double e = 0, n = 0;
            int any_bad = 0;
            for (int w = 0; w < kWarps; ++w) {
                e += err_w[w];
                n += norm_w[w];
                any_bad |= bad_w[w];
            }
            const float rel = any_bad ? INFINITY : (n > 0 ? static_cast<float>(sqrt(e) / sqrt(n)) : 0.0f);
            atomicMax(max_bits, __float_as_uint(rel));  // non-negative floats order as their bits
        }
        __syncthreads();  // err_w is rewritten for the next row
    }
}

// combine_at_source_wire(): fp32 sum from 0 over ranks in ascending order of the decoded rows
// (e4m3 * scale, one fp32 multiply; the own row's bf16 values), then bf16.
__global__ void combine_wire_kernel(const int32_t *row, const int64_t *offset, int32_t R, int64_t tokens,
                                    const uint8_t *wire, uint32_t row_bytes, WireDtype dtype, int32_t me,
                                    const uint16_t *own, const int64_t *own_first, int64_t hidden, uint16_t *out) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    __shared__ int64_t base[kMaxRanks];  // bytes into wire, or elements into own for r == me
    for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        for (int32_t r = threadIdx.x; r < R; r += blockDim.x) {
            const int32_t rr = row[int64_t(r) * tokens + t];
            base[r] = rr < 0 ? -1 : (r == me ? (*own_first + rr) * hidden : (offset[r] + rr) * int64_t(row_bytes));
        }
        __syncthreads();
        for (int64_t h = 4 * threadIdx.x; h < hidden; h += 4 * blockDim.x) {
            float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pv[4];
            for (int32_t r = 0; r < R; ++r) {
                if (base[r] < 0) continue;
                if (r == me) {
                    load4(own + base[r] + h, pv);
                } else {
                    const uint8_t *rp = wire + base[r];
                    dequant4(*reinterpret_cast<const uint32_t *>(rp + h), block_scale(rp + hidden, h / kWireBlock, dtype),
                             pv);
                }
                for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(sum[i], pv[i]);
            }
            store4(out + t * hidden + h, sum);
        }
        __syncthreads();  // base is rewritten for the next token
    }
}

// The gate word of the count exchange: bit 0 = (max error > limit), bits 32..63 = its fp32 bits.
__global__ void gate_word_kernel(const uint32_t *max_bits, float limit, int64_t *word) {
    pdl_wait();  // launched by launch_pdl (cuda_launch.cuh)
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const uint32_t bits = *max_bits;
    const int64_t tripped = __uint_as_float(bits) <= limit ? 0 : 1;
    *word = tripped | static_cast<int64_t>(static_cast<uint64_t>(bits) << 32);
}

}  // namespace

// ---- FP8 combine ---------------------------------------------------------------------------------

void launch_encode_combine(const ReceiveBuffers &B, int64_t hidden, WireDtype dtype, int32_t me, int32_t c, int32_t C,
                           const uint16_t *partial, uint8_t *wire, uint32_t *max_error_bits, cudaStream_t st) {
    if (dtype == WireDtype::Bf16) fail(FT_ERR_INVALID_ARGUMENT, "EP combine encoding: the wire is bf16");
    if (C < 1 || c < 0 || c >= C) fail(FT_ERR_INVALID_ARGUMENT, "EP combine encoding: chunk ", c, " of ", C);
    const size_t rb = combine_row_bytes(hidden, dtype);
    if (reinterpret_cast<uintptr_t>(wire) % 4 || reinterpret_cast<uintptr_t>(partial) % 8)
        fail(FT_ERR_INVALID_ARGUMENT, "EP combine encoding: wire must be 4-byte and partials 8-byte aligned");
    if (B.max_positions > 0)
        launch_pdl(encode_combine_kernel, dim3(grid_for(B.max_positions, 1, 16384)), dim3(kEncodeThreads), 0, st, 
            B.count, B.prefix, B.num_ranks, me, c, C, hidden, dtype, static_cast<uint32_t>(rb), partial, wire,
            max_error_bits);
    check_launch("combine encoding kernel");
}

void launch_combine_wire(const LayoutBuffers &L, int64_t tokens, const uint8_t *wire, WireDtype dtype, int32_t me,
                         const uint16_t *own_partial, const int64_t *own_first, int64_t hidden, uint16_t *out,
                         cudaStream_t st) {
    if (dtype == WireDtype::Bf16) fail(FT_ERR_INVALID_ARGUMENT, "EP combine (wire): the wire is bf16");
    if (me < 0 || me >= L.num_ranks) fail(FT_ERR_INVALID_ARGUMENT, "EP combine (wire): rank ", me, " of ", L.num_ranks);
    if (reinterpret_cast<uintptr_t>(out) % 8 || reinterpret_cast<uintptr_t>(own_partial) % 8 ||
        reinterpret_cast<uintptr_t>(wire) % 4)
        fail(FT_ERR_INVALID_ARGUMENT, "EP combine (wire): misaligned output, partials or wire");
    const size_t rb = combine_row_bytes(hidden, dtype);
    if (tokens > 0)
        launch_pdl(combine_wire_kernel, dim3(grid_for(tokens, 1, 16384)), dim3(256), 0, st, L.row, L.offset, L.num_ranks, tokens, wire,
                                                                        static_cast<uint32_t>(rb), dtype, me,
                                                                        own_partial, own_first, hidden, out);
    check_launch("combine (wire) kernel");
}

void launch_gate_word(const uint32_t *max_error_bits, float limit, int64_t *word, cudaStream_t st) {
    launch_pdl(gate_word_kernel, dim3(1), dim3(1), 0, st, max_error_bits, limit, word);
    check_launch("gate word kernel");
}

}  // namespace ft::ep::cuda
