// The CPU session backend (FT_BACKEND_CPU): every routed expert of a decode call computed by the
// MoE executor straight from the host banks. Also the executor's view of one layer of a model's
// banks, which the hybrid GPU backend's CPU share reads the same way.
#pragma once

#include <cstdint>
#include <memory>

#include "ft/backend.hpp"
#include "ft/cpu.hpp"
#include "ft/model.hpp"

namespace ft::cpu {

// The banks of `layer` of `model` as the executor reads them. Throws FT_ERR_INTERNAL when the
// format has more banks than ExpertSource holds.
ExpertSource expert_source(const Model &model, int32_t layer);

// The CPU backend for ctx.model on ctx.pool (ctx.cpu_isa, ctx.tuning, ctx.params). Throws
// FT_ERR_INVALID_ARGUMENT when params.shared_experts asks for a shared expert the model lacks.
std::unique_ptr<Backend> make_cpu_backend(const BackendContext &ctx);

}  // namespace ft::cpu
