// The `gpu` backend: every expert of every layer resident in device memory.
#include "backend_base.hpp"
#include "ft/device_util.hpp"

namespace ft::gpu_backend {
namespace {

class ResidentBackend final : public CudaBackend {
public:
    explicit ResidentBackend(const BackendContext &ctx) : CudaBackend(ctx) {
        DeviceScope scope(device_);
        const ExpertBanks &banks = ctx.model->banks();
        const size_t L = size_t(spec_.num_layers), E = size_t(spec_.num_experts);
        uniform_ = banks.uniform();
        for (int b = 0; b < banks.num_banks(); ++b) {
            if (uniform_) {
                arrays_.emplace_back(L * E * banks.row_bytes(b), "allocating resident expert memory (the model does not fit: use the offload backend)");
                for (size_t l = 0; l < L; ++l)
                    check(cudaMemcpy(arrays_.back().get() + l * E * banks.row_bytes(b), banks.layer_base(b, int(l)),
                                     E * banks.row_bytes(b), cudaMemcpyHostToDevice),
                          "copying experts to the GPU");
                continue;
            }
            // Rows that differ per layer (mixed block formats): each layer at its own row size,
            // layers 256-byte aligned one after the other.
            size_t total = 0;
            for (size_t l = 0; l < L; ++l) {
                layer_offset_.push_back(total);
                total += (E * banks.layer_row_bytes(b, int(l)) + 255) / 256 * 256;
            }
            arrays_.emplace_back(total, "allocating resident expert memory (the model does not fit: use the offload backend)");
            for (size_t l = 0; l < L; ++l)
                check(cudaMemcpy(arrays_.back().get() + layer_offset_[b * L + l], banks.layer_base(b, int(l)),
                                 E * banks.layer_row_bytes(b, int(l)), cudaMemcpyHostToDevice),
                      "copying experts to the GPU");
        }
    }

private:
    void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y, int32_t tokens,
                    cudaStream_t stream) override {
        int64_t *row = layer_stats_.get<int64_t>() + size_t(layer) * kLayerColumns;
        check(cuda::launch_resident_slots(ids, slots_.get<int32_t>(), int64_t(tokens) * spec_.top_k, spec_.num_experts, row, stream),
              "launching the slot rewrite");
        const cuda::DeviceExperts experts = layer_experts(layer);
        check(decoder_->decode(experts, x, slots_.get<int32_t>(), w, nullptr, y, tokens, stream, ids),
              "launching the expert kernels");
    }

    cuda::DeviceExperts prefill_experts(int32_t layer, cudaStream_t, ft_session_stats &) override {
        return layer_experts(layer);
    }

    // Layer `layer`'s experts at slot = expert id, in the layer's formats (device_experts).
    cuda::DeviceExperts layer_experts(int32_t layer) const {
        if (uniform_) return device_experts(arrays_, size_t(layer) * spec_.num_experts, layer);
        cuda::DeviceExperts d = device_experts(arrays_, 0, layer);
        const ExpertBanks &banks = ctx_.model->banks();
        for (int b = 0; b < d.num_banks; ++b) {
            d.base[b] = arrays_[b].get() + layer_offset_[size_t(b) * spec_.num_layers + layer];
            d.row_bytes[b] = banks.layer_row_bytes(b, layer);
        }
        return d;
    }

    std::vector<DeviceBuffer> arrays_;  // per bank: [L][E] experts
    bool uniform_ = true;               // every layer's rows of a bank have one size
    std::vector<size_t> layer_offset_;  // [bank][layer] byte offset of the layer (not uniform_)
};

}  // namespace

std::unique_ptr<Backend> make_resident_backend(const BackendContext &ctx) { return std::make_unique<ResidentBackend>(ctx); }

}  // namespace ft::gpu_backend
