// SharedExperts (shared_expert.hpp): warp-per-row GEMVs over tiles of up to kTokTile tokens, so a
// decode step reads each shared weight once per tile.
#include "shared_expert.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ft/common.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_numerics.cuh"

namespace ft::gpu_backend {

namespace {

constexpr int kWarps = 8;     // rows per block, one warp each
constexpr int kTokTile = 8;   // tokens per block (blockIdx.y tiles the rest)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Two bf16 at a (4-byte aligned) even index as floats.
__device__ __forceinline__ float2 pair(const uint16_t *p) {
    const uint32_t v = *reinterpret_cast<const uint32_t *>(p);
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// acc[tt] += dot(w[0..K), a[tt * lda + 0..K)) over the warp's lanes (partial sums; reduce after).
// Pairs when K is even and both rows start 4-byte aligned (a caller's x may not), single
// elements otherwise.
__device__ __forceinline__ void dot_rows(const uint16_t *w, const uint16_t *a, int64_t lda, int K, int nt,
                                         float (&acc)[kTokTile]) {
    const int lane = threadIdx.x & 31;
    if ((K & 1) == 0 && ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(a)) & 3) == 0) {
        for (int k = 2 * lane; k < K; k += 64) {
            const float2 wv = pair(w + k);
#pragma unroll
            for (int tt = 0; tt < kTokTile; ++tt)
                if (tt < nt) {
                    const float2 av = pair(a + tt * lda + k);
                    acc[tt] = fmaf(wv.x, av.x, fmaf(wv.y, av.y, acc[tt]));
                }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            const float wv = cuda::bf16_to_f32(w[k]);
#pragma unroll
            for (int tt = 0; tt < kTokTile; ++tt)
                if (tt < nt) acc[tt] = fmaf(wv, cuda::bf16_to_f32(a[tt * lda + k]), acc[tt]);
        }
    }
}

// h[t, j] = bf16(act(gate_j . x_t, up_j . x_t)), with DeepSeek-V4's bf16 rounding
// (ds) and clamp (ds_clamp) as its routed experts apply them.
__global__ void gate_up_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ wg,
                               const uint16_t *__restrict__ wu, uint16_t *__restrict__ h, int H, int Is, int T,
                               cuda::DeviceActivation act, bool ds, bool ds_clamp) {
    const int j = blockIdx.x * kWarps + threadIdx.x / 32;
    const int t0 = blockIdx.y * kTokTile;
    if (j >= Is) return;
    const int nt = min(kTokTile, T - t0);
    float g[kTokTile] = {}, u[kTokTile] = {};
    dot_rows(wg + int64_t(j) * H, x + int64_t(t0) * H, H, H, nt, g);
    dot_rows(wu + int64_t(j) * H, x + int64_t(t0) * H, H, H, nt, u);
#pragma unroll
    for (int tt = 0; tt < kTokTile; ++tt) {
        float gs = warp_sum(g[tt]), us = warp_sum(u[tt]);
        if (ds) {
            // DeepSeek-V4: gate and up rounded to bf16, then (ds_clamp) gate <= limit, |up| <= limit.
            gs = cuda::round_bf16(gs);
            us = cuda::round_bf16(us);
            if (ds_clamp) {
                gs = fminf(gs, act.limit);
                us = fmaxf(fminf(us, act.limit), -act.limit);
            }
        }
        if (tt < nt && (threadIdx.x & 31) == 0) h[int64_t(t0 + tt) * Is + j] = cuda::f32_to_bf16(cuda::activate(act, gs, us));
    }
}

// s[t] = sigmoid(gate_proj . x_t), one block per token.
__global__ void gate_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ wp, float *__restrict__ s, int H) {
    __shared__ float part[32];
    const int t = blockIdx.x;
    float acc = 0.0f;
    for (int k = threadIdx.x; k < H; k += blockDim.x)
        acc = fmaf(cuda::bf16_to_f32(wp[k]), cuda::bf16_to_f32(x[int64_t(t) * H + k]), acc);
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) s[t] = 1.0f / (1.0f + expf(-v));
    }
}

// y[t, n] = bf16(y[t, n] + s_t * down_n . h_t); s null means 1.
__global__ void down_kernel(const uint16_t *__restrict__ h, const uint16_t *__restrict__ wd, const float *__restrict__ s,
                            uint16_t *__restrict__ y, int H, int Is, int T) {
    const int n = blockIdx.x * kWarps + threadIdx.x / 32;
    const int t0 = blockIdx.y * kTokTile;
    if (n >= H) return;
    const int nt = min(kTokTile, T - t0);
    float acc[kTokTile] = {};
    dot_rows(wd + int64_t(n) * Is, h + int64_t(t0) * Is, Is, Is, nt, acc);
#pragma unroll
    for (int tt = 0; tt < kTokTile; ++tt) {
        const float d = warp_sum(acc[tt]);
        if (tt < nt && (threadIdx.x & 31) == 0) {
            uint16_t &out = y[int64_t(t0 + tt) * H + n];
            const float scale = s ? s[t0 + tt] : 1.0f;
            out = cuda::f32_to_bf16(cuda::bf16_to_f32(out) + scale * d);
        }
    }
}

cuda::DeviceBuffer upload(const Tensor &t, const char *what) {
    cuda::DeviceBuffer b(t.bytes.size(), what);
    cuda::check(cudaMemcpy(b.get(), t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), what);
    return b;
}

}  // namespace

SharedExperts::SharedExperts(const Model &model, int32_t max_tokens, cuda::DeviceActivation act)
    : hidden_(model.spec().hidden), inter_(model.spec().shared_intermediate), max_tokens_(max_tokens), act_(act),
      ds_(model.spec().format == Format::ds_fp4),
      ds_clamp_(ds_ && act.kind == FT_ACT_SILU && std::isfinite(act.limit) && act.limit > 0.0f) {
    const ModelSpec &s = model.spec();
    if (inter_ <= 0) fail(FT_ERR_INVALID_ARGUMENT, "shared_experts asked for, but the model has no shared expert");
    const size_t proj = size_t(inter_) * size_t(hidden_) * 2;
    for (int32_t l = 0; l < s.num_layers; ++l) {
        const LayerExtras &x = model.extras(l);
        const bool bf16 = x.shared_gate.dtype == FT_DTYPE_BF16 && x.shared_up.dtype == FT_DTYPE_BF16 &&
                          x.shared_down.dtype == FT_DTYPE_BF16;
        if (!bf16 || x.shared_gate.bytes.size() != proj || x.shared_up.bytes.size() != proj || x.shared_down.bytes.size() != proj)
            fail(FT_ERR_INVALID_ARGUMENT, "shared_experts asked for, but MoE layer ", l, " has no bf16 shared expert weights of [",
                 inter_, ", ", hidden_, "]");
        Layer d;
        d.gate = upload(x.shared_gate, "copying the shared expert to the GPU");
        d.up = upload(x.shared_up, "copying the shared expert to the GPU");
        d.down = upload(x.shared_down, "copying the shared expert to the GPU");
        if (s.shared_expert_gate && x.shared_gate_proj.dtype == FT_DTYPE_BF16 &&
            x.shared_gate_proj.bytes.size() == size_t(hidden_) * 2)
            d.gate_proj = upload(x.shared_gate_proj, "copying the shared expert gate to the GPU");
        weight_bytes_ += 3 * proj + d.gate_proj.bytes();
        layers_.push_back(std::move(d));
    }
    h_ = cuda::DeviceBuffer(size_t(max_tokens) * size_t(inter_) * 2, "allocating the shared expert's intermediate");
    scale_ = cuda::DeviceBuffer(size_t(max_tokens) * sizeof(float), "allocating the shared expert's gate");
}

cudaError_t SharedExperts::add(int32_t layer, const uint16_t *x, uint16_t *y, int32_t tokens, cudaStream_t stream) const {
    if (layer < 0 || layer >= int32_t(layers_.size()) || tokens < 0 || tokens > max_tokens_) return cudaErrorInvalidValue;
    if (tokens == 0) return cudaSuccess;
    const Layer &d = layers_[size_t(layer)];
    const dim3 block(kWarps * 32);
    const unsigned tiles = unsigned((tokens + kTokTile - 1) / kTokTile);
    gate_up_kernel<<<dim3(unsigned((inter_ + kWarps - 1) / kWarps), tiles), block, 0, stream>>>(
        x, d.gate.get<uint16_t>(), d.up.get<uint16_t>(), h_.get<uint16_t>(), hidden_, inter_, tokens, act_, ds_, ds_clamp_);
    const float *s = nullptr;
    if (d.gate_proj.get()) {
        gate_kernel<<<unsigned(tokens), 256, 0, stream>>>(x, d.gate_proj.get<uint16_t>(), scale_.get<float>(), hidden_);
        s = scale_.get<float>();
    }
    down_kernel<<<dim3(unsigned((hidden_ + kWarps - 1) / kWarps), tiles), block, 0, stream>>>(
        h_.get<uint16_t>(), d.down.get<uint16_t>(), s, y, hidden_, inter_, tokens);
    return cudaGetLastError();
}

}  // namespace ft::gpu_backend
