#include "pieces.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "ft/common.hpp"
#include "ft/dequant.hpp"

namespace ft::load {

namespace {

float element_to_f32(Src dt, const uint8_t *p) {
    switch (dt) {
        case Src::BF16: {
            uint16_t v;
            std::memcpy(&v, p, 2);
            return bf16_to_f32(v);
        }
        case Src::F16: {
            uint16_t v;
            std::memcpy(&v, p, 2);
            return f16_to_f32(v);
        }
        case Src::F32: {
            float v;
            std::memcpy(&v, p, 4);
            return v;
        }
        case Src::U8: break;
    }
    fail(FT_ERR_INTERNAL, "element_to_f32: unexpected source type");
}

uint16_t element_to_bf16(Src dt, const uint8_t *p) {
    if (dt == Src::BF16) {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
    }
    return f32_to_bf16(element_to_f32(dt, p));
}

void pread_all(const Source &file, uint8_t *dst, uint64_t bytes, uint64_t offset) {
    while (bytes > 0) {
        const ssize_t n = ::pread(file.fd, dst, bytes, static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            fail(FT_ERR_IO, *file.path, ": read of ", bytes, " bytes at offset ", offset, " failed: ",
                 std::strerror(errno));
        }
        if (n == 0) fail(FT_ERR_IO, *file.path, ": unexpected end of file at offset ", offset, " (file shrank?)");
        dst += n;
        bytes -= static_cast<uint64_t>(n);
        offset += static_cast<uint64_t>(n);
    }
}

// e8m0 code 255 is NaN (ft/dequant.hpp); no quantiser writes it, so a scale tensor holding it is
// corrupt and is rejected rather than turned into NaN weights.
void check_e8m0(const Piece &p, const uint8_t *bytes, uint64_t n) {
    if (const void *hit = std::memchr(bytes, 0xff, n))
        fail(FT_ERR_FORMAT, *p.file.path, ": tensor '", *p.tensor, "': e8m0 scale byte 255 (NaN) at byte ",
             p.src_offset + static_cast<uint64_t>(static_cast<const uint8_t *>(hit) - bytes), " of the file");
}

// One 17-byte ggml MXFP4 block (e8m0 scale, then element j in the low nibble of byte j and
// element j + 16 in the high nibble of byte j) -> the 16 bytes of the mxfp4 banks' element order
// (element 2i low nibble, 2i + 1 high nibble of byte i); rejects scale 255 when p.check_e8m0.
void ggml_mxfp4_block(const Piece &p, const uint8_t *blk, uint8_t packed[16]) {
    if (p.check_e8m0 && blk[0] == 0xff)
        fail(FT_ERR_FORMAT, *p.file.path, ": tensor '", *p.tensor, "': e8m0 scale byte 255 (NaN) at byte ",
             static_cast<uint64_t>(blk - p.file.map), " of the file");
    const uint8_t *qs = blk + 1;
    for (int i = 0; i < 16; ++i) {
        const int a = 2 * i, c = 2 * i + 1;
        const uint8_t lo = a < 16 ? qs[a] & 0x0f : qs[a - 16] >> 4;
        const uint8_t hi = c < 16 ? qs[c] & 0x0f : qs[c - 16] >> 4;
        packed[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
}

void run_piece(const Piece &p) {
    const size_t es = src_size(p.src);
    const uint8_t *src = p.file.map + p.src_offset;
    switch (p.op) {
        case Op::copy:
            pread_all(p.file, p.dst, p.src_bytes, p.src_offset);
            if (p.check_e8m0) check_e8m0(p, p.dst, p.src_bytes);
            return;
        case Op::to_bf16: {
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            const uint64_t n = p.src_bytes / es, step = static_cast<uint64_t>(p.col_step);
            for (uint64_t i = 0; i < n; ++i) out[i * step] = element_to_bf16(p.src, src + i * es);
            return;
        }
        case Op::to_f32: {
            float *out = reinterpret_cast<float *>(p.dst);
            const uint64_t n = p.src_bytes / es;
            if (p.deinterleave) {
                const uint64_t cols = static_cast<uint64_t>(p.cols), half = cols / 2;
                for (uint64_t i = 0; i < n; ++i) {
                    const uint64_t row = i / cols, c = i % cols;
                    out[row * cols + (c % 2) * half + c / 2] = element_to_f32(p.src, src + i * es);
                }
                return;
            }
            for (uint64_t i = 0; i < n; ++i) out[i] = element_to_f32(p.src, src + i * es);
            return;
        }
        case Op::transpose:
        case Op::transpose_u8: {
            // dst[c, r] = src[r, c]; tiles keep both the source rows and destination rows in cache.
            constexpr int64_t tile = 32;
            const uint8_t *base = src - static_cast<uint64_t>(p.row_begin) * p.cols * es;
            if (p.op == Op::transpose_u8 && p.check_e8m0) check_e8m0(p, src, p.src_bytes);
            for (int64_t r0 = p.row_begin; r0 < p.row_end; r0 += tile) {
                const int64_t r1 = std::min(r0 + tile, p.row_end);
                for (int64_t c0 = 0; c0 < p.cols; c0 += tile) {
                    const int64_t c1 = std::min(c0 + tile, p.cols);
                    for (int64_t c = c0; c < c1; ++c) {
                        const int64_t dc = p.deinterleave ? (c % 2) * (p.cols / 2) + c / 2 : c;
                        for (int64_t r = r0; r < r1; ++r) {
                            if (p.op == Op::transpose_u8) {
                                p.dst[dc * p.rows + r] = base[r * p.cols + c];
                            } else {
                                reinterpret_cast<uint16_t *>(p.dst)[dc * p.rows + r] =
                                    element_to_bf16(p.src, base + (r * p.cols + c) * es);
                            }
                        }
                    }
                }
            }
            return;
        }
        case Op::broadcast_f16: {
            const uint16_t h = f32_to_f16(element_to_f32(p.src, src));
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            for (uint64_t i = 0; i < p.dst_bytes / 2; ++i) out[i] = h;
            return;
        }
        case Op::fp8_to_bf16: {
            const int64_t kb = p.cols / kFp8Block;
            const size_t ss = p.scale_e8m0 ? 1 : src_size(p.src2);
            std::vector<uint16_t> band(static_cast<size_t>(kb));
            std::vector<float> row(static_cast<size_t>(p.cols));
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            for (int64_t r = p.row_begin; r < p.row_end; ++r) {
                const uint8_t *sc = p.file.map + p.src2_offset + static_cast<uint64_t>(r / kFp8Block) * kb * ss;
                for (int64_t b = 0; b < kb; ++b) {
                    if (!p.scale_e8m0) {
                        band[b] = element_to_bf16(p.src2, sc + b * ss);
                        continue;
                    }
                    if (sc[b] == 0xff)
                        fail(FT_ERR_FORMAT, *p.file.path, ": scales of tensor '", *p.tensor,
                             "': e8m0 scale byte 255 (NaN) at byte ", static_cast<uint64_t>(sc + b - p.file.map),
                             " of the file");
                    // 2^(b - 127) exactly: a normal bf16 with exponent field b, or 2^-127 (subnormal).
                    band[b] = sc[b] == 0 ? uint16_t{0x0040} : static_cast<uint16_t>(sc[b] << 7);
                }
                dequant_row_fp8_block(src + static_cast<uint64_t>(r - p.row_begin) * p.cols, band.data(), p.cols,
                                      row.data());
                for (int64_t c = 0; c < p.cols; ++c) out[(r - p.row_begin) * p.cols + c] = f32_to_bf16(row[c]);
            }
            return;
        }
        case Op::ids_to_i32: {
            int32_t *out = reinterpret_cast<int32_t *>(p.dst);
            const uint64_t n = p.src_bytes / static_cast<uint64_t>(p.id_width);
            for (uint64_t i = 0; i < n; ++i) {
                int64_t v;
                if (p.id_width == 8) {
                    std::memcpy(&v, src + i * 8, 8);
                } else {
                    int32_t v32;
                    std::memcpy(&v32, src + i * 4, 4);
                    v = v32;
                }
                if (v < 0 || v >= p.id_limit)
                    fail(FT_ERR_FORMAT, *p.file.path, ": tensor '", *p.tensor, "': element ", p.row_begin + static_cast<int64_t>(i),
                         " is expert id ", v, ", outside [0, ", p.id_limit, ")");
                out[i] = static_cast<int32_t>(v);
            }
            return;
        }
        case Op::block_to_bf16: {
            const size_t rb = block_row_bytes(p.fmt, p.cols);
            std::vector<float> row(static_cast<size_t>(p.cols));
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            for (int64_t r = p.row_begin; r < p.row_end; ++r) {
                dequant_row_block(p.fmt, src + static_cast<uint64_t>(r - p.row_begin) * rb, p.cols, row.data());
                for (int64_t c = 0; c < p.cols; ++c) out[(r - p.row_begin) * p.cols + c] = f32_to_bf16(row[c]);
            }
            return;
        }
        case Op::ggml_mxfp4: {
            const int64_t nb = p.cols / 32;
            uint8_t packed[16];
            for (int64_t r = p.row_begin; r < p.row_end; ++r) {
                const uint8_t *blk = src + static_cast<uint64_t>(r - p.row_begin) * nb * 17;
                const int64_t col = p.col_first + r * p.col_step;
                for (int64_t b = 0; b < nb; ++b, blk += 17) {
                    ggml_mxfp4_block(p, blk, packed);
                    p.dst2[b * p.dst_cols + col] = blk[0];
                    for (int i = 0; i < 16; ++i) p.dst[(b * 16 + i) * p.dst_cols + col] = packed[i];
                }
            }
            return;
        }
        case Op::ggml_mxfp4_to_bf16: {
            // Each row re-laid-out as a one-column mxfp4 bank (N = 1), then dequantised by the
            // reference the routed mxfp4 experts are defined by (dequant_col_mxfp4).
            const int64_t nb = p.cols / 32;
            std::vector<uint8_t> packed(static_cast<size_t>(p.cols / 2)), scales(static_cast<size_t>(nb));
            std::vector<float> row(static_cast<size_t>(p.cols));
            uint16_t *out = reinterpret_cast<uint16_t *>(p.dst);
            for (int64_t r = p.row_begin; r < p.row_end; ++r) {
                const uint8_t *blk = src + static_cast<uint64_t>(r - p.row_begin) * nb * 17;
                for (int64_t b = 0; b < nb; ++b, blk += 17) {
                    ggml_mxfp4_block(p, blk, packed.data() + b * 16);
                    scales[static_cast<size_t>(b)] = blk[0];
                }
                dequant_col_mxfp4(packed.data(), scales.data(), p.cols, 1, 0, row.data());
                for (int64_t c = 0; c < p.cols; ++c) out[(r - p.row_begin) * p.cols + c] = f32_to_bf16(row[c]);
            }
            return;
        }
    }
}

}  // namespace

size_t src_size(Src s) {
    switch (s) {
        case Src::BF16: case Src::F16: return 2;
        case Src::F32: return 4;
        case Src::U8: return 1;
    }
    return 1;
}

std::string shape_str(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

int reader_threads(const LoadOptions &opts, size_t pieces) {
    int threads = opts.io_threads > 0 ? opts.io_threads : static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(1, pieces))));
}

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


}  // namespace ft::load
