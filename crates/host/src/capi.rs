//! The C ABI of `include/tcps.h`.
//!
//! A process-global [`Client`] is attached on the first call (or by
//! `tcps_attach`). Each thread caches a clone keyed by a generation number,
//! so the common path takes no lock and touches no shared reference count;
//! `tcps_attach`/`tcps_detach` bump the generation. Every function returns
//! -1 with `errno` set on error and never unwinds into C.

use crate::attach::last_attach_error;
use crate::client::{Client, PollFd};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_long, CStr, CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

static GLOBAL: Mutex<Option<Client>> = Mutex::new(None);
/// Changes (under `GLOBAL`'s lock) whenever `GLOBAL` does.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CACHE: RefCell<Option<(u64, Client)>> = const { RefCell::new(None) };
}

fn global() -> MutexGuard<'static, Option<Client>> {
    GLOBAL.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Runs `f` with the process's client, attaching on demand.
pub(crate) fn with_client<T>(f: impl FnOnce(&Client) -> io::Result<T>) -> io::Result<T> {
    let gen = GENERATION.load(Ordering::Acquire);
    let mut f = Some(f);
    let fast = CACHE.try_with(|c| {
        let b = c.try_borrow().ok()?;
        match &*b {
            Some((g, client)) if *g == gen => f.take().map(|f| f(client)),
            _ => None,
        }
    });
    if let Ok(Some(r)) = fast {
        return r;
    }
    let (gen, client) = {
        let mut g = global();
        let client = match &*g {
            Some(c) => c.clone(),
            None => {
                let c = Client::attach_default()?;
                *g = Some(c.clone());
                GENERATION.fetch_add(1, Ordering::AcqRel);
                c
            }
        };
        (GENERATION.load(Ordering::Acquire), client)
    };
    let _ = CACHE.try_with(|c| {
        if let Ok(mut b) = c.try_borrow_mut() {
            *b = Some((gen, client.clone()));
        }
    });
    match f.take() {
        Some(f) => f(&client),
        None => Err(errno(libc::EIO)),
    }
}

/// Return values of C functions: what -1 is.
pub(crate) trait CRet {
    const ERR: Self;
}
impl CRet for c_int {
    const ERR: c_int = -1;
}
impl CRet for isize {
    const ERR: isize = -1;
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an FFI body: an error sets errno and yields -1; a panic is EIO.
pub(crate) fn ffi<R: CRet>(f: impl FnOnce() -> io::Result<R>) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            R::ERR
        }
        Err(_) => {
            set_errno(libc::EIO);
            R::ERR
        }
    }
}

/// A tcps descriptor: negative ones are unknown sockets.
pub(crate) fn sock(s: c_int) -> io::Result<u32> {
    u32::try_from(s).map_err(|_| errno(libc::EBADF))
}

/// A new socket id as a C descriptor. Ids beyond `int` cannot be returned:
/// close the socket and report EMFILE.
pub(crate) fn new_fd(c: &Client, id: u32) -> io::Result<c_int> {
    c_int::try_from(id).map_err(|_| {
        let _ = c.close(id);
        errno(libc::EMFILE)
    })
}

/// Borrows `len` bytes at `p` (NULL only if `len == 0`).
///
/// # Safety
/// `p` must be valid for reads of `len` bytes for the returned lifetime.
pub(crate) unsafe fn in_bytes<'a>(p: *const libc::c_void, len: usize) -> io::Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() || len > isize::MAX as usize {
        return Err(errno(libc::EFAULT));
    }
    // SAFETY: non-null and, by the caller's contract, valid for `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// Borrows `len` writable bytes at `p` (NULL only if `len == 0`).
///
/// # Safety
/// `p` must be valid for writes of `len` bytes for the returned lifetime and
/// not otherwise accessed meanwhile. The bytes may be uninitialized: they are
/// only ever written through the slice, never read.
unsafe fn out_bytes<'a>(p: *mut libc::c_void, len: usize) -> io::Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() || len > isize::MAX as usize {
        return Err(errno(libc::EFAULT));
    }
    // SAFETY: non-null and, by the caller's contract, valid for `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
}

/// An address out-parameter pair (`addr`, `*addrlen`) as a buffer: empty if
/// `addr` or `addrlen` is NULL.
///
/// # Safety
/// If non-NULL, `addrlen` must be valid and `addr` valid for `*addrlen` bytes.
pub(crate) unsafe fn addr_out<'a>(
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> io::Result<&'a mut [u8]> {
    if addr.is_null() || addrlen.is_null() {
        return Ok(&mut []);
    }
    // SAFETY: non-null; the caller guarantees validity.
    let cap = unsafe { *addrlen } as usize;
    // SAFETY: the caller guarantees `addr` holds `*addrlen` bytes.
    unsafe { out_bytes(addr as *mut libc::c_void, cap) }
}

/// Stores an address length through `addrlen` if it is non-NULL.
///
/// # Safety
/// `addrlen` is NULL or valid for writes.
pub(crate) unsafe fn set_len(addrlen: *mut libc::socklen_t, len: usize) {
    if !addrlen.is_null() {
        // SAFETY: non-null, valid by the caller's contract.
        unsafe { *addrlen = len as libc::socklen_t };
    }
}

// ---- attach / detach -------------------------------------------------------

/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tcps_attach(path: *const c_char) -> c_int {
    ffi(|| {
        let path = if path.is_null() {
            crate::attach::default_path()
        } else {
            // SAFETY: non-null, NUL-terminated by the caller's contract.
            let c = unsafe { CStr::from_ptr(path) };
            OsStr::from_bytes(c.to_bytes()).into()
        };
        let mut g = global();
        if g.as_ref().is_some_and(Client::is_attached) {
            return Err(errno(libc::EISCONN));
        }
        let c = Client::attach(path)?;
        if let Some(old) = g.replace(c) {
            old.detach();
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn tcps_detach() {
    let _ = catch_unwind(|| {
        let old = {
            let mut g = global();
            GENERATION.fetch_add(1, Ordering::AcqRel);
            g.take()
        };
        if let Some(c) = old {
            c.detach();
        }
        let _ = CACHE.try_with(|c| c.try_borrow_mut().map(|mut b| b.take()));
    });
}

/// Interned messages: a pointer handed to C stays valid forever.
static MESSAGES: Mutex<Vec<&'static CStr>> = Mutex::new(Vec::new());

#[no_mangle]
pub extern "C" fn tcps_strerror_last() -> *const c_char {
    catch_unwind(|| {
        let msg = last_attach_error();
        if msg.is_empty() {
            return c"".as_ptr();
        }
        let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        let mut m = MESSAGES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = m.iter().find(|s| s.to_bytes() == c.as_bytes()) {
            return s.as_ptr();
        }
        let s: &'static CStr = Box::leak(c.into_boxed_c_str());
        m.push(s);
        s.as_ptr()
    })
    .unwrap_or(c"".as_ptr())
}

// ---- socket calls -----------------------------------------------------------

#[no_mangle]
pub extern "C" fn tcps_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    ffi(|| with_client(|c| new_fd(c, c.socket(domain, ty, protocol)?)))
}

/// # Safety
/// `addr` is valid for `addrlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_bind(
    s: c_int,
    addr: *const libc::sockaddr,
    addrlen: libc::socklen_t,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let a = unsafe { in_bytes(addr as *const libc::c_void, addrlen as usize)? };
        with_client(|c| c.bind_raw(s, a).map(|()| 0))
    })
}

#[no_mangle]
pub extern "C" fn tcps_listen(s: c_int, backlog: c_int) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.listen(s, backlog).map(|()| 0))
    })
}

/// # Safety
/// As accept(2): `addr`/`addrlen` NULL, or valid with `*addrlen` bytes at `addr`.
#[no_mangle]
pub unsafe extern "C" fn tcps_accept(
    s: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: same contract.
    unsafe { tcps_accept4(s, addr, addrlen, 0) }
}

/// # Safety
/// As accept4(2): `addr`/`addrlen` NULL, or valid with `*addrlen` bytes at `addr`.
#[no_mangle]
pub unsafe extern "C" fn tcps_accept4(
    s: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let out = unsafe { addr_out(addr, addrlen)? };
        with_client(|c| {
            let (id, len) = c.accept_raw(s, flags, out)?;
            let fd = new_fd(c, id)?;
            if !addr.is_null() {
                // SAFETY: the caller's contract.
                unsafe { set_len(addrlen, len) };
            }
            Ok(fd)
        })
    })
}

/// # Safety
/// `addr` is valid for `addrlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_connect(
    s: c_int,
    addr: *const libc::sockaddr,
    addrlen: libc::socklen_t,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let a = unsafe { in_bytes(addr as *const libc::c_void, addrlen as usize)? };
        with_client(|c| c.connect_raw(s, a).map(|()| 0))
    })
}

/// # Safety
/// `buf` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_send(
    s: c_int,
    buf: *const libc::c_void,
    len: usize,
    flags: c_int,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let b = unsafe { in_bytes(buf, len)? };
        with_client(|c| c.send(s, b, flags).map(|n| n as isize))
    })
}

/// # Safety
/// `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_recv(
    s: c_int,
    buf: *mut libc::c_void,
    len: usize,
    flags: c_int,
) -> isize {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let b = unsafe { out_bytes(buf, len)? };
        with_client(|c| c.recv(s, b, flags).map(|n| n as isize))
    })
}

#[no_mangle]
pub extern "C" fn tcps_shutdown(s: c_int, how: c_int) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.shutdown(s, how).map(|()| 0))
    })
}

#[no_mangle]
pub extern "C" fn tcps_close(s: c_int) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| c.close(s).map(|()| 0))
    })
}

/// # Safety
/// `value` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_setsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    value: *const libc::c_void,
    len: libc::socklen_t,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        // SAFETY: the caller's contract.
        let v = unsafe { in_bytes(value, len as usize)? };
        with_client(|c| c.setsockopt(s, level, name, v).map(|()| 0))
    })
}

/// # Safety
/// `len` is valid and `value` is valid for writes of `*len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_getsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    value: *mut libc::c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        if len.is_null() {
            return Err(errno(libc::EFAULT));
        }
        // SAFETY: non-null; the caller's contract.
        let out = unsafe { out_bytes(value, *len as usize)? };
        with_client(|c| {
            let n = c.getsockopt(s, level, name, out)?;
            // SAFETY: non-null, checked above.
            unsafe { set_len(len, n) };
            Ok(0)
        })
    })
}

/// getsockname/getpeername share this shape.
///
/// # Safety
/// As [`addr_out`].
unsafe fn name_call(
    s: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
    call: fn(&Client, u32, &mut [u8]) -> io::Result<usize>,
) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        if addr.is_null() || addrlen.is_null() {
            return Err(errno(libc::EFAULT));
        }
        // SAFETY: the caller's contract.
        let out = unsafe { addr_out(addr, addrlen)? };
        with_client(|c| {
            let n = call(c, s, out)?;
            // SAFETY: non-null, checked above.
            unsafe { set_len(addrlen, n) };
            Ok(0)
        })
    })
}

/// # Safety
/// `addrlen` is valid and `addr` holds `*addrlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_getsockname(
    s: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: same contract.
    unsafe { name_call(s, addr, addrlen, Client::getsockname_raw) }
}

/// # Safety
/// `addrlen` is valid and `addr` holds `*addrlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn tcps_getpeername(
    s: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: same contract.
    unsafe { name_call(s, addr, addrlen, Client::getpeername_raw) }
}

/// # Safety
/// `fds` is valid for reads and writes of `nfds` entries (or `nfds == 0`).
#[no_mangle]
pub unsafe extern "C" fn tcps_poll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout_ms: c_int,
) -> c_int {
    ffi(|| {
        let n = usize::try_from(nfds).map_err(|_| errno(libc::EINVAL))?;
        let fds: &mut [libc::pollfd] = if n == 0 {
            &mut []
        } else if fds.is_null() || n > isize::MAX as usize / std::mem::size_of::<libc::pollfd>() {
            return Err(errno(libc::EFAULT));
        } else {
            // SAFETY: non-null, valid for `n` entries by the caller's contract.
            unsafe { std::slice::from_raw_parts_mut(fds, n) }
        };
        let mut sent: Vec<PollFd> = Vec::with_capacity(n);
        let mut index: Vec<usize> = Vec::with_capacity(n);
        for (i, p) in fds.iter_mut().enumerate() {
            p.revents = 0;
            if let Ok(sock) = u32::try_from(p.fd) {
                sent.push(PollFd {
                    sock,
                    events: p.events,
                    revents: 0,
                });
                index.push(i);
            }
        }
        with_client(|c| {
            let ready = c.poll(&mut sent, timeout_ms)?;
            for (e, &i) in sent.iter().zip(&index) {
                fds[i].revents = e.revents;
            }
            c_int::try_from(ready).map_err(|_| errno(libc::EIO))
        })
    })
}

#[no_mangle]
pub extern "C" fn tcps_fcntl(s: c_int, cmd: c_int, arg: c_long) -> c_int {
    ffi(|| {
        let s = sock(s)?;
        with_client(|c| {
            // c_long is i32 on 32-bit targets.
            #[allow(clippy::useless_conversion)]
            let r = c.fcntl(s, cmd, i64::from(arg))?;
            c_int::try_from(r).map_err(|_| errno(libc::EIO))
        })
    })
}

/// `struct tcps_stats` of tcps.h.
#[repr(C)]
pub struct TcpsStats {
    pub calls: u64,
    pub doorbells: u64,
    pub sleeps: u64,
    pub bytes_copied: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub async_sends: u64,
    pub async_fallbacks: u64,
    pub kicks: u64,
    pub registered_misuse: u64,
    // Appended in protocol version 3 (eager receive and accept).
    pub round_trips: u64,
    pub ring_recvs: u64,
    pub ring_accepts: u64,
    pub recv_kicks: u64,
}

/// # Safety
/// `out` is null or valid for writing one `struct tcps_stats`.
#[no_mangle]
pub unsafe extern "C" fn tcps_stats(out: *mut TcpsStats) -> c_int {
    ffi(|| {
        if out.is_null() {
            return Err(errno(libc::EFAULT));
        }
        // Not attached yet: all zero, without attaching just to report that.
        let s = global().as_ref().map(|c| c.stats()).unwrap_or_default();
        let v = TcpsStats {
            calls: s.calls,
            doorbells: s.doorbells,
            sleeps: s.sleeps,
            bytes_copied: s.bytes_copied,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            async_sends: s.async_sends,
            async_fallbacks: s.async_fallbacks,
            kicks: s.kicks,
            registered_misuse: s.registered_misuse,
            round_trips: s.round_trips,
            ring_recvs: s.ring_recvs,
            ring_accepts: s.ring_accepts,
            recv_kicks: s.recv_kicks,
        };
        // SAFETY: the caller passes a writable tcps_stats (checked non-null).
        unsafe { out.write(v) };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_errno() -> i32 {
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn stats_need_somewhere_to_go() {
        // SAFETY: null is allowed and refused.
        assert_eq!(unsafe { tcps_stats(std::ptr::null_mut()) }, -1);
        assert_eq!(last_errno(), libc::EFAULT);
    }

    #[test]
    fn negative_descriptors_are_ebadf_without_a_server() {
        assert_eq!(tcps_listen(-1, 5), -1);
        assert_eq!(last_errno(), libc::EBADF);
        assert_eq!(tcps_close(-7), -1);
        assert_eq!(last_errno(), libc::EBADF);
    }

    #[test]
    fn null_buffers_are_efault() {
        // SAFETY: NULL with a length: checked before any access.
        let n = unsafe { tcps_send(3, std::ptr::null(), 10, 0) };
        assert_eq!(n, -1);
        assert_eq!(last_errno(), libc::EFAULT);
        // SAFETY: as above.
        let n = unsafe { tcps_getsockopt(3, 0, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(n, -1);
        assert_eq!(last_errno(), libc::EFAULT);
    }
}
