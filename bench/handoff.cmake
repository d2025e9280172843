# Per-step cost of the CPU handoff (signal + wait with an empty task), both mechanisms, eager and
# graph-replayed.
add_executable(bench_handoff ${CMAKE_CURRENT_LIST_DIR}/bench_handoff.cu)
target_link_libraries(bench_handoff PRIVATE ft_cuda_handoff ft_cuda_device benchmark::benchmark)
set_target_properties(bench_handoff PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_handoff PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
