//! Hand-written declarations of the part of include/freetoken.h this example uses.
//!
//! Names, field order and types follow the header exactly; tests/abi/check_rust_ffi.py checks
//! every function (parameter count and types) and struct (fields, offsets, size) declared here
//! against the header, so a header change that breaks these declarations fails a test.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_void};

pub type ft_status = i32;

pub const FT_OK: ft_status = 0;
pub const FT_ERR_INVALID_ARGUMENT: ft_status = 1;

pub const FT_DEVICE_AUTO: i32 = -2;
pub const FT_DEVICE_NONE: i32 = -1;

pub const FT_FORMAT_BF16: i32 = 1;
pub const FT_ACT_SILU: i32 = 0;
pub const FT_ROUTING_SOFTMAX_TOPK_RENORM: i32 = 2;
pub const FT_BACKEND_CPU: i32 = 1;

pub const FT_PROJ_GATE: i32 = 1;
pub const FT_PROJ_UP: i32 = 2;
pub const FT_PROJ_DOWN: i32 = 3;

/// Opaque handles: only ever used behind pointers.
#[repr(C)]
pub struct ft_engine {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ft_model {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct ft_session {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ft_engine_params {
    pub struct_size: u32,
    pub device: i32,
    pub cpu_threads: i32,
    pub pin_threads: bool,
    pub reserved_: [u8; 3],
}

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
}

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
}

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
}

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

extern "C" {
    pub fn ft_version_number() -> u32;
    pub fn ft_version_string() -> *const c_char;
    pub fn ft_status_string(status: ft_status) -> *const c_char;

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
    pub fn ft_model_finalize(model: *mut ft_model) -> ft_status;
    pub fn ft_model_free(model: *mut ft_model);
    pub fn ft_model_last_error(model: *const ft_model) -> *const c_char;
    pub fn ft_model_get_info(model: *const ft_model, info: *mut ft_model_info) -> ft_status;

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
    pub fn ft_route(
        session: *mut ft_session,
        layer: i32,
        num_tokens: i32,
        logits: *const f32,
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
}
