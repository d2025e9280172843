// The CPU handoff: flags, the two enqueue mechanisms, the coordinator and the watchdog
// (cuda_handoff.hpp describes the protocol).
//
// Flag layout: one 128-byte record per site (two cache lines, so the GPU's writes to one site and
// the coordinator's polling of another never share a line):
//   +0   uint32 go       GPU (or the signal host function) writes 1; the coordinator clears it
//   +64  uint32 done     the coordinator writes 1; the stream clears it right after its wait
//   +68  uint32 release  0 until the handoff fails or is destroyed, then 1 for good
// The wait is one 64-bit AND over [done, release] with mask (1 << 32 | 1): it passes when the task
// is done OR the site is released, and the stream's reset (a 32-bit write of done) can never undo
// a release. That is what lets a failed handoff stay open with constant, graph-baked operations.
//
// Memory ordering (CUDA driver API, Stream Memory Operations): a stream write-value carries a
// memory fence before the write (like __threadfence_system, scoped to the stream), so the D2H
// copies enqueued before signal() have landed in host memory when go becomes visible; the
// coordinator loads go with acquire. The coordinator publishes done with a release store after
// the task's writes; the H2D copy ordered after the wait reads host memory, which PCIe keeps
// coherent with the CPU caches. CU_STREAM_WAIT_VALUE_FLUSH is not needed: it only orders earlier
// *remote writes into device memory* (peer or BAR writes) before downstream device work, and no
// data here is written into device memory by the host. (It also needs platform support,
// CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES.) A task that writes device memory through a BAR
// mapping would need it; none does.
#include "ft/cuda_handoff.hpp"

#include <cuda.h>  // types and enums only: the functions are resolved through the runtime

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "ft/common.hpp"
#include "ft/cuda_check.hpp"

namespace ft::cuda {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSiteBytes = 128;
constexpr size_t kGoOffset = 0;
constexpr size_t kDoneOffset = 64;
constexpr size_t kReleaseOffset = 68;
// The wait's mask over the 64-bit word [done (low half), release (high half)], little-endian.
constexpr uint64_t kDoneOrReleased = (uint64_t{1} << 32) | 1u;
// The driver API version whose entry points we want: the v2 stream memory operations (11.7+).
constexpr unsigned kDriverApiVersion = 12000;

using WriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using DeviceGetFn = CUresult (*)(CUdevice *, int);
using DeviceGetAttributeFn = CUresult (*)(int *, CUdevice_attribute, CUdevice);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

inline uint32_t load_acquire(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint32_t load_seq_cst(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
inline void store_release(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void store_seq_cst(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

int64_t to_ns(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Clock::duration to_duration(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

template <typename Fn>
bool resolve(const char *symbol, Fn *fn, std::string *why) {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, kDriverApiVersion, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
        cudaGetLastError();
        *why = cat("driver entry point ", symbol, " unavailable (", cudaGetErrorName(e), ", query result ",
                   static_cast<int>(q), ")");
        return false;
    }
    *fn = reinterpret_cast<Fn>(p);
    return true;
}

// Runtime error codes mirror the driver's for every failure a stream memory operation reports
// (invalid value, not supported, capture errors), so the driver's code is passed through.
cudaError_t to_runtime_error(CUresult r) {
    return r == CUDA_SUCCESS ? cudaSuccess : static_cast<cudaError_t>(r);
}

}  // namespace

const char *handoff_mechanism_name(HandoffMechanism m) {
    switch (m) {
        case HandoffMechanism::stream_memops: return "stream_memops";
        case HandoffMechanism::host_func: return "host_func";
        case HandoffMechanism::automatic: break;
    }
    return "automatic";
}

HandoffMechanism handoff_mechanism_from_knob(const std::string &value) {
    if (value.empty()) return HandoffMechanism::automatic;
    if (value == "memops") return HandoffMechanism::stream_memops;
    if (value == "hostfn") return HandoffMechanism::host_func;
    fail(FT_ERR_INVALID_ARGUMENT, "FT_HANDOFF must be memops or hostfn, not '", value, "'");
}

// One registered site, at a stable address (host functions get a pointer to it).
struct SiteSlot {
    Handoff::State *state = nullptr;
    int site = -1;
    Handoff::Task task;
    bool signalled = false;  // enqueue-order alternation check, under State::enqueue_mutex
    std::atomic<uint64_t> served{0};
    std::atomic<double> task_last{0}, task_avg{0}, service_last{0}, service_avg{0};
};

struct Handoff::State {
    HandoffOptions opt;
    HandoffMechanism mech = HandoffMechanism::host_func;
    unsigned char *flags = nullptr;  // (max_sites + 1) records; the last is the probe's scratch
    CUdeviceptr flags_dev = 0;
    WriteValue32Fn write32 = nullptr;
    WaitValue64Fn wait64 = nullptr;

    std::unique_ptr<SiteSlot[]> sites;
    std::atomic<int> nsites{0};
    std::mutex enqueue_mutex;  // add_site, and the signal/wait alternation

    std::atomic<bool> stop{false}, failed{false};
    mutable std::mutex status_mutex;
    ft_status status = FT_OK;
    std::string message;

    // Coordinator.
    std::thread coordinator;
    std::atomic<int> running_site{-1};
    std::atomic<int64_t> task_start_ns{0};
    std::atomic<bool> coordinator_sleeping{false};
    std::atomic<int64_t> warm_until_ns{0};  // the coordinator polls until then (warm())
    std::mutex coord_mutex;
    std::condition_variable coord_cv;
    bool kicked = false;  // under coord_mutex
    std::mutex exit_mutex;
    std::condition_variable exit_cv;
    bool coordinator_exited = false;  // under exit_mutex

    // host_func waiters.
    std::mutex done_mutex;
    std::condition_variable done_cv;

    // Watchdog.
    std::thread watchdog;
    std::mutex wd_mutex;
    std::condition_variable wd_cv;

    ~State() {
        if (flags) cudaFreeHost(flags);
    }

    uint32_t *word(int site, size_t offset) {
        return reinterpret_cast<uint32_t *>(flags + static_cast<size_t>(site) * kSiteBytes + offset);
    }
    uint32_t *go(int site) { return word(site, kGoOffset); }
    uint32_t *done(int site) { return word(site, kDoneOffset); }
    uint32_t *released(int site) { return word(site, kReleaseOffset); }
    CUdeviceptr dev(int site, size_t offset) const {
        return flags_dev + static_cast<CUdeviceptr>(static_cast<size_t>(site) * kSiteBytes + offset);
    }

    bool any_go_seq_cst() {
        const int n = nsites.load(std::memory_order_acquire);
        for (int s = 0; s < n; ++s)
            if (load_seq_cst(go(s)) != 0) return true;
        return false;
    }

    // Opens every site for good and wakes host-function waiters.
    void release_all() {
        for (int s = 0; s < opt.max_sites; ++s) store_release(released(s), 1);
        { std::lock_guard<std::mutex> lk(done_mutex); }
        done_cv.notify_all();
    }

    void fail(ft_status s, const std::string &why) {
        {
            std::lock_guard<std::mutex> lk(status_mutex);
            if (status == FT_OK) {
                status = s;
                message = why;
            }
        }
        log(FT_LOG_ERROR, "handoff: ", why);
        failed.store(true, std::memory_order_seq_cst);
        release_all();
    }

    std::string probe_memops(int device);
    void coordinator_loop();
    bool serve_once();
    void idle(Clock::duration since_activity);
    void watchdog_loop();
};

namespace {

void CUDART_CB host_signal(void *p) {
    auto *slot = static_cast<SiteSlot *>(p);
    Handoff::State &st = *slot->state;
    store_seq_cst(st.go(slot->site), 1);
    // Dekker pairing with the coordinator: it sets `sleeping` and then re-reads the go flags, we
    // set go and then read `sleeping`; one of the two sees the other.
    if (st.coordinator_sleeping.load(std::memory_order_seq_cst)) {
        {
            std::lock_guard<std::mutex> lk(st.coord_mutex);
            st.kicked = true;
        }
        st.coord_cv.notify_one();
    }
}

void CUDART_CB host_wait(void *p) {
    auto *slot = static_cast<SiteSlot *>(p);
    Handoff::State &st = *slot->state;
    const int s = slot->site;
    auto ready = [&] {
        return load_acquire(st.done(s)) != 0 || load_acquire(st.released(s)) != 0 ||
               st.stop.load(std::memory_order_acquire);
    };
    // Short tasks are often done by now or within microseconds: spin briefly before sleeping.
    const auto spin_until = Clock::now() + std::chrono::microseconds(20);
    while (!ready() && Clock::now() < spin_until) cpu_relax();
    if (!ready()) {
        std::unique_lock<std::mutex> lk(st.done_mutex);
        // The 1 ms bound is a safety net only: the coordinator notifies after every done.
        while (!ready()) st.done_cv.wait_for(lk, std::chrono::milliseconds(1));
    }
    store_release(st.done(s), 0);
}

}  // namespace

// Checks the driver's stream memory operations on the probe's scratch record: write go, wait on a
// pre-set done, reset done, and read both back. Returns "" when they work, else why not.
std::string Handoff::State::probe_memops(int device) {
    std::string why;
    DeviceGetFn device_get = nullptr;
    DeviceGetAttributeFn get_attribute = nullptr;
    if (!resolve("cuDeviceGet", &device_get, &why) || !resolve("cuDeviceGetAttribute", &get_attribute, &why) ||
        !resolve("cuStreamWriteValue32", &write32, &why) || !resolve("cuStreamWaitValue64", &wait64, &why)) {
        write32 = nullptr;
        wait64 = nullptr;
        return why;
    }
    CUdevice cu_dev = 0;
    if (device_get(&cu_dev, device) != CUDA_SUCCESS) return "cuDeviceGet failed";
    int can64 = 0;
    if (get_attribute(&can64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cu_dev) != CUDA_SUCCESS || !can64)
        return "the device does not support 64-bit stream memory operations";

    const int scratch = opt.max_sites;
    store_release(go(scratch), 0);
    store_release(done(scratch), 1);
    store_release(released(scratch), 0);
    cudaStream_t stream = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cat("cudaStreamCreateWithFlags: ", cudaGetErrorString(e));
    }
    CUresult r = write32(stream, dev(scratch, kGoOffset), 7, 0);
    if (r == CUDA_SUCCESS) r = wait64(stream, dev(scratch, kDoneOffset), kDoneOrReleased, CU_STREAM_WAIT_VALUE_AND);
    if (r == CUDA_SUCCESS) r = write32(stream, dev(scratch, kDoneOffset), 0, 0);
    if (r != CUDA_SUCCESS) why = cat("stream memory operation failed with driver error ", static_cast<int>(r));
    // The wait's condition holds from the start; if it is not seen within a second the
    // operations do not work here. Release it so the stream can drain either way.
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (e == cudaErrorNotReady) {
        store_release(released(scratch), 1);
        if (why.empty()) why = "a stream wait on mapped host memory never completed";
    }
    e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess && why.empty()) why = cat("cudaStreamSynchronize: ", cudaGetErrorString(e));
    cudaGetLastError();
    cudaStreamDestroy(stream);
    if (why.empty() && (load_acquire(go(scratch)) != 7 || load_acquire(done(scratch)) != 0))
        why = "stream memory operations did not write mapped host memory";
    store_release(go(scratch), 0);
    store_release(done(scratch), 0);
    store_release(released(scratch), 0);
    return why;
}

bool Handoff::State::serve_once() {
    const int n = nsites.load(std::memory_order_acquire);
    bool any = false;
    for (int s = 0; s < n; ++s) {
        if (load_acquire(go(s)) == 0) continue;
        any = true;
        const auto seen = Clock::now();
        // Cleared before done is set: the stream can only write the next go after the wait that
        // done opens, so this store can never erase a newer go.
        store_release(go(s), 0);
        SiteSlot &slot = sites[s];
        // A failed or stopping handoff runs no more tasks: the release bit opens the wait.
        if (failed.load(std::memory_order_acquire) || stop.load(std::memory_order_acquire)) continue;
        task_start_ns.store(to_ns(seen), std::memory_order_relaxed);
        running_site.store(s, std::memory_order_release);
        const auto t0 = Clock::now();
        try {
            slot.task();
        } catch (const Error &e) {
            fail(e.status(), cat("the task of site ", s, " failed: ", e.what()));
        } catch (const std::exception &e) {
            fail(FT_ERR_INTERNAL, cat("the task of site ", s, " threw: ", e.what()));
        } catch (...) {
            fail(FT_ERR_INTERNAL, cat("the task of site ", s, " threw an unknown exception"));
        }
        const auto t1 = Clock::now();
        running_site.store(-1, std::memory_order_release);
        store_release(done(s), 1);
        if (mech == HandoffMechanism::host_func) {
            { std::lock_guard<std::mutex> lk(done_mutex); }
            done_cv.notify_all();
        }
        const auto t2 = Clock::now();

        const double task = seconds_between(t0, t1), service = seconds_between(seen, t2);
        const bool first = slot.served.load(std::memory_order_relaxed) == 0;
        const double task_avg = slot.task_avg.load(std::memory_order_relaxed);
        const double service_avg = slot.service_avg.load(std::memory_order_relaxed);
        slot.task_last.store(task, std::memory_order_relaxed);
        slot.service_last.store(service, std::memory_order_relaxed);
        slot.task_avg.store(first ? task : task_avg + (task - task_avg) / 8, std::memory_order_relaxed);
        slot.service_avg.store(first ? service : service_avg + (service - service_avg) / 8,
                               std::memory_order_relaxed);
        slot.served.fetch_add(1, std::memory_order_release);
    }
    return any;
}

void Handoff::State::idle(Clock::duration since_activity) {
    if (since_activity < to_duration(opt.spin_seconds) ||
        to_ns(Clock::now()) < warm_until_ns.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 32; ++i) cpu_relax();
        return;
    }
    const Clock::duration nap =
        since_activity < to_duration(opt.idle_seconds) ? to_duration(opt.nap_seconds) : std::chrono::milliseconds(1);
    std::unique_lock<std::mutex> lk(coord_mutex);
    coordinator_sleeping.store(true, std::memory_order_seq_cst);
    if (!kicked && !stop.load(std::memory_order_acquire) && !any_go_seq_cst())
        coord_cv.wait_for(lk, nap, [&] { return kicked || stop.load(std::memory_order_acquire); });
    kicked = false;
    coordinator_sleeping.store(false, std::memory_order_relaxed);
}

void Handoff::State::coordinator_loop() {
#if defined(__linux__)
    // Naps of ~20 us need a timer slack below Linux's default 50 us.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    if (opt.coordinator_cpu >= 0 && opt.coordinator_cpu < CPU_SETSIZE) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(opt.coordinator_cpu, &set);
        if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
            log(FT_LOG_WARN, "handoff: cannot pin the coordinator to CPU ", opt.coordinator_cpu);
    }
#endif
    auto last_activity = Clock::now();
    while (!stop.load(std::memory_order_acquire)) {
        if (serve_once()) {
            last_activity = Clock::now();
            continue;
        }
        idle(Clock::now() - last_activity);
    }
    {
        std::lock_guard<std::mutex> lk(exit_mutex);
        coordinator_exited = true;
    }
    exit_cv.notify_all();
}

void Handoff::State::watchdog_loop() {
    const double period = std::clamp(opt.timeout_seconds / 10, 1e-3, 0.1);
    const int64_t timeout_ns = static_cast<int64_t>(opt.timeout_seconds * 1e9);
    // Per site: when its current go was first seen pending (0: not pending) and the served count
    // then; a go still pending with no task served since, for longer than the timeout, is lost.
    std::vector<int64_t> pending_since(static_cast<size_t>(opt.max_sites), 0);
    std::vector<uint64_t> served_then(static_cast<size_t>(opt.max_sites), 0);
    std::unique_lock<std::mutex> lk(wd_mutex);
    while (!stop.load(std::memory_order_acquire)) {
        wd_cv.wait_for(lk, to_duration(period), [&] { return stop.load(std::memory_order_acquire); });
        if (stop.load(std::memory_order_acquire) || failed.load(std::memory_order_acquire)) continue;
        // `now` is read before the coordinator's state, so a task seen running was running for at
        // least now - start (no false alarm from a task that ends while we look).
        const int64_t now = to_ns(Clock::now());
        const int running = running_site.load(std::memory_order_acquire);
        if (running >= 0) {
            const int64_t ran = now - task_start_ns.load(std::memory_order_relaxed);
            if (ran > timeout_ns) {
                fail(FT_ERR_TIMEOUT, cat("the task of site ", running, " has run for ", ran / 1e9,
                                         " s, over the timeout of ", opt.timeout_seconds, " s"));
                continue;
            }
        }
        const int n = nsites.load(std::memory_order_acquire);
        for (int s = 0; s < n; ++s) {
            const uint64_t served = sites[s].served.load(std::memory_order_acquire);
            if (load_acquire(go(s)) == 0) {
                pending_since[s] = 0;
                continue;
            }
            if (pending_since[s] == 0 || served != served_then[s]) {
                pending_since[s] = now;
                served_then[s] = served;
            } else if (now - pending_since[s] > timeout_ns) {
                fail(FT_ERR_TIMEOUT, cat("the go of site ", s, " was not answered within ", opt.timeout_seconds,
                                         " s (coordinator blocked?)"));
                break;
            }
        }
    }
}

Handoff::Handoff(const HandoffOptions &options) {
    const HandoffOptions &o = options;
    if (!(o.timeout_seconds > 0) || o.max_sites < 1 || o.max_sites > 65536 || !(o.spin_seconds >= 0) ||
        !(o.nap_seconds >= 0) || !(o.idle_seconds >= 0))
        fail(FT_ERR_INVALID_ARGUMENT, "handoff options out of range (timeout ", o.timeout_seconds, " s, max_sites ",
             o.max_sites, ")");

    const HandoffMechanism want = o.mechanism;

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || o.device < 0 || o.device >= count) {
        cudaGetLastError();
        fail(FT_ERR_NO_DEVICE, "handoff: CUDA device ", o.device, " is not usable");
    }
    int previous = 0;
    cudaGetDevice(&previous);
    struct RestoreDevice {
        int device;
        ~RestoreDevice() { cudaSetDevice(device); }
    } restore{previous};
    cudaError_t e = cudaSetDevice(o.device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail(FT_ERR_NO_DEVICE, "handoff: cudaSetDevice(", o.device, "): ", cudaGetErrorString(e));
    }

    auto st = std::make_shared<State>();
    st->opt = o;
    const size_t bytes = static_cast<size_t>(o.max_sites + 1) * kSiteBytes;
    void *host = nullptr;
    check(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "handoff: cudaHostAlloc of the flags");
    st->flags = static_cast<unsigned char *>(host);
    std::memset(host, 0, bytes);
    void *dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, host, 0), "handoff: cudaHostGetDevicePointer");
    st->flags_dev = reinterpret_cast<CUdeviceptr>(dev);
    st->sites = std::make_unique<SiteSlot[]>(static_cast<size_t>(o.max_sites));

    if (want == HandoffMechanism::host_func) {
        st->mech = HandoffMechanism::host_func;
    } else {
        const std::string why = st->probe_memops(o.device);
        if (why.empty()) {
            st->mech = HandoffMechanism::stream_memops;
        } else if (want == HandoffMechanism::stream_memops) {
            fail(FT_ERR_UNSUPPORTED, "handoff: stream memory operations unavailable: ", why);
        } else {
            log(FT_LOG_INFO, "handoff: stream memory operations unavailable (", why, "), using host functions");
            st->mech = HandoffMechanism::host_func;
        }
    }
    log(FT_LOG_DEBUG, "handoff: device ", o.device, ", mechanism ", handoff_mechanism_name(st->mech));

    // Both threads hold the state: a coordinator stuck in a task may outlive the Handoff.
    st->coordinator = std::thread([keep = st] { keep->coordinator_loop(); });
    try {
        st->watchdog = std::thread([keep = st] { keep->watchdog_loop(); });
    } catch (...) {
        st->stop.store(true);
        { std::lock_guard<std::mutex> lk(st->coord_mutex); }
        st->coord_cv.notify_all();
        st->coordinator.join();
        throw;
    }
    state_ = std::move(st);
}

Handoff::~Handoff() {
    if (!state_) return;
    State &st = *state_;
    st.stop.store(true, std::memory_order_seq_cst);
    st.release_all();
    {
        std::lock_guard<std::mutex> lk(st.coord_mutex);
        st.kicked = true;
    }
    st.coord_cv.notify_all();
    { std::lock_guard<std::mutex> lk(st.wd_mutex); }
    st.wd_cv.notify_all();
    if (st.watchdog.joinable()) st.watchdog.join();

    bool exited = false;
    {
        std::unique_lock<std::mutex> lk(st.exit_mutex);
        exited = st.exit_cv.wait_for(lk, to_duration(st.opt.timeout_seconds), [&] { return st.coordinator_exited; });
    }
    if (exited) {
        st.coordinator.join();
    } else {
        log(FT_LOG_WARN, "handoff: the task of site ", st.running_site.load(), " still runs after ",
            st.opt.timeout_seconds, " s; detaching the coordinator");
        st.coordinator.detach();
    }

    // Every wait is released; drain the device so no enqueued signal, wait or host function can
    // touch the flags after they are freed. Errors here belong to whoever caused them.
    int previous = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(st.opt.device) == cudaSuccess) {
        cudaDeviceSynchronize();
        cudaSetDevice(previous);
    }
    cudaGetLastError();
    state_.reset();
}

int Handoff::add_site(Task task) {
    if (!task) fail(FT_ERR_INVALID_ARGUMENT, "handoff: add_site needs a task");
    State &st = *state_;
    std::lock_guard<std::mutex> lk(st.enqueue_mutex);
    const int s = st.nsites.load(std::memory_order_relaxed);
    if (s >= st.opt.max_sites) fail(FT_ERR_STATE, "handoff: all ", st.opt.max_sites, " sites are registered");
    SiteSlot &slot = st.sites[s];
    slot.state = &st;
    slot.site = s;
    slot.task = std::move(task);
    st.nsites.store(s + 1, std::memory_order_release);  // publishes the slot to the coordinator
    return s;
}

int Handoff::add_site(void (*fn)(void *user_data), void *user_data) {
    if (!fn) fail(FT_ERR_INVALID_ARGUMENT, "handoff: add_site needs a task");
    return add_site(Task([fn, user_data] { fn(user_data); }));
}

int Handoff::num_sites() const { return state_->nsites.load(std::memory_order_acquire); }

cudaError_t Handoff::signal(int site, cudaStream_t stream) {
    State &st = *state_;
    if (site < 0 || site >= st.nsites.load(std::memory_order_acquire)) return cudaErrorInvalidValue;
    SiteSlot &slot = st.sites[site];
    std::lock_guard<std::mutex> lk(st.enqueue_mutex);
    if (slot.signalled) return cudaErrorInvalidValue;  // two signals without a wait between
    cudaError_t e;
    if (st.mech == HandoffMechanism::stream_memops)
        e = to_runtime_error(st.write32(stream, st.dev(site, kGoOffset), 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    else
        e = cudaLaunchHostFunc(stream, host_signal, &slot);
    if (e == cudaSuccess) slot.signalled = true;
    return e;
}

void Handoff::warm(double seconds) {
    State &st = *state_;
    st.warm_until_ns.store(to_ns(Clock::now() + to_duration(seconds)), std::memory_order_relaxed);
    if (st.coordinator_sleeping.load(std::memory_order_seq_cst)) {
        {
            std::lock_guard<std::mutex> lk(st.coord_mutex);
            st.kicked = true;
        }
        st.coord_cv.notify_one();
    }
}

cudaError_t Handoff::wait(int site, cudaStream_t stream) {
    State &st = *state_;
    if (site < 0 || site >= st.nsites.load(std::memory_order_acquire)) return cudaErrorInvalidValue;
    SiteSlot &slot = st.sites[site];
    std::lock_guard<std::mutex> lk(st.enqueue_mutex);
    // A wait without its signal would block the stream with no go for the watchdog to see.
    if (!slot.signalled) return cudaErrorInvalidValue;
    cudaError_t e;
    if (st.mech == HandoffMechanism::stream_memops) {
        e = to_runtime_error(st.wait64(stream, st.dev(site, kDoneOffset), kDoneOrReleased, CU_STREAM_WAIT_VALUE_AND));
        // The reset writes only the low half (done); a release in the high half stays.
        if (e == cudaSuccess)
            e = to_runtime_error(st.write32(stream, st.dev(site, kDoneOffset), 0, CU_STREAM_WRITE_VALUE_DEFAULT));
    } else {
        e = cudaLaunchHostFunc(stream, host_wait, &slot);
    }
    if (e == cudaSuccess) slot.signalled = false;
    return e;
}

HandoffMechanism Handoff::mechanism() const { return state_->mech; }

ft_status Handoff::status() const {
    std::lock_guard<std::mutex> lk(state_->status_mutex);
    return state_->status;
}

std::string Handoff::status_message() const {
    std::lock_guard<std::mutex> lk(state_->status_mutex);
    return state_->message;
}

HandoffTiming Handoff::timing(int site) const {
    HandoffTiming t;
    const State &st = *state_;
    if (site < 0 || site >= st.nsites.load(std::memory_order_acquire)) return t;
    const SiteSlot &slot = st.sites[site];
    t.tasks = slot.served.load(std::memory_order_acquire);
    t.task_seconds = slot.task_last.load(std::memory_order_relaxed);
    t.task_seconds_avg = slot.task_avg.load(std::memory_order_relaxed);
    t.service_seconds = slot.service_last.load(std::memory_order_relaxed);
    t.service_seconds_avg = slot.service_avg.load(std::memory_order_relaxed);
    return t;
}

}  // namespace ft::cuda
