//! The loaded library: version, build information and the log callback.

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, RwLock};

use crate::sys;
use crate::error::Result;
use crate::util::{check, sized, string_of};
use crate::enums::LogLevel;

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
