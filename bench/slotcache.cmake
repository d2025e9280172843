# Slot cache admission latency per layer call (docs/formulas.md, "Slot cache"), in CUDA-graph replay: LRU and hybrid,
# S in {2048, 8192, 65536}, 8 tokens x K = 8 with exactly 0 or 8 misses per call. Target: <= 5 us
# at S = 8192 with 8 misses.
add_executable(bench_admission ${CMAKE_CURRENT_LIST_DIR}/bench_admission.cu)
target_link_libraries(bench_admission PRIVATE ft_slotcache_cuda benchmark::benchmark CUDA::cudart_static)
set_target_properties(bench_admission PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_admission PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)

# The same benchmark over admission.cu built with its phase stamps (FT_ADMISSION_TRACE): mean SM
# cycles from kernel entry to each phase boundary, and which victim path each call took.
add_executable(bench_admission_trace ${CMAKE_CURRENT_LIST_DIR}/bench_admission.cu
  ${PROJECT_SOURCE_DIR}/cuda/slotcache/admission.cu)
target_compile_definitions(bench_admission_trace PRIVATE FT_ADMISSION_TRACE=1)
target_link_libraries(bench_admission_trace PRIVATE ft_slotcache ft_cuda_device benchmark::benchmark CUDA::cudart_static)
set_target_properties(bench_admission_trace PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_admission_trace PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
