//! The error of a failed UCX call.

use crate::sys;
use std::ffi::CStr;
use std::fmt;

/// A failed UCX call: the `ucs_status_t` and what was being done.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error {
    pub status: i32,
    pub what: &'static str,
}

impl Error {
    pub(crate) fn new(status: i32, what: &'static str) -> Error {
        Error { status, what }
    }

    /// A failure of the peer or the link (reset, unreachable, timeout):
    /// the endpoint is dead and the peer's state should be released.
    pub fn is_peer_failure(&self) -> bool {
        matches!(self.status, -25 | -24 | -6 | -3 | -20) || (-89..=-40).contains(&self.status)
    }

    /// The errno a socket call failing because of this should report.
    pub fn errno(&self) -> i32 {
        if self.is_peer_failure() {
            libc::ECONNRESET
        } else if self.status == sys::UCS_ERR_CANCELED {
            libc::ECANCELED
        } else {
            libc::EIO
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ucs_status_string returns a static NUL-terminated string
        // for any status value.
        let text = unsafe { CStr::from_ptr(sys::ucs_status_string(self.status)) };
        write!(
            f,
            "{}: {} ({})",
            self.what,
            text.to_string_lossy(),
            self.status
        )
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn check(status: i32, what: &'static str) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(Error::new(status, what))
    }
}
