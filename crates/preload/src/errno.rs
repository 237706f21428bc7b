//! errno, read and set the libc way, for every interposed function.

pub fn last_errno() -> i32 {
    // SAFETY: errno is thread-local; reading it is always valid.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// Sets errno and returns -1, the libc convention.
pub fn fail<T: From<i8>>(e: i32) -> T {
    set_errno(e);
    T::from(-1)
}

pub fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}
