//! Data calls on offloaded sockets: read, write, recv, send, recvfrom,
//! sendto, recvmsg, sendmsg, readv, writev (and glibc's fortified `_chk`
//! variants). Kernel fds pass straight through.
//!
//! Vectored calls gather into (scatter from) one buffer: the channel takes a
//! contiguous range anyway, so this is the copy the copying API makes.

use crate::errno::{errno_of, fail};
use crate::fdtable;
use crate::real;
use crate::signals::restarting;
use crate::sock::on_socket;
use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

/// Largest single receive into a temporary buffer (vectored reads, and
/// `MSG_TRUNC` into a NULL buffer, which counts at most this much).
const MAX_TMP: usize = 256 * 1024;

/// The most iovecs a call takes (the kernel's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

fn err(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

pub unsafe fn recv_id(
    c: &tcps::Client,
    id: u32,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    if crate::gone::gone(c) {
        return fail(crate::gone::call_error(c, id, libc::ENOTCONN));
    }
    // (Not for a dead socket: its id may be a new attachment's now.)
    fdtable::note_read(c, id);
    if let Some(e) = fdtable::take_kept_error(c, id) {
        return fail(e);
    }
    let r = restarting(c, id, libc::SO_RCVTIMEO, || {
        if buf.is_null() && len > 0 {
            null_recv(c, id, len, flags)
        } else {
            let out: &mut [u8] = if len == 0 {
                &mut []
            } else {
                std::slice::from_raw_parts_mut(buf as *mut u8, len)
            };
            c.recv(id, out, flags)
        }
    });
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            let errno = errno_of(&e);
            if matches!(
                errno,
                libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT | libc::EHOSTUNREACH
            ) {
                fdtable::note_broken(c, id);
            }
            fail(crate::gone::seen_by_call(c, id, errno))
        }
    }
}

/// A receive into a NULL buffer, as the kernel's: with `MSG_TRUNC` it
/// counts and discards like any; without, it waits and ends like any, and
/// fails with EFAULT once there are bytes to copy (they stay unread).
fn null_recv(c: &tcps::Client, id: u32, len: usize, flags: c_int) -> std::io::Result<usize> {
    if flags & libc::MSG_TRUNC != 0 {
        let mut scratch = vec![0u8; len.min(MAX_TMP)];
        return c.recv(id, &mut scratch, flags);
    }
    let mut probe = [0u8; 1];
    match c.recv(id, &mut probe, flags | libc::MSG_PEEK | libc::MSG_TRUNC)? {
        0 => Ok(0),
        _ => Err(err(libc::EFAULT)),
    }
}

/// A send on offloaded socket `id` (placeholder `fd`): asynchronous when
/// the send queue has room (`sendq.rs`), else synchronous.
pub unsafe fn send_id(c: &tcps::Client, fd: c_int, id: u32, data: &[u8], flags: c_int) -> ssize_t {
    let r = if crate::gone::gone(c) {
        Err(err(crate::gone::call_error(c, id, libc::EPIPE)))
    } else {
        fdtable::note_write(c, id);
        match fdtable::take_error(c, id).map(err) {
            Some(e) => Err(e),
            None => match crate::sendq::try_send(c, fd, id, data, flags) {
                Some(r) => r,
                None => restarting(c, id, libc::SO_SNDTIMEO, || c.send(id, data, flags)),
            },
        }
    };
    match &r {
        Ok(n) => fdtable::note_sent(c, id, data.len() as u64, *n as u64),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            fdtable::note_sent(c, id, data.len() as u64, 0)
        }
        Err(_) => {}
    }
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            let errno = crate::gone::seen_by_call(c, id, errno_of(&e));
            // The kernel raises SIGPIPE on a broken connection unless told
            // not to; the server cannot do that for us. (An asynchronous
            // send's EPIPE surfaces here on the next call, as the kernel's
            // would on that call.)
            if errno == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                libc::raise(libc::SIGPIPE);
            }
            fail(errno)
        }
    }
}

unsafe fn bytes<'a>(buf: *const c_void, len: size_t) -> &'a [u8] {
    if len == 0 || buf.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(buf as *const u8, len)
    }
}

unsafe fn iovecs<'a>(iov: *const iovec, n: c_int) -> &'a [iovec] {
    if iov.is_null() || n <= 0 {
        &[]
    } else {
        std::slice::from_raw_parts(iov, n as usize)
    }
}

/// Gathers an iovec array into one buffer.
unsafe fn gather(iov: &[iovec]) -> Vec<u8> {
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut out = Vec::with_capacity(total);
    for v in iov {
        out.extend_from_slice(bytes(v.iov_base, v.iov_len));
    }
    out
}

/// Receives into an iovec array (through one temporary buffer). A NULL
/// array, or a NULL base with a length, is a NULL buffer (`null_recv`).
unsafe fn recv_vec(c: &tcps::Client, id: u32, iov: &[iovec], flags: c_int) -> ssize_t {
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    if iov.len() == 1 {
        return recv_id(c, id, iov[0].iov_base, iov[0].iov_len, flags);
    }
    if iov.iter().any(|v| v.iov_base.is_null() && v.iov_len > 0) {
        return recv_id(c, id, std::ptr::null_mut(), total, flags);
    }
    let mut tmp = vec![0u8; total.min(MAX_TMP)];
    let n = recv_id(c, id, tmp.as_mut_ptr() as *mut c_void, tmp.len(), flags);
    if n <= 0 || flags & libc::MSG_TRUNC != 0 {
        // MSG_TRUNC writes nothing.
        return n;
    }
    let mut off = 0usize;
    for v in iov {
        if off >= n as usize {
            break;
        }
        let k = v.iov_len.min(n as usize - off);
        std::ptr::copy_nonoverlapping(tmp.as_ptr().add(off), v.iov_base as *mut u8, k);
        off += k;
    }
    n
}

/// The iovec array of a vectored receive, checked as the kernel does:
/// more than `MAX_IOV` is `too_many`, a NULL array with entries EFAULT.
unsafe fn recv_iovecs<'a>(iov: *const iovec, n: usize, too_many: i32) -> Result<&'a [iovec], i32> {
    if n > MAX_IOV {
        Err(too_many)
    } else if n > 0 && iov.is_null() {
        Err(libc::EFAULT)
    } else {
        Ok(iovecs(iov, n as c_int))
    }
}

/// The iovec array of a vectored send, checked as the kernel does (as
/// [`recv_iovecs`]), and an entry with a NULL base and a length EFAULT (the
/// kernel's copy faults; reading it here would crash the program).
unsafe fn send_iovecs<'a>(iov: *const iovec, n: usize, too_many: i32) -> Result<&'a [iovec], i32> {
    let v = recv_iovecs(iov, n, too_many)?;
    if v.iter().any(|v| v.iov_base.is_null() && v.iov_len > 0) {
        return Err(libc::EFAULT);
    }
    Ok(v)
}

unsafe fn send_vec(c: &tcps::Client, fd: c_int, id: u32, iov: &[iovec], flags: c_int) -> ssize_t {
    if iov.len() == 1 {
        return send_id(c, fd, id, bytes(iov[0].iov_base, iov[0].iov_len), flags);
    }
    send_id(c, fd, id, &gather(iov), flags)
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    // read(2) of nothing on a socket is 0, whatever its state (a zero-length
    // recv(2) waits and fails as any).
    on_socket!(fd, |c, id| if len == 0 { 0 } else { recv_id(c, id, buf, len, 0) }, else real::read()(fd, buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    _buflen: size_t,
) -> ssize_t {
    read(fd, buf, len)
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    on_socket!(fd, |c, id| send_id(c, fd, id, bytes(buf, len), 0), else real::write()(fd, buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    on_socket!(fd, |c, id| recv_id(c, id, buf, len, flags), else real::recv()(fd, buf, len, flags))
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    _buflen: size_t,
    flags: c_int,
) -> ssize_t {
    recv(fd, buf, len, flags)
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    on_socket!(fd, |c, id| send_id(c, fd, id, bytes(buf, len), flags), else real::send()(fd, buf, len, flags))
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    on_socket!(fd, |c, id| {
        let n = recv_id(c, id, buf, len, flags);
        // A TCP socket reports no source address (the kernel sets the
        // length to 0).
        if n >= 0 && !addr.is_null() && !alen.is_null() {
            *alen = 0;
        }
        n
    }, else real::recvfrom()(fd, buf, len, flags, addr, alen))
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    _buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    recvfrom(fd, buf, len, flags, addr, alen)
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    // A connected TCP socket ignores the destination, as in the kernel.
    on_socket!(fd, |c, id| send_id(c, fd, id, bytes(buf, len), flags), else real::sendto()(fd, buf, len, flags, addr, alen))
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    on_socket!(fd, |c, id| {
        let Ok(n) = usize::try_from(n) else {
            return fail(libc::EINVAL);
        };
        match recv_iovecs(iov, n, libc::EINVAL) {
            Err(e) => fail(e),
            // As read(2): nothing to read is 0.
            Ok(v) if v.iter().all(|v| v.iov_len == 0) => 0,
            Ok(v) => recv_vec(c, id, v, 0),
        }
    }, else real::readv()(fd, iov, n))
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    on_socket!(fd, |c, id| {
        let Ok(n) = usize::try_from(n) else {
            return fail(libc::EINVAL);
        };
        match send_iovecs(iov, n, libc::EINVAL) {
            Ok(v) => send_vec(c, fd, id, v, 0),
            Err(e) => fail(e),
        }
    }, else real::writev()(fd, iov, n))
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    on_socket!(fd, |c, id| {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        let m = &mut *msg;
        let v = match recv_iovecs(m.msg_iov, m.msg_iovlen, libc::EMSGSIZE) {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        let n = recv_vec(c, id, v, flags);
        if n >= 0 {
            // TCP: no source address and (through the server) no ancillary
            // data; the kernel hands MSG_CMSG_CLOEXEC back in msg_flags and
            // sets nothing else on TCP (no MSG_TRUNC, no MSG_EOR).
            m.msg_namelen = 0;
            m.msg_controllen = 0;
            m.msg_flags = flags & libc::MSG_CMSG_CLOEXEC;
        }
        n
    }, else real::recvmsg()(fd, msg, flags))
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    on_socket!(fd, |c, id| {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        let m = &*msg;
        if m.msg_controllen != 0 && !m.msg_control.is_null() {
            // Ancillary data would be silently lost at the server: refuse.
            crate::log::debug!("sendmsg(fd {fd}) with ancillary data: EOPNOTSUPP");
            return fail(libc::EOPNOTSUPP);
        }
        match send_iovecs(m.msg_iov, m.msg_iovlen, libc::EMSGSIZE) {
            Ok(v) => send_vec(c, fd, id, v, flags),
            Err(e) => fail(e),
        }
    }, else real::sendmsg()(fd, msg, flags))
}
