// FP8 wire format, dispatch records and the combine reduction.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ft/common.hpp"
#include "ft/dequant.hpp"
#include "ft/ep.hpp"

namespace ft::ep {

namespace {

void check_hidden(int64_t hidden) {
    if (hidden <= 0 || hidden % kWireBlock != 0)
        fail(FT_ERR_INVALID_ARGUMENT, "EP wire: hidden size ", hidden, " is not a positive multiple of ", kWireBlock);
}

float block_amax(const uint16_t *x) {
    float amax = 0.0f;
    for (int32_t i = 0; i < kWireBlock; ++i) {
        const float a = std::fabs(bf16_to_f32(x[i]));
        if (std::isfinite(a)) amax = std::max(amax, a);
    }
    return std::max(amax, kAmaxFloor);
}

// The exponent e with 2^e = the smallest power of two >= r, read from the fp32 bits so that host
// and device agree without a log2 (r is a normal float: amax >= 1e-4 keeps it above 2^-126).
int32_t ue8m0_exponent(float r) {
    uint32_t bits;
    std::memcpy(&bits, &r, sizeof bits);
    return static_cast<int32_t>((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
}

template <typename T>
void put(uint8_t *base, size_t at, T v) {
    std::memcpy(base + at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t *base, size_t at) {
    T v;
    std::memcpy(&v, base + at, sizeof v);
    return v;
}

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

ScaleFormat scale_format(WireDtype dtype) {
    return dtype == WireDtype::Fp8Fp32 ? ScaleFormat::Fp32 : ScaleFormat::Ue8m0;
}

}  // namespace

// ---- FP8 --------------------------------------------------------------------------------------

size_t fp8_scale_bytes(int64_t hidden, ScaleFormat format) {
    check_hidden(hidden);
    return static_cast<size_t>(hidden / kWireBlock) * (format == ScaleFormat::Fp32 ? 4 : 1);
}

float fp8_block_scale(const uint8_t *scales, int64_t block, ScaleFormat format) {
    if (format == ScaleFormat::Fp32) return get<float>(scales, static_cast<size_t>(block) * 4);
    return e8m0_to_f32(scales[block]);
}

void quantize_fp8_row(const uint16_t *x, int64_t hidden, ScaleFormat format, uint8_t *q, uint8_t *scales) {
    check_hidden(hidden);
    for (int64_t b = 0; b < hidden / kWireBlock; ++b) {
        const uint16_t *xb = x + b * kWireBlock;
        uint8_t *qb = q + b * kWireBlock;
        const float amax = block_amax(xb);
        if (format == ScaleFormat::Fp32) {
            const float inv = kE4m3Max / amax;
            for (int32_t i = 0; i < kWireBlock; ++i) qb[i] = f32_to_e4m3(bf16_to_f32(xb[i]) * inv);
            put<float>(scales, static_cast<size_t>(b) * 4, amax / kE4m3Max);
        } else {
            const int32_t e = ue8m0_exponent(amax / kE4m3Max);
            for (int32_t i = 0; i < kWireBlock; ++i) qb[i] = f32_to_e4m3(std::ldexp(bf16_to_f32(xb[i]), -e));
            scales[b] = static_cast<uint8_t>(e + 127);
        }
    }
}

void dequantize_fp8_row(const uint8_t *q, const uint8_t *scales, int64_t hidden, ScaleFormat format, float *out) {
    check_hidden(hidden);
    for (int64_t b = 0; b < hidden / kWireBlock; ++b) {
        const float s = fp8_block_scale(scales, b, format);
        for (int32_t i = 0; i < kWireBlock; ++i) out[b * kWireBlock + i] = e4m3_to_f32(q[b * kWireBlock + i]) * s;
    }
}

// ---- records ----------------------------------------------------------------------------------

RecordLayout record_layout(int64_t hidden, int32_t top_k, WireDtype dtype) {
    check_hidden(hidden);
    if (top_k <= 0 || top_k > 32767) fail(FT_ERR_INVALID_ARGUMENT, "EP wire: top-k ", top_k);
    RecordLayout r;
    r.payload = 0;
    r.payload_bytes = static_cast<size_t>(hidden) * (dtype == WireDtype::Bf16 ? 2 : 1);
    r.scales = r.payload_bytes;
    r.scale_bytes = dtype == WireDtype::Bf16 ? 0 : fp8_scale_bytes(hidden, scale_format(dtype));
    r.token = round_up(r.scales + r.scale_bytes, 4);
    r.source = r.token + 4;
    r.n = r.source + 2;
    r.weight = r.n + 2;
    r.slot = r.weight + 4 * static_cast<size_t>(top_k);
    r.bytes = round_up(r.slot + 2 * static_cast<size_t>(top_k), 16);
    return r;
}

RecordMeta read_record_meta(const uint8_t *rec, const RecordLayout &L, int32_t top_k) {
    RecordMeta m;
    m.token = get<int32_t>(rec, L.token);
    m.source = get<int16_t>(rec, L.source);
    m.n = get<int16_t>(rec, L.n);
    if (m.n < 0 || m.n > top_k) fail(FT_ERR_FORMAT, "EP record carries ", m.n, " routes, top-k is ", top_k);
    for (int32_t i = 0; i < m.n; ++i) {
        m.slot.push_back(get<int16_t>(rec, L.slot + 2 * i));
        m.weight.push_back(get<float>(rec, L.weight + 4 * i));
    }
    return m;
}

void pack_dispatch(const DispatchLayout &layout, const uint16_t *x, int64_t hidden, WireDtype dtype, uint8_t *send) {
    const RecordLayout L = record_layout(hidden, layout.top_k, dtype);
    const int32_t K = layout.top_k;
    const int64_t rows = layout.offset[layout.num_ranks];
    if (rows > 0) std::memset(send, 0, L.bytes * rows);
    for (int64_t i = 0; i < rows; ++i) {
        uint8_t *rec = send + L.bytes * i;
        const int32_t t = layout.send_token[i];
        const uint16_t *xt = x + static_cast<int64_t>(t) * hidden;
        if (dtype == WireDtype::Bf16)
            std::memcpy(rec + L.payload, xt, L.payload_bytes);
        else
            quantize_fp8_row(xt, hidden, scale_format(dtype), rec + L.payload, rec + L.scales);
        put<int32_t>(rec, L.token, t);
        put<int16_t>(rec, L.source, static_cast<int16_t>(layout.source_rank));
        put<int16_t>(rec, L.n, static_cast<int16_t>(layout.send_n[i]));
        for (int32_t j = 0; j < K; ++j) {
            put<float>(rec, L.weight + 4 * j, layout.send_weight[i * K + j]);
            put<int16_t>(rec, L.slot + 2 * j, static_cast<int16_t>(layout.send_slot[i * K + j]));
        }
    }
}

void unpack_payload(const uint8_t *rec, const RecordLayout &L, int64_t hidden, WireDtype dtype, float *out) {
    if (dtype == WireDtype::Bf16) {
        for (int64_t h = 0; h < hidden; ++h) out[h] = bf16_to_f32(get<uint16_t>(rec, L.payload + 2 * h));
        return;
    }
    dequantize_fp8_row(rec + L.payload, rec + L.scales, hidden, scale_format(dtype), out);
}

ExpertRows group_by_expert(const uint8_t *records, const int64_t *count_per_source, int32_t num_ranks,
                           const RecordLayout &L, int32_t top_k, int32_t slots_per_rank) {
    int64_t total = 0;
    for (int32_t s = 0; s < num_ranks; ++s) total += count_per_source[s];
    // Counting pass, then placement pass: the same two steps as a GPU's histogram + scan + scatter.
    ExpertRows g;
    g.offset.assign(slots_per_rank + 1, 0);
    for (int64_t i = 0; i < total; ++i) {
        const RecordMeta m = read_record_meta(records + L.bytes * i, L, top_k);
        for (int32_t slot : m.slot) {
            if (slot < 0 || slot >= slots_per_rank)
                fail(FT_ERR_FORMAT, "EP record ", i, " names slot ", slot, " of ", slots_per_rank);
            ++g.offset[slot + 1];
        }
    }
    for (int32_t s = 0; s < slots_per_rank; ++s) g.offset[s + 1] += g.offset[s];
    g.record.resize(g.offset[slots_per_rank]);
    g.route.resize(g.offset[slots_per_rank]);
    std::vector<int64_t> fill(g.offset.begin(), g.offset.end() - 1);
    for (int64_t i = 0; i < total; ++i) {
        const RecordMeta m = read_record_meta(records + L.bytes * i, L, top_k);
        for (int32_t j = 0; j < m.n; ++j) {
            const int64_t at = fill[m.slot[j]]++;
            g.record[at] = i;
            g.route[at] = j;
        }
    }
    return g;
}

// ---- combine ----------------------------------------------------------------------------------

void reduce_partials(const uint8_t *records, int64_t num_records, const RecordLayout &L, int32_t top_k,
                     int64_t hidden, const uint16_t *expert_out, uint16_t *partials) {
    for (int64_t i = 0; i < num_records; ++i) {
        const uint8_t *rec = records + L.bytes * i;
        const int32_t n = get<int16_t>(rec, L.n);
        for (int64_t h = 0; h < hidden; ++h) {
            float acc = 0.0f;
            for (int32_t j = 0; j < n; ++j) {
                const float y = bf16_to_f32(expert_out[(i * top_k + j) * hidden + h]);
                acc = std::fma(get<float>(rec, L.weight + 4 * j), y, acc);
            }
            partials[i * hidden + h] = f32_to_bf16(acc);
        }
    }
}

void combine_at_source(const DispatchLayout &layout, const uint16_t *const *partials, int64_t hidden,
                       uint16_t *out) {
    std::vector<const uint8_t *> rows(layout.num_ranks);
    for (int32_t r = 0; r < layout.num_ranks; ++r) rows[r] = reinterpret_cast<const uint8_t *>(partials[r]);
    combine_at_source_wire(layout, rows.data(), hidden, WireDtype::Bf16, out);
}

// ---- FP8 combine ------------------------------------------------------------------------------

size_t combine_row_bytes(int64_t hidden, WireDtype dtype) {
    check_hidden(hidden);
    if (dtype == WireDtype::Bf16) return static_cast<size_t>(hidden) * 2;
    // Whole 4-byte words: the kernels store e4m3 four at a time and read fp32 scales.
    return round_up(static_cast<size_t>(hidden) + fp8_scale_bytes(hidden, scale_format(dtype)), 4);
}

double combine_rel_error(const uint16_t *row, const float *decoded, int64_t hidden) {
    double err = 0, norm = 0;
    for (int64_t h = 0; h < hidden; ++h) {
        const float v = bf16_to_f32(row[h]);
        if (!std::isfinite(v)) return HUGE_VAL;
        const double d = static_cast<double>(decoded[h]) - v;
        err += d * d;
        norm += static_cast<double>(v) * v;
    }
    return norm > 0 ? std::sqrt(err) / std::sqrt(norm) : 0.0;
}

double encode_combine_row(const uint16_t *partial, int64_t hidden, WireDtype dtype, uint8_t *wire) {
    const size_t bytes = combine_row_bytes(hidden, dtype);
    if (dtype == WireDtype::Bf16) {
        std::memcpy(wire, partial, bytes);
        return 0.0;
    }
    std::memset(wire, 0, bytes);
    quantize_fp8_row(partial, hidden, scale_format(dtype), wire, wire + hidden);
    std::vector<float> back(static_cast<size_t>(hidden));
    decode_combine_row(wire, hidden, dtype, back.data());
    return combine_rel_error(partial, back.data(), hidden);
}

void decode_combine_row(const uint8_t *wire, int64_t hidden, WireDtype dtype, float *out) {
    check_hidden(hidden);
    if (dtype == WireDtype::Bf16) {
        for (int64_t h = 0; h < hidden; ++h) out[h] = bf16_to_f32(get<uint16_t>(wire, 2 * h));
        return;
    }
    dequantize_fp8_row(wire, wire + hidden, hidden, scale_format(dtype), out);
}

void combine_at_source_wire(const DispatchLayout &layout, const uint8_t *const *rows, int64_t hidden, WireDtype dtype,
                            uint16_t *out) {
    const int64_t T = layout.tokens;
    const size_t row_bytes = combine_row_bytes(hidden, dtype), own_bytes = static_cast<size_t>(hidden) * 2;
    std::vector<float> sum(static_cast<size_t>(hidden)), v(static_cast<size_t>(hidden));
    for (int64_t t = 0; t < T; ++t) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int32_t r = 0; r < layout.num_ranks; ++r) {
            const int32_t row = layout.row[static_cast<size_t>(r) * T + t];
            if (row < 0) continue;
            if (r == layout.source_rank)
                decode_combine_row(rows[r] + own_bytes * row, hidden, WireDtype::Bf16, v.data());
            else
                decode_combine_row(rows[r] + row_bytes * row, hidden, dtype, v.data());
            for (int64_t h = 0; h < hidden; ++h) sum[h] += v[h];
        }
        for (int64_t h = 0; h < hidden; ++h) out[t * hidden + h] = f32_to_bf16(sum[h]);
    }
}

}  // namespace ft::ep
