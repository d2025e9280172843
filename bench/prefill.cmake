# GPU prefill per format on real shapes against a plain cuBLAS bf16 GEMM pair of the same FLOPs,
# and the bf16 dequantisation against a device copy (bench_prefill; included by
# bench/CMakeLists.txt when CUDA is on).
add_executable(bench_prefill ${CMAKE_CURRENT_LIST_DIR}/bench_prefill.cu)
target_link_libraries(bench_prefill PRIVATE ft_cuda_prefill ft_cuda_device ft_formats ft_test_support benchmark::benchmark)
set_target_properties(bench_prefill PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
