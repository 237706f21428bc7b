//! The C ABI of direct connections (`include/tcps.h`, "Balancing"): a
//! program that can serve a connection on a kernel socket itself asks for
//! them once, and its accepts may then return kernel descriptors.

use crate::capi::{addr_out, ffi, new_fd, set_len, sock, with_client};
use crate::direct::Accepted;
use std::ffi::c_int;
use std::os::fd::IntoRawFd;

/// Asks the server for direct connections (see tcps.h).
#[no_mangle]
pub extern "C" fn tcps_take_direct_connections() -> c_int {
    ffi(|| with_client(|c| c.take_direct_connections().map(|()| 0)))
}

/// # Safety
/// As accept4(2): `addr`/`addrlen` NULL, or valid with `*addrlen` bytes at
/// `addr`; `is_kernel` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn tcps_accept_any(
    s: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
    flags: c_int,
    is_kernel: *mut c_int,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let out = unsafe { addr_out(addr, addrlen)? };
        with_client(|c| {
            let (got, len) = c.accept_any(s, flags, out)?;
            let (fd, kernel) = match got {
                Accepted::Offloaded(id) => (new_fd(c, id)?, 0),
                Accepted::Direct(fd) => (fd.into_raw_fd(), 1),
            };
            if !addr.is_null() {
                // SAFETY: the caller's contract.
                unsafe { set_len(addrlen, len) };
            }
            if !is_kernel.is_null() {
                // SAFETY: the caller's contract.
                unsafe { *is_kernel = kernel };
            }
            Ok(fd)
        })
    })
}
