// Checkpoint -> Model. Loading runs in two phases: a plan that resolves every tensor, checks its
// dtype and shape and cuts the copies into pieces of at most kPieceBytes (so that all errors come
// before any I/O and a few huge fused tensors still keep every reader busy), then parallel readers
// that pread each piece straight into its bank row (or convert it from the read-only mapping).
#include "ft/loader.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "ft/common.hpp"
#include "ft/safetensors.hpp"

namespace ft {

namespace {

constexpr uint64_t kPieceBytes = 8ull << 20;

std::string shape_str(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// What a piece does with its source bytes.
enum class Op {
    copy,         // bytes verbatim (bf16 -> bf16, or an extra kept in its stored dtype)
    to_bf16,      // f16 / f32 elements -> bf16, rounded to nearest even
    to_f32,       // bf16 / f16 / f32 elements -> f32
    transpose,    // rows [row_begin, row_end) of a [rows, cols] matrix -> columns of a [cols, rows] bf16 matrix
};

struct Piece {
    const SafetensorsFile *file = nullptr;
    StDtype src_dtype = StDtype::BF16;
    uint64_t src_offset = 0;  // absolute file offset of this piece's first source byte
    uint64_t src_bytes = 0;
    uint8_t *dst = nullptr;   // for transpose: the whole destination matrix
    uint64_t dst_bytes = 0;   // bytes this piece writes
    Op op = Op::copy;
    int64_t rows = 0, cols = 0, row_begin = 0, row_end = 0;  // transpose only
    int moe_layer = -1;       // whose bank bytes these are; -1 for extras
};

float element_to_f32(StDtype dt, const uint8_t *p) {
    switch (dt) {
        case StDtype::BF16: {
            uint16_t v;
            std::memcpy(&v, p, 2);
            return bf16_to_f32(v);
        }
        case StDtype::F16: {
            uint16_t v;
            std::memcpy(&v, p, 2);
            return f16_to_f32(v);
        }
        case StDtype::F32: {
            float v;
            std::memcpy(&v, p, 4);
            return v;
        }
        default: fail(FT_ERR_INTERNAL, "element_to_f32: unexpected dtype ", st_dtype_name(dt));
    }
}

uint16_t element_to_bf16(StDtype dt, const uint8_t *p) {
    if (dt == StDtype::BF16) {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
    }
    return f32_to_bf16(element_to_f32(dt, p));
}

void pread_all(const SafetensorsFile &file, uint8_t *dst, uint64_t bytes, uint64_t offset) {
    while (bytes > 0) {
        const ssize_t n = ::pread(file.fd(), dst, bytes, static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            fail(FT_ERR_IO, file.path(), ": read of ", bytes, " bytes at offset ", offset, " failed: ",
                 std::strerror(errno));
        }
        if (n == 0) fail(FT_ERR_IO, file.path(), ": unexpected end of file at offset ", offset, " (file shrank?)");
        dst += n;
        bytes -= static_cast<uint64_t>(n);
        offset += static_cast<uint64_t>(n);
    }
}

void run_piece(const Piece &p) {
    const size_t es = st_dtype_size(p.src_dtype);
    const uint8_t *src = p.file->mapping() + p.src_offset;
    switch (p.op) {
        case Op::copy: pread_all(*p.file, p.dst, p.src_bytes, p.src_offset); return;
        case Op::to_bf16: {
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            const uint64_t n = p.src_bytes / es;
            for (uint64_t i = 0; i < n; ++i) out[i] = element_to_bf16(p.src_dtype, src + i * es);
            return;
        }
        case Op::to_f32: {
            float *out = reinterpret_cast<float *>(p.dst);
            const uint64_t n = p.src_bytes / es;
            for (uint64_t i = 0; i < n; ++i) out[i] = element_to_f32(p.src_dtype, src + i * es);
            return;
        }
        case Op::transpose: {
            // dst[c, r] = src[r, c]; tiles keep both the source rows and destination rows in cache.
            constexpr int64_t tile = 32;
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            const uint8_t *base = src - static_cast<uint64_t>(p.row_begin) * p.cols * es;
            for (int64_t r0 = p.row_begin; r0 < p.row_end; r0 += tile) {
                const int64_t r1 = std::min(r0 + tile, p.row_end);
                for (int64_t c0 = 0; c0 < p.cols; c0 += tile) {
                    const int64_t c1 = std::min(c0 + tile, p.cols);
                    for (int64_t c = c0; c < c1; ++c)
                        for (int64_t r = r0; r < r1; ++r)
                            out[c * p.rows + r] = element_to_bf16(p.src_dtype, base + (r * p.cols + c) * es);
                }
            }
            return;
        }
    }
}

// Resolves tensor names and builds the piece list for one checkpoint.
class Planner {
public:
    Planner(const SafetensorsCheckpoint &ckpt, Model &model) : ckpt_(ckpt), model_(model), spec_(model.spec()) {}

    void plan();
    std::vector<Piece> &pieces() { return pieces_; }
    const std::vector<uint64_t> &layer_bytes() const { return layer_bytes_; }

private:
    const SafetensorsCheckpoint::Entry &require(const std::string &name, const std::string &why) const {
        const SafetensorsCheckpoint::Entry *e = ckpt_.find(name);
        if (!e) fail(FT_ERR_FORMAT, ckpt_.dir(), ": missing tensor '", name, "' (", why, ")");
        return *e;
    }
    void check_shape(const SafetensorsCheckpoint::Entry &e, const std::vector<int64_t> &want) const {
        if (e.info->shape != want)
            fail(FT_ERR_FORMAT, e.file->path(), ": tensor '", e.info->name, "': expected shape ", shape_str(want),
                 ", got ", shape_str(e.info->shape));
    }
    void check_float(const SafetensorsCheckpoint::Entry &e) const {
        const StDtype d = e.info->dtype;
        if (d != StDtype::BF16 && d != StDtype::F16 && d != StDtype::F32)
            fail(FT_ERR_UNSUPPORTED, e.file->path(), ": tensor '", e.info->name, "': dtype ", st_dtype_name(d),
                 " is not supported (BF16, F16, F32)");
    }

    std::string find_layer_prefix() const;
    void plan_layer(int moe_layer, const std::string &prefix);
    void plan_extras(int moe_layer, const std::string &block);

    // `bytes` source bytes of `e` starting at element `first` -> dst as bf16 (or verbatim).
    void add_bf16(const SafetensorsCheckpoint::Entry &e, uint64_t first, uint64_t count, uint8_t *dst, int layer);
    void add_transpose(const SafetensorsCheckpoint::Entry &e, uint64_t first, int64_t rows, int64_t cols,
                       uint8_t *dst, int layer);
    // An extra tensor into `t`: bf16 (converted if needed), f32, or kept as stored if bf16/f32.
    enum class Keep { bf16, f32, stored };
    void add_extra(const SafetensorsCheckpoint::Entry &e, Tensor &t, Keep keep);

    const SafetensorsCheckpoint &ckpt_;
    Model &model_;
    const ModelSpec &spec_;
    std::vector<Piece> pieces_;
    std::vector<uint64_t> layer_bytes_;
};

bool starts_with(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }

std::string Planner::find_layer_prefix() const {
    // Text-only exports say model.layers.N; multimodal ones (Qwen3.5/3.6) put the language model
    // under model.language_model. or language_model.model.
    static const char *const candidates[] = {"model.layers.", "model.language_model.layers.",
                                             "language_model.model.layers.", "language_model.layers."};
    const std::vector<std::string> &names = ckpt_.names();
    std::vector<std::string> present;
    for (const char *c : candidates) {
        auto it = std::lower_bound(names.begin(), names.end(), std::string(c));
        if (it != names.end() && starts_with(*it, c)) present.push_back(c);
    }
    if (present.size() == 1) return present[0];
    if (present.empty())
        fail(FT_ERR_FORMAT, ckpt_.dir(), ": no decoder layer tensors found (looked for model.layers.*, "
             "model.language_model.layers.*, language_model.model.layers.*)");
    // Several: keep those that hold the first MoE layer's experts.
    std::vector<std::string> with_experts;
    const std::string l0 = std::to_string(spec_.moe_layers[0]) + ".";
    for (const std::string &p : present) {
        for (const char *block : {"mlp.experts.", "block_sparse_moe.experts."}) {
            auto it = std::lower_bound(names.begin(), names.end(), p + l0 + block);
            if (it != names.end() && starts_with(*it, p + l0 + block)) {
                with_experts.push_back(p);
                break;
            }
        }
    }
    if (with_experts.size() == 1) return with_experts[0];
    fail(FT_ERR_FORMAT, ckpt_.dir(), ": decoder layers appear under both '", present[0], "' and '", present[1],
         "'; cannot tell which is the language model");
}

void Planner::plan() {
    const std::string prefix = find_layer_prefix();
    layer_bytes_.assign(spec_.num_layers, 0);
    for (int l = 0; l < spec_.num_layers; ++l) plan_layer(l, prefix + std::to_string(spec_.moe_layers[l]) + ".");
}

void Planner::add_bf16(const SafetensorsCheckpoint::Entry &e, uint64_t first, uint64_t count, uint8_t *dst,
                       int layer) {
    const StDtype dt = e.info->dtype;
    const size_t es = st_dtype_size(dt);
    const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / es);
    for (uint64_t done = 0; done < count; done += per_piece) {
        const uint64_t n = std::min(per_piece, count - done);
        Piece p;
        p.file = e.file;
        p.src_dtype = dt;
        p.src_offset = e.info->file_offset + (first + done) * es;
        p.src_bytes = n * es;
        p.dst = dst + done * 2;
        p.dst_bytes = n * 2;
        p.op = dt == StDtype::BF16 ? Op::copy : Op::to_bf16;
        p.moe_layer = layer;
        pieces_.push_back(p);
        if (layer >= 0) layer_bytes_[layer] += p.dst_bytes;
    }
}

void Planner::add_transpose(const SafetensorsCheckpoint::Entry &e, uint64_t first, int64_t rows, int64_t cols,
                            uint8_t *dst, int layer) {
    const StDtype dt = e.info->dtype;
    const size_t es = st_dtype_size(dt);
    const int64_t rows_per_piece = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / (cols * es)));
    for (int64_t r = 0; r < rows; r += rows_per_piece) {
        Piece p;
        p.file = e.file;
        p.src_dtype = dt;
        p.row_begin = r;
        p.row_end = std::min(rows, r + rows_per_piece);
        p.rows = rows;
        p.cols = cols;
        p.src_offset = e.info->file_offset + (first + static_cast<uint64_t>(r) * cols) * es;
        p.src_bytes = static_cast<uint64_t>(p.row_end - r) * cols * es;
        p.dst = dst;
        p.dst_bytes = static_cast<uint64_t>(p.row_end - r) * cols * 2;
        p.op = Op::transpose;
        p.moe_layer = layer;
        pieces_.push_back(p);
        if (layer >= 0) layer_bytes_[layer] += p.dst_bytes;
    }
}

void Planner::add_extra(const SafetensorsCheckpoint::Entry &e, Tensor &t, Keep keep) {
    check_float(e);
    const StDtype dt = e.info->dtype;
    const uint64_t n = e.info->numel;
    t.shape = e.info->shape;
    Piece p;
    p.file = e.file;
    p.src_dtype = dt;
    p.src_offset = e.info->file_offset;
    p.src_bytes = e.info->nbytes();
    const bool as_f32 = keep == Keep::f32 || (keep == Keep::stored && dt != StDtype::BF16);
    if (as_f32) {
        t.dtype = FT_DTYPE_F32;
        t.bytes.resize(n * 4);
        p.op = dt == StDtype::F32 ? Op::copy : Op::to_f32;
    } else {
        t.dtype = FT_DTYPE_BF16;
        t.bytes.resize(n * 2);
        p.op = dt == StDtype::BF16 ? Op::copy : Op::to_bf16;
    }
    p.dst = t.bytes.data();
    p.dst_bytes = t.bytes.size();
    if (p.src_bytes > 0) pieces_.push_back(p);
}

void Planner::plan_layer(int l, const std::string &layer_prefix) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, I = spec_.intermediate;
    ExpertBanks &banks = model_.banks();

    // Mixtral's original exports use block_sparse_moe.{w1,w3,w2}; everything else (and Mixtral as
    // rewritten by newer transformers) uses mlp.{gate,up,down}_proj.
    std::vector<std::string> blocks = {"mlp."};
    if (spec_.architecture == "mixtral") blocks.insert(blocks.begin(), "block_sparse_moe.");
    std::string block_name = blocks[0];
    for (const std::string &b : blocks) {
        const std::string cand = layer_prefix + b;
        if (ckpt_.contains(cand + "gate.weight") || ckpt_.contains(cand + "experts.gate_up_proj")) {
            block_name = b;
            break;
        }
    }
    const std::string block = layer_prefix + block_name;
    const bool w_names = block_name == "block_sparse_moe.";
    const char *proj_names[3] = {w_names ? "w1" : "gate_proj", w_names ? "w3" : "up_proj",
                                 w_names ? "w2" : "down_proj"};

    const std::string fused_gu = block + "experts.gate_up_proj";
    const std::string fused_dn = block + "experts.down_proj";
    const std::string first_per = block + "experts.0." + proj_names[0] + ".weight";
    const bool fused = ckpt_.contains(fused_gu) || ckpt_.contains(fused_dn);
    const bool per_expert = ckpt_.contains(first_per);
    if (fused && per_expert)
        fail(FT_ERR_FORMAT, ckpt_.dir(), ": layer ", spec_.moe_layers[l], " has both fused '", fused_gu,
             "' and per-expert '", first_per, "' tensors");

    if (fused) {
        const auto &gu = require(fused_gu, "fused gate/up projections of the routed experts");
        const auto &dn = require(fused_dn, "fused down projections of the routed experts");
        check_float(gu);
        check_float(dn);
        const std::vector<int64_t> &gs = gu.info->shape, &ds = dn.info->shape;
        const bool gu_std = gs == std::vector<int64_t>{E, 2 * I, H};
        const bool gu_tr = gs == std::vector<int64_t>{E, H, 2 * I};
        if (!gu_std && !gu_tr)
            fail(FT_ERR_FORMAT, gu.file->path(), ": tensor '", fused_gu, "': expected shape ",
                 shape_str({E, 2 * I, H}), " (or transposed ", shape_str({E, H, 2 * I}), "), got ", shape_str(gs));
        if (gu_std && gu_tr)
            fail(FT_ERR_FORMAT, gu.file->path(), ": tensor '", fused_gu, "': shape ", shape_str(gs),
                 " is ambiguous (hidden_size == 2 * intermediate_size): cannot tell [E, 2I, H] from [E, H, 2I]");
        const bool dn_std = ds == std::vector<int64_t>{E, H, I};
        const bool dn_tr = ds == std::vector<int64_t>{E, I, H};
        if (!dn_std && !dn_tr)
            fail(FT_ERR_FORMAT, dn.file->path(), ": tensor '", fused_dn, "': expected shape ",
                 shape_str({E, H, I}), " (or transposed ", shape_str({E, I, H}), "), got ", shape_str(ds));
        // With H == I both readings fit down_proj; then it follows gate_up_proj's orientation.
        if ((gu_std && !dn_std) || (gu_tr && !dn_tr))
            fail(FT_ERR_FORMAT, dn.file->path(), ": tensor '", fused_dn, "' ", shape_str(ds), " is ",
                 gu_std ? "transposed" : "not transposed", " but '", fused_gu, "' ", shape_str(gs), " is",
                 gu_std ? " not" : "", "; inconsistent fused layout");
        if (gu_std) {
            // [E, 2I, H] with gate rows then up rows is exactly the gate_up bank; [E, H, I] the down bank.
            add_bf16(gu, 0, static_cast<uint64_t>(E * 2 * I * H), banks.row(0, l, 0), l);
            add_bf16(dn, 0, static_cast<uint64_t>(E * H * I), banks.row(1, l, 0), l);
        } else {
            // [E, H, 2I]: column j < I is gate unit j, I + j up unit j; transposing each expert's
            // [H, 2I] gives the [2I, H] bank row. [E, I, H] transposes to the [H, I] down row.
            for (int64_t e = 0; e < E; ++e) {
                add_transpose(gu, static_cast<uint64_t>(e * H * 2 * I), H, 2 * I, banks.row(0, l, e), l);
                add_transpose(dn, static_cast<uint64_t>(e * I * H), I, H, banks.row(1, l, e), l);
            }
        }
    } else {
        if (!per_expert)
            require(first_per, "routed expert 0; fused '" + fused_gu + "' is absent too");
        const std::vector<int64_t> shapes[3] = {{I, H}, {I, H}, {H, I}};
        for (int64_t e = 0; e < E; ++e) {
            for (int proj = 0; proj < 3; ++proj) {
                const std::string name =
                    block + "experts." + std::to_string(e) + "." + proj_names[proj] + ".weight";
                const auto &t = require(name, "routed expert projection");
                check_float(t);
                check_shape(t, shapes[proj]);
                uint8_t *dst = proj == 2 ? banks.row(1, l, e)
                                         : banks.row(0, l, e) + (proj == 1 ? static_cast<size_t>(I * H * 2) : 0);
                add_bf16(t, 0, static_cast<uint64_t>(I * H), dst, l);
            }
        }
    }
    plan_extras(l, block);
}

void Planner::plan_extras(int l, const std::string &block) {
    const int64_t E = spec_.num_experts, H = spec_.hidden, Is = spec_.shared_intermediate;
    LayerExtras &x = model_.extras(l);

    const auto &router = require(block + "gate.weight", "router");
    check_shape(router, {E, H});
    add_extra(router, x.router_weight, Keep::stored);

    const std::string bias_name = block + "gate.e_score_correction_bias";
    if (const auto *bias = ckpt_.find(bias_name)) {
        check_shape(*bias, {E});
        add_extra(*bias, x.router_bias, Keep::f32);
    } else if (spec_.routing.rule == FT_ROUTING_SIGMOID_GROUP_TOPK) {
        require(bias_name, "correction bias of sigmoid routing");
    }

    if (Is > 0) {
        // DeepSeek/GLM/Kimi: shared_experts; Qwen3.5/3.6: shared_expert plus its sigmoid gate.
        const std::string shared = block + (spec_.shared_expert_gate ? "shared_expert." : "shared_experts.");
        const auto &g = require(shared + "gate_proj.weight", "shared expert");
        const auto &u = require(shared + "up_proj.weight", "shared expert");
        const auto &d = require(shared + "down_proj.weight", "shared expert");
        check_shape(g, {Is, H});
        check_shape(u, {Is, H});
        check_shape(d, {H, Is});
        add_extra(g, x.shared_gate, Keep::bf16);
        add_extra(u, x.shared_up, Keep::bf16);
        add_extra(d, x.shared_down, Keep::bf16);
    }
    if (spec_.shared_expert_gate) {
        const auto &sg = require(block + "shared_expert_gate.weight", "sigmoid gate of the shared expert");
        check_shape(sg, {1, H});
        add_extra(sg, x.shared_gate_proj, Keep::bf16);
    }
}

// Runs the pieces on `threads` workers while this thread reports progress.
void execute(std::vector<Piece> &pieces, const std::vector<uint64_t> &layer_bytes, int threads,
             const LoadOptions &opts) {
    uint64_t total = 0;
    for (const Piece &p : pieces) total += p.src_bytes;

    // Pieces are taken in plan order, which is layer order, so layers complete (and can be pinned
    // by on_layer_filled) one after another while later ones are still being read.
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> done{0};
    std::atomic<bool> stop{false};
    std::unique_ptr<std::atomic<uint64_t>[]> left(new std::atomic<uint64_t>[layer_bytes.size()]);
    for (size_t l = 0; l < layer_bytes.size(); ++l) left[l] = layer_bytes[l];

    std::mutex mu;
    std::condition_variable cv;
    std::exception_ptr error;
    int running = threads;

    auto worker = [&]() {
        try {
            for (;;) {
                if (stop.load(std::memory_order_relaxed)) break;
                const size_t i = next.fetch_add(1);
                if (i >= pieces.size()) break;
                const Piece &p = pieces[i];
                run_piece(p);
                done.fetch_add(p.src_bytes, std::memory_order_relaxed);
                if (p.moe_layer >= 0 && left[p.moe_layer].fetch_sub(p.dst_bytes) == p.dst_bytes &&
                    opts.on_layer_filled)
                    opts.on_layer_filled(p.moe_layer);
                cv.notify_one();
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu);
            if (!error) error = std::current_exception();
            stop = true;
        }
        std::lock_guard<std::mutex> lock(mu);
        --running;
        cv.notify_one();
    };

    bool cancelled = false;
    if (opts.progress && !opts.progress(0, total)) fail(FT_ERR_CANCELLED, "loading cancelled by the progress callback");

    std::vector<std::thread> pool;
    pool.reserve(threads);
    try {
        for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
    } catch (...) {
        stop = true;
        for (std::thread &t : pool) t.join();
        throw;
    }

    uint64_t reported = 0;
    {
        std::unique_lock<std::mutex> lock(mu);
        while (running > 0) {
            cv.wait_for(lock, std::chrono::milliseconds(50));
            const uint64_t now = done.load(std::memory_order_relaxed);
            if (opts.progress && now != reported && now != total && !cancelled) {
                reported = now;
                lock.unlock();
                const bool go = opts.progress(now, total);
                lock.lock();
                if (!go) {
                    cancelled = true;
                    stop = true;
                }
            }
        }
    }
    for (std::thread &t : pool) t.join();
    if (error) std::rethrow_exception(error);
    if (!cancelled && opts.progress && !opts.progress(total, total)) cancelled = true;
    if (cancelled) fail(FT_ERR_CANCELLED, "loading cancelled by the progress callback");
}

}  // namespace

std::unique_ptr<Model> load_checkpoint(const std::string &dir, const LoadOptions &opts) {
    ModelSpec spec = read_model_config(dir);
    SafetensorsCheckpoint ckpt(dir);
    auto model = std::make_unique<Model>(std::move(spec));

    Planner planner(ckpt, *model);
    planner.plan();
    if (opts.on_model_allocated) opts.on_model_allocated(*model);
    std::vector<Piece> &pieces = planner.pieces();

    int threads = opts.io_threads > 0 ? opts.io_threads : static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(1, pieces.size()))));
    log(FT_LOG_INFO, "loading ", dir, ": ", model->spec().num_layers, " MoE layers, ", pieces.size(), " pieces, ",
        threads, " readers");
    execute(pieces, planner.layer_bytes(), threads, opts);
    return model;
}

}  // namespace ft
