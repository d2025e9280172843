#include "ft/bank.hpp"

#include <sys/mman.h>
#include <algorithm>
#include <unistd.h>

#include "ft/common.hpp"

namespace ft {

namespace {
size_t page_size() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}
}  // namespace

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    const size_t page = page_size();
    mapped_ = (bytes + page - 1) / page * page;
    void *p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        mapped_ = 0;
        size_ = 0;
        fail(FT_ERR_OUT_OF_MEMORY, "cannot map ", bytes, " bytes of host memory for an expert bank");
    }
    data_ = static_cast<uint8_t *>(p);
    // Banks are filled once, front to back, then read in large rows: transparent huge pages cut
    // the page faults of filling 512-fold (loading ran 3-16x faster with them). Only a hint;
    // where THP is off it does nothing.
    if (mapped_ >= (size_t{2} << 20)) madvise(p, mapped_, MADV_HUGEPAGE);
}

HostBuffer::~HostBuffer() {
    if (data_) munmap(data_, mapped_);
}

HostBuffer::HostBuffer(HostBuffer &&o) noexcept : data_(o.data_), size_(o.size_), mapped_(o.mapped_) {
    o.data_ = nullptr;
    o.size_ = o.mapped_ = 0;
}

HostBuffer &HostBuffer::operator=(HostBuffer &&o) noexcept {
    if (this != &o) {
        if (data_) munmap(data_, mapped_);
        data_ = o.data_;
        size_ = o.size_;
        mapped_ = o.mapped_;
        o.data_ = nullptr;
        o.size_ = o.mapped_ = 0;
    }
    return *this;
}

ExpertBanks::ExpertBanks(std::vector<BankSpec> schema, int num_layers, int num_experts)
    : ExpertBanks(std::move(schema), num_layers, num_experts, {}) {}

ExpertBanks::ExpertBanks(std::vector<BankSpec> schema, int num_layers, int num_experts,
                         std::vector<size_t> layer_row_bytes)
    : schema_(std::move(schema)), num_layers_(num_layers), num_experts_(num_experts) {
    if (num_layers <= 0 || num_experts <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "expert banks need at least one layer and one expert");
    const size_t n = schema_.size() * static_cast<size_t>(num_layers);
    if (layer_row_bytes.empty()) {
        row_bytes_.reserve(n);
        for (const BankSpec &b : schema_)
            for (int l = 0; l < num_layers; ++l) row_bytes_.push_back(b.row_bytes);
    } else {
        if (layer_row_bytes.size() != n)
            fail(FT_ERR_INVALID_ARGUMENT, "expert banks: ", layer_row_bytes.size(), " per-layer row sizes for ",
                 schema_.size(), " banks x ", num_layers, " layers");
        row_bytes_ = std::move(layer_row_bytes);
        for (size_t b = 0; b < schema_.size(); ++b) {
            size_t largest = 0;
            for (int l = 0; l < num_layers; ++l) {
                const size_t rb = row_bytes_[index(static_cast<int>(b), l)];
                if (rb == 0) fail(FT_ERR_INVALID_ARGUMENT, "expert banks: bank ", b, " of layer ", l, " has empty rows");
                if (l > 0 && rb != largest) uniform_ = false;
                largest = std::max(largest, rb);
            }
            if (largest != schema_[b].row_bytes) uniform_ = false;
            schema_[b].row_bytes = largest;
        }
    }
    buffers_.reserve(n);
    for (size_t i = 0; i < n; ++i) buffers_.emplace_back(row_bytes_[i] * static_cast<size_t>(num_experts));
}

size_t ExpertBanks::expert_bytes() const {
    size_t total = 0;
    for (const BankSpec &b : schema_) total += b.row_bytes;
    return total;
}

size_t ExpertBanks::expert_bytes(int layer) const {
    size_t total = 0;
    for (int b = 0; b < num_banks(); ++b) total += layer_row_bytes(b, layer);
    return total;
}

size_t ExpertBanks::total_bytes() const {
    size_t total = 0;
    for (size_t rb : row_bytes_) total += rb;
    return total * static_cast<size_t>(num_experts_);
}

void ExpertBanks::for_each_allocation(const std::function<void(uint8_t *, size_t)> &fn) {
    for (HostBuffer &b : buffers_) {
        if (b.size()) fn(b.data(), b.mapped_size());
    }
}

}  // namespace ft
