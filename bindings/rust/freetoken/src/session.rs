//! Sessions: routing and expert computation on one thread at a time.

use std::marker::PhantomData;
#[cfg(feature = "cuda")]
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use crate::sys;
use crate::error::{Error, Result, Status};
use crate::util::{check, defaults, expect_len, rows_of, sized, string_of, to_i32, with_err_buf};
use crate::bf16::Bf16;
use crate::enums::{Backend, CachePolicy};
use crate::model::Model;

/// Session parameters; `default()` holds the library's defaults.
#[derive(Clone, Debug)]
pub struct SessionParams {
    pub backend: Backend,
    /// Largest token count of one decode (default 256).
    pub max_tokens: usize,
    pub shared_experts: bool,
    pub check_finite: bool,
    pub cache_slots: i64,
    pub cache_fraction: f64,
    pub vram_reserve_bytes: u64,
    pub prefill_min_tokens: i32,
    pub hybrid_fraction: f32,
    pub hybrid_adaptive: bool,
    pub handoff_timeout_seconds: f64,
    /// The slot cache's eviction policy (default `AUTO`: the backend's faster one).
    pub cache_policy: CachePolicy,
    /// `FREQUENCY`: decode steps after which an access counts half (default 0 = 8).
    pub cache_half_life: i32,
}

impl Default for SessionParams {
    fn default() -> SessionParams {
        let p = defaults(sys::ft_session_params_init);
        SessionParams {
            backend: Backend(p.backend),
            max_tokens: p.max_tokens.max(0) as usize,
            shared_experts: p.shared_experts,
            check_finite: p.check_finite,
            cache_slots: p.cache_slots,
            cache_fraction: p.cache_fraction,
            vram_reserve_bytes: p.vram_reserve_bytes,
            prefill_min_tokens: p.prefill_min_tokens,
            hybrid_fraction: p.hybrid_fraction,
            hybrid_adaptive: p.hybrid_adaptive,
            handoff_timeout_seconds: p.handoff_timeout_seconds,
            cache_policy: CachePolicy(p.cache_policy),
            cache_half_life: p.cache_half_life,
        }
    }
}

/// Counters of a session since creation or the last reset (`ft_session_get_stats`).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct SessionStats {
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
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct LayerStats {
    pub calls: u64,
    pub active_experts: u64,
    pub misses: u64,
    pub fetched_experts: u64,
    pub fetched_bytes: u64,
}

/// The decode handle of one model: routes router logits and computes MoE layers. Used by one
/// thread at a time, any thread (`Send`, not `Sync`; the calls take `&mut self`); it borrows its
/// model.
///
/// ```
/// use freetoken::*;
/// let engine = Engine::new(&EngineParams::default())?;
/// let desc = ModelDesc { num_layers: 1, num_experts: 2, top_k: 1, hidden_size: 32, intermediate_size: 16,
///                        ..ModelDesc::default() };
/// let mut b = ModelBuilder::new(&engine, &desc)?;
/// for e in 0..2 {
///     for p in [Projection::GATE, Projection::UP, Projection::DOWN] {
///         b.set_expert(0, e, p, &vec![Bf16::from_f32(0.25); 32 * 16])?;
///     }
/// }
/// let model = b.finalize()?;
/// let mut s = Session::new(&model, &SessionParams { backend: Backend::CPU, max_tokens: 4, ..Default::default() })?;
/// let x = vec![Bf16::from_f32(1.0); 2 * 32];           // two tokens
/// let mut y = vec![Bf16::default(); 2 * 32];
/// s.decode(0, &x, &[0, 1], &[1.0, 1.0], &mut y)?;
/// assert_eq!(s.stats()?.tokens, 2);
/// // Expert 7 does not exist: a status with a message, not a crash.
/// let e = s.decode(0, &x, &[0, 7], &[1.0, 1.0], &mut y).unwrap_err();
/// assert_eq!(e.status(), Status::INVALID_ARGUMENT);
/// # Ok::<(), freetoken::Error>(())
/// ```
pub struct Session<'m> {
    raw: NonNull<sys::ft_session>,
    num_experts: usize,
    top_k: usize,
    hidden: usize,
    _model: PhantomData<&'m Model<'m>>,
}

// SAFETY: the header's threading contract: a session is used by one thread at a time, any thread.
// Every call that changes it takes &mut self, and it is not Sync (the raw pointer), so no two
// threads use it at once.
unsafe impl Send for Session<'_> {}

impl<'m> Session<'m> {
    /// Creates a session (`ft_session_create`).
    pub fn new(model: &'m Model<'_>, params: &SessionParams) -> Result<Session<'m>> {
        let info = model.info()?;
        let mut p = defaults(sys::ft_session_params_init);
        p.backend = params.backend.0;
        p.max_tokens = to_i32(params.max_tokens, "max_tokens")?;
        p.shared_experts = params.shared_experts;
        p.check_finite = params.check_finite;
        p.cache_slots = params.cache_slots;
        p.cache_fraction = params.cache_fraction;
        p.vram_reserve_bytes = params.vram_reserve_bytes;
        p.prefill_min_tokens = params.prefill_min_tokens;
        p.hybrid_fraction = params.hybrid_fraction;
        p.hybrid_adaptive = params.hybrid_adaptive;
        p.handoff_timeout_seconds = params.handoff_timeout_seconds;
        p.cache_policy = params.cache_policy.0;
        p.cache_half_life = params.cache_half_life;
        let mut raw = ptr::null_mut();
        // The C API takes a non-const model; sessions only read it (the model is immutable).
        with_err_buf(|err, n| unsafe { sys::ft_session_create(model.raw.as_ptr(), &p, &mut raw, err, n) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_session_create gave NULL"))?;
        Ok(Session {
            raw,
            num_experts: info.num_experts,
            top_k: info.top_k,
            hidden: info.hidden_size,
            _model: PhantomData,
        })
    }

    fn check(&self, status: sys::ft_status) -> Result<()> {
        check(status, || unsafe { string_of(sys::ft_session_last_error(self.raw.as_ptr())) })
    }

    /// The backend the session runs (AUTO resolved).
    pub fn backend(&self) -> Backend {
        Backend(unsafe { sys::ft_session_backend(self.raw.as_ptr()) })
    }

    /// The slot cache policy the session runs (`AUTO` resolved); `None` for a backend without a
    /// slot cache (cpu, gpu).
    pub fn cache_policy(&self) -> Option<CachePolicy> {
        let p = unsafe { sys::ft_session_cache_policy(self.raw.as_ptr()) };
        if p < 0 { None } else { Some(CachePolicy(p)) }
    }

    /// Why the session runs its backend (the selector's numbers, or "`<name>` requested").
    pub fn backend_reason(&self) -> String {
        unsafe { string_of(sys::ft_session_backend_reason(self.raw.as_ptr())) }
    }

    /// Router logits [T, E] -> expert ids [T, K] and weights [T, K] by the model's routing rule.
    pub fn route(&mut self, layer: i32, logits: &[f32], expert_ids: &mut [i32], expert_weights: &mut [f32]) -> Result<()> {
        let t = rows_of(logits.len(), self.num_experts, "logits")?;
        expect_len(expert_ids.len(), t * self.top_k, "expert_ids")?;
        expect_len(expert_weights.len(), t * self.top_k, "expert_weights")?;
        let s = unsafe {
            sys::ft_route(
                self.raw.as_ptr(),
                layer,
                to_i32(t, "tokens")?,
                logits.as_ptr(),
                expert_ids.as_mut_ptr(),
                expert_weights.as_mut_ptr(),
            )
        };
        self.check(s)
    }

    /// [`Session::route`] for models whose first `hash_layers` MoE layers choose their experts by
    /// token id (DeepSeek-V4): `token_ids` [T] (`None` on the other layers).
    pub fn route_tokens(
        &mut self,
        layer: i32,
        logits: &[f32],
        token_ids: Option<&[i32]>,
        expert_ids: &mut [i32],
        expert_weights: &mut [f32],
    ) -> Result<()> {
        let t = rows_of(logits.len(), self.num_experts, "logits")?;
        if let Some(ids) = token_ids {
            expect_len(ids.len(), t, "token_ids")?;
        }
        expect_len(expert_ids.len(), t * self.top_k, "expert_ids")?;
        expect_len(expert_weights.len(), t * self.top_k, "expert_weights")?;
        let s = unsafe {
            sys::ft_route_tokens(
                self.raw.as_ptr(),
                layer,
                to_i32(t, "tokens")?,
                logits.as_ptr(),
                token_ids.map_or(std::ptr::null(), |v| v.as_ptr()),
                expert_ids.as_mut_ptr(),
                expert_weights.as_mut_ptr(),
            )
        };
        self.check(s)
    }

    /// One MoE layer for T tokens: hidden [T, H], expert ids and weights [T, K] -> out [T, H].
    /// Routes with an id < 0 are left to another device.
    pub fn decode(
        &mut self,
        layer: i32,
        hidden: &[Bf16],
        expert_ids: &[i32],
        expert_weights: &[f32],
        out: &mut [Bf16],
    ) -> Result<()> {
        let t = rows_of(hidden.len(), self.hidden, "hidden")?;
        expect_len(expert_ids.len(), t * self.top_k, "expert_ids")?;
        expect_len(expert_weights.len(), t * self.top_k, "expert_weights")?;
        expect_len(out.len(), hidden.len(), "out")?;
        let s = unsafe {
            sys::ft_decode(
                self.raw.as_ptr(),
                layer,
                to_i32(t, "tokens")?,
                hidden.as_ptr() as *const u16,
                expert_ids.as_ptr(),
                expert_weights.as_ptr(),
                out.as_mut_ptr() as *mut u16,
            )
        };
        self.check(s)
    }

    /// `ft_decode_cuda`: one MoE layer from device memory, enqueued on `stream` (a
    /// `cudaStream_t`; null: the legacy default stream) without waiting.
    ///
    /// # Safety
    /// `hidden` and `out` must point to `num_tokens * H` bf16 values and `expert_ids`,
    /// `expert_weights` to `num_tokens * K` values, in device (or mapped pinned) memory of the
    /// engine's GPU, kept alive and unchanged until the stream has passed this call; `out` must
    /// not alias `hidden`; `stream` must be a valid stream of that device or null.
    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decode_cuda(
        &mut self,
        layer: i32,
        num_tokens: i32,
        hidden: *const Bf16,
        expert_ids: *const i32,
        expert_weights: *const f32,
        out: *mut Bf16,
        stream: *mut c_void,
    ) -> Result<()> {
        let s = sys::ft_decode_cuda(
            self.raw.as_ptr(),
            layer,
            num_tokens,
            hidden as *const u16,
            expert_ids,
            expert_weights,
            out as *mut u16,
            stream,
        );
        self.check(s)
    }

    /// The CUDA device of the session's engine, or None (`ft_session_device`).
    #[cfg(feature = "cuda")]
    pub fn device(&self) -> Option<i32> {
        let d = unsafe { sys::ft_session_device(self.raw.as_ptr()) };
        if d < 0 {
            None
        } else {
            Some(d)
        }
    }

    /// Counters since creation or the last reset.
    pub fn stats(&self) -> Result<SessionStats> {
        let mut st: sys::ft_session_stats = sized();
        let s = unsafe { sys::ft_session_get_stats(self.raw.as_ptr(), &mut st) };
        self.check(s)?;
        Ok(SessionStats {
            decode_calls: st.decode_calls,
            tokens: st.tokens,
            routes_cpu: st.routes_cpu,
            routes_skipped: st.routes_skipped,
            experts_cpu: st.experts_cpu,
            cpu_bytes: st.cpu_bytes,
            cpu_seconds: st.cpu_seconds,
            routes_gpu: st.routes_gpu,
            cache_hits: st.cache_hits,
            cache_misses: st.cache_misses,
            fetched_experts: st.fetched_experts,
            fetched_bytes: st.fetched_bytes,
            prefill_calls: st.prefill_calls,
            prefill_bytes: st.prefill_bytes,
            hybrid_fraction: st.hybrid_fraction,
            hybrid_gpu_seconds: st.hybrid_gpu_seconds,
            hybrid_timed_steps: st.hybrid_timed_steps,
        })
    }

    /// Slot cache figures of MoE layer `layer` (all zero for the CPU backend).
    pub fn layer_stats(&self, layer: i32) -> Result<LayerStats> {
        let mut st: sys::ft_layer_stats = sized();
        let s = unsafe { sys::ft_session_get_layer_stats(self.raw.as_ptr(), layer, &mut st) };
        self.check(s)?;
        Ok(LayerStats {
            calls: st.calls,
            active_experts: st.active_experts,
            misses: st.misses,
            fetched_experts: st.fetched_experts,
            fetched_bytes: st.fetched_bytes,
        })
    }

    pub fn reset_stats(&mut self) {
        unsafe { sys::ft_session_reset_stats(self.raw.as_ptr()) }
    }

    /// Ok, or the sticky failure of a session that cannot continue (`ft_session_status`).
    pub fn status(&self) -> Result<()> {
        let s = unsafe { sys::ft_session_status(self.raw.as_ptr()) };
        self.check(s)
    }

    /// The C handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_ptr(&mut self) -> *mut sys::ft_session {
        self.raw.as_ptr()
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        unsafe { sys::ft_session_free(self.raw.as_ptr()) }
    }
}
