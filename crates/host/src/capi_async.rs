//! The C ABI of asynchronous sends and registered memory (`include/tcps.h`,
//! "Asynchronous sends and registered memory").

use crate::capi::{errno, ffi, in_bytes, sock, with_client};
use crate::sendq::IoHandle;
use std::ffi::c_int;
use std::time::Duration;

/// `tcps_io_t` of tcps.h.
pub type TcpsIo = u64;
/// `tcps_mem_t` of tcps.h.
pub type TcpsMem = u32;

fn timeout(ms: c_int) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// # Safety
/// `buf` is valid for reads of `len` bytes (it is copied before returning).
#[no_mangle]
pub unsafe extern "C" fn tcps_send_async(
    s: c_int,
    buf: *const libc::c_void,
    len: usize,
    flags: c_int,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let b = unsafe { in_bytes(buf, len) }?;
        with_client(|c| c.send_async(s, b, flags)).map(|n| n as isize)
    })
}

/// # Safety
/// `io` is NULL or valid for writes; `buf..buf+len` lies in registration
/// `mem` (checked) and stays untouched until the send is done.
#[no_mangle]
pub unsafe extern "C" fn tcps_send_async_registered(
    s: c_int,
    buf: *const libc::c_void,
    len: usize,
    flags: c_int,
    mem: TcpsMem,
    io: *mut TcpsIo,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        let h = with_client(|c| c.send_async_registered(s, buf as *const u8, len, flags, mem))?;
        if !io.is_null() {
            // SAFETY: non-null, writable by the caller's contract.
            unsafe { io.write(h.0) };
        }
        Ok(len as isize)
    })
}

/// # Safety
/// `buf..buf+len` lies in registration `mem` (checked).
#[no_mangle]
pub unsafe extern "C" fn tcps_send_registered(
    s: c_int,
    buf: *const libc::c_void,
    len: usize,
    flags: c_int,
    mem: TcpsMem,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.send_registered(s, buf as *const u8, len, flags, mem)).map(|n| n as isize)
    })
}

/// # Safety
/// `buf..buf+len` lies in registration `mem` (checked); the server writes it.
#[no_mangle]
pub unsafe extern "C" fn tcps_recv_registered(
    s: c_int,
    buf: *mut libc::c_void,
    len: usize,
    flags: c_int,
    mem: TcpsMem,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.recv_registered(s, buf as *mut u8, len, flags, mem)).map(|n| n as isize)
    })
}

#[no_mangle]
pub extern "C" fn tcps_io_done(io: TcpsIo) -> c_int {
    ffi(|| with_client(|c| c.io_done(IoHandle(io))).map(c_int::from))
}

#[no_mangle]
pub extern "C" fn tcps_io_wait(io: TcpsIo, timeout_ms: c_int) -> c_int {
    ffi(|| with_client(|c| c.io_wait(IoHandle(io), timeout(timeout_ms))).map(|()| 0))
}

#[no_mangle]
pub extern "C" fn tcps_flush(s: c_int, timeout_ms: c_int) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.flush_async(s, timeout(timeout_ms))).map(|()| 0)
    })
}

/// # Safety
/// `ptr..ptr+len` is memory of the caller's, untouched during the call;
/// `handle` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tcps_register_memory(
    ptr: *mut libc::c_void,
    len: usize,
    handle: *mut TcpsMem,
) -> c_int {
    ffi(|| {
        if handle.is_null() {
            return Err(errno(libc::EFAULT));
        }
        let h = with_client(|c| c.register_memory(ptr as *mut u8, len))?;
        // SAFETY: non-null, writable by the caller's contract.
        unsafe { handle.write(h) };
        Ok(0)
    })
}

/// # Safety
/// `handle` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tcps_alloc_registered(
    len: usize,
    handle: *mut TcpsMem,
) -> *mut libc::c_void {
    let mut out = std::ptr::null_mut();
    let rc: c_int = ffi(|| {
        if handle.is_null() {
            return Err(errno(libc::EFAULT));
        }
        let (p, h) = with_client(|c| c.alloc_registered(len))?;
        // SAFETY: non-null, writable by the caller's contract.
        unsafe { handle.write(h) };
        out = p as *mut libc::c_void;
        Ok(0)
    });
    if rc == 0 {
        out
    } else {
        std::ptr::null_mut()
    }
}

#[no_mangle]
pub extern "C" fn tcps_deregister_memory(handle: TcpsMem) -> c_int {
    ffi(|| with_client(|c| c.deregister_memory(handle)).map(|()| 0))
}

/// # Safety
/// `ptr` is valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn tcps_recv_view(
    s: c_int,
    ptr: *mut *const libc::c_void,
    max: usize,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        if ptr.is_null() {
            return Err(errno(libc::EFAULT));
        }
        let (p, n) = with_client(|c| c.recv_view(s, max, 0))?;
        // SAFETY: non-null, writable by the caller's contract.
        unsafe { ptr.write(p as *const libc::c_void) };
        Ok(n as isize)
    })
}

#[no_mangle]
pub extern "C" fn tcps_recv_consume(s: c_int, n: usize) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.recv_consume(s, n)).map(|()| 0)
    })
}
