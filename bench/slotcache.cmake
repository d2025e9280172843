# Slot cache admission latency per layer call (spec 4.3, 4.4), in CUDA-graph replay: LRU and hybrid,
# S in {2048, 8192, 65536}, 8 tokens x K = 8 with exactly 0 or 8 misses per call. Target: <= 5 us
# at S = 8192 with 8 misses.
add_executable(bench_admission ${CMAKE_CURRENT_LIST_DIR}/bench_admission.cu)
target_link_libraries(bench_admission PRIVATE ft_slotcache_cuda benchmark::benchmark CUDA::cudart_static)
set_target_properties(bench_admission PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(bench_admission PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
