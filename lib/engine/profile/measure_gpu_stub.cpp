// The profiler's GPU rig in a build without CUDA: nothing to measure, so the profile keeps its
// GPU figures empty (0 through the C API).
#include "ft/common.hpp"
#include "gather_rig.hpp"

namespace ft::profiler {

bool gather_rig_built() { return false; }

struct GatherRig::Impl {};

GatherRig::GatherRig(int, const HostExperts &, int32_t) {
    fail(FT_ERR_UNSUPPORTED, "this build of FreeToken has no CUDA support (no gather to measure)");
}
GatherRig::~GatherRig() = default;
uint64_t GatherRig::bytes_per_call() const { return 0; }
double GatherRig::time_calls(int) { return 0.0; }
GatherRig::Run GatherRig::run_until(Clock::time_point, Clock::time_point, int, const std::atomic<bool> *) { return {}; }
int64_t GatherRig::slots_that_fit(int, uint64_t) { return 0; }

}  // namespace ft::profiler
