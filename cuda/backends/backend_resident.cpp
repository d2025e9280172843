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
        for (int b = 0; b < banks.num_banks(); ++b) {
            arrays_.emplace_back(L * E * banks.row_bytes(b), "allocating resident expert memory (the model does not fit: use the offload backend)");
            for (size_t l = 0; l < L; ++l)
                check(cudaMemcpy(arrays_.back().get() + l * E * banks.row_bytes(b), banks.layer_base(b, int(l)),
                                 E * banks.row_bytes(b), cudaMemcpyHostToDevice),
                      "copying experts to the GPU");
        }
    }

private:
    void run_decode(int32_t layer, const uint16_t *x, const int32_t *ids, const float *w, uint16_t *y, int32_t tokens,
                    cudaStream_t stream) override {
        int64_t *row = layer_stats_.get<int64_t>() + size_t(layer) * kLayerColumns;
        check(cuda::launch_resident_slots(ids, slots_.get<int32_t>(), int64_t(tokens) * spec_.top_k, spec_.num_experts, row, stream),
              "launching the slot rewrite");
        const cuda::DeviceExperts experts = with_biases(device_experts(arrays_, size_t(layer) * spec_.num_experts), layer);
        check(decoder_->decode(experts, x, slots_.get<int32_t>(), w, nullptr, y, tokens, stream, ids),
              "launching the expert kernels");
    }

    cuda::DeviceExperts prefill_experts(int32_t layer, cudaStream_t, ft_session_stats &) override {
        return device_experts(arrays_, size_t(layer) * spec_.num_experts);
    }

    std::vector<DeviceBuffer> arrays_;  // per bank: [L][E] experts
};

}  // namespace

std::unique_ptr<Backend> make_resident_backend(const BackendContext &ctx) { return std::make_unique<ResidentBackend>(ctx); }

}  // namespace ft::gpu_backend
