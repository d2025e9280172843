#include "ft/bank.hpp"

#include <sys/mman.h>
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
    : schema_(std::move(schema)), num_layers_(num_layers), num_experts_(num_experts) {
    if (num_layers <= 0 || num_experts <= 0)
        fail(FT_ERR_INVALID_ARGUMENT, "expert banks need at least one layer and one expert");
    buffers_.reserve(schema_.size() * num_layers);
    for (const BankSpec &b : schema_) {
        for (int l = 0; l < num_layers; ++l) buffers_.emplace_back(b.row_bytes * static_cast<size_t>(num_experts));
    }
}

size_t ExpertBanks::expert_bytes() const {
    size_t total = 0;
    for (const BankSpec &b : schema_) total += b.row_bytes;
    return total;
}

size_t ExpertBanks::total_bytes() const {
    return expert_bytes() * static_cast<size_t>(num_experts_) * num_layers_;
}

void ExpertBanks::for_each_allocation(const std::function<void(uint8_t *, size_t)> &fn) {
    for (HostBuffer &b : buffers_) {
        if (b.size()) fn(b.data(), b.mapped_size());
    }
}

}  // namespace ft
