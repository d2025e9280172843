//! Helpers shared by the modules: status checks, library defaults and slice length checks.

use std::ffi::{CStr, CString};
use std::mem::{size_of, MaybeUninit};
use std::os::raw::c_char;
use std::path::Path;

use crate::sys;
use crate::error::{Error, Result, Status};

/// Copies a library string; NULL reads as "".
pub(crate) unsafe fn string_of(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A status as a Result; `text` is read only on failure (handle error texts are valid until the
/// next call on the handle, so they are copied at once).
pub(crate) fn check(status: sys::ft_status, text: impl FnOnce() -> String) -> Result<()> {
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
pub(crate) fn with_err_buf(f: impl FnOnce(*mut c_char, usize) -> sys::ft_status) -> Result<()> {
    let mut err = [0 as c_char; 512];
    let status = f(err.as_mut_ptr(), err.len());
    // SAFETY: the buffer starts zeroed and the library NUL-terminates what it writes.
    check(status, || unsafe { string_of(err.as_ptr()) })
}

pub(crate) fn invalid(message: String) -> Error {
    Error::new(Status::INVALID_ARGUMENT, message)
}

/// A zeroed output struct whose first field (struct_size) holds its size.
pub(crate) fn sized<T>() -> T {
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: every C API output struct starts with `uint32_t struct_size`, and all-zero bytes
    // are a valid value of each (integers, floats, bools and raw pointers).
    unsafe {
        (v.as_mut_ptr() as *mut u32).write(size_of::<T>() as u32);
        v.assume_init()
    }
}

/// A params struct with the library's defaults (`init` is its *_params_init function).
pub(crate) fn defaults<T>(init: unsafe extern "C" fn(*mut T)) -> T {
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: *_params_init writes every field of the struct it is given.
    unsafe {
        init(v.as_mut_ptr());
        v.assume_init()
    }
}

pub(crate) fn path_cstring(path: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| invalid(format!("path {} contains a NUL byte", path.display())))
}

pub(crate) fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| invalid(format!("{what} = {v} does not fit the C API's int32_t")))
}

/// Rows of a [rows, width] array given as a flat slice of `len` elements.
pub(crate) fn rows_of(len: usize, width: usize, what: &str) -> Result<usize> {
    if width == 0 || len % width != 0 || len == 0 {
        return Err(invalid(format!("{what} has {len} elements, not a positive multiple of {width}")));
    }
    Ok(len / width)
}

pub(crate) fn expect_len(len: usize, want: usize, what: &str) -> Result<()> {
    if len != want {
        return Err(invalid(format!("{what} has {len} elements, the call needs {want}")));
    }
    Ok(())
}
