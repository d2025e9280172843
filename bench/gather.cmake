# Gather of planned experts, both methods and the zero-copy kernel variants, next to linear pinned
# H2D in the same run (bench_gather.cu). Included by bench/CMakeLists.txt when CUDA is on.
add_executable(bench_gather ${CMAKE_CURRENT_LIST_DIR}/bench_gather.cu)
target_link_libraries(bench_gather PRIVATE ft_cuda_gather ft_formats benchmark::benchmark)
set_target_properties(bench_gather PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_gather PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
