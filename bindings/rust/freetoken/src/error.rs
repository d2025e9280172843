//! Errors: the library's status codes and this crate's `Error` and `Result`.

use std::ffi::CStr;
use std::fmt;

use crate::sys;

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
