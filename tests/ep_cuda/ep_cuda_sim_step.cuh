// The EP step on one GPU with R ranks simulated by the device-copy transport double
// (sim_transport.hpp), shared by the test_ep_cuda_*.cu tests: run_device runs every rank's
// EpRank in one of the modes and returns the outputs and, in throughput mode with one chunk, what
// each rank received and computed (ep_cuda_sim_step.cu); cases() are the shapes every test covers.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ep_traces.hpp"
#include "freetoken_ep.h"
#include "ep_toy_expert.cuh"
#include "ft/common.hpp"
#include "ft/cuda_device.hpp"
#include "ft/ep.hpp"
#include "ft/ep_cuda.hpp"
#include "ep_sim_reference.cuh"
#include "sim_transport.hpp"

#define REQUIRE_GPU()                                              \
    do {                                                           \
        if (ft::cuda::device_count() == 0) GTEST_SKIP() << "no GPU"; \
    } while (0)

namespace ep_cuda_test {

using namespace ft::ep;
using ft::bf16_to_f32;
using ft::f32_to_bf16;
using ft::test::DeviceArray;
using ft::test::fetch;
using ft::test::Rng;
using namespace ft::test;
namespace epc = ft::ep::cuda;

enum class Run { Throughput, LatencyThreaded, LatencyOneThread, LatencyGraph };

struct DeviceResult {
    std::vector<std::vector<uint16_t>> out;
    // Throughput with one chunk only: what each rank received and computed.
    std::vector<std::vector<uint8_t>> received;
    std::vector<std::vector<int64_t>> expert_offset, row_position;
    std::vector<std::vector<int32_t>> row_route, row_source, row_token;
    std::vector<std::vector<uint16_t>> x_rows, partials;
    std::vector<int32_t> chunks;
    std::vector<std::vector<int64_t>> count_matrix;
    size_t sim_remote_bytes = 0;
    std::vector<size_t> bytes_sent;
};

// One EP step of every rank on this GPU (graph_capture_inputs: LatencyGraph captures on these,
// then replays on `in`).
DeviceResult run_device(const Placement &p, const std::vector<RankInput> &in, int64_t H, WireDtype dtype,
                        const Experts &ex, Run run, int32_t chunks, int64_t max_rows,
                        const std::vector<RankInput> *graph_capture_inputs = nullptr);

// The shapes of the whole-step tests: every R of 2..8, both hidden sizes, every wire dtype.
std::vector<Case> cases();

}  // namespace ep_cuda_test
