// Expert parallelism on the GPU (cuda/ep_cuda/README.md): the layout, pack + quantise, unpack,
// local reduction and combine kernels, the Transport interface they exchange bytes through, the
// NCCL transport (libnccl resolved at run time, never linked), and EpRank, one rank's whole
// dispatch -> experts -> combine step in throughput (chunked, one host sync) or latency (fixed
// capacity, no host sync, graph-capturable) mode.
//
// Every kernel reproduces the host reference ft/ep.hpp bit for bit: the same replica choice, row
// order, wire records (padding bytes included), FP8 rounding, fma chain and rank-ordered sum.
// Launchers take device pointers and a stream, never allocate and never synchronise; sizes that
// only the device knows (row counts) are read by the kernels, so the launch grids are bounded by
// capacities given at construction.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ft/cuda_check.hpp"
#include "ft/cuda_memory.hpp"
#include "ft/ep.hpp"

namespace ft::ep::cuda {

inline constexpr int32_t kMaxRanks = 64;  // the dedup mask is one uint64 per token
inline constexpr int32_t kMaxTopK = 32;
inline constexpr size_t kPeerHeaderBytes = 16;  // latency mode: int64 row count + 8 zero bytes

// ft::cuda::check with "EP: " before `what` (the library's CUDA error policy, ft/cuda_check.hpp:
// FT_ERR_DEVICE_LOST for a sticky fault, FT_ERR_OUT_OF_MEMORY, FT_ERR_DEVICE).
inline void check_cuda(cudaError_t err, const char *what) { ft::cuda::check(err, "EP: ", what); }

// Decode sizes (launch_layout: tokens * top_k <= 4096 and R * S <= 4096; launch_group: max_positions
// * top_k <= 8192 and slots <= 1024; launch_pack's latency headers) run one-block kernels instead
// of chains of launches, with bit-identical outputs.

// ---- placement on the device -----------------------------------------------------------------

struct DevicePlacement {
    int32_t num_experts = 0, num_ranks = 0, slots_per_rank = 0;
    const int32_t *logcnt = nullptr;   // [E]
    const int32_t *log2phy = nullptr;  // [E*R]
};

// Device copy of a Placement's maps (owned).
class PlacementBuffer {
public:
    explicit PlacementBuffer(const Placement &placement);
    PlacementBuffer(const PlacementBuffer &) = delete;
    PlacementBuffer &operator=(const PlacementBuffer &) = delete;
    DevicePlacement view() const { return view_; }

private:
    DevicePlacement view_;
    ft::cuda::DeviceBuffer mem_;  // logcnt [E], then log2phy [E*R]
};

// ---- layout (ft::ep::dispatch_layout on the device) ----------------------------------------

// Device arrays of one source rank's layout, sized for max_tokens. The fields mirror
// DispatchLayout; the send_* arrays hold offset[R] valid rows.
struct LayoutBuffers {
    int32_t num_ranks = 0, slots = 0, top_k = 0;
    int64_t max_tokens = 0;
    int32_t *route_phy = nullptr;      // [T*K]
    uint64_t *mask = nullptr;          // [T] bit r: token goes to rank r
    int64_t *forced_load = nullptr;    // [R] forced_rank_load()
    int32_t *row = nullptr;            // [R*T] (T = the tokens of the launch)
    int64_t *count = nullptr;          // [R]
    int64_t *offset = nullptr;         // [R+1]
    int64_t *expert_count = nullptr;   // [R*S]
    int32_t *send_token = nullptr;     // [R*T_max]
    int32_t *send_n = nullptr;         // [R*T_max]
    int32_t *send_slot = nullptr;      // [R*T_max*K]
    float *send_weight = nullptr;      // [R*T_max*K]
};
size_t layout_bytes(int32_t num_ranks, int32_t slots, int32_t top_k, int64_t max_tokens);
// Carves the arrays out of `base` (device, layout_bytes() long, 256-byte aligned).
LayoutBuffers carve_layout(void *base, int32_t num_ranks, int32_t slots, int32_t top_k, int64_t max_tokens);

// ids/weights: [tokens, top_k] device arrays (weights may be null: all 1). rank_load: device [R]
// or null (then forced_rank_load of this routing, as the host does). Ids >= E are ignored here
// (the host reference rejects them; validate on the host if they can occur).
void launch_layout(const DevicePlacement &p, const int32_t *ids, const float *weights, int64_t tokens,
                   int32_t top_k, int32_t source_rank, const int64_t *rank_load, const LayoutBuffers &L,
                   cudaStream_t stream);

// ---- pack + quantise (ft::ep::pack_dispatch) -------------------------------------------------

// Where records go. peer_bytes == 0: one contiguous buffer, row i of the layout at base + i *
// record bytes (throughput mode). peer_bytes > 0: rank r's region starts at base + r *
// peer_bytes with a kPeerHeaderBytes header holding its row count (latency mode), then its rows.
struct WireRegion {
    uint8_t *base = nullptr;
    size_t peer_bytes = 0;
};
inline size_t latency_peer_bytes(int64_t hidden, int32_t top_k, WireDtype dtype, int64_t capacity) {
    return kPeerHeaderBytes + record_bytes(hidden, top_k, dtype) * static_cast<size_t>(capacity);
}
// x: [tokens, H] bf16 device rows (16-byte aligned). max_rows: capacity bound of offset[R]
// (num_ranks * max_tokens), only used to size the grid.
void launch_pack(const LayoutBuffers &L, int64_t max_rows, const uint16_t *x, int64_t hidden, WireDtype dtype,
                 int32_t source_rank, const WireRegion &dst, cudaStream_t stream);

// ---- receive side (group_by_expert, unpack_payload, reduce_partials) -----------------------

// The records a rank received. peer_bytes == 0: source s's records are contiguous from record
// prefix[s] (throughput). peer_bytes > 0: region s at base + s * peer_bytes, header first, room for
// `capacity` records (latency). Record position: prefix[s] + i, or s * capacity + i.
struct RecvRegion {
    const uint8_t *base = nullptr;
    size_t peer_bytes = 0;
    int64_t capacity = 0;
};

struct ReceiveBuffers {
    int32_t num_ranks = 0, slots = 0, top_k = 0;
    int64_t max_positions = 0;         // R * max_tokens
    int64_t max_rows = 0;              // expert rows per chunk
    int64_t *count = nullptr;          // [R] records from each source
    int64_t *prefix = nullptr;         // [R+1]
    int64_t *expert_offset = nullptr;  // [S+1] rows of local slot s: offset[s] .. offset[s+1]-1
    int64_t *expert_fill = nullptr;    // [S] scratch
    int32_t *route_row = nullptr;      // [positions*K] expert row of route j of a record, -1
    int16_t *route_slot = nullptr;     // [positions*K] local slot of route j of a record, -1
    int64_t *row_position = nullptr;   // [max_rows] record position of each expert row
    int32_t *row_route = nullptr;      // [max_rows]
    int32_t *row_source = nullptr;     // [max_rows]
    int32_t *row_token = nullptr;      // [max_rows]
    float *row_weight = nullptr;       // [max_rows]
    int32_t *overflow = nullptr;       // [1] set when a chunk has more than max_rows expert rows
};
size_t receive_bytes(int32_t num_ranks, int32_t slots, int32_t top_k, int64_t max_tokens, int64_t max_rows);
ReceiveBuffers carve_receive(void *base, int32_t num_ranks, int32_t slots, int32_t top_k, int64_t max_tokens,
                             int64_t max_rows);

// count[s] from an all-gathered count matrix (count_matrix[s * stride + me], stride 0 meaning R;
// throughput) or, when count_matrix is null, from the region headers (latency); then prefix.
void launch_receive_counts(const ReceiveBuffers &B, const RecvRegion &src, const int64_t *count_matrix,
                           int32_t me, cudaStream_t stream, int32_t matrix_stride = 0);
// Expert-major rows of chunk c of C (records [count*c/C, count*(c+1)/C) of every source), in the
// order of ft::ep::group_by_expert; fills expert_offset, row_*, route_row.
void launch_group(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, int32_t chunk,
                  int32_t chunks, cudaStream_t stream);
// Payload of each expert row, dequantised: x_bf16 [rows, H] (may be null) and x_f32 (may be null).
void launch_unpack(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype,
                   uint16_t *x_bf16, float *x_f32, cudaStream_t stream);
// partial[position * H + h] = bf16(fma chain of weight_j * y[route_row_j * H + h]) for the
// records of chunk c (ft::ep::reduce_partials).
void launch_reduce(const ReceiveBuffers &B, const RecvRegion &src, int64_t hidden, WireDtype dtype, int32_t chunk,
                   int32_t chunks, const uint16_t *y, uint16_t *partial, cudaStream_t stream);

// FP8 combine, receiving side (ft::ep::encode_combine_row; throughput numbering only): the
// partial of every record of chunk c whose source is not `me` is encoded into wire + position *
// combine_row_bytes(H, dtype) (dtype Fp8Fp32 or Fp8Ue8m0, the dispatch quantiser's device code),
// and the largest relative L2 error of those rows is max-ed into *max_error_bits (the fp32 bits
// of a non-negative float, so an unsigned atomicMax orders them; +Inf for non-finite rows).
// The error is accumulated in double in another order than the host's: equal to ~1e-12, not bits.
void launch_encode_combine(const ReceiveBuffers &B, int64_t hidden, WireDtype dtype, int32_t me, int32_t chunk,
                           int32_t chunks, const uint16_t *partial, uint8_t *wire, uint32_t *max_error_bits,
                           cudaStream_t stream);
// word = (max error > limit ? 1 : 0) | (fp32 bits of the max error) << 32: the gate's entry in the
// count exchange (one more int64 per rank).
void launch_gate_word(const uint32_t *max_error_bits, float limit, int64_t *word, cudaStream_t stream);

// ---- combine at the source (ft::ep::combine_at_source) -------------------------------------

// partials: rank r's rows at partial + (base_r + row) * H with base_r = offset[r] (peer_rows == 0)
// or r * peer_rows.
void launch_combine(const LayoutBuffers &L, int64_t tokens, const uint16_t *partial, int64_t peer_rows,
                    int64_t hidden, uint16_t *out, cudaStream_t stream);
// ft::ep::combine_at_source_wire (throughput): rank r != me's rows at wire + (offset[r] + row) *
// combine_row_bytes(H, dtype), decoded; this rank's own rows bf16 at own_partial + (*own_first +
// row) * H (own_first: device, the receive prefix of source `me`, where its own records sit).
void launch_combine_wire(const LayoutBuffers &L, int64_t tokens, const uint8_t *wire, WireDtype dtype, int32_t me,
                         const uint16_t *own_partial, const int64_t *own_first, int64_t hidden, uint16_t *out,
                         cudaStream_t stream);

// ---- transport ---------------------------------------------------------------------------------

// Byte ranges of one grouped exchange with peer p: send [send_offset, +send_bytes) of the send
// buffer to p, receive recv_bytes from p at recv_offset. The sizes must match pairwise (what s
// sends to d is what d expects from s); p == rank() is a local copy.
struct PeerRange {
    size_t send_offset = 0, send_bytes = 0;
    size_t recv_offset = 0, recv_bytes = 0;
};

// What NCCL serves in production and a device-copy double serves in tests. Calls are collective:
// every rank makes the same sequence of calls. Work is ordered on `stream`; nothing synchronises
// the host.
class Transport {
public:
    virtual ~Transport() = default;
    virtual int32_t rank() const = 0;
    virtual int32_t size() const = 0;
    // recv[r * bytes ...] = rank r's `send` (device memory).
    virtual void all_gather(const void *send, void *recv, size_t bytes, cudaStream_t stream) = 0;
    // One grouped exchange; ranges has size() entries.
    virtual void exchange(const void *send, void *recv, const PeerRange *ranges, cudaStream_t stream) = 0;
    virtual std::string describe() const = 0;
};

// NCCL through dlopen("libnccl.so.2") (the caller sets LD_LIBRARY_PATH). Absent NCCL:
// FT_ERR_UNSUPPORTED with the loader's message.
class NcclTransport : public Transport {
public:
    static bool available(std::string *why = nullptr);
    static int32_t library_version();  // NCCL_VERSION_CODE of the loaded library
    using UniqueId = std::array<uint8_t, 128>;
    static UniqueId unique_id();  // ncclGetUniqueId (honours NCCL_COMM_ID)
    // ncclCommInitRank on `device` (made current). max_ctas > 0 caps the CTAs of every NCCL kernel
    // of the communicator (ncclConfig_t.maxCTAs, the SM budget); 0 keeps NCCL's default.
    static std::unique_ptr<NcclTransport> init_rank(int32_t nranks, const UniqueId &id, int32_t rank, int32_t device,
                                                    int32_t max_ctas = 0);
    // One communicator per device of this process, rank i on devices[i] (ncclCommInitAll, or one
    // grouped ncclCommInitRankConfig per device with an SM budget).
    static std::vector<std::unique_ptr<NcclTransport>> init_all(const std::vector<int32_t> &devices,
                                                                int32_t max_ctas = 0);

    // Wraps an existing ncclComm_t; destroys it on destruction only if `owned`.
    NcclTransport(void *comm, bool owned);
    ~NcclTransport() override;
    NcclTransport(const NcclTransport &) = delete;
    NcclTransport &operator=(const NcclTransport &) = delete;

    int32_t rank() const override { return rank_; }
    int32_t size() const override { return size_; }
    void all_gather(const void *send, void *recv, size_t bytes, cudaStream_t stream) override;
    void exchange(const void *send, void *recv, const PeerRange *ranges, cudaStream_t stream) override;
    std::string describe() const override;
    // Baselines for the benchmarks: bf16 reduce-scatter (sum) of recv_count elements per rank.
    void reduce_scatter_bf16(const void *send, void *recv, size_t recv_count, cudaStream_t stream);
    void *comm() const { return comm_; }

private:
    void *comm_ = nullptr;
    bool owned_ = false;
    int32_t rank_ = 0, size_ = 0;
};

// ---- one rank's EP step ------------------------------------------------------------------------

enum class Mode : int32_t { Throughput = 0, Latency = 1 };

struct EpConfig {
    int32_t top_k = 8;
    int64_t hidden = 0;
    int64_t max_tokens = 0;          // tokens per rank per call; latency mode's capacity per peer
    WireDtype dispatch_dtype = WireDtype::Fp8Fp32;
    Mode mode = Mode::Throughput;
    int32_t chunks = 0;              // throughput: 0 = plan_chunks(), else forced (1..16)
    double link_bytes_per_s = 25e9;  // feeds the chunk plan
    ChunkPolicy policy;
    int64_t max_expert_rows = 0;     // rows per chunk the expert buffers hold; 0: R * max_tokens * K
    // Combine wire (issue 7 item 2). Bf16: the default. Fp8Fp32 / Fp8Ue8m0: throughput mode only;
    // partial rows leave in e4m3 with one scale per 128 channels while every call's largest row
    // error (ft::ep::combine_rel_error) stays <= combine_max_rel_error. The error of call N is
    // agreed on in call N+1's count exchange (one more int64 per rank: flag | error bits << 32):
    // if any rank's exceeded the limit, every rank combines in bf16 from call N+1 on, for good.
    WireDtype combine_dtype = WireDtype::Bf16;
    float combine_max_rel_error = kCombineDefaultMaxRelError;  // > 0, finite
};

// The rows the local experts must process, expert-major (device pointers, valid during the call).
struct ExpertBatch {
    int32_t slots = 0;
    int64_t hidden = 0;
    int64_t max_rows = 0;
    const int64_t *offset = nullptr;     // [S+1] rows of slot s: offset[s] .. offset[s+1]-1
    const uint16_t *x = nullptr;         // [max_rows, H] bf16 inputs
    uint16_t *y = nullptr;               // [max_rows, H] bf16 outputs the callback writes
    const int32_t *row_source = nullptr; // [max_rows] source rank of each row
    const int32_t *row_token = nullptr;  // [max_rows] token index on that source
    const float *row_weight = nullptr;   // [max_rows] the route's weight (applied by the EP step)
};
using ExpertFn = std::function<void(const ExpertBatch &, cudaStream_t)>;

class EpRank {
public:
    // Allocates every buffer now (none in the hot path). The current device must be the rank's.
    EpRank(Transport &transport, const Placement &placement, const EpConfig &config);
    ~EpRank();
    EpRank(const EpRank &) = delete;
    EpRank &operator=(const EpRank &) = delete;

    // Same ranks and slots per rank; takes effect at the next dispatch. All ranks must agree.
    void set_placement(const Placement &placement);
    const Placement &placement() const { return placement_; }
    const EpConfig &config() const { return config_; }

    // The whole layer: out[T, H] bf16 = sum over routes of weight * expert(x). Throughput mode:
    // one host sync (the count exchange), then dispatch chunks, expert calls per chunk and combine
    // chunks pipelined on a second stream. Latency mode: no host sync (capturable).
    void forward(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens, const ExpertFn &expert,
                 uint16_t *out, cudaStream_t stream);

    // Split form: dispatch, then the caller runs batch() through its experts on `stream`, then
    // combine. Throughput mode exchanges in one chunk here (one host sync in dispatch).
    void dispatch(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens, cudaStream_t stream);
    ExpertBatch batch() const;
    void combine(uint16_t *out, cudaStream_t stream);

    // Latency-mode phases, for one host thread driving several ranks in turn (every rank's
    // *_send before any rank's *_recv): dispatch = dispatch_send + dispatch_recv, combine likewise.
    void dispatch_send(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens,
                       cudaStream_t stream);
    void dispatch_recv(cudaStream_t stream);
    void combine_send(cudaStream_t stream);
    void combine_recv(uint16_t *out, cudaStream_t stream);

    // Inspection for tests and benchmarks.
    const LayoutBuffers &layout() const { return layout_; }
    const ReceiveBuffers &receive() const { return recv_; }
    RecvRegion recv_region() const;
    const uint8_t *send_buffer() const { return send_; }
    const uint16_t *partials() const { return partial_; }
    int32_t last_chunks() const { return last_chunks_; }
    const std::vector<int64_t> &last_count_matrix() const { return count_host_; }  // throughput
    size_t last_bytes_sent() const { return last_bytes_sent_; }  // to other ranks, both phases
    // The combine wire in use now: the configured one until the gate trips, then Bf16.
    WireDtype combine_dtype() const { return combine_tripped_ ? WireDtype::Bf16 : config_.combine_dtype; }
    bool combine_gate_tripped() const { return combine_tripped_; }
    // Largest row error of the last FP8-encoded combine (0 before any). Waits for that call's
    // encoding to finish (an event) and reads the device word.
    float combine_last_rel_error() const;
    // True if the last step's expert rows exceeded max_expert_rows (reads a device flag: syncs).
    bool overflowed(cudaStream_t stream) const;

private:
    void count_exchange(cudaStream_t stream);
    void exchange_chunk(bool combine, int32_t chunk, int32_t chunks, cudaStream_t stream);
    void layout_and_pack(const int32_t *ids, const float *weights, const uint16_t *x, int64_t tokens, size_t peer_bytes,
                         cudaStream_t stream);
    void receive_chunk(int32_t chunk, int32_t chunks, cudaStream_t stream);
    void reduce_chunk(int32_t chunk, int32_t chunks, cudaStream_t stream);
    void combine_at_source(uint16_t *out, cudaStream_t stream);

    Transport &net_;
    Placement placement_;
    EpConfig config_;
    std::unique_ptr<PlacementBuffer> dplace_;
    int32_t R_ = 0, S_ = 0, me_ = 0;
    RecordLayout rec_;
    size_t peer_bytes_ = 0;  // latency mode
    int64_t tokens_ = 0;
    ft::cuda::DeviceBuffer mem_;  // every device buffer below, carved
    LayoutBuffers layout_;
    ReceiveBuffers recv_;
    uint8_t *send_ = nullptr, *recvbuf_ = nullptr;
    uint16_t *x_rows_ = nullptr, *y_rows_ = nullptr, *partial_ = nullptr, *back_ = nullptr;
    int64_t *count_matrix_ = nullptr;  // [R * count_stride_] all-gathered
    int64_t *count_send_ = nullptr;    // [count_stride_] this rank's counts (+ the gate word)
    ft::cuda::PinnedBuffer pinned_counts_;
    int64_t *count_pinned_ = nullptr;  // pinned_counts_: [R * count_stride_]
    int32_t count_stride_ = 0;         // R, or R + 1 with an FP8 combine wire (the gate word)
    uint8_t *cwire_ = nullptr;         // FP8 combine: encoded partials to send [positions * crb]
    uint32_t *gate_max_ = nullptr;     // FP8 combine: fp32 bits of the encoding call's max error
    size_t combine_row_bytes_ = 0;     // of the configured combine wire
    bool combine_tripped_ = false;     // sticky: the gate tripped on some rank
    bool combine_encoded_ = false;     // some call has encoded (gate_event_ is recorded)
    cudaEvent_t gate_event_ = nullptr;
    std::vector<int64_t> count_host_;
    cudaStream_t comm_ = nullptr;
    std::vector<cudaEvent_t> events_;
    int32_t last_chunks_ = 1;
    size_t last_bytes_sent_ = 0;
};

}  // namespace ft::ep::cuda
