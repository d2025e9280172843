# Session-level decode step times of the GPU backends (offload hit rates, hybrid all-miss against
# the additive bound, the f sweep, hybrid vs offload vs cpu) through the public C API, with the
# bounds measured in the same run (bench_backends.cu; its pieces in bench_backends_*.cu). Included
# by bench/CMakeLists.txt when CUDA is on. `bench_backends --quick` for a shorter run.
add_executable(bench_backends ${CMAKE_CURRENT_LIST_DIR}/bench_backends.cu ${CMAKE_CURRENT_LIST_DIR}/bench_backends_measure.cu
               ${CMAKE_CURRENT_LIST_DIR}/bench_backends_models.cu)
target_link_libraries(bench_backends PRIVATE freetoken ft_synth ft_cuda_device CUDA::cudart_static benchmark::benchmark)
set_target_properties(bench_backends PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_backends PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
