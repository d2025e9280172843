//! Models: built from memory or loaded from a checkpoint, and views of their tensors.

use std::marker::PhantomData;
use std::os::raw::c_void;
use std::path::Path;
use std::ptr::{self, NonNull};

use crate::sys;
use crate::error::{Error, Result, Status};
use crate::util::{check, defaults, expect_len, path_cstring, sized, string_of, to_i32, with_err_buf};
use crate::bf16::Bf16;
use crate::enums::{Activation, Dtype, Format, Projection, Routing, TensorKind};
use crate::progress::{ProgressFn, with_progress};
use crate::engine::Engine;

/// Geometry and routing of a model built from memory; `default()` holds the library's defaults
/// (the five sizes are 0 and must be set).
#[derive(Clone, Debug)]
pub struct ModelDesc {
    pub num_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    /// [`Format::BF16`], the only format built from memory.
    pub format: Format,
    pub activation: Activation,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
    pub routing: Routing,
    pub num_groups: i32,
    pub topk_groups: i32,
    pub routed_scaling_factor: f32,
    pub renormalize: bool,
}

impl Default for ModelDesc {
    fn default() -> ModelDesc {
        let d = defaults(sys::ft_model_desc_init);
        ModelDesc {
            num_layers: d.num_layers.max(0) as usize,
            num_experts: d.num_experts.max(0) as usize,
            top_k: d.top_k.max(0) as usize,
            hidden_size: d.hidden_size.max(0) as usize,
            intermediate_size: d.intermediate_size.max(0) as usize,
            format: Format(d.format),
            activation: Activation(d.activation),
            swiglu_alpha: d.swiglu_alpha,
            swiglu_limit: d.swiglu_limit,
            routing: Routing(d.routing),
            num_groups: d.num_groups,
            topk_groups: d.topk_groups,
            routed_scaling_factor: d.routed_scaling_factor,
            renormalize: d.renormalize,
        }
    }
}

/// A model's geometry and sizes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ModelInfo {
    pub num_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub format: Format,
    pub activation: Activation,
    pub routing: Routing,
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
    pub architecture: String,
    pub pinned_bytes: u64,
    /// Bit (1 << FT_FORMAT_x) per format some layer's gate/up or down matrices use.
    pub formats_used: u32,
    /// The layers or matrices differ in format ([`Model::layer_formats`]); `format` is then MoE
    /// layer 0's gate/up format.
    pub mixed_formats: bool,
    /// MoE layers 0..hash_layers route by token id ([`crate::Session::route_tokens`]).
    pub hash_layers: usize,
    /// Token ids those layers accept: 0..vocab_size (0 without hash layers).
    pub vocab_size: usize,
}

fn model_info(raw: *const sys::ft_model) -> Result<ModelInfo> {
    let mut i: sys::ft_model_info = sized();
    let s = unsafe { sys::ft_model_get_info(raw, &mut i) };
    check(s, || "ft_model_get_info failed".to_string())?;
    Ok(ModelInfo {
        num_layers: i.num_layers.max(0) as usize,
        num_experts: i.num_experts.max(0) as usize,
        top_k: i.top_k.max(0) as usize,
        hidden_size: i.hidden_size.max(0) as usize,
        intermediate_size: i.intermediate_size.max(0) as usize,
        format: Format(i.format),
        activation: Activation(i.activation),
        routing: Routing(i.routing),
        num_groups: i.num_groups,
        topk_groups: i.topk_groups,
        routed_scaling_factor: i.routed_scaling_factor,
        swiglu_alpha: i.swiglu_alpha,
        swiglu_limit: i.swiglu_limit,
        first_moe_layer: i.first_moe_layer,
        total_layers: i.total_layers,
        shared_intermediate_size: i.shared_intermediate_size,
        expert_bytes: i.expert_bytes,
        bank_bytes: i.bank_bytes,
        // SAFETY: valid while the model lives; copied here.
        architecture: unsafe { string_of(i.architecture) },
        pinned_bytes: i.pinned_bytes,
        formats_used: i.formats_used,
        mixed_formats: i.mixed_formats != 0,
        hash_layers: i.hash_layers.max(0) as usize,
        vocab_size: i.vocab_size.max(0) as usize,
    })
}

/// A model being filled from memory (`ft_model_create`): set every projection of every expert,
/// then [`finalize`](ModelBuilder::finalize) it into an immutable [`Model`]. Built by one thread
/// (neither `Send` nor `Sync`, as the header asks); it borrows its engine.
///
/// ```
/// use freetoken::{Bf16, Engine, EngineParams, ModelBuilder, ModelDesc, Projection, Status};
/// let engine = Engine::new(&EngineParams::default())?;
/// let desc = ModelDesc { num_layers: 1, num_experts: 2, top_k: 1, hidden_size: 32, intermediate_size: 16,
///                        ..ModelDesc::default() };
/// let mut b = ModelBuilder::new(&engine, &desc)?;
/// let w = vec![Bf16::from_f32(0.5); 32 * 16];
/// // A slice of the wrong length is refused before the library sees it.
/// assert_eq!(b.set_expert(0, 0, Projection::GATE, &w[1..]).unwrap_err().status(), Status::INVALID_ARGUMENT);
/// for e in 0..2 {
///     for p in [Projection::GATE, Projection::UP, Projection::DOWN] {
///         b.set_expert(0, e, p, &w)?;
///     }
/// }
/// let model = b.finalize()?;
/// assert_eq!(model.info()?.num_experts, 2);
/// # Ok::<(), freetoken::Error>(())
/// ```
pub struct ModelBuilder<'e> {
    raw: NonNull<sys::ft_model>,
    expert_elems: usize,
    num_experts: usize,
    _engine: PhantomData<&'e Engine>,
}

impl<'e> ModelBuilder<'e> {
    /// Creates an empty model with its bank memory (`ft_model_create`).
    pub fn new(engine: &'e Engine, desc: &ModelDesc) -> Result<ModelBuilder<'e>> {
        let mut d = defaults(sys::ft_model_desc_init);
        d.num_layers = to_i32(desc.num_layers, "num_layers")?;
        d.num_experts = to_i32(desc.num_experts, "num_experts")?;
        d.top_k = to_i32(desc.top_k, "top_k")?;
        d.hidden_size = to_i32(desc.hidden_size, "hidden_size")?;
        d.intermediate_size = to_i32(desc.intermediate_size, "intermediate_size")?;
        d.format = desc.format.0;
        d.activation = desc.activation.0;
        d.swiglu_alpha = desc.swiglu_alpha;
        d.swiglu_limit = desc.swiglu_limit;
        d.routing = desc.routing.0;
        d.num_groups = desc.num_groups;
        d.topk_groups = desc.topk_groups;
        d.routed_scaling_factor = desc.routed_scaling_factor;
        d.renormalize = desc.renormalize;
        let mut raw = ptr::null_mut();
        with_err_buf(|err, n| unsafe { sys::ft_model_create(engine.raw.as_ptr(), &d, &mut raw, err, n) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_model_create gave NULL"))?;
        Ok(ModelBuilder {
            raw,
            expert_elems: desc.hidden_size * desc.intermediate_size,
            num_experts: desc.num_experts,
            _engine: PhantomData,
        })
    }

    fn check(&self, status: sys::ft_status) -> Result<()> {
        check(status, || unsafe { string_of(sys::ft_model_last_error(self.raw.as_ptr())) })
    }

    /// Copies one projection of one expert (bf16, [I, H] for gate and up, [H, I] for down).
    pub fn set_expert(&mut self, layer: i32, expert: i32, proj: Projection, weights: &[Bf16]) -> Result<()> {
        expect_len(weights.len(), self.expert_elems, "the expert projection")?;
        let s = unsafe {
            sys::ft_model_set_expert(
                self.raw.as_ptr(),
                layer,
                expert,
                proj.0,
                weights.as_ptr() as *const c_void,
                std::mem::size_of_val(weights),
            )
        };
        self.check(s)
    }

    /// Sets the routing correction bias of a layer (one float per expert).
    pub fn set_router_bias(&mut self, layer: i32, bias: &[f32]) -> Result<()> {
        expect_len(bias.len(), self.num_experts, "the router bias")?;
        let s = unsafe {
            sys::ft_model_set_router_bias(self.raw.as_ptr(), layer, bias.as_ptr(), to_i32(bias.len(), "bias length")?)
        };
        self.check(s)
    }

    /// Checks that every projection was set and makes the model immutable (`ft_model_finalize`).
    /// On failure the builder is freed; the error names the first missing expert.
    pub fn finalize(self) -> Result<Model<'e>> {
        let s = unsafe { sys::ft_model_finalize(self.raw.as_ptr()) };
        self.check(s)?;
        let raw = self.raw;
        std::mem::forget(self);
        Ok(Model { raw, _engine: PhantomData })
    }
}

impl Drop for ModelBuilder<'_> {
    fn drop(&mut self) {
        unsafe { sys::ft_model_free(self.raw.as_ptr()) }
    }
}

/// Options of [`Model::load`]: reader threads and a progress closure.
#[derive(Default)]
pub struct LoadOptions<'a> {
    io_threads: usize,
    progress: Option<ProgressFn<'a>>,
}

impl<'a> LoadOptions<'a> {
    pub fn new() -> LoadOptions<'a> {
        LoadOptions::default()
    }
    /// Parallel readers; 0 (default): the engine's worker count.
    pub fn io_threads(mut self, n: usize) -> LoadOptions<'a> {
        self.io_threads = n;
        self
    }
    /// Called with ("load", bytes done, bytes total); return false to cancel the load
    /// ([`Status::CANCELLED`]). A panic in it cancels the load and resumes after it.
    pub fn progress(mut self, f: ProgressFn<'a>) -> LoadOptions<'a> {
        self.progress = Some(f);
        self
    }
}

/// A loaded slice of one of the model's tensors (`ft_model_tensor`), borrowed from the model.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'m> {
    pub dtype: Dtype,
    shape: [i64; 4],
    ndim: usize,
    bytes: &'m [u8],
}

impl<'m> TensorView<'m> {
    pub fn shape(&self) -> &[i64] {
        &self.shape[..self.ndim]
    }
    /// The raw row-major bytes.
    pub fn bytes(&self) -> &'m [u8] {
        self.bytes
    }
    /// The elements, if the tensor is bf16.
    pub fn as_bf16(&self) -> Option<&'m [Bf16]> {
        if self.dtype != Dtype::BF16 || self.bytes.as_ptr() as usize % 2 != 0 {
            return None;
        }
        // SAFETY: aligned, and Bf16 is any 16-bit pattern.
        Some(unsafe { std::slice::from_raw_parts(self.bytes.as_ptr() as *const Bf16, self.bytes.len() / 2) })
    }
    /// The elements, if the tensor is f32.
    pub fn as_f32(&self) -> Option<&'m [f32]> {
        if self.dtype != Dtype::F32 || self.bytes.as_ptr() as usize % 4 != 0 {
            return None;
        }
        // SAFETY: aligned, and f32 is any 32-bit pattern.
        Some(unsafe { std::slice::from_raw_parts(self.bytes.as_ptr() as *const f32, self.bytes.len() / 4) })
    }
}

/// An immutable model: expert weights in host banks, geometry and routing rule. Shared by any
/// number of threads and sessions (`Send + Sync`); it borrows its engine, and its sessions
/// borrow it.
///
/// ```
/// use freetoken::{Engine, EngineParams, LoadOptions, Model, Status};
/// let engine = Engine::new(&EngineParams::default())?;
/// let mut seen = 0u64;
/// let mut progress = |_phase: &str, done: u64, _total: u64| { seen = done; true };
/// match Model::load(&engine, "/no/such/checkpoint", LoadOptions::new().progress(&mut progress)) {
///     Ok(model) => println!("{} MoE layers", model.info()?.num_layers),
///     Err(e) => assert_eq!(e.status(), Status::IO),
/// }
/// # Ok::<(), freetoken::Error>(())
/// ```
pub struct Model<'e> {
    pub(crate) raw: NonNull<sys::ft_model>,
    _engine: PhantomData<&'e Engine>,
}

// SAFETY: the header's threading contract: a model is immutable and shareable by any number of
// threads once ft_model_load returned or ft_model_finalize succeeded (the only ways to get one).
unsafe impl Send for Model<'_> {}
unsafe impl Sync for Model<'_> {}

impl<'e> Model<'e> {
    /// Loads the routed experts of a Hugging Face checkpoint directory or a GGUF file
    /// (`ft_model_load`).
    pub fn load(engine: &'e Engine, path: impl AsRef<Path>, options: LoadOptions<'_>) -> Result<Model<'e>> {
        let cpath = path_cstring(path.as_ref())?;
        let mut p = defaults(sys::ft_model_load_params_init);
        p.io_threads = to_i32(options.io_threads, "io_threads")?;
        let mut raw = ptr::null_mut();
        with_progress(options.progress, |cb, user| {
            p.progress = cb;
            p.progress_user_data = user;
            with_err_buf(|err, n| unsafe {
                sys::ft_model_load(engine.raw.as_ptr(), cpath.as_ptr(), &p, &mut raw, err, n)
            })
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_model_load gave NULL"))?;
        Ok(Model { raw, _engine: PhantomData })
    }

    /// Geometry, format and sizes (`ft_model_get_info`).
    pub fn info(&self) -> Result<ModelInfo> {
        model_info(self.raw.as_ptr())
    }

    /// The (gate/up, down) formats of MoE layer `layer` (`ft_model_layer_formats`).
    pub fn layer_formats(&self, layer: i32) -> Result<(Format, Format)> {
        let (mut gu, mut dn) = (0i32, 0i32);
        let s = unsafe { sys::ft_model_layer_formats(self.raw.as_ptr(), layer, &mut gu, &mut dn) };
        check(s, || format!("ft_model_layer_formats: no MoE layer {layer}"))?;
        Ok((Format(gu), Format(dn)))
    }

    /// The MoE layer index of checkpoint layer `model_layer`, or None for a dense or missing layer.
    pub fn moe_layer(&self, model_layer: i32) -> Option<i32> {
        let l = unsafe { sys::ft_model_moe_layer(self.raw.as_ptr(), model_layer) };
        if l < 0 {
            None
        } else {
            Some(l)
        }
    }

    /// Tensor `kind` of MoE layer `layer` (router weights, shared experts; read from checkpoints).
    /// [`Status::UNSUPPORTED`] if the model has no such tensor.
    pub fn tensor(&self, layer: i32, kind: TensorKind) -> Result<TensorView<'_>> {
        let mut v: sys::ft_tensor_view = sized();
        let s = unsafe { sys::ft_model_tensor(self.raw.as_ptr(), layer, kind.0, &mut v) };
        // ft_model_tensor leaves no error text (the model is shared), so the message is made here.
        check(s, || format!("tensor {kind:?} of MoE layer {layer}: {}", Status(s).name()))?;
        let ndim = (v.ndim.max(0) as usize).min(4);
        let bytes = if v.nbytes == 0 || v.data.is_null() {
            &[][..]
        } else {
            // SAFETY: owned by the model, valid and unchanged while it lives (the borrow of self).
            unsafe { std::slice::from_raw_parts(v.data as *const u8, v.nbytes) }
        };
        Ok(TensorView { dtype: Dtype(v.dtype), shape: v.shape, ndim, bytes })
    }

    /// The C handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::ft_model {
        self.raw.as_ptr()
    }
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        unsafe { sys::ft_model_free(self.raw.as_ptr()) }
    }
}
