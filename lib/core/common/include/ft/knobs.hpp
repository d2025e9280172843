// The environment knobs (FT_*): one registry, read into an engine's Tuning when the engine is
// created. One FT_KNOB line per knob: field, variable, type, default, one-line doc. docs/knobs.md
// lists them; the test Knobs.DocMatchesRegistry keeps that file equal to knobs_markdown().
//
// Read at engine creation (read_tuning), never cached in statics: a setenv before the next
// ft_engine_create takes effect for that engine. FT_LOG is the exception: logging exists before
// any engine, so it is read once per process (lib/core/common/common.cpp).
#pragma once

#include <cstddef>
#include <string>

namespace ft {

enum class KnobType { integer, boolean, text };

// X(field, variable, type, default, doc). Types: Int (int), Bool (0 or 1), Text (a string; ""
// = unset). A default of -1 for an Int means "chosen from the machine" (the doc says how).
#define FT_KNOBS(X)                                                                                                   \
    X(log, "FT_LOG", Text, "warn", "log level: off, error, warn, info, debug (process-wide, read at the first log line)") \
    X(cpu_isa, "FT_CPU_ISA", Text, "", "cap the CPU kernel tier: scalar, avx2, avx512, avx512bf16 (only lowers it)")  \
    X(cpu_prefetch, "FT_CPU_PREFETCH", Int, 512,                                                                      \
      "CPU kernels' software prefetch distance in bytes ahead of each weight row (0 = off; mxfp4: this / 8 K rows; GGUF block formats other than q4_0: 4 x this)")   \
    X(cpu_spin_us, "FT_CPU_SPIN_US", Int, 100, "microseconds an idle CPU worker polls before it sleeps")             \
    X(cpu_vnni, "FT_CPU_VNNI", Bool, 1, "q4_0, nvfp4, ds_fp4 and the GGUF block formats through their AVX-512-VNNI kernels where cpuid has avx512vnni (0 = the tier's AVX-512F/BW or AVX-512-BF16 kernels); at the avx2 tier nvfp4, ds_fp4, mxfp4, q4_0 and the GGUF block formats through their AVX-VNNI builds where cpuid has avx_vnni (same results; 0 = plain AVX2)") \
    X(cpu_amx, "FT_CPU_AMX", Bool, 1,                                                                                 \
      "calls of 2 or more tokens on AMX tiles at the avx512bf16 tier where cpuid has them and the OS grants the tile state: the bf16 GEMV (bf16 experts, the quantised batched path) and fp8_block on AMX-BF16, mxfp4 and ds_fp4 on AMX-BF16 with VBMI (ds_fp4 from 3 tokens with AVX-512-VNNI), q2_k and q3_k on AMX-INT8 with VBMI (their calls of 5 or more tokens) (0 = the AVX-512 kernels)") \
    X(cpu_mxfp4_w4a8, "FT_CPU_MXFP4_W4A8", Bool, 1,                                                                   \
      "mxfp4 through the W4A8 x2 kernel where cpuid has avx512vnni and avx512vbmi (same error bound; 0 = the W4A16 VBMI kernel); the AVX2 tier's mxfp4 kernel is W4A8 x2 whatever this says") \
    X(cpu_nvfp4_w4a8, "FT_CPU_NVFP4_W4A8", Bool, 0,                                                                   \
      "nvfp4 through the W4A8 kernel (needs avx512vnni); faster, but layer error ~1.3e-2, over nvfp4's 1e-2 bound")   \
    X(cpu_quant_batched_min_tokens, "FT_CPU_QUANT_BATCHED_MIN_TOKENS", Int, -1,                                       \
      "quantised experts with at least this many routes in a call are dequantised to bf16 tiles (0 = never; -1: 8 on the AMX GEMV, FT_CPU_AMX, else 16)") \
    X(cpu_onednn_min_tokens, "FT_CPU_ONEDNN_MIN_TOKENS", Int, -1,                                                     \
      "bf16 experts with at least this many routes go through oneDNN (0 = never; -1: 64 with AMX-BF16 and FT_CPU_AMX=0, else never)") \
    X(handoff, "FT_HANDOFF", Text, "", "hybrid CPU handoff: memops (stream memory operations) or hostfn; unset = probe") \
    X(cuda_pdl, "FT_CUDA_PDL", Bool, 1, "programmatic dependent launch of the GPU kernel chains (sm_90+; 0 = plain launches)") \
    X(prefill_gemm, "FT_PREFILL_GEMM", Text, "", "GPU prefill GEMMs: grouped = one cuBLAS grouped call per chunk; unset = one GEMM per expert") \
    X(prefill_dequant_mib, "FT_PREFILL_DEQUANT_MIB", Int, 512, "GPU prefill: MiB of bf16 scratch for dequantised experts (both buffers together)") \
    X(prefill_chunk_rows, "FT_PREFILL_CHUNK_ROWS", Int, 0, "GPU prefill: routed rows per GEMM chunk (0 = from max_tokens)") \
    X(cublas_library, "FT_CUBLAS_LIBRARY", Text, "", "path of the libcublas to load first (process-wide: loaded once)") \
    X(profile_path, "FT_PROFILE_PATH", Text, "", "bandwidth profile file (unset: $XDG_CACHE_HOME/freetoken/benchbw.json)") \
    X(trace_routes, "FT_TRACE_ROUTES", Text, "", "append every host ft_decode call's layer and expert ids to this route trace file (docs/formats.md)")

namespace knob_types {
using Int = int;
using Bool = bool;
using Text = std::string;
}  // namespace knob_types

// Every knob's value for one engine.
struct Tuning {
#define FT_KNOB_FIELD(field, var, type, def, doc) knob_types::type field = knob_types::type(def);
    FT_KNOBS(FT_KNOB_FIELD)
#undef FT_KNOB_FIELD
};

struct KnobInfo {
    const char *name;           // FT_...
    KnobType type;
    const char *default_text;   // as docs/knobs.md shows it
    const char *doc;
};

// The registry, in FT_KNOBS order.
const KnobInfo *knobs(size_t *count);

// Reads every knob from the environment. A value that does not parse as the knob's type is
// ignored (the default stays). With `log_set` (engine creation) each set knob is logged at
// FT_LOG=info and each ignored value with a warning; other readers pass false and stay quiet.
Tuning read_tuning(bool log_set = true);

// The table of docs/knobs.md generated from the registry (markdown, one row per knob).
std::string knobs_markdown();

}  // namespace ft
