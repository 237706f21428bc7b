//! Socket creation and the calls that act on one socket: socket, bind,
//! listen, accept, accept4, connect, shutdown, get/setsockopt,
//! getsockname, getpeername.
//!
//! AF_INET/AF_INET6 SOCK_STREAM sockets are offloaded; everything else goes
//! to the kernel untouched.

use crate::attach;
use crate::errno::{errno_of, fail};
use crate::fdtable;
use crate::log::{debug, COUNTERS};
use crate::real;
use libc::{c_int, c_void, sockaddr, socklen_t};
use std::os::fd::IntoRawFd;
use std::sync::atomic::Ordering;

fn is_tcp(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    (domain == libc::AF_INET || domain == libc::AF_INET6)
        && base == libc::SOCK_STREAM
        && (protocol == 0 || protocol == libc::IPPROTO_TCP)
}

/// A placeholder fd for a new offloaded socket, with the socket's
/// SOCK_CLOEXEC / SOCK_NONBLOCK flags (so F_GETFL/F_GETFD tell the truth).
pub fn placeholder(flags: c_int) -> Result<c_int, i32> {
    let mut ef = 0;
    if flags & libc::SOCK_CLOEXEC != 0 {
        ef |= libc::EFD_CLOEXEC;
    }
    if flags & libc::SOCK_NONBLOCK != 0 {
        ef |= libc::EFD_NONBLOCK;
    }
    // SAFETY: plain syscall.
    let fd = unsafe { real::eventfd()(0, ef) };
    if fd < 0 {
        return Err(crate::errno::last_errno());
    }
    Ok(fd)
}

/// Gives the tcps socket `id` an fd (a new placeholder); on failure closes
/// `id` and returns the errno.
pub fn adopt(c: &tcps::Client, id: u32, flags: c_int) -> Result<c_int, i32> {
    let fd = match placeholder(flags) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = c.close(id);
            return Err(e);
        }
    };
    if !fdtable::fits(fd, id) {
        // SAFETY: closing the placeholder we just made.
        unsafe { real::close()(fd) };
        let _ = c.close(id);
        debug!("fd {fd} / socket id {id} beyond the table: EMFILE");
        return Err(libc::EMFILE);
    }
    fdtable::insert(fd, crate::state::epoch_of(c), id);
    COUNTERS.offloaded.fetch_add(1, Ordering::Relaxed);
    Ok(fd)
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if !is_tcp(domain, ty, protocol) {
        let fd = real::socket()(domain, ty, protocol);
        if domain == libc::AF_UNIX && attach::attaching_here() {
            // The host library's control socket (fork needs it).
            crate::control::note_socket(fd);
        } else {
            COUNTERS.kernel_other.fetch_add(1, Ordering::Relaxed);
            debug!("socket(domain {domain}, type {ty:#x}, protocol {protocol}) = fd {fd}: kernel (not a TCP socket)");
        }
        return fd;
    }
    // `--reattach`: a server that came back takes new sockets.
    let target = match attach::for_new_socket() {
        Err(_) if crate::reattach::try_now() => attach::for_new_socket(),
        r => r,
    };
    match target {
        Ok(c) => {
            let id = match c.socket(domain, ty, protocol) {
                Ok(id) => id,
                Err(e) => return fail(errno_of(&e)),
            };
            match adopt(c, id, ty) {
                Ok(fd) => {
                    debug!("socket(domain {domain}, type {ty:#x}) = fd {fd}: offloaded as tcps socket {id}");
                    fd
                }
                Err(e) => fail(e),
            }
        }
        Err(None) => {
            COUNTERS.kernel_tcp.fetch_add(1, Ordering::Relaxed);
            let fd = real::socket()(domain, ty, protocol);
            debug!("socket(domain {domain}, type {ty:#x}) = fd {fd}: kernel (no TCP server)");
            fd
        }
        Err(Some(e)) => fail(e),
    }
}

/// `addr`/`len` as bytes (empty for a null pointer).
unsafe fn addr_bytes<'a>(addr: *const sockaddr, len: socklen_t) -> &'a [u8] {
    if addr.is_null() {
        &[]
    } else {
        // SAFETY: the caller passed `len` readable bytes at `addr`.
        std::slice::from_raw_parts(addr as *const u8, len as usize)
    }
}

/// Copies `bytes` (full length `full`) to a user (addr, addrlen) pair,
/// truncating like the kernel and storing the full length.
pub unsafe fn put_addr(bytes: &[u8], full: usize, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let room = *len as usize;
    let n = bytes.len().min(room).min(full);
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, n);
    *len = full as socklen_t;
}

/// The attachment and tcps socket behind `fd`, or None for a kernel fd:
/// the attachment the socket was made in (a dead one's, after the server
/// died: its calls fail as `gone.rs` says and never reach a new server).
/// A forked child attaches first; EBADF without an attachment (ENOTCONN
/// for a socket of a group's server the process never attached to).
#[inline]
pub fn offloaded(fd: c_int) -> Option<Result<(&'static tcps::Client, u32), i32>> {
    let (epoch, id) = fdtable::lookup_at(fd)?;
    let c = match crate::state::client_at(epoch) {
        Some(c) => Some(c),
        // A forked child attaches (to each server of a group) first.
        None if crate::state::in_group(epoch) => {
            attach::for_existing().and_then(|_| crate::state::client_at(epoch))
        }
        None => None,
    };
    // A group's server that was gone before this process attached (a
    // forked child skips it): its sockets are not connected any more.
    let missing = if crate::state::is_group() && crate::state::in_group(epoch) {
        libc::ENOTCONN
    } else {
        libc::EBADF
    };
    Some(c.map(|c| (c, id)).ok_or(missing))
}

macro_rules! on_socket {
    ($fd:expr, |$c:ident, $id:ident| $body:expr, else $kernel:expr) => {
        match $crate::sock::offloaded($fd) {
            None => $kernel,
            Some(Err(e)) => $crate::errno::fail(e),
            Some(Ok(($c, $id))) => $body,
        }
    };
}
pub(crate) use on_socket;

/// 0 or -1/errno from a unit result.
fn unit(r: std::io::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    on_socket!(fd, |c, id| {
        let r = unit(c.bind_raw(id, addr_bytes(addr, len)));
        debug!("bind(fd {fd}) = {r}");
        r
    }, else real::bind()(fd, addr, len))
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    on_socket!(fd, |c, id| {
        let r = unit(c.listen(id, backlog));
        // Several servers: the listener listens at each (`group.rs`).
        if r == 0 && crate::state::is_group() && crate::group::siblings(crate::state::epoch_of(c), id).is_none() {
            crate::group::open_siblings(c, id, backlog);
        }
        r
    }, else real::listen()(fd, backlog))
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    on_socket!(fd, |c, id| {
        fdtable::note_state_change(c, id);
        // A new connection: what a poll said of the unconnected socket
        // (POLLHUP) is not about it.
        fdtable::id_state(c, id).broken.store(0, std::sync::atomic::Ordering::Relaxed);
        let r = unit(c.connect_raw(id, addr_bytes(addr, len)));
        debug!("connect(fd {fd}) = {r} (errno {})", if r < 0 { crate::errno::last_errno() } else { 0 });
        r
    }, else real::connect()(fd, addr, len))
}

/// A dead listener was taken over by a new attachment while an accept
/// waited on it: the accept starts again there (never returned).
const TAKEN_OVER: i32 = libc::ERESTART;

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    accept4(fd, addr, len, 0)
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    on_socket!(fd, |c, id| {
        if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
            return fail(libc::EINVAL);
        }
        fdtable::note_read(c, id);
        let mut buf = [0u8; 128];
        let want = if addr.is_null() || len.is_null() { 0 } else { buf.len() };
        let got = if crate::group::siblings(crate::state::epoch_of(c), id).is_some() {
            // A listener on several servers: from any of them.
            crate::group_accept::take(fd, c, id, flags, &mut buf[..want])
        } else {
            take(fd, c, id, flags, &mut buf[..want]).map(|(a, full)| (c, id, a, full))
        };
        match got {
            Err(e) if e.raw_os_error() == Some(TAKEN_OVER) => accept4(fd, addr, len, flags),
            Ok((_, _, tcps::Accepted::Direct(kfd), full)) => {
                // Balancing: a kernel socket of this process, which the
                // program uses as it is (not in the fd table).
                let nfd = kfd.into_raw_fd();
                COUNTERS.direct.fetch_add(1, Ordering::Relaxed);
                put_addr(&buf[..want], full, addr, len);
                debug!("accept(fd {fd}) = fd {nfd} (direct: a kernel socket)");
                nfd
            }
            // `m`: the server whose listener `lid` had the connection.
            Ok((m, lid, tcps::Accepted::Offloaded(nid), full)) => match adopt(m, nid, flags) {
                Ok(nfd) => {
                    crate::sendq::accepted(m, lid, nid);
                    COUNTERS.accepted.fetch_add(1, Ordering::Relaxed);
                    put_addr(&buf[..want], full, addr, len);
                    debug!("accept(fd {fd}) = fd {nfd} (tcps socket {nid})");
                    nfd
                }
                Err(e) => fail(e),
            },
            Err(e) => fail(errno_of(&e)),
        }
    }, else real::accept4()(fd, addr, len, flags))
}

/// The accept on listener `id` of `c` (placeholder `fd`): a connection, or
/// the error; [`TAKEN_OVER`] when a new attachment took a dead listener
/// over meanwhile.
fn take(
    fd: c_int,
    c: &'static tcps::Client,
    id: u32,
    flags: c_int,
    buf: &mut [u8],
) -> std::io::Result<(tcps::Accepted, usize)> {
    crate::signals::restarting(c, id, libc::SO_RCVTIMEO, || loop {
        if crate::gone::gone(c) {
            let nonblock = flags & libc::SOCK_NONBLOCK != 0;
            let e = match crate::gone::accept_error(fd, c, id, nonblock) {
                Some(e) => e,
                // Blocks until a signal, or until a new attachment
                // took the listener over (`--reattach`): then again.
                None => match crate::reattach::wait_taken_over(fd, crate::state::epoch_of(c), id) {
                    Ok(()) => TAKEN_OVER,
                    Err(e) => e,
                },
            };
            return Err(std::io::Error::from_raw_os_error(e));
        }
        match c.accept_any(id, flags, buf) {
            // The server died while the accept waited: as above.
            Err(_) if crate::gone::gone(c) => continue,
            r => return r,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    on_socket!(
        fd,
        |c, id| {
            let r = unit(c.shutdown(id, how));
            // epoll sets look again (EPOLLRDHUP, EPOLLHUP), in both directions.
            fdtable::note_state_change(c, id);
            r
        },
        else real::shutdown()(fd, how)
    )
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    on_socket!(fd, |c, id| {
        if val.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        let room = (*len as usize).min(256);
        let out = std::slice::from_raw_parts_mut(val as *mut u8, room);
        if (level, name) == (libc::SOL_SOCKET, libc::SO_ERROR) && room >= 4 {
            if let Some(e) = fdtable::take_error(c, id) {
                out[..4].copy_from_slice(&e.to_ne_bytes());
                *len = 4;
                return 0;
            }
        }
        match c.getsockopt(id, level, name, out) {
            Ok(n) => {
                *len = n as socklen_t;
                0
            }
            Err(e) => {
                debug!("getsockopt(fd {fd}, level {level}, name {name}): {e}");
                fail(errno_of(&e))
            }
        }
    }, else real::getsockopt()(fd, level, name, val, len))
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    on_socket!(fd, |c, id| {
        let v = if val.is_null() { &[][..] } else { std::slice::from_raw_parts(val as *const u8, len as usize) };
        let r = unit(c.setsockopt(id, level, name, v));
        if r == 0 {
            crate::group::set_option(crate::state::epoch_of(c), id, level, name, v);
        }
        if r == 0 && level == libc::SOL_SOCKET && name == libc::SO_SNDBUF {
            crate::sendq::sndbuf_changed(c, id);
        }
        if r < 0 {
            debug!("setsockopt(fd {fd}, level {level}, name {name}) refused by the server: errno {}", crate::errno::last_errno());
        }
        r
    }, else real::setsockopt()(fd, level, name, val, len))
}

unsafe fn name_call(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, peer: bool) -> c_int {
    on_socket!(fd, |c, id| {
        if addr.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        let mut buf = [0u8; 128];
        let r = if peer { c.getpeername_raw(id, &mut buf) } else { c.getsockname_raw(id, &mut buf) };
        match r {
            Ok(full) => {
                put_addr(&buf[..full.min(buf.len())], full, addr, len);
                0
            }
            Err(e) => fail(errno_of(&e)),
        }
    }, else if peer { real::getpeername()(fd, addr, len) } else { real::getsockname()(fd, addr, len) })
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    name_call(fd, addr, len, false)
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    name_call(fd, addr, len, true)
}
