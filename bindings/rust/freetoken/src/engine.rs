//! The engine: the CPU worker pool and the GPU choice.

use std::ptr::{self, NonNull};

use crate::sys;
use crate::error::{Error, Result, Status};
use crate::util::{check, defaults, sized, string_of, to_i32, with_err_buf};
use crate::enums::Device;

/// Engine parameters; `default()` holds the library's defaults.
#[derive(Clone, Debug)]
pub struct EngineParams {
    /// The GPU to use (default [`Device::Auto`]).
    pub device: Device,
    /// Worker threads; 0 (default): one per physical core, less two with a GPU.
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
    pub(crate) raw: NonNull<sys::ft_engine>,
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
