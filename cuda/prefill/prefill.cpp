// GPU prefill of the routed experts: host-planned grouping of routes by expert slot, gather of
// the tokens' rows, bf16 dequantisation of each expert once, cuBLAS GEMMs (fp32 accumulate) with
// our own epilogues, scatter into per-route rows and launch_combine_routes (see
// ft/cuda_prefill.hpp for the interface and the numerics).
// Files: prefill_kernels.cuh/.cu (dequantisation, gather, epilogue, scatter), plan.hpp (the host
// plan); this file holds ExpertPrefill, its constructor and run() as named steps.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ft/common.hpp"
#include "ft/cublas_loader.hpp"
#include "ft/cuda_check.hpp"
#include "ft/cuda_memory.hpp"
#include "ft/cuda_prefill.hpp"
#include "ft/dequant.hpp"
#include "plan.hpp"
#include "prefill_kernels.cuh"

namespace ft::cuda {
namespace {

using prefill::Roles;

constexpr int kStreams = 4;                           // internal streams of the "streams" GEMM path
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // per cuBLAS handle (Hopper's recommendation)
constexpr int kDefaultChunkRows = 8192;

// A CUDA error of the prefill path, per the library's policy (ft/cuda_check.hpp).
void check_step(cudaError_t e, const char *what) { check(e, "GPU prefill: ", what); }

// A cuBLAS failure is FT_ERR_DEVICE, unless the context died under it (then FT_ERR_DEVICE_LOST).
void check_blas(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    const cudaError_t pending = cudaPeekAtLastError();
    if (sticky_error(pending)) throw_cuda(pending, cat("GPU prefill: ", what, " (", cublas_status_name(s), ")"));
    fail(FT_ERR_DEVICE, "GPU prefill: ", what, ": ", cublas_status_name(s));
}

size_t align_up(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

}  // namespace

// ---- ExpertPrefill --------------------------------------------------------------------------

struct ExpertPrefill::Impl {
    using Piece = prefill::Piece;
    using Chunk = prefill::Chunk;

    // Device addresses of the uploaded plan of one run.
    struct PlanView {
        const int32_t *row_token = nullptr, *row_route = nullptr, *row_slot = nullptr, *chunk_slots = nullptr;
        void *const *ptrs = nullptr;  // grouped path: [2 GEMMs][A, B, C][pieces]
        int64_t pieces = 0;
    };

    Format format;
    int32_t H, I, K, max_tokens;
    DeviceActivation act;
    bool ds_clamp = false;
    bool quant = false;
    Roles ro{};
    std::vector<size_t> bank_bytes;
    int32_t chunk_rows = 0, chunk_experts = 0;
    int64_t max_pieces = 0;
    bool grouped = false;
    const CublasApi *blas = nullptr;
    std::string error;
    size_t device_bytes = 0;

    // Device memory.
    DeviceBuffer xg;         // [chunk_rows, H] gathered (ds_fp4: round-tripped) inputs
    DeviceBuffer acc;        // [chunk_rows, max(2I, H)] f32 GEMM outputs
    DeviceBuffer inter;      // [chunk_rows, I] bf16
    DeviceBuffer route_out;  // [max_tokens * K, H] f32
    // Two dequantisation buffers [chunk_experts, 3 H I] (quantised formats): chunk c uses c % 2,
    // so the dequantisation of chunk c + 1 (on dq_stream) overlaps the GEMMs of chunk c.
    DeviceBuffer deq[2];
    DeviceBuffer workspace;  // (kStreams + 1) cuBLAS workspaces
    DeviceBuffer plan_dev;
    PinnedBuffer plan_host;  // pinned staging of the plan
    size_t plan_bytes = 0;

    cudaStream_t streams[kStreams] = {};
    cudaStream_t dq_stream = nullptr;
    cudaEvent_t ev_ready[2] = {}, ev_free[2] = {};  // dequantised buffer b written / no longer read
    cublasHandle_t handles[kStreams + 1] = {};      // [kStreams]: the caller's stream (grouped path)
    cudaEvent_t ev_fork = nullptr, ev_join[kStreams] = {}, ev_upload = nullptr;

    prefill::Plan plan;  // per run (host)
    // Grouped path: per-piece host arrays (cuBLAS reads them on the host).
    std::vector<cublasOperation_t> op_t, op_n;
    std::vector<int> gm, gn, gk, glda, gldb, gldc, gsize;
    std::vector<float> alpha, beta;

    // Streams, events and handles are released first (after their work is done), then the
    // buffers by their destructors.
    ~Impl() { release(); }

    void release() noexcept {
        for (int i = 0; i < kStreams; ++i)
            if (streams[i]) cudaStreamSynchronize(streams[i]);
        if (dq_stream) cudaStreamSynchronize(dq_stream), cudaStreamDestroy(dq_stream), dq_stream = nullptr;
        for (int b = 0; b < 2; ++b) {
            if (ev_ready[b]) cudaEventDestroy(ev_ready[b]), ev_ready[b] = nullptr;
            if (ev_free[b]) cudaEventDestroy(ev_free[b]), ev_free[b] = nullptr;
        }
        if (blas)
            for (cublasHandle_t &h : handles)
                if (h) blas->destroy(h), h = nullptr;
        for (int i = 0; i < kStreams; ++i) {
            if (streams[i]) cudaStreamDestroy(streams[i]), streams[i] = nullptr;
            if (ev_join[i]) cudaEventDestroy(ev_join[i]), ev_join[i] = nullptr;
        }
        if (ev_fork) cudaEventDestroy(ev_fork), ev_fork = nullptr;
        if (ev_upload) cudaEventSynchronize(ev_upload), cudaEventDestroy(ev_upload), ev_upload = nullptr;
    }

    void alloc(DeviceBuffer &b, size_t bytes, const char *what) {
        if (bytes == 0) return;
        b = DeviceBuffer(bytes, cat("GPU prefill: cannot allocate ", bytes, " bytes of device memory for ", what).c_str());
        device_bytes += bytes;
    }

    // Constructor steps.
    void size_chunks(int32_t routes_per_call, const PrefillTuning &tuning);
    void reserve_host_plan(int64_t routes);
    void allocate_device(int64_t routes);
    void create_streams_and_handles();

    // run() steps.
    void check_run_arguments(const DeviceExperts &ex, const uint16_t *x, const int32_t *slots_dev,
                             const int32_t *slots_host, const float *w, const uint16_t *y) const;
    void check_biases(const DeviceExperts &ex, const int32_t *slots_host, int64_t routes) const;
    PlanView upload_plan(const DeviceExperts &ex, const int32_t *slots_host, int64_t routes, cudaStream_t stream);
    void operands(const DeviceExperts &ex, const Piece &pc, const Chunk &c, size_t ci, bool down, const void *&A,
                  const void *&B, void *&C) const;
    void enqueue_dequant(const DeviceExperts &ex, const PlanView &pv, size_t ci);
    void run_chunk(const DeviceExperts &ex, const uint16_t *x, const PlanView &pv, size_t ci, cudaStream_t stream);
    bool gemms_grouped(const PlanView &pv, const Chunk &c, int d);
    void gemms_streams(const DeviceExperts &ex, const Chunk &c, size_t ci, int d, cudaStream_t stream);

    void gemm(cublasHandle_t h, int m, int n, int k, const uint16_t *A, int lda, const uint16_t *B, int ldb, float *C,
              int ldc) {
        // Row-major C[n, m] = B[n, k] * A[m, k]^T, i.e. column-major C = op_T(A) * B.
        const float one = 1.0f, zero = 0.0f;
        check_blas(blas->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                                 &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }
};

PrefillTuning prefill_tuning(const Tuning &t) {
    PrefillTuning p;
    p.grouped = t.prefill_gemm == "grouped";
    p.dequant_mib = t.prefill_dequant_mib;
    p.chunk_rows = t.prefill_chunk_rows;
    return p;
}

namespace {

void check_geometry(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                    const DeviceActivation &act) {
    if (!format_known(int32_t(format))) fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: unknown format ", int32_t(format));
    if (hidden <= 0 || inter <= 0 || hidden % 8 || inter % 8)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: hidden (", hidden, ") and intermediate (", inter,
             ") sizes must be positive multiples of 8");
    if (const std::string err = format_geometry_error(format, hidden, inter); !err.empty())
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: ", err);
    if (top_k <= 0 || top_k > 1024)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: top_k must be in [1, 1024], got ", top_k);
    if (max_tokens <= 0 || int64_t(max_tokens) * top_k > INT_MAX / 2)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: max_tokens ", max_tokens, " x top_k ", top_k, " out of range");
    if (act.kind < FT_ACT_SILU || act.kind > FT_ACT_SWIGLU_CLAMP)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: unknown activation ", act.kind);
}

}  // namespace

ExpertPrefill::ExpertPrefill(Format format, int32_t hidden, int32_t inter, int32_t top_k, int32_t max_tokens,
                             DeviceActivation act, PrefillTuning tuning)
    : p_(std::make_unique<Impl>()) {
    Impl &s = *p_;
    check_geometry(format, hidden, inter, top_k, max_tokens, act);
    s.blas = cublas_api();
    if (!s.blas) fail(FT_ERR_UNSUPPORTED, "GPU prefill needs cuBLAS: ", cublas_load_error());

    s.format = format;
    s.H = hidden, s.I = inter, s.K = top_k, s.max_tokens = max_tokens;
    s.act = act;
    s.quant = format != Format::bf16;
    s.ds_clamp = format == Format::ds_fp4 && act.kind == FT_ACT_SILU && std::isfinite(act.limit) && act.limit > 0.0f;
    s.ro = prefill::roles_of(format);
    for (const BankSpec &b : bank_schema(format, hidden, inter)) s.bank_bytes.push_back(b.row_bytes);

    const int64_t routes = int64_t(max_tokens) * top_k;
    s.size_chunks(int32_t(routes), tuning);
    s.reserve_host_plan(routes);
    s.allocate_device(routes);
    s.create_streams_and_handles();
}

// Rows and experts per chunk, the most pieces a run can have, and the GEMM path.
void ExpertPrefill::Impl::size_chunks(int32_t routes, const PrefillTuning &tuning) {
    int rows = tuning.chunk_rows;
    if (rows <= 0) rows = int(std::max<int64_t>(max_tokens, std::min<int64_t>(routes, kDefaultChunkRows)));
    chunk_rows = int32_t(std::min<int64_t>(rows, routes));
    const size_t expert_bf16 = size_t(3) * H * I * 2;
    if (quant) {
        const size_t budget = size_t(std::max(0, tuning.dequant_mib)) << 20;
        chunk_experts = int32_t(std::clamp<int64_t>(int64_t(budget / 2 / expert_bf16), 1, std::min<int64_t>(routes, 512)));
    } else {
        chunk_experts = INT_MAX;
    }
    // Each distinct slot gives ceil(rows / chunk_rows) pieces: at most routes + routes / chunk_rows.
    max_pieces = routes + routes / chunk_rows + 1;
    grouped = tuning.grouped && blas->gemm_grouped_batched_ex;
}

void ExpertPrefill::Impl::reserve_host_plan(int64_t routes) {
    try {
        plan.keys.reserve(routes);
        for (auto *v : {&plan.row_token, &plan.row_route, &plan.row_slot}) v->reserve(routes);
        plan.pieces.reserve(max_pieces);
        plan.chunks.reserve(max_pieces);
        plan.chunk_slots.reserve(max_pieces);
        if (grouped) {
            op_t.assign(max_pieces, CUBLAS_OP_T);
            op_n.assign(max_pieces, CUBLAS_OP_N);
            for (auto *v : {&gm, &gn, &gk, &glda, &gldb, &gldc}) v->resize(max_pieces);
            gsize.assign(max_pieces, 1);
            alpha.assign(max_pieces, 1.0f);
            beta.assign(max_pieces, 0.0f);
        }
    } catch (const std::bad_alloc &) {
        fail(FT_ERR_OUT_OF_MEMORY, "GPU prefill: cannot allocate the host plan for ", routes, " routes");
    }
}

void ExpertPrefill::Impl::allocate_device(int64_t routes) {
    const size_t R = size_t(chunk_rows);
    const size_t expert_bf16 = size_t(3) * H * I * 2;
    alloc(xg, R * H * 2, "gathered activations");
    alloc(acc, R * std::max<size_t>(2 * size_t(I), H) * 4, "GEMM output");
    alloc(inter, R * I * 2, "intermediate");
    alloc(route_out, size_t(routes) * H * 4, "route outputs");
    if (quant)
        for (DeviceBuffer &d : deq) alloc(d, size_t(chunk_experts) * expert_bf16, "dequantised experts");
    alloc(workspace, (kStreams + 1) * kWorkspaceBytes, "cuBLAS workspaces");
    // Plan: row_token, row_route, row_slot [routes] + chunk slots [max_pieces] (int32), then six
    // pointer arrays [max_pieces] for the grouped path.
    plan_bytes = align_up((3 * size_t(routes) + size_t(max_pieces)) * 4, 16) +
                 (grouped ? 6 * size_t(max_pieces) * sizeof(void *) : 0);
    alloc(plan_dev, plan_bytes, "routing plan");
    plan_host = PinnedBuffer(plan_bytes, cat("GPU prefill: cannot allocate ", plan_bytes, " bytes of pinned memory").c_str(),
                             cudaHostAllocDefault);
}

void ExpertPrefill::Impl::create_streams_and_handles() {
    check_step(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming), "cudaEventCreate");
    check_step(cudaEventCreateWithFlags(&ev_upload, cudaEventDisableTiming), "cudaEventCreate");
    if (quant) {
        check_step(cudaStreamCreateWithFlags(&dq_stream, cudaStreamNonBlocking), "cudaStreamCreate");
        for (int b = 0; b < 2; ++b) {
            check_step(cudaEventCreateWithFlags(&ev_ready[b], cudaEventDisableTiming), "cudaEventCreate");
            check_step(cudaEventCreateWithFlags(&ev_free[b], cudaEventDisableTiming), "cudaEventCreate");
        }
    }
    for (int i = 0; i < kStreams; ++i) {
        check_step(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
        check_step(cudaEventCreateWithFlags(&ev_join[i], cudaEventDisableTiming), "cudaEventCreate");
    }
    for (int i = 0; i <= kStreams; ++i) {
        check_blas(blas->create(&handles[i]), "cublasCreate");
        check_blas(blas->set_math_mode(handles[i], CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
        if (i < kStreams) check_blas(blas->set_stream(handles[i], streams[i]), "cublasSetStream");
        // A handle's workspace must not be shared by kernels that can run at once: one each.
        if (blas->set_workspace)
            check_blas(blas->set_workspace(handles[i], workspace.get() + i * kWorkspaceBytes, kWorkspaceBytes),
                       "cublasSetWorkspace");
    }
}

ExpertPrefill::~ExpertPrefill() = default;

const char *ExpertPrefill::last_error() const {
    return p_->error.c_str();
}
size_t ExpertPrefill::scratch_bytes() const {
    return p_->device_bytes;
}
const char *ExpertPrefill::gemm_path() const {
    return p_->grouped ? "grouped" : "streams";
}

// Plan on the host (valid routes sorted by (slot, route), cut into pieces and chunks), staged in
// pinned memory with the grouped path's pointer arrays and uploaded on `stream`.
ExpertPrefill::Impl::PlanView ExpertPrefill::Impl::upload_plan(const DeviceExperts &ex, const int32_t *slots_host,
                                                               int64_t routes, cudaStream_t stream) {
    // The pinned staging is reused: wait until the previous run's upload has been read.
    check_step(cudaEventSynchronize(ev_upload), "waiting for the previous plan upload");
    prefill::Plan &pl = plan;
    pl.build(slots_host, routes, K, chunk_rows, chunk_experts);
    const int64_t nvalid = pl.rows();
    int32_t *row_token = plan_host.get<int32_t>();
    std::copy(pl.row_token.begin(), pl.row_token.end(), row_token);
    std::copy(pl.row_route.begin(), pl.row_route.end(), row_token + nvalid);
    std::copy(pl.row_slot.begin(), pl.row_slot.end(), row_token + 2 * nvalid);
    PlanView pv;
    pv.pieces = int64_t(pl.pieces.size());
    std::copy(pl.chunk_slots.begin(), pl.chunk_slots.end(), row_token + 3 * nvalid);
    size_t used = (3 * size_t(nvalid) + pl.chunk_slots.size()) * 4;
    pv.row_token = plan_dev.get<const int32_t>();
    pv.row_route = pv.row_token + nvalid;
    pv.row_slot = pv.row_route + nvalid;
    pv.chunk_slots = pv.row_slot + nvalid;
    if (grouped && pv.pieces > 0) {
        used = align_up(used, 16);
        void **ptrs = reinterpret_cast<void **>(plan_host.get() + used);
        pv.ptrs = reinterpret_cast<void *const *>(plan_dev.get() + used);
        for (size_t ci = 0; ci < pl.chunks.size(); ++ci)
            for (int32_t q = pl.chunks[ci].piece0; q < pl.chunks[ci].piece0 + pl.chunks[ci].pieces; ++q)
                for (int d = 0; d < 2; ++d) {
                    const void *A, *B;
                    void *C;
                    operands(ex, pl.pieces[q], pl.chunks[ci], ci, d == 1, A, B, C);
                    ptrs[(3 * d + 0) * pv.pieces + q] = const_cast<void *>(A);
                    ptrs[(3 * d + 1) * pv.pieces + q] = const_cast<void *>(B);
                    ptrs[(3 * d + 2) * pv.pieces + q] = C;
                }
        used += 6 * size_t(pv.pieces) * sizeof(void *);
    }
    if (used > 0) {
        check_step(cudaMemcpyAsync(plan_dev.get(), plan_host.get(), used, cudaMemcpyHostToDevice, stream), "plan upload");
        check_step(cudaEventRecord(ev_upload, stream), "cudaEventRecord");
    }
    return pv;
}

// Operands of one piece's GEMM (A: weights, B: activations, C: fp32 output).
void ExpertPrefill::Impl::operands(const DeviceExperts &ex, const Piece &pc, const Chunk &c, size_t ci, bool down,
                                   const void *&A, const void *&B, void *&C) const {
    const size_t expert_elems = size_t(3) * H * I;
    const int64_t lr = pc.row0 - c.row0;  // first row within the chunk
    if (quant) {
        A = deq[ci & 1].get<uint16_t>() + size_t(pc.dq) * expert_elems + (down ? size_t(2) * I * H : 0);
    } else {
        const int bank = down ? ro.dn : ro.gu;
        A = ex.base[bank] + size_t(pc.slot) * ex.row_bytes[bank];
    }
    B = down ? static_cast<const void *>(inter.get<uint16_t>() + lr * I)
             : static_cast<const void *>(xg.get<uint16_t>() + lr * H);
    C = acc.get<float>() + lr * (down ? H : 2 * int64_t(I));
}

// Dequantisation of chunk ci into buffer ci % 2 on dq_stream, once the GEMMs that read the
// buffer before (chunk ci - 2, possibly of the previous run) are done.
void ExpertPrefill::Impl::enqueue_dequant(const DeviceExperts &ex, const PlanView &pv, size_t ci) {
    const Chunk &c = plan.chunks[ci];
    const int b = int(ci & 1);
    check_step(cudaStreamWaitEvent(dq_stream, ev_free[b], 0), "cudaStreamWaitEvent");
    check_step(launch_dequant_bf16(ex, pv.chunk_slots + c.slot0, c.nslots, deq[b].get<uint16_t>(), dq_stream),
               "dequant kernel");
    check_step(cudaEventRecord(ev_ready[b], dq_stream), "cudaEventRecord");
}

// One grouped GEMM call for the chunk's pieces (d: 0 gate_up, 1 down); false when this cuBLAS
// does not take bf16 -> fp32 there (the streams path is used from then on).
bool ExpertPrefill::Impl::gemms_grouped(const PlanView &pv, const Chunk &c, int d) {
    const bool down = d == 1;
    const int m = int(down ? H : 2 * I), k = int(down ? I : H);
    for (int32_t q = 0; q < c.pieces; ++q) {
        gm[q] = m, gn[q] = plan.pieces[c.piece0 + q].rows, gk[q] = k;
        glda[q] = k, gldb[q] = k, gldc[q] = m;
    }
    const void *const *A = const_cast<const void *const *>(pv.ptrs + (3 * d + 0) * pv.pieces + c.piece0);
    const void *const *B = const_cast<const void *const *>(pv.ptrs + (3 * d + 1) * pv.pieces + c.piece0);
    void *const *C = pv.ptrs + (3 * d + 2) * pv.pieces + c.piece0;
    const cublasStatus_t st = blas->gemm_grouped_batched_ex(
        handles[kStreams], op_t.data(), op_n.data(), gm.data(), gn.data(), gk.data(), alpha.data(), A, CUDA_R_16BF,
        glda.data(), B, CUDA_R_16BF, gldb.data(), beta.data(), C, CUDA_R_32F, gldc.data(), c.pieces, gsize.data(),
        CUBLAS_COMPUTE_32F);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
        log(FT_LOG_WARN,
            "GPU prefill: cublasGemmGroupedBatchedEx does not take bf16 x bf16 -> "
            "fp32 here; using one GEMM per expert");
        grouped = false;
        return false;
    }
    check_blas(st, "cublasGemmGroupedBatchedEx");
    return true;
}

// One GEMM per piece, forked over the internal streams and joined back into `stream`.
void ExpertPrefill::Impl::gemms_streams(const DeviceExperts &ex, const Chunk &c, size_t ci, int d, cudaStream_t stream) {
    const bool down = d == 1;
    const int m = int(down ? H : 2 * I), k = int(down ? I : H);
    const int used_streams = std::min(kStreams, c.pieces);
    check_step(cudaEventRecord(ev_fork, stream), "cudaEventRecord");
    for (int i = 0; i < used_streams; ++i)
        check_step(cudaStreamWaitEvent(streams[i], ev_fork, 0), "cudaStreamWaitEvent");
    for (int32_t q = 0; q < c.pieces; ++q) {
        const Piece &pc = plan.pieces[c.piece0 + q];
        const void *A, *B;
        void *C;
        operands(ex, pc, c, ci, down, A, B, C);
        gemm(handles[q % used_streams], m, pc.rows, k, static_cast<const uint16_t *>(A), k,
             static_cast<const uint16_t *>(B), k, static_cast<float *>(C), m);
    }
    for (int i = 0; i < used_streams; ++i) {
        check_step(cudaEventRecord(ev_join[i], streams[i]), "cudaEventRecord");
        check_step(cudaStreamWaitEvent(stream, ev_join[i], 0), "cudaStreamWaitEvent");
    }
}

// Chunk ci: gather its rows, wait for its dequantised experts, then per GEMM (gate_up, down) the
// GEMMs and the epilogue (gate_up) or the scatter into route_out (down).
void ExpertPrefill::Impl::run_chunk(const DeviceExperts &ex, const uint16_t *x, const PlanView &pv, size_t ci,
                                    cudaStream_t stream) {
    const Chunk &c = plan.chunks[ci];
    const bool vec_x = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    prefill::launch_gather_rows(format == Format::ds_fp4, vec_x, x, pv.row_token + c.row0, H, xg.get<uint16_t>(), c.rows,
                                stream);
    check_step(cudaGetLastError(), "gather kernel");
    if (quant) check_step(cudaStreamWaitEvent(stream, ev_ready[ci & 1], 0), "cudaStreamWaitEvent");
    for (int d = 0; d < 2; ++d) {
        const bool down = d == 1;
        const bool done = grouped && gemms_grouped(pv, c, d);
        if (!done) gemms_streams(ex, c, ci, d, stream);
        if (down && quant) {
            // The chunk's weights are consumed: their buffer takes chunk ci + 2.
            check_step(cudaEventRecord(ev_free[ci & 1], stream), "cudaEventRecord");
            if (ci + 2 < plan.chunks.size()) enqueue_dequant(ex, pv, ci + 2);
        }
        prefill::launch_format(format, down, acc.get<float>(), pv.row_route + c.row0, pv.row_slot + c.row0, ex, ro, act,
                               ds_clamp, inter.get<uint16_t>(), route_out.get<float>(), c.rows, stream);
        check_step(cudaGetLastError(), down ? "scatter kernel" : "epilogue kernel");
    }
}

void ExpertPrefill::Impl::check_run_arguments(const DeviceExperts &ex, const uint16_t *x, const int32_t *slots_dev,
                                              const int32_t *slots_host, const float *w, const uint16_t *y) const {
    const Impl &s = *this;
    if (!x || !slots_dev || !slots_host || !w || !y)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: NULL x, slots, weights or output");
    const Format f_dn = ex.down();
    // A prefill for a block format runs any block formats per matrix (models mixing them).
    const bool mixed = ex.format != s.format || f_dn != s.format;
    const bool mix_ok = format_is_block(s.format) && format_is_block(ex.format) && format_is_block(f_dn) &&
                        format_geometry_error(ex.format, s.H, s.I).empty() && format_geometry_error(f_dn, s.H, s.I).empty();
    if ((mixed && !mix_ok) || ex.hidden != s.H || ex.inter != s.I)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: experts are ", format_known(int32_t(ex.format)) ? format_name(ex.format) : "?",
             mixed && f_dn != ex.format ? cat(" gate_up with ", format_known(int32_t(f_dn)) ? format_name(f_dn) : "?", " down") : "",
             " H=", ex.hidden, " I=", ex.inter, ", the prefill was made for ", format_name(s.format), " H=", s.H, " I=", s.I);
    // Bank rows must hold each matrix's rows in its own format.
    std::vector<size_t> need = s.bank_bytes;
    if (mixed) need = {bank_schema(ex.format, s.H, s.I)[0].row_bytes, bank_schema(f_dn, s.H, s.I)[1].row_bytes};
    if (ex.num_banks != int(need.size()))
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: ", ex.num_banks, " banks, ", format_name(s.format), " has ",
             need.size());
    for (int b = 0; b < ex.num_banks; ++b)
        if (!ex.base[b] || ex.row_bytes[b] < need[b])
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: bank ", b, " has no base or rows of ", ex.row_bytes[b],
                 " bytes (< ", need[b], ")");
}

// Bias tables (bf16 gpt-oss) are indexed by slot = expert id: bf16 only, both tables, and every
// slot of the call a row of them.
void ExpertPrefill::Impl::check_biases(const DeviceExperts &ex, const int32_t *slots_host, int64_t routes) const {
    if (format != Format::bf16 || !ex.gate_up_bias || !ex.down_bias || ex.bias_experts <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: expert bias tables need bf16 experts and both tables (",
             format_name(format), ", gate_up ", ex.gate_up_bias ? "set" : "NULL", ", down ",
             ex.down_bias ? "set" : "NULL", ", ", ex.bias_experts, " rows)");
    for (int64_t r = 0; r < routes; ++r)
        if (slots_host[r] >= ex.bias_experts)
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: slot ", slots_host[r], " of route ", r, " has no row in the ",
                 ex.bias_experts, "-expert bias tables (slot = expert id)");
}

ft_status ExpertPrefill::run(const DeviceExperts &ex, const uint16_t *x, const int32_t *slots_dev,
                             const int32_t *slots_host, const float *w, const uint16_t *addend, uint16_t *y,
                             int32_t tokens, cudaStream_t stream) {
    Impl &s = *p_;
    s.error.clear();
    try {
        if (tokens < 0 || tokens > s.max_tokens)
            fail(FT_ERR_INVALID_ARGUMENT, "GPU prefill: tokens ", tokens, " outside [0, ", s.max_tokens, "]");
        if (tokens == 0) return FT_OK;
        s.check_run_arguments(ex, x, slots_dev, slots_host, w, y);
        if (ex.gate_up_bias || ex.down_bias) s.check_biases(ex, slots_host, int64_t(tokens) * s.K);
        const Impl::PlanView pv = s.upload_plan(ex, slots_host, int64_t(tokens) * s.K, stream);
        if (s.grouped) check_blas(s.blas->set_stream(s.handles[kStreams], stream), "cublasSetStream");
        if (s.quant && !s.plan.chunks.empty()) {
            check_step(cudaStreamWaitEvent(s.dq_stream, s.ev_upload, 0), "cudaStreamWaitEvent");  // chunk slot lists
            for (size_t ci = 0; ci < std::min<size_t>(2, s.plan.chunks.size()); ++ci) s.enqueue_dequant(ex, pv, ci);
        }
        for (size_t ci = 0; ci < s.plan.chunks.size(); ++ci) s.run_chunk(ex, x, pv, ci, stream);
        check_step(launch_combine_routes(s.route_out.get<float>(), slots_dev, w, addend, y, tokens, s.K, s.H,
                                         s.format == Format::ds_fp4, stream),
                   "launch_combine_routes");
        return FT_OK;
    } catch (const Error &e) {
        s.error = e.what();
        return e.status();
    } catch (const std::bad_alloc &) {
        s.error = "GPU prefill: out of host memory";
        return FT_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        s.error = cat("GPU prefill: ", e.what());
        return FT_ERR_INTERNAL;
    }
}

}  // namespace ft::cuda
