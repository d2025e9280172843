// The models of bench_backends (bf16 built in memory, mxfp4 / nvfp4 synthetic checkpoints), the
// sessions on them and the timed runs.
#include "bench_backends.cuh"

namespace backends_bench {

namespace {

// Random bf16 patterns of magnitude 2^-7 .. 2^-5 (finite, like trained expert weights).
std::vector<uint16_t> random_weights(size_t n, uint64_t seed) {
    std::vector<uint16_t> v(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto &w : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint16_t sign = uint16_t((x >> 8) & 1u) << 15, exp = uint16_t(0x78 + (x >> 16) % 3), mant = uint16_t((x >> 24) & 0x7f);
        w = uint16_t(sign | exp << 7 | mant);
    }
    return v;
}

void fill_info(Model &m) {
    m.info.struct_size = sizeof m.info;
    ft_ok(ft_model_get_info(m.m, &m.info), "ft_model_get_info", ft_model_last_error(m.m));
    if (m.info.pinned_bytes != m.info.bank_bytes)
        std::fprintf(stderr, "bench_backends: %s: only %llu of %llu bank bytes are pinned\n", m.name,
                     (unsigned long long)m.info.pinned_bytes, (unsigned long long)m.info.bank_bytes);
}

}  // namespace

Model build_bf16(ft_engine *engine) {
    const auto t0 = Clock::now();
    Model m;
    m.name = "bf16";
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 10;  // 8 L fetches per rotation > 64 slots even at one fetch per call
    d.num_experts = 64;
    d.top_k = 8;
    d.hidden_size = 4096;
    d.intermediate_size = 1536;
    d.format = FT_FORMAT_BF16;
    char err[512] = "";
    ft_ok(ft_model_create(engine, &d, &m.m, err, sizeof err), "ft_model_create", err);
    // A few distinct random projections reused across experts: the bytes differ per expert in
    // address only, which is all a bandwidth benchmark needs, and filling stays fast.
    const size_t n = size_t(d.hidden_size) * d.intermediate_size;
    std::vector<std::vector<uint16_t>> variants;
    for (uint64_t i = 0; i < 5; ++i) variants.push_back(random_weights(n, i + 1));
    for (int l = 0; l < d.num_layers; ++l)
        for (int e = 0; e < d.num_experts; ++e)
            for (int p : {FT_PROJ_GATE, FT_PROJ_UP, FT_PROJ_DOWN}) {
                const auto &v = variants[size_t(l * 7 + e * 3 + p) % variants.size()];
                ft_ok(ft_model_set_expert(m.m, l, e, p, v.data(), n * sizeof(uint16_t)), "ft_model_set_expert",
                      ft_model_last_error(m.m));
            }
    ft_ok(ft_model_finalize(m.m), "ft_model_finalize", ft_model_last_error(m.m));
    fill_info(m);
    m.setup_seconds = seconds_since(t0);
    return m;
}

// A synthetic checkpoint written once to `dir` (reused by later runs) and loaded.
Model build_synth(ft_engine *engine, const char *name, const ft::synth::Spec &s, const std::string &dir) {
    const auto t0 = Clock::now();
    Model m;
    m.name = name;
    namespace fs = std::filesystem;
    const std::string marker = dir + "/.complete-v1";
    if (!fs::exists(marker)) {
        fs::remove_all(dir);
        std::fprintf(stderr, "bench_backends: writing the %s checkpoint to %s (once)\n", name, dir.c_str());
        ft::synth::write_checkpoint(dir, s);
        std::ofstream(marker) << "ok\n";
    }
    char err[512] = "";
    ft_ok(ft_model_load(engine, dir.c_str(), nullptr, &m.m, err, sizeof err), "ft_model_load", err);
    fill_info(m);
    m.setup_seconds = seconds_since(t0);
    return m;
}

Model build_mxfp4(ft_engine *engine) {
    ft::synth::Spec s;
    s.architecture = "gpt_oss";
    s.format = "mxfp4";
    s.num_layers = 5;  // 8 L fetches per rotation > 32 slots at one fetch per call
    s.num_experts = 32;
    s.top_k = 4;
    s.hidden = 2880;
    s.intermediate = 2880;
    s.seed = 7;
    return build_synth(engine, "mxfp4", s, "/tmp/ft-bench-backends-mxfp4");
}

// nvfp4 at GLM-4.x expert shapes (H=5120, I=1536, top-8), E=64 and L=5: a 4-bit model whose
// steps miss eight experts, as DeepSeek-style models do (gpt-oss misses four).
Model build_nvfp4(ft_engine *engine) {
    ft::synth::Spec s;
    s.architecture = "qwen3_moe";  // no shared expert, no leading dense layers
    s.format = "nvfp4";
    s.num_layers = 5;
    s.num_experts = 64;
    s.top_k = 8;
    s.hidden = 5120;
    s.intermediate = 1536;
    s.seed = 11;
    return build_synth(engine, "nvfp4", s, "/tmp/ft-bench-backends-nvfp4");
}

Session open_session(const Model &m, int32_t backend, double fraction, bool adaptive) {
    ft_session_params p;
    ft_session_params_init(&p);
    p.backend = backend;
    p.max_tokens = 1;  // decode only: no prefill buffers
    p.cache_slots = m.info.num_experts;  // one layer of slots, shared LRU over all layers
    p.vram_reserve_bytes = 0;
    p.hybrid_fraction = float(fraction);
    p.hybrid_adaptive = adaptive;
    ft_session *s = nullptr;
    char err[512] = "";
    ft_ok(ft_session_create(m.m, &p, &s, err, sizeof err), "ft_session_create", err);
    return Session(s);
}

namespace {

// Calls between stream synchronisations in the timed part: whole periods, about 16 calls.
int64_t sync_interval(const Trace &t) { return int64_t(t.period) * std::max(1, 16 / t.period); }

}  // namespace

RunResult timed_run(ft_session *s, const Model &m, const Trace &t, const RunOptions &o) {
    const int K = m.info.top_k, H = m.info.hidden_size;
    const int64_t warm = round_up(o.warmup, t.period), meas = round_up(std::max<int64_t>(o.measured, 1), sync_interval(t));
    if (int64_t(t.layer.size()) < warm + meas) throw std::runtime_error("trace shorter than the run");
    const bool device = ft_session_backend(s) != FT_BACKEND_CPU;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(H)), y(static_cast<size_t>(H));
    for (auto &v : x) {
        const float f = u(rng);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        v = uint16_t(b >> 16);
    }
    const size_t routes = size_t(warm + meas) * K;
    std::vector<float> w(routes, 1.0f / float(K));
    Stream stream;
    std::unique_ptr<DeviceBuffer> dx, dy, dids, dw;
    if (device) {
        dx = std::make_unique<DeviceBuffer>(x.size() * 2);
        dy = std::make_unique<DeviceBuffer>(y.size() * 2);
        dids = std::make_unique<DeviceBuffer>(routes * sizeof(int32_t));
        dw = std::make_unique<DeviceBuffer>(routes * sizeof(float));
        cuda_ok(cudaMemcpy(dx->get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), "upload");
        cuda_ok(cudaMemcpy(dids->get(), t.ids.data(), routes * sizeof(int32_t), cudaMemcpyHostToDevice), "upload");
        cuda_ok(cudaMemcpy(dw->get(), w.data(), routes * sizeof(float), cudaMemcpyHostToDevice), "upload");
    }
    auto call = [&](int64_t c) {
        const size_t r = size_t(c) * K;
        const ft_status st = device ? ft_decode_cuda(s, t.layer[size_t(c)], 1, dx->get<uint16_t>(), dids->get<int32_t>() + r,
                                                     dw->get<float>() + r, dy->get<uint16_t>(), stream.get())
                                    : ft_decode(s, t.layer[size_t(c)], 1, x.data(), t.ids.data() + r, w.data() + r, y.data());
        ft_ok(st, "decode", ft_session_last_error(s));
    };
    auto sync = [&] {
        if (device) cuda_ok(cudaStreamSynchronize(stream.get()), "decode (stream)");
    };
    for (int64_t c = 0; c < warm; ++c) {
        call(c);
        if (o.sync_each_warmup || (c + 1) % t.period == 0) sync();
    }
    sync();
    ft_session_reset_stats(s);
    const int64_t every = sync_interval(t);
    const auto t0 = Clock::now();
    for (int64_t c = warm; c < warm + meas; ++c) {
        call(c);
        if ((c - warm + 1) % every == 0) sync();
    }
    sync();
    RunResult r;
    r.seconds_per_call = seconds_since(t0) / double(meas);
    ft_ok(ft_session_status(s), "session status", ft_session_last_error(s));
    ft_session_stats st;
    st.struct_size = sizeof st;
    ft_ok(ft_session_get_stats(s, &st), "ft_session_get_stats", ft_session_last_error(s));
    if (device) {
        r.hits_per_call = double(st.cache_hits) / double(meas);
        r.misses_per_call = double(st.cache_misses) / double(meas);
        const double active = double(st.cache_hits + st.cache_misses);
        r.hit_rate = active > 0 ? double(st.cache_hits) / active : 0.0;
    } else {
        r.misses_per_call = double(st.experts_cpu) / double(meas);  // every routed expert is read
    }
    r.fraction = st.hybrid_fraction;
    const double all = double(st.routes_cpu + st.routes_gpu);
    r.cpu_share = all > 0 ? double(st.routes_cpu) / all : 0.0;
    r.cpu_bytes_per_call = double(st.cpu_bytes) / double(meas);
    r.cpu_task_seconds = st.cpu_seconds / double(meas);
    return r;
}

}  // namespace backends_bench
