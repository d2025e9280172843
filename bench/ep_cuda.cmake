# EP kernels on one GPU: pack + quantise, group + unpack, reduce + combine against the device copy
# bandwidth of the same run, and the wire bytes per token from the layout (issue 7's table).
add_executable(bench_ep ${CMAKE_CURRENT_LIST_DIR}/bench_ep.cu)
target_link_libraries(bench_ep PRIVATE ft_ep_cuda ft_cuda_device ft_test_support benchmark::benchmark)
set_target_properties(bench_ep PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_ep PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)

# One process, every visible GPU, the NCCL transport: each rank's output checked against the host
# reference, then the dispatch + combine table (--check-only, --bench-only, --quick). Exits 0 with a
# note when fewer than two GPUs or no NCCL are usable.
add_executable(bench_ep_multi_gpu
  ${CMAKE_CURRENT_LIST_DIR}/bench_ep_multi_gpu.cu ${CMAKE_CURRENT_LIST_DIR}/bench_ep_multi_gpu_ranks.cu
  ${CMAKE_CURRENT_LIST_DIR}/bench_ep_multi_gpu_check.cu ${CMAKE_CURRENT_LIST_DIR}/bench_ep_multi_gpu_speed.cu
  ${CMAKE_CURRENT_LIST_DIR}/bench_ep_multi_gpu_placement.cu)
target_link_libraries(bench_ep_multi_gpu PRIVATE ft_ep_cuda ft_cuda_device ft_test_support)
set_target_properties(bench_ep_multi_gpu PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_ep_multi_gpu PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
