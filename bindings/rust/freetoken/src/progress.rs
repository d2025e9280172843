//! Progress callbacks of long calls (model load, profiling).

use std::any::Any;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Mutex;

use crate::sys;
use crate::util::string_of;

/// A progress closure: (phase, done, total) -> continue?
pub type ProgressFn<'a> = &'a mut (dyn FnMut(&str, u64, u64) -> bool + Send);

/// What the C progress callback's user data points to during one call.
pub(crate) struct Progress<'a> {
    f: Mutex<ProgressFn<'a>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Runs `call` with the C progress callback and user data that report to `f` (None and NULL
/// without one); once it has returned, re-raises a panic of `f`.
pub(crate) fn with_progress<R>(f: Option<ProgressFn<'_>>, call: impl FnOnce(sys::ft_progress_fn, *mut c_void) -> R) -> R {
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

pub(crate) unsafe extern "C" fn progress_trampoline(user: *mut c_void, phase: *const c_char, done: u64, total: u64) -> bool {
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
