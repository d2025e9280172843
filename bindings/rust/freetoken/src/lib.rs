//! Safe Rust API of libfreetoken, which computes the routed experts of Mixture-of-Experts layers
//! whose weights live in host memory.
//!
//! The handles follow the C API (`freetoken.h`) and its threading contract:
//!
//! | type | C handle | frees | lives at most as long as | `Send` | `Sync` |
//! |---|---|---|---|---|---|
//! | [`Engine`] | `ft_engine` | `ft_engine_free` | | yes | yes (shared by many threads) |
//! | [`ModelBuilder<'e>`] | `ft_model` before finalize | `ft_model_free` | its engine | no | no (built by one thread) |
//! | [`Model<'e>`] | `ft_model`, immutable | `ft_model_free` | its engine | yes | yes (immutable) |
//! | [`Session<'m>`] | `ft_session` | `ft_session_free` | its model | yes | no (one thread at a time) |
//! | [`Profile`] | `ft_profile` | `ft_profile_free` | | yes | yes (immutable) |
//! | [`ep::EpGroup`] | `ft_ep_group` | `ft_ep_group_free` | | yes | no (one thread at a time) |
//!
//! Every fallible call returns [`Result<T>`](Result) whose [`Error`] carries the library's
//! [`Status`] and its message. Slices are checked against the shapes the library will read or
//! write before any call, so a wrong length is an `Error` with [`Status::INVALID_ARGUMENT`],
//! never an out-of-bounds access. bf16 values are [`Bf16`] (the 16-bit pattern).
//!
//! ```
//! use freetoken::{Bf16, Engine, EngineParams, ModelBuilder, ModelDesc, Projection, Session, SessionParams, Backend};
//!
//! let engine = Engine::new(&EngineParams { cpu_threads: 2, ..EngineParams::default() })?;
//! let desc = ModelDesc { num_layers: 1, num_experts: 4, top_k: 2, hidden_size: 64, intermediate_size: 32,
//!                        ..ModelDesc::default() };
//! let mut builder = ModelBuilder::new(&engine, &desc)?;
//! let w = vec![Bf16::from_f32(0.01); 64 * 32];
//! for e in 0..4 {
//!     for p in [Projection::GATE, Projection::UP, Projection::DOWN] {
//!         builder.set_expert(0, e, p, &w)?;
//!     }
//! }
//! let model = builder.finalize()?;
//! let mut session = Session::new(&model, &SessionParams { backend: Backend::CPU, ..SessionParams::default() })?;
//! let logits = [0.5f32, 0.1, 0.9, -1.0];              // one token, 4 experts
//! let (mut ids, mut weights) = ([0i32; 2], [0f32; 2]);
//! session.route(0, &logits, &mut ids, &mut weights)?;
//! assert_eq!(ids, [2, 0]);
//! let x = vec![Bf16::from_f32(1.0); 64];
//! let mut y = vec![Bf16::default(); 64];
//! session.decode(0, &x, &ids, &weights, &mut y)?;
//! assert!(y.iter().all(|v| v.to_f32().is_finite()));
//! # Ok::<(), freetoken::Error>(())
//! ```
//!
//! The compiler holds the contract. A session cannot outlive its model:
//! ```compile_fail
//! # use freetoken::*;
//! # let engine = Engine::new(&EngineParams::default()).unwrap();
//! let session = {
//!     let model = ModelBuilder::new(&engine, &ModelDesc::default()).unwrap().finalize().unwrap();
//!     Session::new(&model, &SessionParams::default()).unwrap()
//! };
//! ```
//! nor be used by two threads at once (it is not `Sync`):
//! ```compile_fail
//! # use freetoken::*;
//! fn shared<T: Sync>(_: &T) {}
//! # fn f(s: Session<'_>) {
//! shared(&s);
//! # }
//! ```
//! and a model under construction stays on its thread (not `Send`):
//! ```compile_fail
//! # use freetoken::*;
//! fn movable<T: Send>(_: T) {}
//! # fn f(b: ModelBuilder<'_>) {
//! movable(b);
//! # }
//! ```
//!
//! Building needs the library through `pkg-config` (or `FREETOKEN_LIB_DIR`); see freetoken-sys.
//! The oldest Rust this crate builds with is 1.63.

use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::mem::{size_of, MaybeUninit};
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, RwLock};

pub use freetoken_sys as sys;

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/// A status code of the C API (`ft_status`). Values never change meaning; unknown values (from a
/// newer library) keep their number.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub i32);

impl Status {
    pub const OK: Status = Status(sys::FT_OK);
    pub const INVALID_ARGUMENT: Status = Status(sys::FT_ERR_INVALID_ARGUMENT);
    pub const OUT_OF_MEMORY: Status = Status(sys::FT_ERR_OUT_OF_MEMORY);
    pub const IO: Status = Status(sys::FT_ERR_IO);
    pub const FORMAT: Status = Status(sys::FT_ERR_FORMAT);
    pub const UNSUPPORTED: Status = Status(sys::FT_ERR_UNSUPPORTED);
    pub const NO_DEVICE: Status = Status(sys::FT_ERR_NO_DEVICE);
    pub const DEVICE: Status = Status(sys::FT_ERR_DEVICE);
    pub const DEVICE_LOST: Status = Status(sys::FT_ERR_DEVICE_LOST);
    pub const TIMEOUT: Status = Status(sys::FT_ERR_TIMEOUT);
    pub const CANCELLED: Status = Status(sys::FT_ERR_CANCELLED);
    pub const NON_FINITE: Status = Status(sys::FT_ERR_NON_FINITE);
    pub const STATE: Status = Status(sys::FT_ERR_STATE);
    pub const INTERNAL: Status = Status(sys::FT_ERR_INTERNAL);

    /// The library's name for the status, e.g. "FT_ERR_FORMAT" ("FT_ERR_UNKNOWN" if unknown).
    pub fn name(self) -> &'static str {
        // SAFETY: ft_status_string returns a static, never-NULL string.
        unsafe { CStr::from_ptr(sys::ft_status_string(self.0)) }.to_str().unwrap_or("FT_ERR_UNKNOWN")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: the library's status and its error text (or this crate's, for a check made
/// before calling the library).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with the given status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    pub fn status(&self) -> Status {
        self.status
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// `Result<T, freetoken::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// Copies a library string; NULL reads as "".
unsafe fn string_of(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A status as a Result; `text` is read only on failure (handle error texts are valid until the
/// next call on the handle, so they are copied at once).
fn check(status: sys::ft_status, text: impl FnOnce() -> String) -> Result<()> {
    if status == sys::FT_OK {
        Ok(())
    } else {
        let mut message = text();
        if message.is_empty() {
            message = "(no message)".to_string();
        }
        Err(Error::new(Status(status), message))
    }
}

/// Runs a creation call with a buffer for its error text.
fn with_err_buf(f: impl FnOnce(*mut c_char, usize) -> sys::ft_status) -> Result<()> {
    let mut err = [0 as c_char; 512];
    let status = f(err.as_mut_ptr(), err.len());
    // SAFETY: the buffer starts zeroed and the library NUL-terminates what it writes.
    check(status, || unsafe { string_of(err.as_ptr()) })
}

fn invalid(message: String) -> Error {
    Error::new(Status::INVALID_ARGUMENT, message)
}

/// A zeroed output struct whose first field (struct_size) holds its size.
fn sized<T>() -> T {
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: every C API output struct starts with `uint32_t struct_size`, and all-zero bytes
    // are a valid value of each (integers, floats, bools and raw pointers).
    unsafe {
        (v.as_mut_ptr() as *mut u32).write(size_of::<T>() as u32);
        v.assume_init()
    }
}

/// A params struct with the library's defaults (`init` is its *_params_init function).
fn defaults<T>(init: unsafe extern "C" fn(*mut T)) -> T {
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: *_params_init writes every field of the struct it is given.
    unsafe {
        init(v.as_mut_ptr());
        v.assume_init()
    }
}

fn path_cstring(path: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| invalid(format!("path {} contains a NUL byte", path.display())))
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| invalid(format!("{what} = {v} does not fit the C API's int32_t")))
}

/// Rows of a [rows, width] array given as a flat slice of `len` elements.
fn rows_of(len: usize, width: usize, what: &str) -> Result<usize> {
    if width == 0 || len % width != 0 || len == 0 {
        return Err(invalid(format!("{what} has {len} elements, not a positive multiple of {width}")));
    }
    Ok(len / width)
}

fn expect_len(len: usize, want: usize, what: &str) -> Result<()> {
    if len != want {
        return Err(invalid(format!("{what} has {len} elements, the call needs {want}")));
    }
    Ok(())
}

/* ---------------------------------------------------------------------------------------------
 * bf16
 * ------------------------------------------------------------------------------------------- */

/// A bfloat16 value as its 16-bit pattern (the layout of `half::bf16`: `repr(transparent)` over
/// `u16`), so `&[Bf16]` passes to the library as `const uint16_t *`.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    pub const fn from_bits(bits: u16) -> Bf16 {
        Bf16(bits)
    }
    pub const fn to_bits(self) -> u16 {
        self.0
    }
    /// Rounds to the nearest bf16, ties to even; NaN stays NaN (quiet), infinities stay.
    pub fn from_f32(f: f32) -> Bf16 {
        let u = f.to_bits();
        if f.is_nan() {
            return Bf16(((u >> 16) as u16) | 0x0040);
        }
        Bf16((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
    }
    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl fmt::Debug for Bf16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_f32())
    }
}

impl From<f32> for Bf16 {
    fn from(f: f32) -> Bf16 {
        Bf16::from_f32(f)
    }
}

impl From<Bf16> for f32 {
    fn from(b: Bf16) -> f32 {
        b.to_f32()
    }
}

/* ---------------------------------------------------------------------------------------------
 * Enumerations (integer newtypes: values a newer library adds keep their number)
 * ------------------------------------------------------------------------------------------- */

macro_rules! int_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $value:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub i32);
        impl $name {
            $($(#[$vm])* pub const $variant: $name = $name($value);)*
            /// The C constant's name without its prefix, or None for a value this crate does not know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(v if v == $value => Some(stringify!($variant)),)*
                    _ => None,
                }
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}::{}", stringify!($name), n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }
    };
}

int_enum!(
    /// Expert weight formats (`FT_FORMAT_*`).
    Format {
        BF16 = sys::FT_FORMAT_BF16,
        FP8_BLOCK = sys::FT_FORMAT_FP8_BLOCK,
        NVFP4 = sys::FT_FORMAT_NVFP4,
        MXFP4 = sys::FT_FORMAT_MXFP4,
        DS_FP4 = sys::FT_FORMAT_DS_FP4,
        Q4_0 = sys::FT_FORMAT_Q4_0,
    }
);
int_enum!(
    /// Element types of model tensors (`FT_DTYPE_*`).
    Dtype { BF16 = sys::FT_DTYPE_BF16, F32 = sys::FT_DTYPE_F32 }
);
int_enum!(
    /// Expert activations (`FT_ACT_*`).
    Activation {
        SILU = sys::FT_ACT_SILU,
        GELU = sys::FT_ACT_GELU,
        GELU_TANH = sys::FT_ACT_GELU_TANH,
        SWIGLU_CLAMP = sys::FT_ACT_SWIGLU_CLAMP,
    }
);
int_enum!(
    /// Routing rules (`FT_ROUTING_*`).
    Routing {
        SOFTMAX_TOPK = sys::FT_ROUTING_SOFTMAX_TOPK,
        SOFTMAX_TOPK_RENORM = sys::FT_ROUTING_SOFTMAX_TOPK_RENORM,
        SIGMOID_GROUP_TOPK = sys::FT_ROUTING_SIGMOID_GROUP_TOPK,
        TOPK_SOFTMAX = sys::FT_ROUTING_TOPK_SOFTMAX,
        SQRTSOFTPLUS_GROUP_TOPK = sys::FT_ROUTING_SQRTSOFTPLUS_GROUP_TOPK,
    }
);
int_enum!(
    /// Backends (`FT_BACKEND_*`).
    Backend {
        AUTO = sys::FT_BACKEND_AUTO,
        CPU = sys::FT_BACKEND_CPU,
        GPU = sys::FT_BACKEND_GPU,
        OFFLOAD = sys::FT_BACKEND_OFFLOAD,
        HYBRID = sys::FT_BACKEND_HYBRID,
    }
);
int_enum!(
    /// Log levels (`FT_LOG_*`).
    LogLevel {
        OFF = sys::FT_LOG_OFF,
        ERROR = sys::FT_LOG_ERROR,
        WARN = sys::FT_LOG_WARN,
        INFO = sys::FT_LOG_INFO,
        DEBUG = sys::FT_LOG_DEBUG,
    }
);
int_enum!(
    /// The projection of an expert that [`ModelBuilder::set_expert`] writes (`FT_PROJ_*`).
    Projection {
        /// gate_proj / w1, [I, H] row-major.
        GATE = sys::FT_PROJ_GATE,
        /// up_proj / w3, [I, H] row-major.
        UP = sys::FT_PROJ_UP,
        /// down_proj / w2, [H, I] row-major.
        DOWN = sys::FT_PROJ_DOWN,
    }
);
int_enum!(
    /// Tensors a loaded model carries besides the routed experts (`FT_TENSOR_*`).
    TensorKind {
        ROUTER_WEIGHT = sys::FT_TENSOR_ROUTER_WEIGHT,
        ROUTER_BIAS = sys::FT_TENSOR_ROUTER_BIAS,
        SHARED_GATE = sys::FT_TENSOR_SHARED_GATE,
        SHARED_UP = sys::FT_TENSOR_SHARED_UP,
        SHARED_DOWN = sys::FT_TENSOR_SHARED_DOWN,
        SHARED_GATE_PROJ = sys::FT_TENSOR_SHARED_GATE_PROJ,
    }
);

/// Which GPU an engine or profile uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The first CUDA device if one is usable, else none (`FT_DEVICE_AUTO`).
    Auto,
    /// Never touch a GPU (`FT_DEVICE_NONE`).
    CpuOnly,
    /// This CUDA device ordinal.
    Cuda(i32),
}

impl Device {
    fn raw(self) -> i32 {
        match self {
            Device::Auto => sys::FT_DEVICE_AUTO,
            Device::CpuOnly => sys::FT_DEVICE_NONE,
            Device::Cuda(n) => n,
        }
    }
    fn from_raw(v: i32) -> Device {
        match v {
            sys::FT_DEVICE_AUTO => Device::Auto,
            sys::FT_DEVICE_NONE => Device::CpuOnly,
            n => Device::Cuda(n),
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Version, build information, logging
 * ------------------------------------------------------------------------------------------- */

/// The loaded library's version as (major, minor, patch).
pub fn version() -> (u32, u32, u32) {
    let n = unsafe { sys::ft_version_number() };
    (n / 10000, n / 100 % 100, n % 100)
}

/// The loaded library's version as "MAJOR.MINOR.PATCH".
pub fn version_string() -> &'static str {
    // SAFETY: static storage, never NULL.
    unsafe { CStr::from_ptr(sys::ft_version_string()) }.to_str().unwrap_or("")
}

/// What the loaded library was built with and the kernels this CPU runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BuildInfo {
    pub version_number: u32,
    pub cuda: bool,
    pub nccl: bool,
    pub cuda_runtime_version: i32,
    pub cuda_archs: String,
    pub onednn_version: String,
    pub cpu_isa: String,
    pub compiler: String,
    /// oneDNN runs bf16 matmuls on this CPU (AVX-512 and newer); when false the CPU backend
    /// never takes its oneDNN path.
    pub onednn_bf16: bool,
}

/// The library's build information (`ft_build_info_get`).
pub fn build_info() -> Result<BuildInfo> {
    let mut i: sys::ft_build_info = sized();
    check(unsafe { sys::ft_build_info_get(&mut i) }, || "ft_build_info_get failed".to_string())?;
    // SAFETY: the strings are static storage.
    unsafe {
        Ok(BuildInfo {
            version_number: i.version_number,
            cuda: i.cuda,
            nccl: i.nccl,
            cuda_runtime_version: i.cuda_runtime_version,
            cuda_archs: string_of(i.cuda_archs),
            onednn_version: string_of(i.onednn_version),
            cpu_isa: string_of(i.cpu_isa),
            compiler: string_of(i.compiler),
            onednn_bf16: i.onednn_bf16,
        })
    }
}

type LogFn = dyn Fn(LogLevel, &str) + Send + Sync;

/// The closure the library's log messages go to (the C side gets only the trampoline).
static LOGGER: RwLock<Option<Arc<LogFn>>> = RwLock::new(None);

unsafe extern "C" fn log_trampoline(_user: *mut c_void, level: i32, message: *const c_char) {
    let f = match LOGGER.read() {
        Ok(g) => g.clone(),
        Err(_) => return,
    };
    if let Some(f) = f {
        let text = string_of(message);
        // A panic must not unwind into the library; it is dropped.
        let _ = catch_unwind(AssertUnwindSafe(|| f(LogLevel(level), &text)));
    }
}

/// Sends the library's log messages of `level` or more severe to `f` (one line each, from any
/// library thread, possibly at the same time). `f` must not call back into the library. A panic
/// in `f` is caught and dropped. Process-wide: replaces any earlier callback.
pub fn set_log_callback(level: LogLevel, f: impl Fn(LogLevel, &str) + Send + Sync + 'static) {
    *LOGGER.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(f));
    unsafe { sys::ft_log_set_callback(Some(log_trampoline), ptr::null_mut(), level.0) };
}

/// Sends log messages of `level` or more severe to standard error again (the library's default).
pub fn reset_log_callback(level: LogLevel) {
    unsafe { sys::ft_log_set_callback(None, ptr::null_mut(), level.0) };
    *LOGGER.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/* ---------------------------------------------------------------------------------------------
 * Progress callbacks
 * ------------------------------------------------------------------------------------------- */

/// A progress closure: (phase, done, total) -> continue?
pub type ProgressFn<'a> = &'a mut (dyn FnMut(&str, u64, u64) -> bool + Send);

/// What the C progress callback's user data points to during one call.
struct Progress<'a> {
    f: Mutex<ProgressFn<'a>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Runs `call` with the C progress callback and user data that report to `f` (None and NULL
/// without one); once it has returned, re-raises a panic of `f`.
fn with_progress<R>(f: Option<ProgressFn<'_>>, call: impl FnOnce(sys::ft_progress_fn, *mut c_void) -> R) -> R {
    let p = match f {
        Some(f) => Progress { f: Mutex::new(f), panic: Mutex::new(None) },
        None => return call(None, ptr::null_mut()),
    };
    let r = call(Some(progress_trampoline), &p as *const Progress as *mut c_void);
    if let Some(e) = p.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        resume_unwind(e);
    }
    r
}

unsafe extern "C" fn progress_trampoline(user: *mut c_void, phase: *const c_char, done: u64, total: u64) -> bool {
    let p = &*(user as *const Progress);
    let phase = string_of(phase);
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut f = p.f.lock().unwrap_or_else(|e| e.into_inner());
        (*f)(&phase, done, total)
    }));
    match r {
        Ok(go) => go,
        Err(e) => {
            // Cancel the operation; the panic resumes in the caller's thread afterwards.
            *p.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            false
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Engine
 * ------------------------------------------------------------------------------------------- */

/// Engine parameters; `default()` holds the library's defaults.
#[derive(Clone, Debug)]
pub struct EngineParams {
    /// The GPU to use (default [`Device::Auto`]).
    pub device: Device,
    /// Worker threads; 0 (default): one per physical core, less one with a GPU.
    pub cpu_threads: usize,
    /// Pin each worker to its own core (default true).
    pub pin_threads: bool,
}

impl Default for EngineParams {
    fn default() -> EngineParams {
        let p = defaults(sys::ft_engine_params_init);
        EngineParams { device: Device::from_raw(p.device), cpu_threads: p.cpu_threads.max(0) as usize, pin_threads: p.pin_threads }
    }
}

/// What an engine runs on.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineInfo {
    /// The CUDA device in use, or None.
    pub device: Option<i32>,
    pub cpu_threads: i32,
    pub physical_cores: i32,
    pub cpu_isa: String,
    pub device_name: String,
}

/// The machine context: the CPU worker pool and the GPU choice. Shared by any number of threads
/// (`Send + Sync`); its models borrow it, so it outlives them.
///
/// ```
/// use freetoken::{Device, Engine, EngineParams};
/// let engine = Engine::new(&EngineParams { device: Device::CpuOnly, cpu_threads: 1, ..Default::default() })?;
/// let info = engine.info()?;
/// assert_eq!(info.device, None);
/// assert_eq!(info.cpu_threads, 1);
/// # Ok::<(), freetoken::Error>(())
/// ```
pub struct Engine {
    raw: NonNull<sys::ft_engine>,
}

// SAFETY: the header's threading contract: an engine may be shared by many threads once created.
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

impl Engine {
    /// Creates an engine (`ft_engine_create`).
    pub fn new(params: &EngineParams) -> Result<Engine> {
        let mut p = defaults(sys::ft_engine_params_init);
        p.device = params.device.raw();
        p.cpu_threads = to_i32(params.cpu_threads, "cpu_threads")?;
        p.pin_threads = params.pin_threads;
        let mut raw = ptr::null_mut();
        with_err_buf(|err, n| unsafe { sys::ft_engine_create(&p, &mut raw, err, n) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_engine_create gave NULL"))?;
        Ok(Engine { raw })
    }

    /// The engine's device, threads and kernel tier (`ft_engine_get_info`).
    pub fn info(&self) -> Result<EngineInfo> {
        let mut i: sys::ft_engine_info = sized();
        let s = unsafe { sys::ft_engine_get_info(self.raw.as_ptr(), &mut i) };
        check(s, || unsafe { string_of(sys::ft_engine_last_error(self.raw.as_ptr())) })?;
        // SAFETY: cpu_isa is static; device_name lives as long as the engine and is copied here.
        unsafe {
            Ok(EngineInfo {
                device: if i.device < 0 { None } else { Some(i.device) },
                cpu_threads: i.cpu_threads,
                physical_cores: i.physical_cores,
                cpu_isa: string_of(i.cpu_isa),
                device_name: string_of(i.device_name),
            })
        }
    }

    /// The C handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::ft_engine {
        self.raw.as_ptr()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        unsafe { sys::ft_engine_free(self.raw.as_ptr()) }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------------- */

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
    raw: NonNull<sys::ft_model>,
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

/* ---------------------------------------------------------------------------------------------
 * Session
 * ------------------------------------------------------------------------------------------- */

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

/* ---------------------------------------------------------------------------------------------
 * Bandwidth profile
 * ------------------------------------------------------------------------------------------- */

/// Options of [`Profile::measure`]; `default()` holds the library's defaults.
pub struct ProfileOptions<'a> {
    pub device: Device,
    /// 0 (default): as engines choose.
    pub cpu_threads: usize,
    /// Formats to measure; empty (default): every format.
    pub formats: Vec<Format>,
    /// Soft bound on the whole run (default 30).
    pub max_seconds: f64,
    /// Called with (phase, done, total); return false to cancel.
    pub progress: Option<ProgressFn<'a>>,
}

impl Default for ProfileOptions<'_> {
    fn default() -> Self {
        let p = defaults(sys::ft_profile_params_init);
        ProfileOptions {
            device: Device::from_raw(p.device),
            cpu_threads: p.cpu_threads.max(0) as usize,
            formats: Vec::new(),
            max_seconds: p.max_seconds,
            progress: None,
        }
    }
}

/// Machine figures of a profile.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProfileMachine {
    pub physical_cores: i32,
    pub threads_used: i32,
    pub cpu_read_gbs: f64,
    pub h2d_gbs: f64,
    pub d2h_gbs: f64,
    pub gpu_name: String,
    pub cpu_model: String,
}

/// Figures of one expert format in a profile.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProfileFormat {
    pub format: Format,
    pub expert_bytes: u64,
    pub cpu_gbs: f64,
    pub gather_gbs: f64,
    pub cpu_overlap_gbs: f64,
    pub gather_overlap_gbs: f64,
    /// Share of a step's misses to fetch over PCIe; None when the figures do not tell.
    pub fetch_fraction: Option<f64>,
    pub cpu_kernel: String,
}

/// What this machine's memory, bus and kernels do: measured, or read from a saved profile.
/// Immutable (`Send + Sync`).
///
/// ```
/// use freetoken::{Device, Format, Profile, ProfileOptions, Status};
/// // Cancelled by its progress closure at the first report.
/// let mut stop = |_phase: &str, _done: u64, _total: u64| false;
/// let options = ProfileOptions { device: Device::CpuOnly, formats: vec![Format::BF16], progress: Some(&mut stop),
///                                ..Default::default() };
/// assert_eq!(Profile::measure(options).err().map(|e| e.status()), Some(Status::CANCELLED));
/// // A missing file is an I/O error.
/// assert_eq!(Profile::load(Some("/no/such/profile.json".as_ref())).err().map(|e| e.status()), Some(Status::IO));
/// ```
pub struct Profile {
    raw: NonNull<sys::ft_profile>,
}

// SAFETY: the header's threading contract: a profile is immutable once made and may be read
// from any number of threads.
unsafe impl Send for Profile {}
unsafe impl Sync for Profile {}

impl Profile {
    /// Measures the machine (`ft_profile_bandwidth`).
    pub fn measure(options: ProfileOptions<'_>) -> Result<Profile> {
        let mut p = defaults(sys::ft_profile_params_init);
        p.device = options.device.raw();
        p.cpu_threads = to_i32(options.cpu_threads, "cpu_threads")?;
        p.formats = 0;
        for f in &options.formats {
            if !(0..32).contains(&f.0) {
                return Err(invalid(format!("format {f:?} has no bit in the formats mask")));
            }
            p.formats |= 1u32 << f.0;
        }
        p.max_seconds = options.max_seconds;
        let mut raw = ptr::null_mut();
        with_progress(options.progress, |cb, user| {
            p.progress = cb;
            p.progress_user_data = user;
            with_err_buf(|err, n| unsafe { sys::ft_profile_bandwidth(&p, &mut raw, err, n) })
        })?;
        Ok(Profile { raw: NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_profile_bandwidth gave NULL"))? })
    }

    /// Reads a profile; None: `$FT_PROFILE_PATH`, else the default cache path (`ft_profile_load`).
    pub fn load(path: Option<&Path>) -> Result<Profile> {
        let cpath = path.map(path_cstring).transpose()?;
        let mut raw = ptr::null_mut();
        with_err_buf(|err, n| unsafe {
            sys::ft_profile_load(cpath.as_ref().map_or(ptr::null(), |c| c.as_ptr()), &mut raw, err, n)
        })?;
        Ok(Profile { raw: NonNull::new(raw).ok_or_else(|| Error::new(Status::INTERNAL, "ft_profile_load gave NULL"))? })
    }

    /// Writes the profile atomically; None: the default path (`ft_profile_save`).
    pub fn save(&self, path: Option<&Path>) -> Result<()> {
        let cpath = path.map(path_cstring).transpose()?;
        with_err_buf(|err, n| unsafe {
            sys::ft_profile_save(self.raw.as_ptr(), cpath.as_ref().map_or(ptr::null(), |c| c.as_ptr()), err, n)
        })
    }

    pub fn machine(&self) -> Result<ProfileMachine> {
        let mut m: sys::ft_profile_machine = sized();
        let s = unsafe { sys::ft_profile_get_machine(self.raw.as_ptr(), &mut m) };
        check(s, || "ft_profile_get_machine failed".to_string())?;
        // SAFETY: the strings live as long as the profile and are copied here.
        unsafe {
            Ok(ProfileMachine {
                physical_cores: m.physical_cores,
                threads_used: m.threads_used,
                cpu_read_gbs: m.cpu_read_gbs,
                h2d_gbs: m.h2d_gbs,
                d2h_gbs: m.d2h_gbs,
                gpu_name: string_of(m.gpu_name),
                cpu_model: string_of(m.cpu_model),
            })
        }
    }

    /// Figures of one format; [`Status::UNSUPPORTED`] when the profile has none for it.
    pub fn format(&self, format: Format) -> Result<ProfileFormat> {
        let mut f: sys::ft_profile_format = sized();
        let s = unsafe { sys::ft_profile_get_format(self.raw.as_ptr(), format.0, &mut f) };
        check(s, || format!("the profile has no figures for {format:?}"))?;
        Ok(ProfileFormat {
            format: Format(f.format),
            expert_bytes: f.expert_bytes,
            cpu_gbs: f.cpu_gbs,
            gather_gbs: f.gather_gbs,
            cpu_overlap_gbs: f.cpu_overlap_gbs,
            gather_overlap_gbs: f.gather_overlap_gbs,
            fetch_fraction: if f.fetch_fraction < 0.0 { None } else { Some(f.fetch_fraction) },
            // SAFETY: lives as long as the profile; copied here.
            cpu_kernel: unsafe { string_of(f.cpu_kernel) },
        })
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        unsafe { sys::ft_profile_free(self.raw.as_ptr()) }
    }
}

// After the int_enum! macro, which it uses.
pub mod ep;
