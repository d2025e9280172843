//! Raw declarations of libfreetoken's C API: every function, struct, callback type and constant
//! of `freetoken.h`, `freetoken_cuda.h` and `freetoken_ep.h`, under their C names.
//!
//! The headers are the specification: each item here says in a line what it is, and the header
//! says everything else about the same name (parameters, errors, ownership, threading).
//! `tests/abi/check_rust_ffi.py` checks this file against the headers: every item present,
//! parameter, return and field types, constant values, and struct sizes and offsets as the C
//! compiler lays them out.
//!
//! Linking: the build script finds the library with the `pkg-config` program (at least the
//! version these declarations describe), or in the folder named by `FREETOKEN_LIB_DIR`. The
//! folder it used is published to dependents' build scripts as `DEP_FREETOKEN_LIBDIR`.
//!
//! Most users want the safe `freetoken` crate instead.
#![allow(non_camel_case_types)]

pub use std::os::raw::{c_char, c_void};

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

/// Major version of the header these declarations follow.
pub const FT_VERSION_MAJOR: u32 = 0;
/// Minor version of the header these declarations follow.
pub const FT_VERSION_MINOR: u32 = 8;
/// Patch version of the header these declarations follow.
pub const FT_VERSION_PATCH: u32 = 0;
/// MAJOR*10000 + MINOR*100 + PATCH.
pub const FT_VERSION_NUMBER: u32 = 800;

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

/// Result of every fallible call; `FT_OK` is success.
pub type ft_status = i32;

pub const FT_OK: ft_status = 0;
/// NULL pointer, out-of-range value, wrong shape.
pub const FT_ERR_INVALID_ARGUMENT: ft_status = 1;
/// Host or device allocation failed.
pub const FT_ERR_OUT_OF_MEMORY: ft_status = 2;
/// File missing, unreadable, short read.
pub const FT_ERR_IO: ft_status = 3;
/// Corrupt or inconsistent checkpoint / JSON / layout.
pub const FT_ERR_FORMAT: ft_status = 4;
/// Valid request this build or machine cannot serve.
pub const FT_ERR_UNSUPPORTED: ft_status = 5;
/// A GPU was required and none is usable.
pub const FT_ERR_NO_DEVICE: ft_status = 6;
/// A CUDA call failed.
pub const FT_ERR_DEVICE: ft_status = 7;
/// A sticky device fault; the session cannot continue.
pub const FT_ERR_DEVICE_LOST: ft_status = 8;
/// A handoff or wait did not complete in time.
pub const FT_ERR_TIMEOUT: ft_status = 9;
/// A progress callback asked to stop.
pub const FT_ERR_CANCELLED: ft_status = 10;
/// NaN or Inf in an input that must be finite.
pub const FT_ERR_NON_FINITE: ft_status = 11;
/// Call not valid in the handle's current state.
pub const FT_ERR_STATE: ft_status = 12;
/// A bug in FreeToken.
pub const FT_ERR_INTERNAL: ft_status = 13;

/* ---------------------------------------------------------------------------------------------
 * Enumerations
 * ------------------------------------------------------------------------------------------- */

/// Expert weight formats.
pub const FT_FORMAT_BF16: i32 = 1;
pub const FT_FORMAT_FP8_BLOCK: i32 = 2;
pub const FT_FORMAT_NVFP4: i32 = 3;
pub const FT_FORMAT_MXFP4: i32 = 4;
pub const FT_FORMAT_DS_FP4: i32 = 5;
pub const FT_FORMAT_Q4_0: i32 = 6;
/// GGUF block formats (since 0.6).
pub const FT_FORMAT_Q8_0: i32 = 7;
pub const FT_FORMAT_Q2_K: i32 = 8;
pub const FT_FORMAT_Q3_K: i32 = 9;
pub const FT_FORMAT_Q4_K: i32 = 10;
pub const FT_FORMAT_Q5_K: i32 = 11;
pub const FT_FORMAT_Q6_K: i32 = 12;
pub const FT_FORMAT_IQ4_XS: i32 = 13;

/// Data types of tensors returned by `ft_model_tensor`.
pub const FT_DTYPE_BF16: i32 = 1;
pub const FT_DTYPE_F32: i32 = 2;

/// Expert activations.
pub const FT_ACT_SILU: i32 = 0;
pub const FT_ACT_GELU: i32 = 1;
pub const FT_ACT_GELU_TANH: i32 = 2;
pub const FT_ACT_SWIGLU_CLAMP: i32 = 3;

/// Routing rules (what `ft_route` does with router logits).
pub const FT_ROUTING_SOFTMAX_TOPK: i32 = 1;
pub const FT_ROUTING_SOFTMAX_TOPK_RENORM: i32 = 2;
pub const FT_ROUTING_SIGMOID_GROUP_TOPK: i32 = 3;
pub const FT_ROUTING_TOPK_SOFTMAX: i32 = 4;
pub const FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK: i32 = 5;
pub const FT_ROUTING_TOPK_SIGMOID: i32 = 6;
pub const FT_ROUTING_SOFTMAX_GROUP_TOPK: i32 = 7;
pub const FT_ROUTING_SOFTMAX_BIASED_TOPK: i32 = 8;
pub const FT_ROUTING_SPARSEMIXER: i32 = 9;

/// How `ft_decode` applies a route's weight (`ft_model_info.route_weight`).
pub const FT_ROUTE_WEIGHT_OUTPUT: i32 = 0;
pub const FT_ROUTE_WEIGHT_INPUT: i32 = 1;

/// Backends.
pub const FT_BACKEND_AUTO: i32 = 0;
pub const FT_BACKEND_CPU: i32 = 1;
pub const FT_BACKEND_GPU: i32 = 2;
pub const FT_BACKEND_OFFLOAD: i32 = 3;
pub const FT_BACKEND_HYBRID: i32 = 4;
pub const FT_CACHE_LRU: i32 = 0;
pub const FT_CACHE_FREQUENCY: i32 = 1;
pub const FT_CACHE_AUTO: i32 = 2;

/// Log levels.
pub const FT_LOG_OFF: i32 = 0;
pub const FT_LOG_ERROR: i32 = 1;
pub const FT_LOG_WARN: i32 = 2;
pub const FT_LOG_INFO: i32 = 3;
pub const FT_LOG_DEBUG: i32 = 4;

/* ---------------------------------------------------------------------------------------------
 * Build information and logging
 * ------------------------------------------------------------------------------------------- */

/// What the loaded library was built with (`ft_build_info_get`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_build_info {
    pub struct_size: u32,
    pub version_number: u32,
    pub cuda: bool,
    pub nccl: bool,
    pub reserved_: [u8; 2],
    pub cuda_runtime_version: i32,
    pub cuda_archs: *const c_char,
    pub onednn_version: *const c_char,
    pub cpu_isa: *const c_char,
    pub compiler: *const c_char,
    pub onednn_bf16: bool,
}

/// Receives one formatted log line (no trailing newline).
pub type ft_log_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, level: i32, message: *const c_char)>;

/// Progress of a long operation; return false to cancel it.
pub type ft_progress_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, phase: *const c_char, done: u64, total: u64) -> bool>;

/* ---------------------------------------------------------------------------------------------
 * Engine
 * ------------------------------------------------------------------------------------------- */

/// The machine context (CPU worker pool, GPU choice); opaque.
#[repr(C)]
pub struct ft_engine {
    _opaque: [u8; 0],
}

/// The first CUDA device if one is usable, else none.
pub const FT_DEVICE_AUTO: i32 = -2;
/// Never touch a GPU.
pub const FT_DEVICE_NONE: i32 = -1;

/// Engine creation parameters (`ft_engine_params_init` fills the defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_engine_params {
    pub struct_size: u32,
    pub device: i32,
    pub cpu_threads: i32,
    pub pin_threads: bool,
    pub reserved_: [u8; 3],
}

/// What an engine runs on (`ft_engine_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_engine_info {
    pub struct_size: u32,
    pub device: i32,
    pub cpu_threads: i32,
    pub physical_cores: i32,
    pub cpu_isa: *const c_char,
    pub device_name: *const c_char,
}

/* ---------------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------------- */

/// Expert weights in host banks, geometry and routing rule; opaque.
#[repr(C)]
pub struct ft_model {
    _opaque: [u8; 0],
}

/// Checkpoint loading parameters (`ft_model_load_params_init`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_model_load_params {
    pub struct_size: u32,
    pub io_threads: i32,
    pub progress: ft_progress_fn,
    pub progress_user_data: *mut c_void,
}

/// Geometry of a model built from memory (`ft_model_desc_init`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_model_desc {
    pub struct_size: u32,
    pub num_layers: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub format: i32,
    pub activation: i32,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
    pub routing: i32,
    pub num_groups: i32,
    pub topk_groups: i32,
    pub routed_scaling_factor: f32,
    pub renormalize: bool,
    pub reserved_: [u8; 3],
    pub route_weight: i32,
    pub router_jitter_eps: f32,
}

/// Which projection `ft_model_set_expert` writes: gate_proj / w1, [I, H].
pub const FT_PROJ_GATE: i32 = 1;
/// up_proj / w3, [I, H].
pub const FT_PROJ_UP: i32 = 2;
/// down_proj / w2, [H, I].
pub const FT_PROJ_DOWN: i32 = 3;

/// A model's geometry and sizes (`ft_model_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_model_info {
    pub struct_size: u32,
    pub num_layers: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub format: i32,
    pub activation: i32,
    pub routing: i32,
    pub num_groups: i32,
    pub topk_groups: i32,
    pub routed_scaling_factor: f32,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
    pub first_moe_layer: i32,
    pub total_layers: i32,
    pub shared_intermediate_size: i32,
    pub expert_bytes: u64,
    pub bank_bytes: u64,
    pub architecture: *const c_char,
    pub pinned_bytes: u64,
    pub route_weight: i32,
    pub router_jitter_eps: f32,
    pub expert_biases: i32,
    pub shared_expert_gate: i32,
    /// Since 0.6: bit (1 << FT_FORMAT_x) per format of some layer's gate/up or down matrices.
    pub formats_used: u32,
    /// Since 0.6: 1 when the layers or matrices differ in format.
    pub mixed_formats: i32,
    /// Since 0.7: MoE layers 0..hash_layers-1 route by token id (`ft_route_tokens`).
    pub hash_layers: i32,
    /// Since 0.7: token ids those layers accept, [0, vocab_size); 0 without hash layers.
    pub vocab_size: i32,
}

/// Tensors a model carries besides the routed experts (`ft_model_tensor`).
pub const FT_TENSOR_ROUTER_WEIGHT: i32 = 1;
pub const FT_TENSOR_ROUTER_BIAS: i32 = 2;
pub const FT_TENSOR_SHARED_GATE: i32 = 3;
pub const FT_TENSOR_SHARED_UP: i32 = 4;
pub const FT_TENSOR_SHARED_DOWN: i32 = 5;
pub const FT_TENSOR_SHARED_GATE_PROJ: i32 = 6;
pub const FT_TENSOR_EXPERT_GATE_UP_BIAS: i32 = 7;
pub const FT_TENSOR_EXPERT_DOWN_BIAS: i32 = 8;

/// A tensor owned by a model (`ft_model_tensor`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_tensor_view {
    pub struct_size: u32,
    pub dtype: i32,
    pub ndim: i32,
    pub shape: [i64; 4],
    pub data: *const c_void,
    pub nbytes: usize,
}

/* ---------------------------------------------------------------------------------------------
 * Session
 * ------------------------------------------------------------------------------------------- */

/// The decode handle of one model on one engine; opaque.
#[repr(C)]
pub struct ft_session {
    _opaque: [u8; 0],
}

/// Session creation parameters (`ft_session_params_init`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_session_params {
    pub struct_size: u32,
    pub backend: i32,
    pub max_tokens: i32,
    pub shared_experts: bool,
    pub check_finite: bool,
    pub reserved_: [u8; 2],
    pub cache_slots: i64,
    pub cache_fraction: f64,
    pub vram_reserve_bytes: u64,
    pub prefill_min_tokens: i32,
    pub hybrid_fraction: f32,
    pub hybrid_adaptive: bool,
    pub reserved2_: [u8; 3],
    pub handoff_timeout_seconds: f64,
    pub cache_policy: i32,
    pub cache_half_life: i32,
}

/// Counters of a session (`ft_session_get_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_session_stats {
    pub struct_size: u32,
    pub reserved_: u32,
    pub decode_calls: u64,
    pub tokens: u64,
    pub routes_cpu: u64,
    pub routes_skipped: u64,
    pub experts_cpu: u64,
    pub cpu_bytes: u64,
    pub cpu_seconds: f64,
    pub routes_gpu: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub fetched_experts: u64,
    pub fetched_bytes: u64,
    pub prefill_calls: u64,
    pub prefill_bytes: u64,
    pub hybrid_fraction: f64,
    pub hybrid_gpu_seconds: f64,
    pub hybrid_timed_steps: u64,
}

/// Slot cache figures of one MoE layer (`ft_session_get_layer_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_layer_stats {
    pub struct_size: u32,
    pub reserved_: u32,
    pub calls: u64,
    pub active_experts: u64,
    pub misses: u64,
    pub fetched_experts: u64,
    pub fetched_bytes: u64,
}

/* ---------------------------------------------------------------------------------------------
 * Bandwidth profile
 * ------------------------------------------------------------------------------------------- */

/// What this machine's memory, bus and kernels do; opaque.
#[repr(C)]
pub struct ft_profile {
    _opaque: [u8; 0],
}

/// Measurement parameters (`ft_profile_params_init`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_profile_params {
    pub struct_size: u32,
    pub device: i32,
    pub cpu_threads: i32,
    pub formats: u32,
    pub max_seconds: f64,
    pub progress: ft_progress_fn,
    pub progress_user_data: *mut c_void,
}

/// Machine figures of a profile (`ft_profile_get_machine`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_profile_machine {
    pub struct_size: u32,
    pub physical_cores: i32,
    pub threads_used: i32,
    pub reserved_: u32,
    pub cpu_read_gbs: f64,
    pub h2d_gbs: f64,
    pub d2h_gbs: f64,
    pub gpu_name: *const c_char,
    pub cpu_model: *const c_char,
}

/// Figures of one expert format in a profile (`ft_profile_get_format`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_profile_format {
    pub struct_size: u32,
    pub format: i32,
    pub expert_bytes: u64,
    pub cpu_gbs: f64,
    pub gather_gbs: f64,
    pub cpu_overlap_gbs: f64,
    pub gather_overlap_gbs: f64,
    pub fetch_fraction: f64,
    pub cpu_kernel: *const c_char,
}

/* ---------------------------------------------------------------------------------------------
 * freetoken_cuda.h
 * ------------------------------------------------------------------------------------------- */

/// CUDA's `cudaStream_t` (a pointer to an opaque runtime object; null is the legacy default
/// stream).
pub type cudaStream_t = *mut c_void;

/* ---------------------------------------------------------------------------------------------
 * freetoken_ep.h: expert parallelism through NCCL
 * ------------------------------------------------------------------------------------------- */

/// One rank (one GPU) of an expert-parallel group; opaque.
#[repr(C)]
pub struct ft_ep_group {
    _opaque: [u8; 0],
}

/// Prefill: exact sizes (one host sync per call), chunked.
pub const FT_EP_MODE_THROUGHPUT: i32 = 0;
/// Decode: fixed capacity per peer, no host sync, capturable.
pub const FT_EP_MODE_LATENCY: i32 = 1;

/// bf16 rows on the wire.
pub const FT_EP_WIRE_BF16: i32 = 0;
/// e4m3, one fp32 scale per 128 channels.
pub const FT_EP_WIRE_FP8: i32 = 1;
/// e4m3, one power-of-two (e8m0) scale per 128 channels.
pub const FT_EP_WIRE_FP8_UE8M0: i32 = 2;

/// Group parameters (`ft_ep_params_init`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_ep_params {
    pub struct_size: u32,
    pub num_experts: i32,
    pub slots_per_rank: i32,
    pub top_k: i32,
    pub hidden: i64,
    pub max_tokens: i64,
    pub mode: i32,
    pub wire: i32,
    pub chunks: i32,
    pub nccl_max_ctas: i32,
    pub link_bytes_per_s: f64,
    pub max_expert_rows: i64,
    pub combine_wire: i32,
    pub combine_max_rel_error: f32,
}

/// Broadcast of `bytes` bytes from rank 0 to every rank; returns 0 on success.
pub type ft_ep_broadcast_fn = Option<unsafe extern "C" fn(data: *mut c_void, bytes: usize, user_data: *mut c_void) -> i32>;

/// A group's rank, topology and last-call figures (`ft_ep_group_info_get`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_ep_group_info {
    pub struct_size: u32,
    pub rank: i32,
    pub ranks: i32,
    pub slots_per_rank: i32,
    pub device: i32,
    pub nccl_version: i32,
    pub last_chunks: i32,
    pub last_bytes_sent: u64,
    pub pci_bus_id: [c_char; 16],
    pub numa_node: i32,
    pub pcie_link_width: i32,
    pub pcie_link_gts: f64,
    pub link_bytes_per_s: f64,
    pub calibrated_bytes_per_s: f64,
    pub p2p_known: u64,
    pub p2p_mask: u64,
    pub combine_wire: i32,
    pub combine_last_rel_error: f32,
}

/// The rows this rank's experts must process (device pointers owned by the group).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_ep_expert_batch {
    pub struct_size: u32,
    pub slots: i32,
    pub hidden: i64,
    pub max_rows: i64,
    pub offset: *const i64,
    pub x: *const u16,
    pub y: *mut u16,
    pub row_source: *const i32,
    pub row_token: *const i32,
    pub row_weight: *const f32,
}

/// Enqueues the caller's experts for `batch` on `stream`.
pub type ft_ep_expert_fn =
    Option<unsafe extern "C" fn(batch: *const ft_ep_expert_batch, stream: *mut c_void, user_data: *mut c_void)>;

/* ---------------------------------------------------------------------------------------------
 * Functions
 * ------------------------------------------------------------------------------------------- */

extern "C" {
    // Version, status names, build information, logging.
    pub fn ft_version_number() -> u32;
    pub fn ft_version_string() -> *const c_char;
    pub fn ft_status_string(status: ft_status) -> *const c_char;
    pub fn ft_build_info_get(info: *mut ft_build_info) -> ft_status;
    pub fn ft_log_set_callback(fn_: ft_log_fn, user_data: *mut c_void, level: i32);

    // Engine.
    pub fn ft_engine_params_init(params: *mut ft_engine_params);
    pub fn ft_engine_create(
        params: *const ft_engine_params,
        out: *mut *mut ft_engine,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_engine_free(engine: *mut ft_engine);
    pub fn ft_engine_last_error(engine: *const ft_engine) -> *const c_char;
    pub fn ft_engine_get_info(engine: *const ft_engine, info: *mut ft_engine_info) -> ft_status;

    // Model.
    pub fn ft_model_load_params_init(params: *mut ft_model_load_params);
    pub fn ft_model_load(
        engine: *mut ft_engine,
        path: *const c_char,
        params: *const ft_model_load_params,
        out: *mut *mut ft_model,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_model_desc_init(desc: *mut ft_model_desc);
    pub fn ft_model_create(
        engine: *mut ft_engine,
        desc: *const ft_model_desc,
        out: *mut *mut ft_model,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_model_set_expert(
        model: *mut ft_model,
        layer: i32,
        expert: i32,
        proj: i32,
        data: *const c_void,
        nbytes: usize,
    ) -> ft_status;
    pub fn ft_model_set_router_bias(model: *mut ft_model, layer: i32, bias: *const f32, num_experts: i32)
        -> ft_status;
    pub fn ft_model_finalize(model: *mut ft_model) -> ft_status;
    pub fn ft_model_free(model: *mut ft_model);
    pub fn ft_model_last_error(model: *const ft_model) -> *const c_char;
    pub fn ft_model_get_info(model: *const ft_model, info: *mut ft_model_info) -> ft_status;
    pub fn ft_model_moe_layer(model: *const ft_model, model_layer: i32) -> i32;
    pub fn ft_model_layer_formats(
        model: *const ft_model,
        layer: i32,
        gate_up_format: *mut i32,
        down_format: *mut i32,
    ) -> ft_status;
    pub fn ft_model_tensor(model: *const ft_model, layer: i32, which: i32, view: *mut ft_tensor_view)
        -> ft_status;

    // Session.
    pub fn ft_session_params_init(params: *mut ft_session_params);
    pub fn ft_session_create(
        model: *mut ft_model,
        params: *const ft_session_params,
        out: *mut *mut ft_session,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_session_free(session: *mut ft_session);
    pub fn ft_session_last_error(session: *const ft_session) -> *const c_char;
    pub fn ft_session_backend(session: *const ft_session) -> i32;
    /// Since 0.8.
    pub fn ft_session_cache_policy(session: *const ft_session) -> i32;
    pub fn ft_route(
        session: *mut ft_session,
        layer: i32,
        num_tokens: i32,
        logits: *const f32,
        expert_ids: *mut i32,
        expert_weights: *mut f32,
    ) -> ft_status;
    /// Since 0.7.
    pub fn ft_route_tokens(
        session: *mut ft_session,
        layer: i32,
        num_tokens: i32,
        logits: *const f32,
        token_ids: *const i32,
        expert_ids: *mut i32,
        expert_weights: *mut f32,
    ) -> ft_status;
    pub fn ft_decode(
        session: *mut ft_session,
        layer: i32,
        num_tokens: i32,
        hidden: *const u16,
        expert_ids: *const i32,
        expert_weights: *const f32,
        out: *mut u16,
    ) -> ft_status;
    pub fn ft_session_get_stats(session: *const ft_session, stats: *mut ft_session_stats) -> ft_status;
    pub fn ft_session_reset_stats(session: *mut ft_session);
    pub fn ft_session_get_layer_stats(session: *const ft_session, layer: i32, stats: *mut ft_layer_stats)
        -> ft_status;
    pub fn ft_session_status(session: *const ft_session) -> ft_status;
    pub fn ft_session_backend_reason(session: *const ft_session) -> *const c_char;

    // Bandwidth profile.
    pub fn ft_profile_params_init(params: *mut ft_profile_params);
    pub fn ft_profile_bandwidth(
        params: *const ft_profile_params,
        out: *mut *mut ft_profile,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_profile_load(path: *const c_char, out: *mut *mut ft_profile, err: *mut c_char, err_size: usize)
        -> ft_status;
    pub fn ft_profile_save(profile: *const ft_profile, path: *const c_char, err: *mut c_char, err_size: usize)
        -> ft_status;
    pub fn ft_profile_free(profile: *mut ft_profile);
    pub fn ft_profile_get_machine(profile: *const ft_profile, machine: *mut ft_profile_machine) -> ft_status;
    pub fn ft_profile_get_format(profile: *const ft_profile, format: i32, out: *mut ft_profile_format)
        -> ft_status;

    // freetoken_cuda.h.
    pub fn ft_decode_cuda(
        session: *mut ft_session,
        layer: i32,
        num_tokens: i32,
        hidden: *const u16,
        expert_ids: *const i32,
        expert_weights: *const f32,
        out: *mut u16,
        stream: cudaStream_t,
    ) -> ft_status;
    pub fn ft_session_device(session: *const ft_session) -> i32;

    // freetoken_ep.h.
    pub fn ft_ep_params_init(params: *mut ft_ep_params);
    pub fn ft_ep_group_create_from_comm(
        nccl_comm: *mut c_void,
        device: i32,
        params: *const ft_ep_params,
        out: *mut *mut ft_ep_group,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_ep_group_bootstrap(
        nranks: i32,
        rank: i32,
        device: i32,
        broadcast: ft_ep_broadcast_fn,
        user_data: *mut c_void,
        params: *const ft_ep_params,
        out: *mut *mut ft_ep_group,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_ep_group_bootstrap_local(
        ndevices: i32,
        devices: *const i32,
        params: *const ft_ep_params,
        groups: *mut *mut ft_ep_group,
        err: *mut c_char,
        err_size: usize,
    ) -> ft_status;
    pub fn ft_ep_group_info_get(group: *const ft_ep_group, info: *mut ft_ep_group_info) -> ft_status;
    pub fn ft_ep_group_set_placement(group: *mut ft_ep_group, phy2log: *const i32, count: usize) -> ft_status;
    pub fn ft_ep_group_get_placement(
        group: *const ft_ep_group,
        phy2log: *mut i32,
        capacity: usize,
        count: *mut usize,
    ) -> ft_status;
    pub fn ft_ep_dispatch(
        group: *mut ft_ep_group,
        topk_ids: *const i32,
        topk_weights: *const f32,
        x: *const u16,
        tokens: i64,
        stream: *mut c_void,
        batch: *mut ft_ep_expert_batch,
    ) -> ft_status;
    pub fn ft_ep_combine(group: *mut ft_ep_group, out: *mut u16, stream: *mut c_void) -> ft_status;
    pub fn ft_ep_forward(
        group: *mut ft_ep_group,
        topk_ids: *const i32,
        topk_weights: *const f32,
        x: *const u16,
        tokens: i64,
        expert: ft_ep_expert_fn,
        user_data: *mut c_void,
        out: *mut u16,
        stream: *mut c_void,
    ) -> ft_status;
    pub fn ft_ep_group_last_error(group: *const ft_ep_group) -> *const c_char;
    pub fn ft_ep_group_free(group: *mut ft_ep_group);
    pub fn ft_ep_forward_session(
        group: *mut ft_ep_group,
        session: *mut ft_session,
        model: *const ft_model,
        session_max_tokens: i32,
        layer: i32,
        topk_ids: *const i32,
        topk_weights: *const f32,
        x: *const u16,
        tokens: i64,
        out: *mut u16,
        stream: *mut c_void,
    ) -> ft_status;
}
