// Host expert banks (docs/formats.md, "Banks"): one page-aligned allocation per (bank, layer), viewed as
// [E, layer_row_bytes(b, l)]. Expert e of layer l in bank b starts at
// layer_base(b, l) + e * layer_row_bytes(b, l); the row size is the same in every layer unless the
// model mixes block formats (ModelSpec::layer_formats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ft/formats.hpp"

namespace ft {

// An anonymous, page-aligned mapping. Pages are not touched here: whoever fills the buffer
// faults them in, which lets parallel readers place them (and lets pinning come after filling).
class HostBuffer {
public:
    HostBuffer() = default;
    explicit HostBuffer(size_t bytes);  // throws FT_ERR_OUT_OF_MEMORY
    ~HostBuffer();
    HostBuffer(HostBuffer &&other) noexcept;
    HostBuffer &operator=(HostBuffer &&other) noexcept;
    HostBuffer(const HostBuffer &) = delete;
    HostBuffer &operator=(const HostBuffer &) = delete;

    uint8_t *data() { return data_; }
    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }          // bytes asked for
    size_t mapped_size() const { return mapped_; } // rounded up to whole pages

private:
    uint8_t *data_ = nullptr;
    size_t size_ = 0;
    size_t mapped_ = 0;
};

class ExpertBanks {
public:
    ExpertBanks() = default;
    ExpertBanks(std::vector<BankSpec> schema, int num_layers, int num_experts);
    // Per-layer row sizes: layer_row_bytes[b * num_layers + l] bytes per expert in bank b of layer
    // l (empty: every layer uses schema[b].row_bytes). The schema's row_bytes become the largest
    // over the layers.
    ExpertBanks(std::vector<BankSpec> schema, int num_layers, int num_experts, std::vector<size_t> layer_row_bytes);

    int num_banks() const { return static_cast<int>(schema_.size()); }
    int num_layers() const { return num_layers_; }
    int num_experts() const { return num_experts_; }
    const BankSpec &spec(int bank) const { return schema_[bank]; }
    // The largest row of `bank` over the layers: what a slot of that bank must hold. Equal to
    // every layer's row unless the model mixes formats (uniform()).
    size_t row_bytes(int bank) const { return schema_[bank].row_bytes; }
    // Bytes of one expert's row of `bank` in `layer` (block formats may differ per layer:
    // ModelSpec::layer_formats).
    size_t layer_row_bytes(int bank, int layer) const { return row_bytes_[index(bank, layer)]; }
    // True when every layer's rows have the schema's sizes.
    bool uniform() const { return uniform_; }

    uint8_t *row(int bank, int layer, int expert) {
        const size_t i = index(bank, layer);
        return buffers_[i].data() + static_cast<size_t>(expert) * row_bytes_[i];
    }
    const uint8_t *row(int bank, int layer, int expert) const {
        const size_t i = index(bank, layer);
        return buffers_[i].data() + static_cast<size_t>(expert) * row_bytes_[i];
    }
    const uint8_t *layer_base(int bank, int layer) const { return buffers_[index(bank, layer)].data(); }
    uint8_t *layer_base(int bank, int layer) { return buffers_[index(bank, layer)].data(); }

    size_t expert_bytes() const;           // one expert across all banks, largest rows (row_bytes)
    size_t expert_bytes(int layer) const;  // one expert of `layer` across all banks, its real rows
    size_t total_bytes() const;            // every expert of every layer, real rows

    // Visits every (bank, layer) allocation, e.g. to page-lock it.
    void for_each_allocation(const std::function<void(uint8_t *data, size_t bytes)> &fn);

private:
    size_t index(int bank, int layer) const { return static_cast<size_t>(bank) * num_layers_ + layer; }

    std::vector<BankSpec> schema_;
    int num_layers_ = 0;
    int num_experts_ = 0;
    std::vector<size_t> row_bytes_;    // [bank][layer]
    bool uniform_ = true;
    std::vector<HostBuffer> buffers_;  // [bank][layer]
};

}  // namespace ft
