/*
 * freetoken.h - the stable C API of libfreetoken.
 *
 * FreeToken computes the routed experts of Mixture-of-Experts (MoE) layers whose weights live
 * in host memory. A host runtime hands over, per MoE layer and step, the hidden states and the
 * router's choice (expert ids and weights), and receives the weighted sum of the routed experts'
 * outputs.
 *
 * This header is self-contained C99. It is the specification of the library: every function
 * documents its parameters, return codes, ownership and thread-safety.
 *
 * ------------------------------------------------------------------------------------------
 * Conventions
 * ------------------------------------------------------------------------------------------
 * - Every fallible call returns an ft_status (FT_OK = 0). Values never change meaning and are
 *   never reused; ft_status_string() names them.
 * - Handles are opaque. A handle's most recent error text is returned by its *_last_error()
 *   function; the text stays valid until the next call on that handle. Failures before a handle
 *   exists (creation, loading) write their text into a caller-supplied buffer (err, err_size),
 *   which may be NULL.
 * - Parameter structs start with `uint32_t struct_size`, are filled with defaults by their
 *   *_params_init() function, and only ever grow at the end. The library reads
 *   min(struct_size, its own size) bytes and uses defaults for fields the caller did not know.
 *   Output structs (info, stats) work the same way: the library writes at most struct_size bytes.
 * - Every *_free() accepts NULL.
 * - bf16 values are passed as their 16-bit patterns (uint16_t), as stored in checkpoints.
 * - No exception, abort or signal crosses this API. No global initialisation call is needed.
 *
 * ------------------------------------------------------------------------------------------
 * Threading contract
 * ------------------------------------------------------------------------------------------
 * - ft_version_*, ft_status_string, ft_build_info_get and ft_log_set_callback may be called
 *   from any thread at any time.
 * - An ft_engine may be shared by many threads once created. Its worker pool runs one decode at
 *   a time; concurrent sessions of one engine take turns.
 * - An ft_model is built by one thread (ft_model_create, ft_model_set_*, ft_model_finalize) and
 *   is immutable and shareable by any number of threads and sessions after ft_model_load returns
 *   or ft_model_finalize succeeds. It must outlive its sessions.
 * - An ft_session is used by one thread at a time (any thread, not necessarily the same one).
 * - An ft_profile is immutable once made (ft_profile_bandwidth, ft_profile_load) and may be
 *   read from any number of threads.
 * - The engine must outlive its models and sessions.
 */
#ifndef FREETOKEN_H
#define FREETOKEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  if defined(FT_BUILDING_LIBRARY)
#    define FT_API __declspec(dllexport)
#  else
#    define FT_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define FT_API __attribute__((visibility("default")))
#else
#  define FT_API
#endif

/* ==========================================================================================
 * Version
 * ========================================================================================== */

#define FT_VERSION_MAJOR 0
#define FT_VERSION_MINOR 8
#define FT_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH */
#define FT_VERSION_NUMBER (FT_VERSION_MAJOR * 10000 + FT_VERSION_MINOR * 100 + FT_VERSION_PATCH)

/* The version of the library actually loaded (may differ from the header's). */
FT_API uint32_t ft_version_number(void);
/* "MAJOR.MINOR.PATCH", static storage. */
FT_API const char *ft_version_string(void);

/* ==========================================================================================
 * Status codes (values fixed forever)
 * ========================================================================================== */

typedef int32_t ft_status;

#define FT_OK                    0
#define FT_ERR_INVALID_ARGUMENT  1  /* NULL pointer, out-of-range value, wrong shape           */
#define FT_ERR_OUT_OF_MEMORY     2  /* host or device allocation failed                        */
#define FT_ERR_IO                3  /* file missing, unreadable, short read                    */
#define FT_ERR_FORMAT            4  /* corrupt or inconsistent checkpoint / JSON / layout      */
#define FT_ERR_UNSUPPORTED       5  /* valid request this build or machine cannot serve        */
#define FT_ERR_NO_DEVICE         6  /* a GPU was required and none is usable                   */
#define FT_ERR_DEVICE            7  /* a CUDA call failed                                      */
#define FT_ERR_DEVICE_LOST       8  /* a sticky device fault; the session cannot continue      */
#define FT_ERR_TIMEOUT           9  /* a handoff or wait did not complete in time              */
#define FT_ERR_CANCELLED        10  /* a progress callback asked to stop                       */
#define FT_ERR_NON_FINITE       11  /* NaN or Inf in an input that must be finite              */
#define FT_ERR_STATE            12  /* call not valid in the handle's current state            */
#define FT_ERR_INTERNAL         13  /* a bug in FreeToken; please report the message           */

/* A static, never-NULL name for a status ("FT_ERR_FORMAT"); unknown values give "FT_ERR_UNKNOWN". */
FT_API const char *ft_status_string(ft_status status);

/* ==========================================================================================
 * Enumerations (int32_t values fixed forever)
 * ========================================================================================== */

/* Expert weight formats (byte layouts: see the README's format table). */
#define FT_FORMAT_BF16      1 /* bf16 weights                                                */
#define FT_FORMAT_FP8_BLOCK 2 /* e4m3 weights, 128x128 block scales (DeepSeek-V3, Qwen3.5-FP8) */
#define FT_FORMAT_NVFP4     3 /* e2m1, e4m3 scale per 16, fp16 global per row (ModelOpt NVFP4)  */
#define FT_FORMAT_MXFP4     4 /* e2m1, e8m0 scale per 32, biases (gpt-oss)                      */
#define FT_FORMAT_DS_FP4    5 /* e2m1, e8m0 scale per 32 (DeepSeek-V4)                          */
#define FT_FORMAT_Q4_0      6 /* GGUF Q4_0 blocks of 32                                         */
#define FT_FORMAT_Q8_0      7 /* GGUF Q8_0 blocks of 32                                         */
#define FT_FORMAT_Q2_K      8 /* GGUF Q2_K super-blocks of 256                                  */
#define FT_FORMAT_Q3_K      9 /* GGUF Q3_K super-blocks of 256                                  */
#define FT_FORMAT_Q4_K     10 /* GGUF Q4_K super-blocks of 256                                  */
#define FT_FORMAT_Q5_K     11 /* GGUF Q5_K super-blocks of 256                                  */
#define FT_FORMAT_Q6_K     12 /* GGUF Q6_K super-blocks of 256                                  */
#define FT_FORMAT_IQ4_XS   13 /* GGUF IQ4_XS super-blocks of 256                                */

/* Data types of tensors returned by ft_model_tensor. */
#define FT_DTYPE_BF16 1
#define FT_DTYPE_F32  2

/* Expert activations: out = act(gate) * up, applied per intermediate unit. */
#define FT_ACT_SILU         0 /* x * sigmoid(x)                                             */
#define FT_ACT_GELU         1 /* 0.5 x (1 + erf(x / sqrt 2))                                */
#define FT_ACT_GELU_TANH    2 /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))            */
#define FT_ACT_SWIGLU_CLAMP 3 /* g = min(g, limit), u = clamp(u, +-limit),
                                 out = g * sigmoid(alpha g) * (u + 1)                        */

/* Routing rules (what ft_route does with router logits). */
#define FT_ROUTING_SOFTMAX_TOPK        1 /* softmax over all experts, top-k of the probabilities,
                                            no renormalisation (Qwen3-MoE norm_topk_prob=false) */
#define FT_ROUTING_SOFTMAX_TOPK_RENORM 2 /* softmax, top-k, weights renormalised to sum 1
                                            (Qwen3-MoE, Qwen3.5/3.6-MoE, Mixtral)              */
#define FT_ROUTING_SIGMOID_GROUP_TOPK  3 /* sigmoid scores; selection on score + correction bias,
                                            limited to the best groups; unbiased weights,
                                            optionally renormalised, times routed_scaling_factor
                                            (DeepSeek-V3, Kimi-K2, GLM-4.x)                     */
#define FT_ROUTING_TOPK_SOFTMAX        4 /* top-k of the logits, softmax over the k (gpt-oss)  */
#define FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK 5 /* as FT_ROUTING_SIGMOID_GROUP_TOPK with scores
                                            sqrt(softplus(logit)) (DeepSeek-V4)                */
#define FT_ROUTING_TOPK_SIGMOID        6 /* top-k of the logits, weight sigmoid(logit), no
                                            renormalisation (Llama-4)                          */
#define FT_ROUTING_SOFTMAX_GROUP_TOPK  7 /* softmax; top-k within the topk_groups groups whose best
                                            probability is highest; weights the probabilities,
                                            renormalised if renormalize, times
                                            routed_scaling_factor (DeepSeek-V2; num_groups 1 is
                                            its greedy variant)                                */
#define FT_ROUTING_SOFTMAX_BIASED_TOPK 8 /* as FT_ROUTING_SIGMOID_GROUP_TOPK with softmax scores:
                                            selection on probability + correction bias, weights
                                            the unbiased probabilities (ERNIE-4.5)             */
#define FT_ROUTING_SPARSEMIXER         9 /* PhiMoE inference routing, top_k 2: route j takes the
                                            best logit m_j not yet taken; its weight is the
                                            softmax of m_j among the logits s (the earlier
                                            routes' excluded) with (m_j - s) / max(|s|, m_j)
                                            <= 2 * router_jitter_eps                            */

/* How ft_decode applies a route's weight (ft_model_info.route_weight). */
#define FT_ROUTE_WEIGHT_OUTPUT 0 /* w * expert(x): every model but Llama-4                     */
#define FT_ROUTE_WEIGHT_INPUT  1 /* expert(w * x): the weight scales the expert's input
                                    (Llama-4); x * w is rounded to bf16 before the expert      */

/* Backends. */
#define FT_BACKEND_AUTO    0 /* the best backend this engine can run for the model          */
#define FT_BACKEND_CPU     1 /* every routed expert computed by the CPU from host memory      */
#define FT_BACKEND_GPU     2 /* every expert copied once into GPU memory and computed there   */
#define FT_BACKEND_OFFLOAD 3 /* a GPU slot cache of hot experts; misses fetched over PCIe     */
#define FT_BACKEND_HYBRID  4 /* offload, with part of each step's misses computed by the CPU
                                straight from host memory at the same time                    */

/* Log levels. */
#define FT_LOG_OFF   0
#define FT_LOG_ERROR 1
#define FT_LOG_WARN  2
#define FT_LOG_INFO  3
#define FT_LOG_DEBUG 4

/* ==========================================================================================
 * Build information and logging
 * ========================================================================================== */

typedef struct ft_build_info {
    uint32_t struct_size;     /* set by the caller to sizeof(ft_build_info)                    */
    uint32_t version_number;  /* as ft_version_number()                                        */
    bool cuda;                /* built with CUDA support                                       */
    bool nccl;                /* built with NCCL support                                       */
    uint8_t reserved_[2];
    int32_t cuda_runtime_version; /* e.g. 13000; 0 without CUDA                                */
    const char *cuda_archs;   /* e.g. "86;89;90;120"; "" without CUDA (static storage)         */
    const char *onednn_version; /* e.g. "2.6.3" (static storage)                               */
    const char *cpu_isa;      /* best kernel tier this CPU runs, e.g. "avx512bf16" (static)   */
    const char *compiler;     /* compiler and version (static storage)                         */
    /* Since 0.4. Whether oneDNN can run a bf16 matmul on this CPU (it needs AVX-512 or newer,
     * and honours ONEDNN_MAX_CPU_ISA). When false the CPU backend never takes its oneDNN
     * batched path; the SIMD kernels compute every route. */
    bool onednn_bf16;
} ft_build_info;

/* Fills *info up to info->struct_size bytes. FT_ERR_INVALID_ARGUMENT if info is NULL or
 * struct_size is smaller than 8. Thread-safe. */
FT_API ft_status ft_build_info_get(ft_build_info *info);

/* Receives one formatted line (no trailing newline) per message. */
typedef void (*ft_log_fn)(void *user_data, int32_t level, const char *message);

/* Routes library log messages of `level` or more severe to `fn` (NULL: standard error).
 * The default level is FT_LOG_WARN, or the value of the FT_LOG environment variable
 * (0..4 or off/error/warn/info/debug). Process-wide; thread-safe; the callback may be
 * called from any library thread and must not call back into the library. */
FT_API void ft_log_set_callback(ft_log_fn fn, void *user_data, int32_t level);

/* Progress callback for long operations: `done` of `total` units of the named phase.
 * Return true to continue, false to cancel (the operation then returns FT_ERR_CANCELLED). */
typedef bool (*ft_progress_fn)(void *user_data, const char *phase, uint64_t done, uint64_t total);

/* ==========================================================================================
 * Engine: the machine context (CPU worker pool, GPU choice)
 * ========================================================================================== */

typedef struct ft_engine ft_engine;

#define FT_DEVICE_AUTO (-2) /* the first CUDA device if one is usable, else none                */
#define FT_DEVICE_NONE (-1) /* never touch a GPU                                                */

typedef struct ft_engine_params {
    uint32_t struct_size;
    int32_t device;       /* CUDA device ordinal, FT_DEVICE_AUTO (default) or FT_DEVICE_NONE.
                             With a device, host expert banks are page-locked for it.          */
    int32_t cpu_threads;  /* worker threads; 0 (default) = one per physical core, less two when
                             the engine uses a GPU (less one below 4 cores): those cores are
                             left to the thread that drives the GPU and to the hybrid
                             coordinator. At most 4096
                             (FT_ERR_INVALID_ARGUMENT beyond); a count above the logical CPUs
                             of the process's affinity set is clamped to them (logged; the
                             count in use is ft_engine_info.cpu_threads)                       */
    bool pin_threads;     /* pin each worker to its own core (default true)                    */
    uint8_t reserved_[3];
} ft_engine_params;

FT_API void ft_engine_params_init(ft_engine_params *params);

/* Creates an engine. params may be NULL (defaults). On failure *out is NULL and err receives a
 * message. FT_ERR_NO_DEVICE if an explicit device ordinal is not usable. */
FT_API ft_status ft_engine_create(const ft_engine_params *params, ft_engine **out,
                                  char *err, size_t err_size);
FT_API void ft_engine_free(ft_engine *engine);
FT_API const char *ft_engine_last_error(const ft_engine *engine);

typedef struct ft_engine_info {
    uint32_t struct_size;
    int32_t device;        /* CUDA device in use, or FT_DEVICE_NONE                            */
    int32_t cpu_threads;   /* worker threads                                                   */
    int32_t physical_cores;/* physical cores in the process's affinity set                     */
    const char *cpu_isa;   /* kernel tier in use (static storage)                              */
    const char *device_name; /* GPU name, "" without one; valid while the engine lives         */
} ft_engine_info;

FT_API ft_status ft_engine_get_info(const ft_engine *engine, ft_engine_info *info);

/* ==========================================================================================
 * Model: expert weights in host banks, geometry and routing rule. Immutable once built.
 * ========================================================================================== */

typedef struct ft_model ft_model;

typedef struct ft_model_load_params {
    uint32_t struct_size;
    int32_t io_threads;        /* parallel readers; 0 (default) = engine's worker count        */
    ft_progress_fn progress;   /* optional; phase "load"; units are bytes                      */
    void *progress_user_data;
} ft_model_load_params;

FT_API void ft_model_load_params_init(ft_model_load_params *params);

/* Loads the routed experts of every MoE layer of a Hugging Face checkpoint directory
 * (config.json, model.safetensors or sharded safetensors with model.safetensors.index.json) or
 * of a GGUF file (or a directory holding exactly one).
 * Supported: Qwen3-MoE, Qwen3.5/3.6-MoE, Mixtral, DeepSeek-V3, Kimi-K2, GLM-4.x MoE with bf16
 * experts (per expert or pre-fused), block-FP8 or ModelOpt NVFP4 experts; gpt-oss (MXFP4);
 * DeepSeek-V4 (ds_fp4); GGUF models with Q4_0/BF16/F16/F32 experts. Router weights, router
 * biases and shared experts are read too (ft_model_tensor). params may be NULL.
 * Errors: FT_ERR_IO (missing/unreadable files), FT_ERR_FORMAT (corrupt header, inconsistent or
 * ambiguous layout, missing tensor: the message names the file and tensor), FT_ERR_UNSUPPORTED
 * (architecture or dtype not served), FT_ERR_OUT_OF_MEMORY, FT_ERR_CANCELLED.
 * Limits (docs/limits.md; FT_ERR_FORMAT naming the field beyond them): at most 4096 layers,
 * 65536 experts per layer, widths (hidden, intermediate, shared expert) of 2^20; config.json,
 * model.safetensors.index.json and hf_quant_config.json of at most 64 MiB, JSON nested at most
 * 64 deep; an index naming at most 65536 shard files; safetensors headers of at most 100 MiB.
 * Every count and size a file declares is checked against the file before it is used.
 * Weights are not scanned for NaN/Inf: a NaN or Inf in a weight or scale makes the outputs of
 * the tokens routed to that expert NaN/Inf (or garbage), never undefined behaviour. */
FT_API ft_status ft_model_load(ft_engine *engine, const char *path,
                               const ft_model_load_params *params, ft_model **out,
                               char *err, size_t err_size);

/* Geometry of a model built from memory. */
typedef struct ft_model_desc {
    uint32_t struct_size;
    int32_t num_layers;        /* MoE layers                                       (required)  */
    int32_t num_experts;       /* routed experts per layer, E                      (required)  */
    int32_t top_k;             /* routes per token, K                              (required)  */
    int32_t hidden_size;       /* H                                                (required)  */
    int32_t intermediate_size; /* I, per expert                                    (required)  */
    int32_t format;            /* FT_FORMAT_BF16 (default; the only format built from memory,
                                  quantised models come from checkpoints)                      */
    int32_t activation;        /* FT_ACT_SILU (default)                                        */
    float swiglu_alpha;        /* FT_ACT_SWIGLU_CLAMP alpha (default 1.702)                    */
    float swiglu_limit;        /* FT_ACT_SWIGLU_CLAMP limit (default 7.0; INFINITY = none)     */
    int32_t routing;           /* FT_ROUTING_* (default FT_ROUTING_SOFTMAX_TOPK_RENORM)        */
    int32_t num_groups;        /* FT_ROUTING_SIGMOID_GROUP_TOPK: expert groups (default 1)     */
    int32_t topk_groups;       /* groups kept (default 1)                                      */
    float routed_scaling_factor; /* default 1.0                                                */
    bool renormalize;          /* FT_ROUTING_SIGMOID_GROUP_TOPK: renormalise (default true)    */
    uint8_t reserved_[3];
    /* since 0.5 */
    int32_t route_weight;      /* FT_ROUTE_WEIGHT_* (default FT_ROUTE_WEIGHT_OUTPUT)           */
    float router_jitter_eps;   /* FT_ROUTING_SPARSEMIXER margin (default 0.01)                 */
} ft_model_desc;

FT_API void ft_model_desc_init(ft_model_desc *desc);

/* Creates an empty model to be filled with ft_model_set_expert and made usable with
 * ft_model_finalize. Bank memory is allocated here. FT_ERR_INVALID_ARGUMENT beyond the limits
 * of ft_model_load (4096 layers, 65536 experts, widths of 2^20). */
FT_API ft_status ft_model_create(ft_engine *engine, const ft_model_desc *desc, ft_model **out,
                                 char *err, size_t err_size);

/* Which part of an expert ft_model_set_expert writes. */
#define FT_PROJ_GATE 1 /* [I, H] row-major: gate_proj / w1                                   */
#define FT_PROJ_UP   2 /* [I, H] row-major: up_proj / w3                                     */
#define FT_PROJ_DOWN 3 /* [H, I] row-major: down_proj / w2                                   */

/* Copies one projection of expert `expert` of MoE layer `layer` into the model's banks.
 * For FT_FORMAT_BF16, `data` holds the bf16 weights in the shape above and `nbytes` must equal
 * their size. Only before ft_model_finalize (else FT_ERR_STATE). */
FT_API ft_status ft_model_set_expert(ft_model *model, int32_t layer, int32_t expert,
                                     int32_t proj, const void *data, size_t nbytes);

/* Sets the routing correction bias of a layer ([E] floats; DeepSeek-V3's
 * e_score_correction_bias), used by FT_ROUTING_SIGMOID_GROUP_TOPK. Only before finalize. */
FT_API ft_status ft_model_set_router_bias(ft_model *model, int32_t layer, const float *bias,
                                          int32_t num_experts);

/* Checks that every projection of every expert was set, pins the banks for the engine's GPU if
 * it has one, and makes the model immutable. FT_ERR_STATE names the first missing expert. */
FT_API ft_status ft_model_finalize(ft_model *model);

FT_API void ft_model_free(ft_model *model);

/* Error text of the last failed call on this model (valid until the next call on it). */
FT_API const char *ft_model_last_error(const ft_model *model);

typedef struct ft_model_info {
    uint32_t struct_size;
    int32_t num_layers;        /* MoE layers, L                                                */
    int32_t num_experts;       /* E                                                            */
    int32_t top_k;             /* K                                                            */
    int32_t hidden_size;       /* H                                                            */
    int32_t intermediate_size; /* I                                                            */
    int32_t format;            /* FT_FORMAT_*                                                  */
    int32_t activation;        /* FT_ACT_*                                                     */
    int32_t routing;           /* FT_ROUTING_*                                                 */
    int32_t num_groups, topk_groups;
    float routed_scaling_factor;
    float swiglu_alpha, swiglu_limit;
    int32_t first_moe_layer;   /* checkpoint layer index of MoE layer 0                        */
    int32_t total_layers;      /* decoder layers in the checkpoint (0 for ft_model_create)     */
    int32_t shared_intermediate_size; /* width of the shared expert(s), 0 if none              */
    uint64_t expert_bytes;     /* bytes of one expert across all banks                         */
    uint64_t bank_bytes;       /* bytes of all routed experts of all layers                    */
    const char *architecture;  /* e.g. "qwen3_moe", "custom" (valid while the model lives)     */
    uint64_t pinned_bytes;     /* bank bytes page-locked for the engine's GPU (0 without one)  */
    /* since 0.5 */
    int32_t route_weight;      /* FT_ROUTE_WEIGHT_*                                            */
    float router_jitter_eps;   /* FT_ROUTING_SPARSEMIXER margin                                */
    int32_t expert_biases;     /* 1: the routed experts carry biases (gpt-oss; see
                                  FT_TENSOR_EXPERT_GATE_UP_BIAS), added by ft_decode          */
    int32_t shared_expert_gate; /* 1: the shared expert's output is scaled by
                                   sigmoid(FT_TENSOR_SHARED_GATE_PROJ . x)                     */
    /* since 0.6. GGUF files may give each MoE layer's gate/up and down matrices their own block
     * format; `format` is then MoE layer 0's gate/up format, `expert_bytes` the largest expert
     * over the layers and `bank_bytes` the real total. */
    uint32_t formats_used;     /* bit (1u << FT_FORMAT_x) for every format of some layer's
                                  gate/up or down matrices                                     */
    int32_t mixed_formats;     /* 1: the layers or matrices differ in format (every backend
                                  runs such models; ft_model_layer_formats gives each layer's)*/
    /* since 0.7. DeepSeek-V4: MoE layers 0 .. hash_layers-1 choose their experts by token id
     * (a [vocab_size, top_k] table read from the checkpoint); route them with ft_route_tokens. */
    int32_t hash_layers;       /* hash-routed MoE layers (0: every layer routes by its logits) */
    int32_t vocab_size;        /* token ids those layers accept: [0, vocab_size); 0 if none    */
} ft_model_info;

FT_API ft_status ft_model_get_info(const ft_model *model, ft_model_info *info);

/* Since 0.6. The FT_FORMAT_* of MoE layer `layer`'s gate/up matrices and of its down matrix
 * (both `format` unless the model mixes formats). FT_ERR_INVALID_ARGUMENT for a NULL argument or
 * a layer outside [0, num_layers). */
FT_API ft_status ft_model_layer_formats(const ft_model *model, int32_t layer, int32_t *gate_up_format,
                                        int32_t *down_format);

/* The MoE layer index of checkpoint layer `model_layer`, or -1 if that layer has no routed
 * experts (dense layers, out of range). */
FT_API int32_t ft_model_moe_layer(const ft_model *model, int32_t model_layer);

/* Tensors a model carries besides the routed experts (read from checkpoints). */
#define FT_TENSOR_ROUTER_WEIGHT    1 /* [E, H]   router (gate) linear weight                   */
#define FT_TENSOR_ROUTER_BIAS      2 /* [E]      f32 selection bias (e_score_correction_bias),
                                        or the router linear's bias (gpt-oss)                  */
#define FT_TENSOR_SHARED_GATE      3 /* [Is, H]  shared expert gate_proj                       */
#define FT_TENSOR_SHARED_UP        4 /* [Is, H]  shared expert up_proj                         */
#define FT_TENSOR_SHARED_DOWN      5 /* [H, Is]  shared expert down_proj                       */
#define FT_TENSOR_SHARED_GATE_PROJ 6 /* [1, H]   sigmoid gate of the shared expert (Qwen2/3.5)  */
#define FT_TENSOR_EXPERT_GATE_UP_BIAS 7 /* [E, 2I] f32 biases of the routed experts' gate (first
                                           I of a row) and up (last I) projections (bf16 gpt-oss) */
#define FT_TENSOR_EXPERT_DOWN_BIAS 8 /* [E, H]  f32 biases of the routed experts' down projection */

typedef struct ft_tensor_view {
    uint32_t struct_size;
    int32_t dtype;          /* FT_DTYPE_*                                                      */
    int32_t ndim;
    int64_t shape[4];
    const void *data;       /* row-major; owned by the model, valid while it lives             */
    size_t nbytes;
} ft_tensor_view;

/* Describes tensor `which` of MoE layer `layer`. FT_ERR_INVALID_ARGUMENT for a bad layer or
 * kind; FT_ERR_UNSUPPORTED if the model has no such tensor. Thread-safe. */
FT_API ft_status ft_model_tensor(const ft_model *model, int32_t layer, int32_t which,
                                 ft_tensor_view *view);

/* ==========================================================================================
 * Session: the decode handle of one model on one engine
 * ========================================================================================== */

typedef struct ft_session ft_session;

typedef struct ft_session_params {
    uint32_t struct_size;
    int32_t backend;          /* FT_BACKEND_* (default FT_BACKEND_AUTO)                        */
    int32_t max_tokens;       /* largest num_tokens of one ft_decode (default 256); scratch is
                                 sized once for it, so decode never allocates                  */
    bool shared_experts;      /* ft_decode also adds the model's shared expert(s) (default
                                 false: the caller computes them)                              */
    bool check_finite;        /* reject NaN/Inf hidden states and route weights with
                                 FT_ERR_NON_FINITE (default true). Off: garbage in, garbage out
                                 (a NaN/Inf input makes the outputs that use it NaN/Inf), never
                                 undefined behaviour                                           */
    uint8_t reserved_[2];
    /* GPU backends (since 0.2). The slot cache of FT_BACKEND_OFFLOAD holds cache_slots experts
     * if > 0, else cache_fraction of all experts if > 0, else as many as the free GPU memory
     * minus vram_reserve_bytes holds; never fewer than one layer (E) nor more than all (L*E). */
    int64_t cache_slots;      /* default 0                                                     */
    double cache_fraction;    /* default 0                                                     */
    uint64_t vram_reserve_bytes; /* memory left to the caller; default 2 GiB                  */
    int32_t prefill_min_tokens; /* GPU backends: calls with at least this many tokens take the
                                   prefill path (grouped GEMMs; not capturable in a CUDA graph;
                                   FT_BACKEND_OFFLOAD streams whole layers through buffers of
                                   their own, so prefill never evicts the decode working set).
                                   Default 0 = 64; a value > max_tokens disables the path.      */
    /* FT_BACKEND_HYBRID: the fraction f of each step's slot cache misses fetched over PCIe; the
     * CPU computes the rest from host memory at the same time. 0 (default): from the saved
     * profile of this machine, else 0.5. With hybrid_adaptive (default true) the session times
     * its eager steps and moves f towards the split where both sides finish together, as far as
     * fetching every miss, or none, where one side is much slower (graph replays keep the f of
     * their capture). */
    float hybrid_fraction;
    bool hybrid_adaptive;
    uint8_t reserved2_[3];
    double handoff_timeout_seconds; /* a CPU handoff not done in this time fails the session
                                       with FT_ERR_TIMEOUT instead of hanging (default 10)      */
    /* Since 0.5. Which expert the slot cache of FT_BACKEND_OFFLOAD and FT_BACKEND_HYBRID evicts
     * on a miss: FT_CACHE_LRU or FT_CACHE_FREQUENCY (the lowest decayed access count, kept per
     * expert while evicted; docs/formulas.md, "Slot cache policies"). Default FT_CACHE_AUTO
     * (since 0.8): FT_CACHE_FREQUENCY for FT_BACKEND_OFFLOAD, FT_CACHE_LRU for
     * FT_BACKEND_HYBRID, the faster of the two on the decode traces of bench/run_trace.sh;
     * ft_session_cache_policy tells the one in use. */
    int32_t cache_policy;
    int32_t cache_half_life;  /* FT_CACHE_FREQUENCY: decode steps after which an access counts
                                 half; default 0 = 8                                            */
} ft_session_params;

#define FT_CACHE_LRU       0 /* least recently used                                         */
#define FT_CACHE_FREQUENCY 1 /* lowest decayed frequency (recency and frequency)              */
#define FT_CACHE_AUTO      2 /* the backend's default (since 0.8)                             */

FT_API void ft_session_params_init(ft_session_params *params);

FT_API ft_status ft_session_create(ft_model *model, const ft_session_params *params,
                                   ft_session **out, char *err, size_t err_size);
FT_API void ft_session_free(ft_session *session);
FT_API const char *ft_session_last_error(const ft_session *session);

/* The backend the session runs (FT_BACKEND_*; AUTO resolved). */
FT_API int32_t ft_session_backend(const ft_session *session);

/* Since 0.8. The slot cache policy the session runs (FT_CACHE_LRU or FT_CACHE_FREQUENCY;
 * FT_CACHE_AUTO resolved), or -1 for a backend without a slot cache (FT_BACKEND_CPU,
 * FT_BACKEND_GPU) and for a NULL session. */
FT_API int32_t ft_session_cache_policy(const ft_session *session);

/* Router logits [num_tokens, E] (f32) -> expert ids [num_tokens, K] and routing weights
 * [num_tokens, K] by the model's routing rule. Ties are broken towards the lower expert id.
 * Routes are ordered by decreasing selection score. FT_ERR_NON_FINITE for NaN logits.
 * num_tokens is not limited by the session's max_tokens: the three arrays must hold num_tokens
 * rows each. Layers that route by token id (ft_model_info.hash_layers) need ft_route_tokens:
 * here they are FT_ERR_INVALID_ARGUMENT. */
FT_API ft_status ft_route(ft_session *session, int32_t layer, int32_t num_tokens,
                          const float *logits, int32_t *expert_ids, float *expert_weights);

/* Since 0.7. ft_route for models whose first MoE layers route by token id (DeepSeek-V4's hash
 * layers, ft_model_info.hash_layers): token_ids [num_tokens] int32 are the tokens being decoded.
 * On a hash-routed layer token t takes the top_k experts of row token_ids[t] of the model's table,
 * in the table's order; their weights are the unbiased scores of the model's score function
 * (softmax, sigmoid or sqrt(softplus) of the logits, no correction bias), renormalised to sum 1
 * unless softmax, times routed_scaling_factor. On any other layer it is ft_route (token_ids
 * ignored, may be NULL). ft_route refuses hash-routed layers (FT_ERR_INVALID_ARGUMENT naming
 * this call). Errors: FT_ERR_INVALID_ARGUMENT (NULL token_ids on a hash-routed layer, naming the
 * layer; a token id outside [0, vocab_size), naming the token; as ft_route), FT_ERR_NON_FINITE
 * for NaN/Inf logits. Host memory only; there is no device-side routing call. */
FT_API ft_status ft_route_tokens(ft_session *session, int32_t layer, int32_t num_tokens,
                                 const float *logits, const int32_t *token_ids,
                                 int32_t *expert_ids, float *expert_weights);

/* One MoE layer for num_tokens tokens (1..max_tokens):
 *   out[t] = sum_k expert_weights[t,k] * expert(expert_ids[t,k])(hidden[t])
 * (plus the shared expert(s) when the session was created with shared_experts).
 *   hidden [num_tokens, H] bf16, expert_ids [num_tokens, K] int32, expert_weights
 *   [num_tokens, K] f32, out [num_tokens, H] bf16 (may not alias hidden).
 * Routes with an id < 0 are not computed here (another device computes them); a token whose
 * routes are all < 0 gets zeros. Duplicate ids within a token are computed twice. Each expert's
 * weights are read once per call, whatever the number of tokens routed to it.
 * Errors: FT_ERR_INVALID_ARGUMENT (NULL, layer or num_tokens out of range, id >= E: the message
 * names the token and route), FT_ERR_NON_FINITE (NaN/Inf input with check_finite). On error
 * `out` is left unspecified. */
FT_API ft_status ft_decode(ft_session *session, int32_t layer, int32_t num_tokens,
                           const uint16_t *hidden, const int32_t *expert_ids,
                           const float *expert_weights, uint16_t *out);

typedef struct ft_session_stats {
    uint32_t struct_size;
    uint32_t reserved_;
    uint64_t decode_calls;     /* successful ft_decode calls                                   */
    uint64_t tokens;           /* tokens decoded                                               */
    uint64_t routes_cpu;       /* routes computed by the CPU                                   */
    uint64_t routes_skipped;   /* routes with id < 0 left to another device                    */
    uint64_t experts_cpu;      /* distinct (call, expert) weight reads by the CPU              */
    uint64_t cpu_bytes;        /* expert weight bytes read by the CPU                          */
    double cpu_seconds;        /* wall time of the CPU expert compute                          */
    /* GPU backends (since 0.2); read from the device when asked for. */
    uint64_t routes_gpu;       /* routes computed by the GPU                                   */
    uint64_t cache_hits;       /* distinct (call, expert) found in the slot cache (GPU: all)   */
    uint64_t cache_misses;     /* distinct (call, expert) not resident when the call began     */
    uint64_t fetched_experts;  /* experts copied host -> GPU slots (decode path)                */
    uint64_t fetched_bytes;    /* bytes of those copies                                        */
    uint64_t prefill_calls;    /* calls that took the prefill path                             */
    uint64_t prefill_bytes;    /* expert bytes streamed host -> GPU by prefill calls           */
    double hybrid_fraction;    /* FT_BACKEND_HYBRID: the fetch fraction f in use now           */
    /* Since 0.3. FT_BACKEND_HYBRID: the GPU side's time (gather + expert kernels, CUDA events)
     * summed over the steps it was read for (eager calls whose events had completed by the next
     * call; graph replays are not timed); mean = hybrid_gpu_seconds / hybrid_timed_steps. The CPU
     * side's time is cpu_seconds over every step. */
    double hybrid_gpu_seconds;
    uint64_t hybrid_timed_steps;
} ft_session_stats;
/* Per-layer slot cache figures of a GPU-backed session (all zero for FT_BACKEND_CPU). */
typedef struct ft_layer_stats {
    uint32_t struct_size;
    uint32_t reserved_;
    uint64_t calls;            /* decode-path calls of this layer                              */
    uint64_t active_experts;   /* sum over calls of the distinct experts routed               */
    uint64_t misses;           /* of those, not resident when the call began                   */
    uint64_t fetched_experts;  /* misses copied into slots (offload: all misses; hybrid: the
                                  others were computed by the CPU)                             */
    uint64_t fetched_bytes;
} ft_layer_stats;

/* Fills *stats up to stats->struct_size bytes. */
FT_API ft_status ft_session_get_stats(const ft_session *session, ft_session_stats *stats);
FT_API void ft_session_reset_stats(ft_session *session);
/* Slot cache figures of MoE layer `layer` since the last reset. FT_ERR_INVALID_ARGUMENT for a
 * bad layer. Waits for the session's GPU work to finish (not to be called during capture). */
FT_API ft_status ft_session_get_layer_stats(const ft_session *session, int32_t layer,
                                            ft_layer_stats *stats);
/* FT_OK, or the sticky state of a session that cannot continue: FT_ERR_DEVICE_LOST after a
 * sticky CUDA fault (every later call returns it; free the session, and in most cases the
 * process must be restarted to use the GPU again), FT_ERR_TIMEOUT after a CPU handoff that
 * never completed. */
FT_API ft_status ft_session_status(const ft_session *session);

/* Why the session runs its backend: for FT_BACKEND_AUTO the selector's decision with the numbers
 * behind it (predicted step times per backend from the machine's profile, the expected cache hit
 * rate, or the fallback taken without a profile); else "<name> requested". Valid while the
 * session lives; "" for a NULL session. */
FT_API const char *ft_session_backend_reason(const ft_session *session);

/* ==========================================================================================
 * Bandwidth profile: what this machine's memory, bus and kernels really do
 * ========================================================================================== */

typedef struct ft_profile ft_profile;

typedef struct ft_profile_params {
    uint32_t struct_size;
    int32_t device;          /* CUDA device to measure: FT_DEVICE_AUTO (default) or an ordinal;
                                FT_DEVICE_NONE measures the CPU only                           */
    int32_t cpu_threads;     /* 0 (default): as engines choose (one per physical core, less two
                                with a GPU)                                                    */
    uint32_t formats;        /* bit (1u << FT_FORMAT_x) per expert format to measure; 0
                                (default): every format                                         */
    double max_seconds;      /* soft bound on the whole run (default 30)                       */
    ft_progress_fn progress; /* optional; phases "read", "pcie", "<format>"; may cancel          */
    void *progress_user_data;
} ft_profile_params;

FT_API void ft_profile_params_init(ft_profile_params *params);

/* Measures the machine: the CPU's memory read bandwidth (all workers), pinned host<->device
 * copies (with a GPU), and per expert format the production CPU expert kernels at one token
 * over experts far larger than the caches; with a GPU also the production gather of a window of
 * experts into GPU slots, alone and while the CPU kernels run (the overlapped pair). Figures a build or machine cannot measure are left
 * at 0. params may be NULL. FT_ERR_CANCELLED if the progress callback stops it. */
FT_API ft_status ft_profile_bandwidth(const ft_profile_params *params, ft_profile **out,
                                      char *err, size_t err_size);

/* Reads a profile (FreeToken's JSON schema version 4, also as the original engine wrote it).
 * path NULL: $FT_PROFILE_PATH, else $XDG_CACHE_HOME/freetoken/benchbw.json (~/.cache when
 * unset). FT_ERR_IO if unreadable, FT_ERR_FORMAT if not a valid version-4 profile. */
FT_API ft_status ft_profile_load(const char *path, ft_profile **out, char *err, size_t err_size);

/* Writes the profile atomically (a temporary file renamed over `path`), creating folders.
 * path NULL: the default path above. */
FT_API ft_status ft_profile_save(const ft_profile *profile, const char *path, char *err,
                                 size_t err_size);

FT_API void ft_profile_free(ft_profile *profile);

typedef struct ft_profile_machine {
    uint32_t struct_size;
    int32_t physical_cores;
    int32_t threads_used;    /* CPU threads the figures were measured with                     */
    uint32_t reserved_;
    double cpu_read_gbs;     /* best read bandwidth of all workers (GB/s = 1e9 B/s); 0: none   */
    double h2d_gbs;          /* pinned host-to-device copies; 0: not measured                  */
    double d2h_gbs;          /* pinned device-to-host copies; 0: not measured                  */
    const char *gpu_name;    /* "" without a GPU; valid while the profile lives                */
    const char *cpu_model;   /* "" if unknown; valid while the profile lives                   */
} ft_profile_machine;

FT_API ft_status ft_profile_get_machine(const ft_profile *profile, ft_profile_machine *machine);

typedef struct ft_profile_format {
    uint32_t struct_size;
    int32_t format;             /* FT_FORMAT_*                                                 */
    uint64_t expert_bytes;      /* bytes of the measured expert geometry                       */
    double cpu_gbs;             /* CPU expert kernels at one token; 0: not measured            */
    double gather_gbs;          /* gather into GPU slots; 0: not measured                      */
    double cpu_overlap_gbs;     /* CPU side while the gather runs too; 0: not measured         */
    double gather_overlap_gbs;  /* gather side while the CPU runs too; 0: not measured         */
    double fetch_fraction;      /* share of a step's misses to fetch over PCIe so that both
                                   sides finish together; -1 when the figures do not tell     */
    const char *cpu_kernel;     /* e.g. "nvfp4-w4a16-avx512bf16"; valid while the profile lives */
} ft_profile_format;

/* Figures of one format. FT_ERR_UNSUPPORTED when the profile has none for it. */
FT_API ft_status ft_profile_get_format(const ft_profile *profile, int32_t format,
                                       ft_profile_format *out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FREETOKEN_H */
