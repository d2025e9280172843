// The NCCL transport: libnccl.so.2 opened with dlopen at first use, never linked, so
// libfreetoken loads on machines without NCCL and reports FT_ERR_UNSUPPORTED there. nccl.h is
// included only for the types and signatures of the functions looked up.
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>

#include "ft/common.hpp"
#include "ft/ep_cuda.hpp"

namespace ft::ep::cuda {

namespace {

struct NcclApi {
    decltype(&::ncclGetVersion) get_version = nullptr;
    decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
    decltype(&::ncclCommInitRank) init_rank = nullptr;
    decltype(&::ncclCommInitAll) init_all = nullptr;
    decltype(&::ncclCommDestroy) destroy = nullptr;
    decltype(&::ncclCommCount) count = nullptr;
    decltype(&::ncclCommUserRank) user_rank = nullptr;
    decltype(&::ncclGroupStart) group_start = nullptr;
    decltype(&::ncclGroupEnd) group_end = nullptr;
    decltype(&::ncclSend) send = nullptr;
    decltype(&::ncclRecv) recv = nullptr;
    decltype(&::ncclAllGather) all_gather = nullptr;
    decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
    decltype(&::ncclGetErrorString) error_string = nullptr;
    decltype(&::ncclCommInitRankConfig) init_rank_config = nullptr;  // optional (NCCL >= 2.14)
    std::string error;  // why loading failed, empty when loaded
    int version = 0;
};

const NcclApi &api() {
    static NcclApi a;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *why = dlerror();
            a.error = cat("cannot load libnccl.so.2 (", why ? why : "unknown", "); set LD_LIBRARY_PATH to NCCL's lib folder");
            return;
        }
        bool ok = true;
        auto sym = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn && ok) {
                ok = false;
                a.error = cat("libnccl.so.2 lacks ", name);
            }
        };
        sym(a.get_version, "ncclGetVersion");
        sym(a.get_unique_id, "ncclGetUniqueId");
        sym(a.init_rank, "ncclCommInitRank");
        sym(a.init_all, "ncclCommInitAll");
        sym(a.destroy, "ncclCommDestroy");
        sym(a.count, "ncclCommCount");
        sym(a.user_rank, "ncclCommUserRank");
        sym(a.group_start, "ncclGroupStart");
        sym(a.group_end, "ncclGroupEnd");
        sym(a.send, "ncclSend");
        sym(a.recv, "ncclRecv");
        sym(a.all_gather, "ncclAllGather");
        sym(a.reduce_scatter, "ncclReduceScatter");
        sym(a.error_string, "ncclGetErrorString");
        a.init_rank_config = reinterpret_cast<decltype(a.init_rank_config)>(dlsym(lib, "ncclCommInitRankConfig"));
        if (ok) a.get_version(&a.version);
        // The handle stays open for the life of the process: communicators may outlive any owner.
    });
    return a;
}

const NcclApi &need() {
    const NcclApi &a = api();
    if (!a.error.empty()) fail(FT_ERR_UNSUPPORTED, "EP transport: ", a.error);
    return a;
}

void check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return;
    const NcclApi &a = api();
    fail(FT_ERR_DEVICE, "NCCL ", what, ": ", a.error_string ? a.error_string(r) : "error", " (", static_cast<int>(r), ")");
}

// The SM budget of a communicator we create: at most max_ctas CTAs per
// NCCL kernel, so the expert GEMMs keep the rest of the GPU.
ncclConfig_t budget_config(const NcclApi &a, int32_t max_ctas) {
    if (!a.init_rank_config) fail(FT_ERR_UNSUPPORTED, "EP: this libnccl lacks ncclCommInitRankConfig (SM budget)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.minCTAs = 1;
    config.maxCTAs = max_ctas;
    return config;
}

}  // namespace

bool NcclTransport::available(std::string *why) {
    const NcclApi &a = api();
    if (why) *why = a.error;
    return a.error.empty();
}

int32_t NcclTransport::library_version() { return available() ? api().version : 0; }

NcclTransport::UniqueId NcclTransport::unique_id() {
    const NcclApi &a = need();
    ncclUniqueId id;
    check(a.get_unique_id(&id), "ncclGetUniqueId");
    UniqueId out;
    static_assert(sizeof(id) == out.size(), "ncclUniqueId is 128 bytes");
    std::memcpy(out.data(), &id, out.size());
    return out;
}

std::unique_ptr<NcclTransport> NcclTransport::init_rank(int32_t nranks, const UniqueId &uid, int32_t rank,
                                                        int32_t device, int32_t max_ctas) {
    const NcclApi &a = need();
    if (nranks < 1 || rank < 0 || rank >= nranks || max_ctas < 0)
        fail(FT_ERR_INVALID_ARGUMENT, "EP bootstrap: rank ", rank, " of ", nranks, ", max CTAs ", max_ctas);
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id;
    std::memcpy(&id, uid.data(), uid.size());
    ncclComm_t comm = nullptr;
    if (max_ctas > 0) {
        ncclConfig_t config = budget_config(a, max_ctas);
        check(a.init_rank_config(&comm, nranks, id, rank, &config), "ncclCommInitRankConfig");
    } else {
        check(a.init_rank(&comm, nranks, id, rank), "ncclCommInitRank");
    }
    return std::make_unique<NcclTransport>(comm, true);
}

std::vector<std::unique_ptr<NcclTransport>> NcclTransport::init_all(const std::vector<int32_t> &devices,
                                                                    int32_t max_ctas) {
    const NcclApi &a = need();
    if (devices.empty() || max_ctas < 0) fail(FT_ERR_INVALID_ARGUMENT, "EP bootstrap: no devices or max CTAs ", max_ctas);
    const int n = static_cast<int>(devices.size());
    std::vector<ncclComm_t> comms(devices.size());
    if (max_ctas > 0) {
        // ncclCommInitAll takes no config: one id and every rank's init in one group instead.
        ncclUniqueId id;
        check(a.get_unique_id(&id), "ncclGetUniqueId");
        ncclConfig_t config = budget_config(a, max_ctas);
        check(a.group_start(), "ncclGroupStart");
        ncclResult_t r = ncclSuccess;
        for (int i = 0; i < n && r == ncclSuccess; ++i) {
            check_cuda(cudaSetDevice(devices[i]), "cudaSetDevice");
            r = a.init_rank_config(&comms[i], n, id, i, &config);
        }
        const ncclResult_t end = a.group_end();
        check(r, "ncclCommInitRankConfig");
        check(end, "ncclGroupEnd");
    } else {
        check(a.init_all(comms.data(), n, devices.data()), "ncclCommInitAll");
    }
    std::vector<std::unique_ptr<NcclTransport>> out;
    for (ncclComm_t c : comms) out.push_back(std::make_unique<NcclTransport>(c, true));
    return out;
}

NcclTransport::NcclTransport(void *comm, bool owned) : comm_(comm), owned_(owned) {
    const NcclApi &a = need();
    if (!comm) fail(FT_ERR_INVALID_ARGUMENT, "EP transport: null NCCL communicator");
    int n = 0, r = 0;
    check(a.count(static_cast<ncclComm_t>(comm), &n), "ncclCommCount");
    check(a.user_rank(static_cast<ncclComm_t>(comm), &r), "ncclCommUserRank");
    size_ = n;
    rank_ = r;
}

NcclTransport::~NcclTransport() {
    if (owned_ && comm_) api().destroy(static_cast<ncclComm_t>(comm_));
}

void NcclTransport::all_gather(const void *send, void *recv, size_t bytes, cudaStream_t stream) {
    check(api().all_gather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(comm_), stream), "ncclAllGather");
}

void NcclTransport::exchange(const void *send, void *recv, const PeerRange *ranges, cudaStream_t stream) {
    const NcclApi &a = api();
    const auto *sb = static_cast<const uint8_t *>(send);
    auto *rb = static_cast<uint8_t *>(recv);
    const PeerRange &self = ranges[rank_];
    if (self.send_bytes != self.recv_bytes)
        fail(FT_ERR_INTERNAL, "EP exchange: self send ", self.send_bytes, " bytes vs receive ", self.recv_bytes);
    // The rank's own rows are a device copy, not a wire transfer.
    if (self.send_bytes)
        check_cuda(cudaMemcpyAsync(rb + self.recv_offset, sb + self.send_offset, self.send_bytes, cudaMemcpyDeviceToDevice,
                                   stream),
                   "EP self copy");
    // Zero-byte pairs are skipped on both sides: sender and receiver compute the same sizes.
    check(a.group_start(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (int32_t p = 0; p < size_ && r == ncclSuccess; ++p) {
        if (p == rank_) continue;
        if (ranges[p].send_bytes)
            r = a.send(sb + ranges[p].send_offset, ranges[p].send_bytes, ncclUint8, p, static_cast<ncclComm_t>(comm_),
                       stream);
        if (r == ncclSuccess && ranges[p].recv_bytes)
            r = a.recv(rb + ranges[p].recv_offset, ranges[p].recv_bytes, ncclUint8, p, static_cast<ncclComm_t>(comm_),
                       stream);
    }
    const ncclResult_t end = a.group_end();
    check(r, "ncclSend/ncclRecv");
    check(end, "ncclGroupEnd");
}

void NcclTransport::reduce_scatter_bf16(const void *send, void *recv, size_t recv_count, cudaStream_t stream) {
    check(api().reduce_scatter(send, recv, recv_count, ncclBfloat16, ncclSum, static_cast<ncclComm_t>(comm_), stream),
          "ncclReduceScatter");
}

std::string NcclTransport::describe() const {
    const int v = api().version;
    return cat("NCCL ", v / 10000, ".", (v / 100) % 100, ".", v % 100, " rank ", rank_, " of ", size_);
}

}  // namespace ft::ep::cuda
