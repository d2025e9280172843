/*
 * freetoken_ep.h - expert parallelism across GPUs through NCCL (C API of libfreetoken).
 *
 * An ft_ep_group is one rank (one GPU) of a group that splits a MoE layer's routed experts
 * across GPUs. Per layer, each rank hands over its tokens (bf16 hidden states on its GPU) and the
 * router's choice; dispatch sends every token at most once to each GPU that holds one of its
 * experts, in FP8 e4m3 with one scale per 128 channels by default; the caller runs its local
 * experts on the received rows; combine reduces each token's routes on the GPU that computed
 * them, returns one bf16 row per (token, GPU) (optionally FP8, throughput mode, behind an
 * accuracy gate: ft_ep_params.combine_wire) and sums them at the source in rank order, so the
 * result does not depend on chunking or arrival order.
 *
 * Conventions are those of freetoken.h (statuses, struct_size params, *_last_error, NULL-safe
 * *_free). Device pointers are CUDA device memory of the group's GPU; a stream is a
 * cudaStream_t passed as void* (NULL: the legacy default stream).
 *
 * NCCL is not linked: the library opens libnccl.so.2 at run time (put NCCL's lib folder on
 * LD_LIBRARY_PATH, e.g. the one PyTorch bundles). Without it every creation call returns
 * FT_ERR_UNSUPPORTED; a build without CUDA returns FT_ERR_UNSUPPORTED everywhere.
 *
 * Threading contract
 * - A group is used by one host thread at a time.
 * - Dispatch, combine and forward are collective: every rank of the group must make the same
 *   sequence of these calls with the same parameters (tokens may differ per rank). In throughput
 *   mode dispatch and forward block the calling thread until every rank has posted its counts,
 *   so several groups of one process (ft_ep_group_bootstrap_local) need one host thread each.
 * - Latency mode never synchronises the host and may be captured into a CUDA graph (the
 *   capture must cover every call from dispatch to combine; NCCL's own capture rules apply).
 * - ft_ep_params_init and ft_ep_group_last_error may be called from any thread.
 */
#ifndef FREETOKEN_EP_H
#define FREETOKEN_EP_H

#include "freetoken.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ft_ep_group ft_ep_group;

/* Modes. */
#define FT_EP_MODE_THROUGHPUT 0 /* prefill: exact sizes (one host sync per call), chunked     */
#define FT_EP_MODE_LATENCY    1 /* decode: fixed capacity per peer, no host sync, capturable  */

/* Dispatch payload on the wire (compute stays bf16); also the combine wire (combine_wire). */
#define FT_EP_WIRE_BF16       0 /* bf16 rows                                                 */
#define FT_EP_WIRE_FP8        1 /* e4m3, one fp32 scale per 128 channels (default)           */
#define FT_EP_WIRE_FP8_UE8M0  2 /* e4m3, one power-of-two (e8m0) scale per 128 channels      */

typedef struct ft_ep_params {
    uint32_t struct_size;
    int32_t num_experts;      /* logical experts E                                          */
    int32_t slots_per_rank;   /* expert slots per GPU; 0: E / ranks (E a multiple of ranks).
                                 More than E / ranks leaves room for replicas; the initial
                                 placement puts physical slot p on logical expert p % E    */
    int32_t top_k;            /* routes per token, 1..32 (default 8)                        */
    int64_t hidden;           /* H, a multiple of 128                                       */
    int64_t max_tokens;       /* tokens per rank per call (latency mode: the capacity)      */
    int32_t mode;             /* FT_EP_MODE_* (default THROUGHPUT)                          */
    int32_t wire;             /* FT_EP_WIRE_* (default FP8)                                 */
    int32_t chunks;           /* throughput: pipeline chunks, 0 = from the link bandwidth   */
    int32_t nccl_max_ctas;    /* groups that make their communicator: at most this many CTAs
                                 (SMs) per NCCL kernel, so the experts keep the rest; 0: NCCL's
                                 default (NCCL_MAX_CTAS is honoured by NCCL itself)          */
    double link_bytes_per_s;  /* per-peer link bandwidth for the chunk plan; 0: measured at
                                 creation by one exchange of 64 MB per rank through the
                                 group (a collective), or 25e9 with one rank              */
    int64_t max_expert_rows;  /* expert rows per chunk the buffers hold; 0: ranks *
                                 max_tokens * top_k (the worst case; lower it to save memory) */
    /* Since 0.3 (callers with a smaller struct_size get the defaults). */
    int32_t combine_wire;     /* FT_EP_WIRE_* of the partial rows combine returns (default
                                 BF16). FP8 / FP8_UE8M0 (throughput mode only; a latency-mode
                                 group refuses them): each remote partial row travels as e4m3
                                 with one scale per 128 channels, H + 4H/128 (or H + H/128)
                                 bytes instead of 2H, with the dispatch quantiser's rounding;
                                 the source dequantises and sums in rank order as before, so
                                 results stay bit-identical across chunk counts. Its own rows
                                 are not sent and stay bf16. See combine_max_rel_error.     */
    float combine_max_rel_error; /* accuracy gate of an FP8 combine wire (default 0.05; > 0,
                                 finite): each call measures every encoded row's relative L2
                                 error ||dequant(q(r)) - r|| / ||r|| (0 for zero rows, +Inf for
                                 non-finite ones); if the largest on any rank exceeds this,
                                 all ranks learn it in the next call's count exchange and
                                 combine in bf16 from that call on, for good (one
                                 FT_LOG_WARN). The measure is set by a row's largest values:
                                 ~0.026 on gaussian rows, below ~0.063 for any finite row
                                 (half an e4m3 ulp), +Inf for Inf/NaN partials (which FP8
                                 cannot carry); small values lost in a block of huge range
                                 barely move it. Lower the limit for a tighter budget.      */
} ft_ep_params;

FT_API void ft_ep_params_init(ft_ep_params *params);

/* Creates a group on `device` from an existing communicator (an ncclComm_t, borrowed: it must
 * outlive the group). Rank and size come from the communicator. Allocates every buffer now.
 * Creation is collective (every rank of the communicator creates its group at the same time):
 * it probes the topology (bus ids all-gathered, P2P status, and, unless params set
 * link_bytes_per_s or chunks, a timed 64 MB exchange; see ft_ep_group_info) and logs it at
 * FT_LOG_INFO. The bootstrap calls below probe the same way.
 * Returns FT_ERR_UNSUPPORTED without NCCL or CUDA, FT_ERR_INVALID_ARGUMENT for bad params,
 * FT_ERR_OUT_OF_MEMORY, FT_ERR_DEVICE. */
FT_API ft_status ft_ep_group_create_from_comm(void *nccl_comm, int32_t device, const ft_ep_params *params,
                                              ft_ep_group **out, char *err, size_t err_size);

/* Broadcast of `bytes` bytes from rank 0 to every rank (the caller's side channel: MPI_Bcast, a
 * TCP store, a file). Called once on every rank; returns 0 on success. */
typedef int32_t (*ft_ep_broadcast_fn)(void *data, size_t bytes, void *user_data);

/* Creates rank `rank` of `nranks` on `device` with a communicator of its own (destroyed with
 * the group). Rank 0 makes NCCL's unique id and `broadcast` carries it to the others. With
 * broadcast == NULL every rank makes the id itself, which only agrees when NCCL_COMM_ID
 * (host:port of rank 0) is set in every rank's environment. Blocks until all ranks joined. */
FT_API ft_status ft_ep_group_bootstrap(int32_t nranks, int32_t rank, int32_t device, ft_ep_broadcast_fn broadcast,
                                       void *user_data, const ft_ep_params *params, ft_ep_group **out, char *err,
                                       size_t err_size);

/* One group per listed device of this process (ncclCommInitAll); groups[i] is rank i on
 * devices[i]. Each group then needs its own host thread (see the threading contract). */
FT_API ft_status ft_ep_group_bootstrap_local(int32_t ndevices, const int32_t *devices, const ft_ep_params *params,
                                             ft_ep_group **groups, char *err, size_t err_size);

typedef struct ft_ep_group_info {
    uint32_t struct_size;
    int32_t rank;
    int32_t ranks;
    int32_t slots_per_rank;
    int32_t device;
    int32_t nccl_version;     /* NCCL_VERSION_CODE of the loaded libnccl                    */
    int32_t last_chunks;      /* chunks of the last throughput call                         */
    uint64_t last_bytes_sent; /* bytes the last call sent to other ranks (both directions)  */
    /* Topology probe at creation (since 0.3); unknown values as noted. */
    char pci_bus_id[16];      /* this GPU, "0000:3b:00.0" (sysfs spelling); "" unknown        */
    int32_t numa_node;        /* NUMA node of this GPU, -1 unknown                          */
    int32_t pcie_link_width;  /* current PCIe lanes, 0 unknown                              */
    double pcie_link_gts;     /* current PCIe link speed per lane in GT/s, 0 unknown        */
    double link_bytes_per_s;  /* the per-peer bandwidth the chunk plan uses: params' value,
                                 else the calibration, else 25e9                           */
    double calibrated_bytes_per_s; /* per-peer rate of the creation-time exchange (minimum
                                 over ranks, so all ranks plan alike); 0 if not measured    */
    uint64_t p2p_known;       /* bit r: the P2P status towards rank r's GPU is known (that
                                 GPU is visible to this process); own bit set              */
    uint64_t p2p_mask;        /* bit r: cudaDeviceCanAccessPeer to rank r's GPU; own bit set */
    /* Since 0.3. */
    int32_t combine_wire;     /* FT_EP_WIRE_* the combine uses now: params' combine_wire until
                                 the accuracy gate trips (noticed in the call after the one
                                 that exceeded it), then FT_EP_WIRE_BF16                     */
    float combine_last_rel_error; /* largest row error of the last FP8-encoded combine on this
                                 rank, 0 if none yet (waits for that call's encoding)       */
} ft_ep_group_info;

FT_API ft_status ft_ep_group_info_get(const ft_ep_group *group, ft_ep_group_info *info);

/* Expert placement, EPLB style: phy2log[r * slots_per_rank + s] is the logical expert in slot s
 * of rank r; every expert placed at least once, copies of one expert on distinct ranks. All
 * ranks must set the same map before their next dispatch. count = ranks * slots_per_rank. */
FT_API ft_status ft_ep_group_set_placement(ft_ep_group *group, const int32_t *phy2log, size_t count);
/* Writes min(capacity, ranks * slots_per_rank) entries; *count receives the full size. */
FT_API ft_status ft_ep_group_get_placement(const ft_ep_group *group, int32_t *phy2log, size_t capacity, size_t *count);

/* The rows this rank's experts must process, expert-major (device pointers owned by the group,
 * valid until the next call on it). Rows offset[s] .. offset[s+1]-1 belong to local slot s; the
 * callee reads x and writes y for those rows (bf16, [rows, hidden]); offsets live on the device
 * (latency mode never copies them to the host). */
typedef struct ft_ep_expert_batch {
    uint32_t struct_size;
    int32_t slots;
    int64_t hidden;
    int64_t max_rows;
    const int64_t *offset;       /* [slots + 1], device                                       */
    const uint16_t *x;           /* [max_rows, hidden] bf16 inputs, device                    */
    uint16_t *y;                 /* [max_rows, hidden] bf16 outputs, device                   */
    const int32_t *row_source;   /* [max_rows] source rank of each row, device                */
    const int32_t *row_token;    /* [max_rows] token index on the source, device              */
    const float *row_weight;     /* [max_rows] route weight (the group applies it), device    */
} ft_ep_expert_batch;

/* topk_ids [tokens, top_k] int32 (negative: no route), topk_weights [tokens, top_k] float (NULL:
 * all 1), x [tokens, hidden] bf16, all device memory; tokens <= max_tokens. On return `batch`
 * (may be NULL) describes the rows to compute on `stream` before ft_ep_combine. Throughput mode
 * synchronises the host once (the count exchange) and exchanges in a single chunk here; use
 * ft_ep_forward for the chunked pipeline. */
FT_API ft_status ft_ep_dispatch(ft_ep_group *group, const int32_t *topk_ids, const float *topk_weights,
                                const uint16_t *x, int64_t tokens, void *stream, ft_ep_expert_batch *batch);

/* out [tokens, hidden] bf16 device = sum over the token's routes of weight * expert(x), for the
 * tokens of the matching dispatch. */
FT_API ft_status ft_ep_combine(ft_ep_group *group, uint16_t *out, void *stream);

/* Enqueues the caller's experts for `batch` on `stream` (it must not synchronise or fail: the
 * peers are waiting on this rank). */
typedef void (*ft_ep_expert_fn)(const ft_ep_expert_batch *batch, void *stream, void *user_data);

/* Dispatch, experts and combine in one call. Throughput mode pipelines chunks: the exchange of
 * chunk i+1 and the return of chunk i-1 run on a second stream while `expert` runs chunk i. */
FT_API ft_status ft_ep_forward(ft_ep_group *group, const int32_t *topk_ids, const float *topk_weights,
                               const uint16_t *x, int64_t tokens, ft_ep_expert_fn expert, void *user_data,
                               uint16_t *out, void *stream);

/* The group's most recent error text, valid until the next call on the group; "" if none. */
FT_API const char *ft_ep_group_last_error(const ft_ep_group *group);

/* Frees the buffers and, if the group made it, the communicator. Accepts NULL. */
FT_API void ft_ep_group_free(ft_ep_group *group);

/* ---- since 0.3: the local experts through a FreeToken session ------------------------------ */

/* ft_ep_forward with this rank's experts computed by `session` (a session of this process on the
 * group's GPU, backend FT_BACKEND_GPU, FT_BACKEND_OFFLOAD or FT_BACKEND_HYBRID), so expert
 * parallelism composes with offloading.
 *
 * `model` is the session's model. It holds exactly this rank's physical expert slots: its
 * num_experts equals the group's slots_per_rank S, and expert j of that model (every layer) is
 * physical slot j of this rank, i.e. logical expert phy2log[rank * S + j] of the group's
 * placement (ft_ep_group_get_placement). Replicas are just slots holding the same weights. Its
 * hidden_size equals the group's hidden; its top_k may be anything (1 is enough: every received
 * row carries one route); `layer` is the MoE layer of that model.
 *
 * The group hands each received row to ft_decode_cuda as a token whose route 0 is its local slot
 * with weight 1 (routes 1.. are -1), at most `session_max_tokens` rows per call, on `stream`,
 * and applies the routing weights in its own reduction, as ft_ep_forward does. Pass the
 * session's max_tokens; in latency mode pass a value below the session's prefill_min_tokens so
 * every call stays on the capturable decode path. Throughput mode reads each chunk's row count
 * on the host (one synchronisation per chunk) and calls the session for those rows only; latency
 * mode covers all max_expert_rows rows (rows without a route are skipped by the session), so
 * keep max_expert_rows small there. A session created with shared_experts computes the expert
 * rows without them and then adds the layer's shared expert(s) once to each of this rank's
 * `tokens` outputs, after the combine, on `stream` (out = bf16(out + shared(x))), so the result
 * is what ft_decode_cuda of the whole model gives.
 *
 * The first call allocates this rank's route buffers (make it outside a CUDA graph capture).
 * Errors: FT_ERR_INVALID_ARGUMENT (NULL, geometry mismatch, layer or session_max_tokens out of
 * range), FT_ERR_UNSUPPORTED (a session without a device path), and the session's errors; a
 * session failure in the middle of a step leaves the peers of this rank waiting, so validate
 * the session (e.g. ft_session_status) before the collective. */
FT_API ft_status ft_ep_forward_session(ft_ep_group *group, ft_session *session, const ft_model *model,
                                       int32_t session_max_tokens, int32_t layer, const int32_t *topk_ids,
                                       const float *topk_weights, const uint16_t *x, int64_t tokens,
                                       uint16_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* FREETOKEN_EP_H */
