// HostMailboxTransport (ft/ep_mailbox.hpp): one kernel per exchange, mailboxes in mapped pinned
// host memory. The protocol is described in the header.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ft/common.hpp"
#include "ft/ep_mailbox.hpp"

namespace ft::ep::cuda {

namespace {

constexpr size_t kLine = 128;                // one flag per cache line
constexpr size_t kLineWords = kLine / sizeof(uint64_t);
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 32;
constexpr size_t kBytesPerBlock = 64 * 1024;  // below this a block has too little to stream

struct Ranges {
    PeerRange r[kMaxMailboxRanks];
};

// What one rank's kernel needs (device-visible addresses).
struct View {
    int32_t me = 0, R = 0;
    uint8_t *box = nullptr;   // box(src, dst, parity) at ((src * R + dst) * 2 + parity) * cap
    size_t cap = 0;
    uint64_t *ready = nullptr;  // ready[(dst * R + src) * kLineWords]
    uint64_t *done = nullptr;   // done[(src * R + dst) * kLineWords]
    uint32_t *fault = nullptr;
    uint64_t *seq = nullptr;     // device: exchanges completed by this rank
    uint32_t *arrive = nullptr;  // device [2]: blocks past the send phase, blocks finished
    uint64_t timeout_ns = 0;
};

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release_sys(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// Thread 0 only: waits until *word >= want. False (and the group marked faulted) on timeout or
// when the group is already faulted.
__device__ bool wait_at_least(const View &v, const uint64_t *word, uint64_t want) {
    const uint64_t start = now_ns();
    while (load_acquire_sys(word) < want) {
        if (*reinterpret_cast<volatile uint32_t *>(v.fault) != 0) return false;
        if (now_ns() - start > v.timeout_ns) {
            atomicExch_system(v.fault, 1u);
            return false;
        }
        __nanosleep(100);
    }
    return true;
}

// A mailbox word, read as a system-scope relaxed load: ordered after thread 0's acquire of the
// sender's flag (bar.sync between), and never served from a stale cached copy of an earlier
// message (a hint such as ld.cv is not a memory-model guarantee, and the sender may be this GPU).
__device__ __forceinline__ uint4 load_sys(const uint4 *p) {
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Copies the byte ranges [k] (src_k -> dst_k, n_k bytes) as one grid-strided stream of 16-byte
// words (vec) or bytes; mailbox sources (kFromHost) through system-scope loads.
struct Piece {
    const uint8_t *src;
    uint8_t *dst;
    size_t n;
};

template <bool kFromHost>
__device__ void copy_pieces(const Piece *pieces, int count, bool vec) {
    const size_t unit = vec ? 16 : 1;
    size_t total = 0;
    for (int k = 0; k < count; ++k) total += pieces[k].n / unit;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    int k = 0;
    size_t before = 0;  // units in pieces[0..k)
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        while (i >= before + pieces[k].n / unit) before += pieces[k++].n / unit;
        const size_t at = i - before;
        if (vec) {
            const uint4 *s = reinterpret_cast<const uint4 *>(pieces[k].src) + at;
            reinterpret_cast<uint4 *>(pieces[k].dst)[at] = kFromHost ? load_sys(s) : *s;
        } else {
            const uint8_t *s = pieces[k].src + at;
            pieces[k].dst[at] = kFromHost ? *reinterpret_cast<const volatile uint8_t *>(s) : *s;
        }
    }
}

__global__ void __launch_bounds__(kThreads)
    mailbox_exchange_kernel(View v, const uint8_t *send, uint8_t *recv, Ranges rg, bool vec) {
    __shared__ bool ok;
    __shared__ Piece pieces[kMaxMailboxRanks];
    const uint64_t s = *v.seq + 1;  // this exchange's number, the same on every rank
    const int parity = static_cast<int>(s & 1);
    const int R = v.R, me = v.me;
    auto box = [&](int src, int dst) { return v.box + (size_t(src * R + dst) * 2 + parity) * v.cap; };

    // Send: once each receiver has finished the exchange that last used this parity's box.
    if (threadIdx.x == 0) {
        ok = true;
        for (int p = 0; p < R && ok; ++p)
            if (p != me && rg.r[p].send_bytes && s > 2)
                ok = wait_at_least(v, v.done + size_t(me * R + p) * kLineWords, s - 2);
    }
    __syncthreads();
    if (ok) {
        int n = 0;
        for (int p = 0; p < R; ++p) {
            const PeerRange &q = rg.r[p];
            if (!q.send_bytes) continue;
            pieces[n++] = p == me ? Piece{send + q.send_offset, recv + q.recv_offset, q.send_bytes}
                                  : Piece{send + q.send_offset, box(me, p), q.send_bytes};
        }
        copy_pieces<false>(pieces, n, vec);
    }
    __threadfence_system();  // this thread's mailbox writes before the flags below
    __syncthreads();
    if (threadIdx.x == 0) {
        if (atomicAdd(&v.arrive[0], 1u) == gridDim.x - 1) {
            v.arrive[0] = 0;  // the next launch starts after this one has finished
            __threadfence_system();
            for (int p = 0; p < R; ++p)
                if (p != me) store_release_sys(v.ready + size_t(p * R + me) * kLineWords, s);
        }
    }

    // Receive: each expected message once its sender's flag says it is complete.
    if (threadIdx.x == 0) {
        for (int p = 0; p < R && ok; ++p)
            if (p != me && rg.r[p].recv_bytes) ok = wait_at_least(v, v.ready + size_t(me * R + p) * kLineWords, s);
        __threadfence();
    }
    __syncthreads();
    if (ok) {
        int n = 0;
        for (int p = 0; p < R; ++p) {
            const PeerRange &q = rg.r[p];
            if (p != me && q.recv_bytes) pieces[n++] = Piece{box(p, me), recv + q.recv_offset, q.recv_bytes};
        }
        copy_pieces<true>(pieces, n, vec);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        if (atomicAdd(&v.arrive[1], 1u) == gridDim.x - 1) {
            v.arrive[1] = 0;
            *v.seq = s;
            for (int p = 0; p < R; ++p)
                if (p != me) store_release_sys(v.done + size_t(p * R + me) * kLineWords, s);
        }
    }
}

uint64_t timeout_ns(uint32_t ms) {
    if (ms == 0) {
        const char *e = std::getenv("FT_EP_MAILBOX_TIMEOUT_MS");
        const long env = e ? std::atol(e) : 0;
        ms = env > 0 && env < (1l << 31) ? static_cast<uint32_t>(env) : 10000u;
    }
    return uint64_t{ms} * 1000000ull;
}

}  // namespace

struct HostMailboxTransport::Shared {
    int32_t ranks = 0;
    size_t cap = 0;
    uint64_t timeout_ns = 0;
    uint8_t *host = nullptr;  // boxes, then ready lines, done lines, the fault word
    size_t boxes_bytes = 0, flags_bytes = 0;
    std::vector<int32_t> devices;
    ~Shared() {
        if (host) cudaFreeHost(host);
    }
    uint64_t *ready() const { return reinterpret_cast<uint64_t *>(host + boxes_bytes); }
    uint64_t *done() const { return ready() + size_t(ranks) * ranks * kLineWords; }
    uint32_t *fault() const { return reinterpret_cast<uint32_t *>(done() + size_t(ranks) * ranks * kLineWords); }
};

std::vector<std::unique_ptr<HostMailboxTransport>> HostMailboxTransport::create_local(
    const std::vector<int32_t> &devices, size_t max_message_bytes, uint32_t timeout_ms) {
    const int32_t R = static_cast<int32_t>(devices.size());
    if (R < 1 || R > kMaxMailboxRanks)
        fail(FT_ERR_UNSUPPORTED, "EP mailbox transport: ", R, " ranks (1..", kMaxMailboxRanks, " supported)");
    if (max_message_bytes == 0 || max_message_bytes > (size_t{1} << 32))
        fail(FT_ERR_INVALID_ARGUMENT, "EP mailbox transport: max message ", max_message_bytes, " bytes");
    auto shared = std::make_shared<Shared>();
    shared->ranks = R;
    shared->cap = (max_message_bytes + kLine - 1) / kLine * kLine;
    shared->devices = devices;
    shared->timeout_ns = timeout_ns(timeout_ms);
    shared->boxes_bytes = size_t(R) * R * 2 * shared->cap;
    shared->flags_bytes = 2 * size_t(R) * R * kLine + kLine;
    const size_t total = shared->boxes_bytes + shared->flags_bytes;
    check_cuda(cudaHostAlloc(reinterpret_cast<void **>(&shared->host), total, cudaHostAllocPortable | cudaHostAllocMapped),
               "EP mailbox pinned memory");
    std::memset(shared->host + shared->boxes_bytes, 0, shared->flags_bytes);
    std::vector<std::unique_ptr<HostMailboxTransport>> out;
    for (int32_t r = 0; r < R; ++r)
        out.push_back(std::unique_ptr<HostMailboxTransport>(new HostMailboxTransport(shared, r, devices[r])));
    return out;
}

HostMailboxTransport::HostMailboxTransport(std::shared_ptr<Shared> shared, int32_t rank, int32_t device)
    : shared_(std::move(shared)), rank_(rank), size_(shared_->ranks), device_(device) {
    int previous = 0;
    check_cuda(cudaGetDevice(&previous), "EP mailbox device");
    check_cuda(cudaSetDevice(device), "EP mailbox device");
    void *mapped = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&mapped, shared_->host, 0);
    if (err == cudaSuccess && mapped != shared_->host) err = cudaErrorNotSupported;  // needs unified addressing
    if (err == cudaSuccess) err = cudaMalloc(&counters_, kLine);
    if (err == cudaSuccess) err = cudaMemset(counters_, 0, kLine);
    cudaSetDevice(previous);
    check_cuda(err, "EP mailbox mapping");
}

HostMailboxTransport::~HostMailboxTransport() {
    if (!counters_) return;
    int previous = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device_) == cudaSuccess) {
        cudaFree(counters_);
        cudaSetDevice(previous);
    }
}

size_t HostMailboxTransport::max_message_bytes() const { return shared_->cap; }

bool HostMailboxTransport::faulted() const {
    return *reinterpret_cast<volatile uint32_t *>(shared_->fault()) != 0;
}

void HostMailboxTransport::exchange(const void *send, void *recv, const PeerRange *ranges, cudaStream_t stream) {
    if (faulted())
        fail(FT_ERR_DEVICE, "EP mailbox transport: an earlier exchange timed out waiting for a peer ",
             "(", shared_->timeout_ns / 1000000, " ms); the group is unusable");
    Ranges rg{};
    bool vec = (reinterpret_cast<uintptr_t>(send) | reinterpret_cast<uintptr_t>(recv)) % 16 == 0;
    size_t most = 0;
    for (int32_t p = 0; p < size_; ++p) {
        const PeerRange &q = ranges[p];
        if (p != rank_ && (q.send_bytes > shared_->cap || q.recv_bytes > shared_->cap))
            fail(FT_ERR_INVALID_ARGUMENT, "EP mailbox transport: a message of ", std::max(q.send_bytes, q.recv_bytes),
                 " bytes to/from rank ", p, "; the mailboxes hold ", shared_->cap);
        if (p == rank_ && q.send_bytes != q.recv_bytes)
            fail(FT_ERR_INTERNAL, "EP exchange: self send ", q.send_bytes, " bytes vs receive ", q.recv_bytes);
        vec = vec && (q.send_offset | q.send_bytes | q.recv_offset | q.recv_bytes) % 16 == 0;
        most = std::max(most, q.send_bytes + q.recv_bytes);
        rg.r[p] = q;
    }
    View v;
    v.me = rank_;
    v.R = size_;
    v.box = shared_->host;
    v.cap = shared_->cap;
    v.ready = shared_->ready();
    v.done = shared_->done();
    v.fault = shared_->fault();
    v.seq = static_cast<uint64_t *>(counters_);
    v.arrive = reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(counters_) + 8);
    v.timeout_ns = shared_->timeout_ns;
    const int blocks = static_cast<int>(std::clamp<size_t>(most * size_ / kBytesPerBlock, 1, kMaxBlocks));
    mailbox_exchange_kernel<<<blocks, kThreads, 0, stream>>>(v, static_cast<const uint8_t *>(send),
                                                             static_cast<uint8_t *>(recv), rg, vec);
    check_cuda(cudaGetLastError(), "EP mailbox exchange launch");
}

void HostMailboxTransport::all_gather(const void *send, void *recv, size_t bytes, cudaStream_t stream) {
    PeerRange ranges[kMaxMailboxRanks];
    for (int32_t p = 0; p < size_; ++p) ranges[p] = {0, bytes, size_t(p) * bytes, bytes};
    exchange(send, recv, ranges, stream);
}

std::string HostMailboxTransport::describe() const {
    return cat("host mailbox rank ", rank_, " of ", size_, " (", shared_->cap, " bytes a message)");
}

}  // namespace ft::ep::cuda
