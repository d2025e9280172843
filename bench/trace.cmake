# Decode traces (Zipf with locality, or an FT_TRACE_ROUTES file) through offload, hybrid and cpu
# for several geometries, against per-step bounds from bandwidths measured in the same run, with
# the simulated Belady / LRU / policy hit rates (bench_trace.cu; bench/run_trace.sh runs the table).
add_executable(bench_trace ${CMAKE_CURRENT_LIST_DIR}/bench_trace.cu)
target_link_libraries(bench_trace PRIVATE freetoken ft_synth ft_slotcache ft_trace CUDA::cudart_static)
set_target_properties(bench_trace PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
