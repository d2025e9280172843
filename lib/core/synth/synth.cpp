// write_checkpoint: config.json, the safetensors shards (tensor data generated and written by
// every core in parallel) and, for several shards, model.safetensors.index.json.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "synth_internal.hpp"

namespace ft::synth {

using namespace detail;

namespace {

// Generates every placed tensor's data into its file, pieces of at most 1 Mi elements spread over
// all cores; `progress(done, total)` is polled from this thread and returning false stops early.
// Returns false when stopped; rethrows the first error of any worker.
bool fill_tensors(const Spec &s, const std::vector<Placed> &placed, const std::vector<std::unique_ptr<File>> &files,
                  uint64_t total, const std::function<bool(uint64_t, uint64_t)> &progress) {
    struct Job {
        const Placed *p;
        uint64_t first, count;
    };
    constexpr uint64_t kJobElems = 1ull << 20;
    std::vector<Job> jobs;
    for (const Placed &p : placed)
        for (uint64_t first = 0; first < p.t->numel(); first += kJobElems)
            jobs.push_back({&p, first, std::min(kJobElems, p.t->numel() - first)});

    std::atomic<size_t> next{0};
    std::atomic<uint64_t> done{0};
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::exception_ptr error;
    auto worker = [&]() {
        std::vector<float> values;
        std::vector<uint8_t> bytes;
        try {
            for (size_t j; !stop && (j = next.fetch_add(1)) < jobs.size();) {
                const Job &job = jobs[j];
                const TensorDesc &t = *job.p->t;
                const size_t es = t.elem_size();
                bytes.resize(job.count * es);
                if (t.raw) {
                    t.raw(job.first, job.count, bytes.data());
                } else {
                    values.resize(job.count);
                    generate(s, t, job.first, job.count, values.data());
                    for (uint64_t i = 0; i < job.count; ++i) store(values[i], t.dtype, &bytes[i * es]);
                }
                files[job.p->shard]->write_at(bytes.data(), bytes.size(), job.p->offset + job.first * es);
                done += bytes.size();
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu);
            if (!error) error = std::current_exception();
            stop = true;
        }
    };
    const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < n_threads; ++i) pool.emplace_back(worker);
    if (progress) {
        uint64_t reported = UINT64_MAX;
        while (done.load() < total && !stop) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const uint64_t now = done.load();
            if (now != reported) {
                reported = now;
                if (!progress(now, total)) stop = true;
            }
        }
    }
    for (std::thread &t : pool) t.join();
    if (error) std::rethrow_exception(error);
    return !stop;
}

}  // namespace

void write_checkpoint(const std::string &dir, const Spec &s, const std::function<bool(uint64_t, uint64_t)> &progress) {
    check_spec(s);
    make_dir(dir);
    write_text(dir + "/config.json", config_json(s).dump(2) + "\n");
    if (format_is_block(parse_format(s.format)))
        fail(FT_ERR_INVALID_ARGUMENT, "synth: ", s.format, " checkpoints are GGUF files (write_gguf)");
    const std::string hf_quant = hf_quant_config_text(s);
    if (!hf_quant.empty()) write_text(dir + "/hf_quant_config.json", hf_quant);

    const std::vector<TensorDesc> tensors = all_tensors(s);
    const ShardPlan plan = plan_shards(tensors, s.shards);
    std::vector<Placed> placed;
    ordered_json weight_map = ordered_json::object();
    std::vector<std::unique_ptr<File>> files = write_shard_headers(dir, plan, placed, weight_map);
    const bool finished = fill_tensors(s, placed, files, plan.total, progress);
    for (auto &f : files) f->close();
    if (!finished) fail(FT_ERR_CANCELLED, "synth: writing ", dir, " cancelled by the progress callback");

    if (plan.tensors.size() > 1) {
        ordered_json index;
        index["metadata"] = {{"total_size", plan.total}};
        index["weight_map"] = weight_map;
        write_text(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
    }
    if (progress) progress(plan.total, plan.total);
}

}  // namespace ft::synth
