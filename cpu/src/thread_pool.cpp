// Persistent worker pool. Workers spin for a short while after a job (consecutive MoE layers
// arrive back to back, and a futex wake-up costs several microseconds per worker), then sleep on
// a condition variable so an idle pool burns no core.
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <set>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FT_CPU_RELAX() _mm_pause()
#else
#define FT_CPU_RELAX() std::this_thread::yield()
#endif

#include "ft/common.hpp"
#include "ft/cpu.hpp"

namespace ft::cpu {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Polls pred() with pause instructions for up to `budget`, and on until the steady-clock time
// *warm_until_ns; true if it became true.
template <typename Pred>
bool spin_until(Pred pred, std::chrono::microseconds budget, const std::atomic<int64_t> &warm_until_ns) {
    const int64_t now0 = now_ns(), end = now0 + std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count();
    if (budget.count() == 0 && now0 >= warm_until_ns.load(std::memory_order_relaxed)) return pred();
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (pred()) return true;
            FT_CPU_RELAX();
        }
        const int64_t now = now_ns();
        if (now > end && now > warm_until_ns.load(std::memory_order_relaxed)) return pred();
    }
}

// Physical-core representatives first, then the remaining allowed logical CPUs.
std::vector<int> pin_order() {
    std::vector<int> order = physical_core_cpus();
    std::set<int> used(order.begin(), order.end());
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set) && !used.count(c)) order.push_back(c);
    return order;
}

}  // namespace

ThreadPool::ThreadPool(int threads, bool pin, int spin_us) : spin_(std::max(0, spin_us)) {
    if (threads < 0) fail(FT_ERR_INVALID_ARGUMENT, "thread pool size must be >= 0, got ", threads);
    std::vector<int> order = pin_order();
    if (threads == 0) threads = static_cast<int>(std::max<size_t>(1, physical_core_cpus().size()));
    workers_.reserve(threads);
    try {
        for (int i = 0; i < threads; ++i) {
            int cpu = pin && !order.empty() ? order[i % order.size()] : -1;
            workers_.emplace_back([this, i, cpu] { worker_main(i, cpu); });
        }
    } catch (...) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_.store(true, std::memory_order_release);
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        for (auto &t : workers_) t.join();
        fail(FT_ERR_OUT_OF_MEMORY, "could not start ", threads, " CPU worker threads");
    }
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::worker_main(int index, int cpu) {
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
            log(FT_LOG_WARN, "could not pin CPU worker ", index, " to CPU ", cpu);
    }
    uint64_t seen = 0;
    for (;;) {
        auto changed = [&] { return generation_.load(std::memory_order_acquire) != seen; };
        while (!spin_until(changed, spin_, warm_until_ns_)) {
            std::unique_lock<std::mutex> lock(mutex_);
            // warm() sets the deadline, then bumps the epoch under this mutex: either the
            // deadline is seen here, or the bump comes after this wait began and ends it.
            if (now_ns() < warm_until_ns_.load(std::memory_order_relaxed)) continue;
            const uint64_t epoch = warm_epoch_.load(std::memory_order_relaxed);
            sleepers_.fetch_add(1, std::memory_order_relaxed);
            wake_.wait(lock, [&] { return changed() || warm_epoch_.load(std::memory_order_relaxed) != epoch; });
            sleepers_.fetch_sub(1, std::memory_order_relaxed);
            if (changed()) break;
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load(std::memory_order_acquire)) return;
        try {
            (*job_)(index, size());
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex_);
            if (!error_) error_ = std::current_exception();
        }
        if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::lock_guard<std::mutex> lock(mutex_);
            done_cv_.notify_one();
        }
    }
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
    std::lock_guard<std::mutex> serial(run_mutex_);
    job_ = &fn;
    error_ = nullptr;
    remaining_.store(size(), std::memory_order_relaxed);
    bool any_sleeping;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_release);
        // A worker counted here sleeps and needs the notify; one not counted yet will see the new
        // generation when it checks under the mutex.
        any_sleeping = sleepers_.load(std::memory_order_relaxed) > 0;
    }
    if (any_sleeping) wake_.notify_all();

    // The caller polls for a shorter time than the workers: it may share a core with one of them.
    auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(done, spin_ / 4, warm_until_ns_)) {
        std::unique_lock<std::mutex> lock(mutex_);
        done_cv_.wait(lock, done);
    }
    job_ = nullptr;
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

void ThreadPool::warm(std::chrono::microseconds period) {
    const int64_t now = now_ns(), p = std::chrono::duration_cast<std::chrono::nanoseconds>(period).count();
    // Warmed within the last half period: no worker can have gone to sleep since.
    if (warm_until_ns_.load(std::memory_order_relaxed) > now + p / 2) return;
    warm_until_ns_.store(now + p, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        warm_epoch_.fetch_add(1, std::memory_order_relaxed);
    }
    wake_.notify_all();
}

}  // namespace ft::cpu
