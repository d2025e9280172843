// The CPU handoff on a GPU, for both mechanisms: stream ordering of data around signal/wait over
// many steps, an enqueuing thread that never blocks, CUDA-graph replays without host sync, the
// watchdog's release of a stuck task, destruction with a task pending, many interleaved sites,
// and misuse. Skips where no CUDA device is usable.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/cuda_handoff.hpp"
#include "ft/cuda_memory.hpp"

namespace {

using ft::cuda::Handoff;
using ft::cuda::HandoffMechanism;
using ft::cuda::HandoffOptions;
using Clock = std::chrono::steady_clock;

#define CUDA_OK(expr)                                                                                      \
    do {                                                                                                   \
        const cudaError_t e_ = (expr);                                                                     \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
    } while (0)

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Pinned host or device memory of n zeroed elements (the library's owning handles).
template <typename T>
struct Pinned {
    ft::cuda::PinnedBuffer buf;
    T *p;
    explicit Pinned(size_t n) : buf(n * sizeof(T), "pinned", cudaHostAllocPortable), p(buf.get<T>()) {
        std::fill(p, p + n, T{});
    }
};

template <typename T>
struct Device {
    ft::cuda::DeviceBuffer buf;
    T *p;
    explicit Device(size_t n) : buf(n * sizeof(T), "device"), p(buf.get<T>()) {
        if (cudaMemset(p, 0, n * sizeof(T)) != cudaSuccess) throw std::runtime_error("device");
    }
};

using ft::cuda::Stream;

__host__ __device__ int64_t input_of(int64_t step, int64_t site) { return step * 7919 + site * 104729 + 13; }
__host__ __device__ int64_t task_of(int64_t x, int64_t site) { return x * 3 + 1 + site; }

// Busy for about `ns` nanoseconds, so a missing stream dependency would show as stale data.
__device__ void dwell(long long ns) {
    const long long t0 = clock64();
    while (clock64() - t0 < ns) {
    }
}

__global__ void produce(int64_t *val, int64_t step, int sites) {
    dwell(2000);
    for (int k = 0; k < sites; ++k) val[k] = input_of(step, k);
}

__global__ void other_work(int64_t *scratch) {
    dwell(5000);
    *scratch += 1;
}

__global__ void consume(const int64_t *out, int64_t *results, int64_t step, int sites) {
    for (int k = 0; k < sites; ++k) results[step * sites + k] = out[k];
}

__global__ void set_marker(int64_t *marker, int64_t v) { *marker = v; }

// Graph variant: the step comes from a device counter, so every replay has new inputs.
__global__ void graph_produce(const int64_t *counter, int64_t *val) {
    dwell(2000);
    const int64_t s = *counter;
    val[0] = s;
    val[1] = input_of(s, 0);
}

__global__ void graph_other(const int64_t *counter, int64_t *other) {
    dwell(5000);
    *other = *counter * 5;
}

__global__ void graph_consume(int64_t *counter, const int64_t *out, const int64_t *other, int64_t *results) {
    const int64_t s = *counter;
    results[s] = out[0] == s ? out[1] + *other : -1;
    *counter = s + 1;
}

class HandoffTest : public ::testing::TestWithParam<HandoffMechanism> {
protected:
    void SetUp() override {
        if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    }

    // A handoff of the mechanism under test; skips if stream memory operations are unavailable.
    std::unique_ptr<Handoff> make(double timeout_seconds = 10.0, int max_sites = 256) {
        HandoffOptions o;
        o.device = 0;
        o.timeout_seconds = timeout_seconds;
        o.max_sites = max_sites;
        o.mechanism = GetParam();
        try {
            return std::make_unique<Handoff>(o);
        } catch (const ft::Error &e) {
            if (e.status() == FT_ERR_UNSUPPORTED) return nullptr;
            throw;
        }
    }
};

#define MAKE_OR_SKIP(var, ...)                                                        \
    auto var = make(__VA_ARGS__);                                                     \
    if (!var) GTEST_SKIP() << "stream memory operations are not available here";     \
    ASSERT_EQ(var->mechanism(), GetParam())

// (1) Data written by a kernel before signal reaches the task; the task's result reaches a
// kernel after wait; 1000 steps with changing values, some slow tasks.
TEST_P(HandoffTest, OrderingOverManySteps) {
    MAKE_OR_SKIP(h);
    constexpr int kSteps = 1000;
    Stream stream;
    Device<int64_t> val(1), out(1), scratch(1), results(kSteps);
    Pinned<int64_t> pin_in(1), pin_out(1);
    std::atomic<int64_t> calls{0}, wrong_inputs{0};
    int64_t *in_p = pin_in.p, *out_p = pin_out.p;
    const int site = h->add_site([&, in_p, out_p] {
        const int64_t step = calls.load();
        const int64_t x = *static_cast<volatile int64_t *>(in_p);
        if (x != input_of(step, 0)) wrong_inputs.fetch_add(1);
        if (step % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));  // GPU must wait
        *static_cast<volatile int64_t *>(out_p) = task_of(x, 0);
        calls.fetch_add(1);
    });
    for (int i = 0; i < kSteps; ++i) {
        produce<<<1, 1, 0, stream.get()>>>(val.p, i, 1);
        CUDA_OK(cudaMemcpyAsync(pin_in.p, val.p, sizeof(int64_t), cudaMemcpyDeviceToHost, stream.get()));
        if (i % 3 == 0) h->warm(1e-3);  // some steps with the coordinator kept polling
        CUDA_OK(h->signal(site, stream.get()));
        other_work<<<1, 1, 0, stream.get()>>>(scratch.p);
        CUDA_OK(h->wait(site, stream.get()));
        CUDA_OK(cudaMemcpyAsync(out.p, pin_out.p, sizeof(int64_t), cudaMemcpyHostToDevice, stream.get()));
        consume<<<1, 1, 0, stream.get()>>>(out.p, results.p, i, 1);
    }
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    std::vector<int64_t> got(kSteps);
    CUDA_OK(cudaMemcpy(got.data(), results.p, kSteps * sizeof(int64_t), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < kSteps; ++i) bad += got[i] != task_of(input_of(i, 0), 0);
    EXPECT_EQ(bad, 0) << "steps whose result was stale";
    EXPECT_EQ(wrong_inputs.load(), 0) << "tasks that saw a stale input";
    EXPECT_EQ(calls.load(), kSteps);
    EXPECT_EQ(h->status(), FT_OK) << h->status_message();
    const auto t = h->timing(site);
    EXPECT_EQ(t.tasks, uint64_t{kSteps});
    EXPECT_GE(t.service_seconds, t.task_seconds);
    EXPECT_GT(t.task_seconds_avg, 0.0);
}

// (2) The enqueuing thread never waits for the task. Timed: ctest label `timing`
// (tests/handoff/CMakeLists.txt), left out of compute-sanitizer runs, whose launches are slower.
TEST_P(HandoffTest, EnqueueNeverBlocks) {
    MAKE_OR_SKIP(h);
    constexpr double kTaskSeconds = 0.1;
    Stream stream;
    Device<int64_t> val(1), out(1), scratch(1), results(2);
    Pinned<int64_t> pin_in(1), pin_out(1);
    std::atomic<bool> slow{false};
    const int site = h->add_site([&] {
        if (slow.load()) std::this_thread::sleep_for(std::chrono::duration<double>(kTaskSeconds));
    });
    auto step = [&](int i) {
        produce<<<1, 1, 0, stream.get()>>>(val.p, i, 1);
        cudaMemcpyAsync(pin_in.p, val.p, sizeof(int64_t), cudaMemcpyDeviceToHost, stream.get());
        h->signal(site, stream.get());
        other_work<<<1, 1, 0, stream.get()>>>(scratch.p);
        h->wait(site, stream.get());
        cudaMemcpyAsync(out.p, pin_out.p, sizeof(int64_t), cudaMemcpyHostToDevice, stream.get());
        consume<<<1, 1, 0, stream.get()>>>(out.p, results.p, i, 1);
    };
    step(0);  // warm-up: module loading and first-call costs
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    slow = true;
    const auto t0 = Clock::now();
    step(1);
    const double enqueue = since(t0);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    const double total = since(t0);
    EXPECT_LT(enqueue, kTaskSeconds / 4) << "enqueue took " << enqueue << " s";
    EXPECT_GE(total, kTaskSeconds * 0.9) << "the stream did not wait for the task";
    EXPECT_GE(h->last_task_seconds(site), kTaskSeconds * 0.9);
    EXPECT_EQ(h->status(), FT_OK) << h->status_message();
}

// (3) [copy, signal, kernel, wait, copy, kernel] captured once and replayed 200 times back to
// back with no host synchronisation; each replay takes a new input from a device counter.
TEST_P(HandoffTest, GraphReplay) {
    MAKE_OR_SKIP(h);
    constexpr int kReplays = 200;
    Stream stream;
    Device<int64_t> counter(1), val(2), out(2), other(1), results(kReplays);
    Pinned<int64_t> pin_in(2), pin_out(2);
    std::atomic<int64_t> calls{0}, out_of_order{0};
    int64_t *in_p = pin_in.p, *out_p = pin_out.p;
    const int site = h->add_site([&, in_p, out_p] {
        const volatile int64_t *in = in_p;
        volatile int64_t *o = out_p;
        const int64_t s = in[0];
        if (s != calls.load()) out_of_order.fetch_add(1);
        o[0] = s;
        o[1] = task_of(in[1], 0);
        calls.fetch_add(1);
    });

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
    graph_produce<<<1, 1, 0, stream.get()>>>(counter.p, val.p);
    CUDA_OK(cudaMemcpyAsync(pin_in.p, val.p, 2 * sizeof(int64_t), cudaMemcpyDeviceToHost, stream.get()));
    CUDA_OK(h->signal(site, stream.get()));
    graph_other<<<1, 1, 0, stream.get()>>>(counter.p, other.p);
    CUDA_OK(h->wait(site, stream.get()));
    CUDA_OK(cudaMemcpyAsync(out.p, pin_out.p, 2 * sizeof(int64_t), cudaMemcpyHostToDevice, stream.get()));
    graph_consume<<<1, 1, 0, stream.get()>>>(counter.p, out.p, other.p, results.p);
    CUDA_OK(cudaStreamEndCapture(stream.get(), &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    EXPECT_EQ(calls.load(), 0) << "capture must not run the task";

    for (int r = 0; r < kReplays; ++r) CUDA_OK(cudaGraphLaunch(exec, stream.get()));
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    std::vector<int64_t> got(kReplays);
    CUDA_OK(cudaMemcpy(got.data(), results.p, kReplays * sizeof(int64_t), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int s = 0; s < kReplays; ++s) bad += got[s] != task_of(input_of(s, 0), 0) + s * 5;
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(calls.load(), kReplays);
    EXPECT_EQ(out_of_order.load(), 0);
    EXPECT_EQ(h->status(), FT_OK) << h->status_message();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

// (4) A task that blocks past the timeout: the stream is released, the status is sticky, later
// waits pass at once, and another site waiting behind the blocked coordinator is released too.
TEST_P(HandoffTest, WatchdogReleasesStuckTask) {
    MAKE_OR_SKIP(h, 0.2);
    Stream stream;
    Device<int64_t> marker(1);
    auto unblock = std::make_shared<std::atomic<bool>>(false);
    auto finished = std::make_shared<std::atomic<bool>>(false);
    const int stuck = h->add_site([unblock, finished] {
        const auto t0 = Clock::now();
        while (!unblock->load() && since(t0) < 2.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        finished->store(true);
    });
    std::atomic<int> other_calls{0};
    const int other = h->add_site([&] { other_calls.fetch_add(1); });
    set_marker<<<1, 1, 0, stream.get()>>>(marker.p, 0);  // module loading stays out of the timing
    CUDA_OK(cudaStreamSynchronize(stream.get()));

    const auto t0 = Clock::now();
    CUDA_OK(h->signal(stuck, stream.get()));
    CUDA_OK(h->signal(other, stream.get()));
    CUDA_OK(h->wait(other, stream.get()));  // behind the stuck task: its go is never answered
    CUDA_OK(h->wait(stuck, stream.get()));
    set_marker<<<1, 1, 0, stream.get()>>>(marker.p, 42);
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    const double released_after = since(t0);
    EXPECT_LT(released_after, 1.0) << "stream released after " << released_after << " s";
    EXPECT_EQ(h->status(), FT_ERR_TIMEOUT);
    EXPECT_FALSE(h->status_message().empty());
    int64_t m = 0;
    CUDA_OK(cudaMemcpy(&m, marker.p, sizeof m, cudaMemcpyDeviceToHost));
    EXPECT_EQ(m, 42);

    // Later handoffs pass at once and the status stays.
    const auto t1 = Clock::now();
    for (int i = 0; i < 5; ++i) {
        CUDA_OK(h->signal(stuck, stream.get()));
        CUDA_OK(h->wait(stuck, stream.get()));
    }
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    EXPECT_LT(since(t1), 0.5) << "later waits must not wait for the stuck task (2 s)";
    EXPECT_EQ(h->status(), FT_ERR_TIMEOUT);

    unblock->store(true);
    const auto t2 = Clock::now();
    while (!finished->load() && since(t2) < 3.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(finished->load());
}

// A task that throws fails the handoff with its status and still releases the stream.
TEST_P(HandoffTest, TaskErrorIsStickyAndReleases) {
    MAKE_OR_SKIP(h);
    Stream stream;
    const int site = h->add_site([] { ft::fail(FT_ERR_IO, "synthetic task failure"); });
    CUDA_OK(h->signal(site, stream.get()));
    CUDA_OK(h->wait(site, stream.get()));
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    EXPECT_EQ(h->status(), FT_ERR_IO);
    EXPECT_NE(h->status_message().find("synthetic task failure"), std::string::npos);
}

// (5) Destroying the handoff while its task is stuck returns promptly and releases the stream.
TEST_P(HandoffTest, DestroyWhileTaskPending) {
    MAKE_OR_SKIP(h, 0.2);
    Stream stream;
    Device<int64_t> marker(1);
    auto unblock = std::make_shared<std::atomic<bool>>(false);
    auto started = std::make_shared<std::atomic<bool>>(false);
    auto finished = std::make_shared<std::atomic<bool>>(false);
    const int site = h->add_site([unblock, started, finished] {
        started->store(true);
        const auto t0 = Clock::now();
        while (!unblock->load() && since(t0) < 3.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        finished->store(true);
    });
    CUDA_OK(h->signal(site, stream.get()));
    CUDA_OK(h->wait(site, stream.get()));
    set_marker<<<1, 1, 0, stream.get()>>>(marker.p, 7);
    const auto t0 = Clock::now();
    while (!started->load() && since(t0) < 2.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(started->load());

    const auto t1 = Clock::now();
    h.reset();
    EXPECT_LT(since(t1), 1.0) << "destruction took " << since(t1) << " s";
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    int64_t m = 0;
    CUDA_OK(cudaMemcpy(&m, marker.p, sizeof m, cudaMemcpyDeviceToHost));
    EXPECT_EQ(m, 7);

    // Let the detached task finish before the test's objects go (it only touches its own state).
    unblock->store(true);
    const auto t2 = Clock::now();
    while (!finished->load() && since(t2) < 3.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// (6) Eight sites, signalled and waited in a different random order every step.
TEST_P(HandoffTest, ManySitesInterleaved) {
    MAKE_OR_SKIP(h);
    constexpr int kSites = 8, kSteps = 200;
    Stream stream;
    Device<int64_t> val(kSites), out(kSites), scratch(1), results(kSites * kSteps);
    Pinned<int64_t> pin_in(kSites), pin_out(kSites);
    std::vector<int> ids;
    std::atomic<int> calls{0};
    for (int k = 0; k < kSites; ++k) {
        volatile int64_t *in = pin_in.p + k, *o = pin_out.p + k;
        ids.push_back(h->add_site([in, o, k, &calls] {
            *o = task_of(*in, k);
            calls.fetch_add(1);
        }));
        EXPECT_EQ(ids.back(), k);
    }
    EXPECT_EQ(h->num_sites(), kSites);
    std::mt19937 rng(1234);
    std::vector<int> signal_order(kSites), wait_order(kSites);
    std::iota(signal_order.begin(), signal_order.end(), 0);
    std::iota(wait_order.begin(), wait_order.end(), 0);
    for (int i = 0; i < kSteps; ++i) {
        std::shuffle(signal_order.begin(), signal_order.end(), rng);
        std::shuffle(wait_order.begin(), wait_order.end(), rng);
        produce<<<1, 1, 0, stream.get()>>>(val.p, i, kSites);
        for (int k : signal_order) {
            CUDA_OK(cudaMemcpyAsync(pin_in.p + k, val.p + k, sizeof(int64_t), cudaMemcpyDeviceToHost, stream.get()));
            CUDA_OK(h->signal(ids[k], stream.get()));
        }
        other_work<<<1, 1, 0, stream.get()>>>(scratch.p);
        for (int k : wait_order) {
            CUDA_OK(h->wait(ids[k], stream.get()));
            CUDA_OK(cudaMemcpyAsync(out.p + k, pin_out.p + k, sizeof(int64_t), cudaMemcpyHostToDevice, stream.get()));
        }
        consume<<<1, 1, 0, stream.get()>>>(out.p, results.p, i, kSites);
    }
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    std::vector<int64_t> got(kSites * kSteps);
    CUDA_OK(cudaMemcpy(got.data(), results.p, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < kSteps; ++i)
        for (int k = 0; k < kSites; ++k) bad += got[i * kSites + k] != task_of(input_of(i, k), k);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(calls.load(), kSites * kSteps);
    for (int k = 0; k < kSites; ++k) EXPECT_EQ(h->timing(ids[k]).tasks, uint64_t{kSteps});
    EXPECT_EQ(h->status(), FT_OK) << h->status_message();
}

// Misuse is refused at enqueue time instead of hanging a stream.
TEST_P(HandoffTest, MisuseIsRefused) {
    MAKE_OR_SKIP(h, 10.0, 2);
    Stream stream;
    const int a = h->add_site([] {});
    h->add_site([](void *) {}, nullptr);
    EXPECT_THROW(h->add_site([] {}), ft::Error);
    EXPECT_THROW(h->add_site(Handoff::Task{}), ft::Error);
    EXPECT_EQ(h->signal(5, stream.get()), cudaErrorInvalidValue);
    EXPECT_EQ(h->wait(-1, stream.get()), cudaErrorInvalidValue);
    EXPECT_EQ(h->wait(a, stream.get()), cudaErrorInvalidValue) << "wait without signal";
    CUDA_OK(h->signal(a, stream.get()));
    EXPECT_EQ(h->signal(a, stream.get()), cudaErrorInvalidValue) << "two signals without a wait";
    CUDA_OK(h->wait(a, stream.get()));
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    EXPECT_EQ(h->status(), FT_OK);
    EXPECT_EQ(h->timing(7).tasks, 0u);
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, HandoffTest,
                         ::testing::Values(HandoffMechanism::stream_memops, HandoffMechanism::host_func),
                         [](const ::testing::TestParamInfo<HandoffMechanism> &info) {
                             return std::string(ft::cuda::handoff_mechanism_name(info.param));
                         });

TEST(Handoff, RejectsBadOptions) {
    if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    HandoffOptions o;
    o.timeout_seconds = 0;
    EXPECT_THROW(Handoff{o}, ft::Error);
    o = HandoffOptions{};
    o.max_sites = 0;
    EXPECT_THROW(Handoff{o}, ft::Error);
    o = HandoffOptions{};
    o.device = 1 << 20;
    try {
        Handoff h(o);
        ADD_FAILURE() << "expected FT_ERR_NO_DEVICE";
    } catch (const ft::Error &e) {
        EXPECT_EQ(e.status(), FT_ERR_NO_DEVICE);
    }
}

// Automatic selection picks stream memory operations where the probe passes (H200 and Linux
// drivers do); otherwise it must still work through host functions.
TEST(Handoff, AutomaticSelection) {
    if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    Handoff h(HandoffOptions{});
    std::printf("handoff: automatic selection chose %s\n", ft::cuda::handoff_mechanism_name(h.mechanism()));
    EXPECT_NE(h.mechanism(), HandoffMechanism::automatic);
}

}  // namespace
