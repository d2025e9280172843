# GPU decode expert kernels per format on the real shapes, with the device read bandwidth of the
# same run as the bound (counters GBps, bound_GBps, ratio).
add_executable(bench_experts ${CMAKE_CURRENT_LIST_DIR}/bench_experts.cu)
target_link_libraries(bench_experts PRIVATE ft_cuda_experts ft_cuda_device benchmark::benchmark)
set_target_properties(bench_experts PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_experts PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
