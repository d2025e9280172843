// The hybrid backend's CPU handoff (docs/ARCHITECTURE.md, "hybrid"): at a "site" (one MoE layer,
// say) a CUDA stream hands a task to a coordinator thread and, later in stream order, waits for
// it to finish, without the enqueuing host thread ever synchronising. Every enqueued operation
// uses constant values, so a captured CUDA graph replays the same handshake on every launch.
//
// Stream order at one site, per step:
//   [caller: D2H copies of the task's inputs into pinned memory]
//   signal(site)  go[site] = 1
//   [caller: any GPU work that overlaps the task]
//   wait(site)    block the stream until done[site] is set, then clear done[site]
//   [caller: H2D copy of the task's pinned result, the add]
// The coordinator polls the go flags; on go[site] it clears it, runs the site's task, and sets
// done[site]. Sites are independent; tasks run one at a time, in the order their go is seen.
//
// Mechanisms. stream_memops: cuStreamWriteValue32 / cuStreamWaitValue64 on flags in mapped pinned
// host memory, resolved from the driver at run time (libcuda is never linked); no host thread
// runs on the stream's behalf. host_func: cudaLaunchHostFunc nodes; the signal node sets go and
// returns, the wait node blocks CUDA's callback thread until done (slower, ~tens of us per node,
// but works where stream memory operations do not: WDDM, some vGPUs, old drivers).
//
// Failure. A watchdog thread fails the handoff with FT_ERR_TIMEOUT when a task runs, or a go waits
// unanswered, longer than `timeout_seconds`. A failed handoff is released for good: every pending
// and later wait passes at once, tasks are no longer run, and status() reports the first error
// (sticky). An exception thrown by a task fails it the same way with the exception's status
// (ft::Error) or FT_ERR_INTERNAL. The stream therefore never hangs on a lost handoff; the results
// of a failed handoff are garbage and the owner must report status() to its caller.
//
// Threading: add_site, signal and wait may be called from any thread, but one site's signal/wait
// must alternate (signal, wait, signal, ...) in the stream order of one stream at a time. The
// coordinator and watchdog make no CUDA calls, so they never disturb a stream capture in global
// mode. Tasks must make no CUDA calls that synchronise with the stream being served.
//
// Consuming the result: read it with an H2D copy (or a kernel) ordered after wait(); the flag and
// the data both live in host memory, so the stream needs no remote-write flush. A stream blocked
// in a stream-memops wait holds its hardware queue: work of other streams that must run before
// the task can finish should not be behind it (CUDA's warning on stream memory operations);
// overlapping GPU work belongs on the same stream between signal and wait. With host_func, a
// blocked wait node also delays every other host function of the process until it returns.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "freetoken.h"

namespace ft::cuda {

enum class HandoffMechanism {
    automatic,      // stream_memops where the probe passes, else host_func
    stream_memops,  // stream write/wait value operations on mapped host flags
    host_func,      // cudaLaunchHostFunc nodes
};

// "stream_memops", "host_func" or "automatic".
const char *handoff_mechanism_name(HandoffMechanism m);
// The FT_HANDOFF knob: "memops", "hostfn", or "" (automatic); FT_ERR_INVALID_ARGUMENT otherwise.
HandoffMechanism handoff_mechanism_from_knob(const std::string &value);

struct HandoffOptions {
    int device = 0;                 // CUDA device whose streams use the handoff
    double timeout_seconds = 10.0;  // watchdog limit for one task, or for a go left unanswered
    int max_sites = 256;            // capacity for add_site (1..65536)
    // automatic: memops where supported. A forced mechanism that is unavailable makes the
    // constructor throw FT_ERR_UNSUPPORTED.
    HandoffMechanism mechanism = HandoffMechanism::automatic;
    // Coordinator idle policy and its CPU cost. After serving a task it spins (pause loop, one
    // core busy) for `spin_seconds`, enough to catch the next go of back-to-back handoffs (a PCIe
    // round trip is a few us); until `idle_seconds` have passed without a go it then naps
    // `nap_seconds` at a time (timer slack lowered to 1 us; ~50k wake-ups/s at 20 us, a few % of
    // a core); after that it sleeps 1 ms at a time (~1000 wake-ups/s, negligible). So a go costs
    // ~1 us to notice right after a task, up to ~nap_seconds + wake-up (~25 us) during decode, and
    // up to ~1 ms after a long idle period. Decode at 48 layers and 30 tokens/s keeps one core
    // roughly 5-10 % busy outside the tasks themselves.
    double spin_seconds = 20e-6;
    double nap_seconds = 20e-6;
    double idle_seconds = 0.05;
    int coordinator_cpu = -1;  // pin the coordinator to this CPU (-1: no pinning)
};

// Timings of one site, measured by the coordinator with the steady clock. The averages are
// exponential moving averages with weight 1/8 on the newest sample (the first sample seeds them).
struct HandoffTiming {
    uint64_t tasks = 0;              // tasks run at this site (none after a failure)
    double task_seconds = 0;         // last task's wall time (the task function alone)
    double task_seconds_avg = 0;
    double service_seconds = 0;      // last: from the go being seen to done being set
    double service_seconds_avg = 0;
};

class Handoff {
public:
    using Task = std::function<void()>;

    // Chooses and probes the mechanism, allocates the flags (one cudaHostAlloc, portable +
    // mapped) and starts the coordinator and watchdog threads. Throws ft::Error:
    // FT_ERR_INVALID_ARGUMENT (bad options), FT_ERR_NO_DEVICE, FT_ERR_UNSUPPORTED (a forced
    // mechanism that is unavailable), FT_ERR_DEVICE / FT_ERR_DEVICE_LOST / FT_ERR_OUT_OF_MEMORY (CUDA failures).
    explicit Handoff(const HandoffOptions &options);

    // Never hangs. Releases every site for good, stops the watchdog, gives a running task up to
    // timeout_seconds to return (then detaches the coordinator, which frees the shared state when
    // the task finally returns, and logs a warning), then synchronises the device so no enqueued
    // handoff operation can touch freed flags. Graphs holding this handoff's operations must not
    // be launched after it is destroyed.
    ~Handoff();

    Handoff(const Handoff &) = delete;
    Handoff &operator=(const Handoff &) = delete;

    // Registers a site and returns its id (0, 1, ...). Allowed at any time, also while other
    // sites are in use. Throws FT_ERR_INVALID_ARGUMENT for an empty task, FT_ERR_STATE when
    // max_sites are registered.
    int add_site(Task task);
    int add_site(void (*fn)(void *user_data), void *user_data);
    int num_sites() const;

    // Enqueue the go of `site` / the wait for its done on `stream` (capturable; never blocks the
    // calling thread). Return cudaSuccess, cudaErrorInvalidValue for an unknown site or a broken
    // signal/wait alternation (checked in enqueue order), or the error of the enqueue itself.
    // Both keep enqueuing normally after a failure: the waits then pass at once.
    cudaError_t signal(int site, cudaStream_t stream);
    // Keeps the coordinator polling (no naps) for `seconds` from now: for a go the caller has
    // just enqueued and wants noticed within a microsecond or so.
    void warm(double seconds);
    cudaError_t wait(int site, cudaStream_t stream);

    HandoffMechanism mechanism() const;
    // FT_OK, or the first failure (FT_ERR_TIMEOUT from the watchdog, a task's error); sticky.
    ft_status status() const;
    std::string status_message() const;  // "" while status() is FT_OK

    HandoffTiming timing(int site) const;  // zeros for an unknown site
    double last_task_seconds(int site) const { return timing(site).task_seconds; }
    double smoothed_task_seconds(int site) const { return timing(site).task_seconds_avg; }

    struct State;  // shared with the coordinator and watchdog threads (cuda_handoff.cpp)

private:
    std::shared_ptr<State> state_;
};

}  // namespace ft::cuda
