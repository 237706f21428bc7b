//! The host's own descriptor of each of its kernel sockets.
//!
//! The kernel, not tcps, decides what a host may do (`docs/PROTOCOL.md`
//! §6): the library creates each TCP socket in this process, binds it,
//! listens on it and sets its options here, on its own descriptor, so the
//! kernel checks this process's uid, capabilities, network namespace,
//! cgroup and LSM label; the server gets a copy (`ControlMsg::SocketAdopt`)
//! and runs the data path. A connection the server accepted has no such
//! descriptor until the library needs one (`ControlMsg::SocketDup`).
//!
//! Descriptors are close-on-exec (an exec drops them with the attachment)
//! and kept at high numbers, away from those a program expects. They are
//! made and used with raw system calls: under the preload library libc's
//! socket functions are interposed.

use crate::table::SockTable;
use crate::Client;
use std::io;
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use tcps_proto::handshake::ControlMsg;

/// `fd + 1` of socket id `i` (0: none).
pub(crate) struct KernelFds {
    fds: SockTable<i32>,
}

fn last_errno() -> io::Error {
    io::Error::last_os_error()
}

/// The lowest number our descriptors take: half the descriptor limit, at
/// most 32768, so they stay clear of the numbers a program uses.
fn high_base() -> i32 {
    static BASE: OnceLock<i32> = OnceLock::new();
    *BASE.get_or_init(|| {
        // SAFETY: getrlimit writes into a local rlimit.
        let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return 0;
        }
        (r.rlim_cur / 2).min(32768) as i32
    })
}

/// Moves `fd` (ours) to a high number, close-on-exec; keeps it where it is
/// if that fails. Returns the descriptor to use.
pub(crate) fn move_high(fd: RawFd) -> RawFd {
    let base = high_base();
    if fd >= base {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC on our descriptor; the result is checked.
    let high = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base) } as i32;
    if high < 0 {
        return fd;
    }
    close(fd);
    high
}

/// close(2) without the preload library's interposition.
pub(crate) fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this library owns.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// A result of a raw system call: -1 is the errno.
pub(crate) fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(rc)
    }
}

/// A new TCP socket of this process (close-on-exec, at a high number).
pub(crate) fn new_tcp_socket(domain: i32, protocol: i32) -> io::Result<RawFd> {
    let ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    // SAFETY: socket(2) with integer arguments.
    let fd = check(unsafe { libc::syscall(libc::SYS_socket, domain, ty, protocol) })? as RawFd;
    Ok(move_high(fd))
}

impl KernelFds {
    pub fn new() -> KernelFds {
        KernelFds {
            fds: SockTable::new(),
        }
    }

    /// The descriptor of socket `s`, if this process has one.
    pub fn get(&self, s: u32) -> Option<RawFd> {
        let v = *self.fds.get(s)?.lock();
        (v > 0).then_some(v - 1)
    }

    /// Records `fd` as socket `s`'s (closing one recorded before).
    pub fn set(&self, s: u32, fd: RawFd) {
        let Some(slot) = self.fds.get_or_insert(s) else {
            close(fd);
            return;
        };
        let old = std::mem::replace(&mut *slot.lock(), fd + 1);
        if old > 0 {
            close(old - 1);
        }
    }

    /// Takes socket `s`'s descriptor out (the caller closes it).
    pub fn take(&self, s: u32) -> Option<RawFd> {
        let v = std::mem::take(&mut *self.fds.get(s)?.lock());
        (v > 0).then_some(v - 1)
    }

    /// Closes socket `s`'s descriptor, if any (its id is handed out anew).
    pub fn forget(&self, s: u32) {
        if let Some(fd) = self.take(s) {
            close(fd);
        }
    }

    /// Every (socket, descriptor) pair (fork: the child keeps them).
    pub fn all(&self) -> Vec<(u32, RawFd)> {
        let mut out = Vec::new();
        self.fds.for_each(|id, v| {
            if *v > 0 {
                out.push((id, *v - 1));
            }
        });
        out
    }
}

impl Drop for KernelFds {
    fn drop(&mut self) {
        self.fds.for_each(|_, v| {
            if *v > 0 {
                close(*v - 1);
                *v = 0;
            }
        });
    }
}

/// Socket options the server must also know when the host sets them on its
/// own descriptor: it times out parked calls itself (its copy is
/// non-blocking, so the kernel would ignore them there).
fn server_must_know(level: i32, name: i32) -> bool {
    level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO)
}

fn is_eperm(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EPERM)
}

fn sys_setsockopt(fd: RawFd, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is readable for its length.
    check(unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            fd,
            level,
            name,
            value.as_ptr(),
            value.len() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn sys_getsockopt(fd: RawFd, level: i32, name: i32, out: &mut [u8]) -> io::Result<usize> {
    let mut len = out.len() as libc::socklen_t;
    // SAFETY: `out` is writable for `len` bytes; `len` is a valid socklen_t.
    check(unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            fd,
            level,
            name,
            out.as_mut_ptr(),
            &mut len as *mut libc::socklen_t,
        )
    })?;
    Ok((len as usize).min(out.len()))
}

static NEXT_NONCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl Client {
    /// socket(2) in this process, handed to the server once
    /// (`ControlMsg::SocketAdopt`); returns the new tcps socket id.
    pub(crate) fn new_kernel_socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<u32> {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        }
        if ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != libc::SOCK_STREAM {
            return Err(io::Error::from_raw_os_error(libc::ESOCKTNOSUPPORT)); // only TCP is offloaded
        }
        if protocol != 0 && protocol != libc::IPPROTO_TCP {
            return Err(io::Error::from_raw_os_error(libc::EPROTONOSUPPORT));
        }
        self.conn.check_open(libc::ENOTCONN)?;
        let fd = new_tcp_socket(domain, protocol)?;
        let handle = NEXT_NONCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let msg = ControlMsg::SocketAdopt {
            handle,
            nonblocking: ty & libc::SOCK_NONBLOCK != 0,
        };
        let id = match self.conn.control().exchange(&msg, &[fd]) {
            Ok((ControlMsg::Adopted { sock, .. }, _)) => Ok(sock),
            Ok((ControlMsg::Reply { errno, .. }, _)) if errno != 0 => {
                Err(io::Error::from_raw_os_error(errno))
            }
            Ok(_) => Err(io::Error::from_raw_os_error(libc::EPROTO)),
            Err(e) => Err(e),
        };
        match id {
            Ok(id) => {
                self.ahead_new_socket(id, ty & libc::SOCK_NONBLOCK != 0, 0, None, false);
                self.conn.kfds.set(id, fd);
                Ok(id)
            }
            Err(e) => {
                close(fd);
                Err(e)
            }
        }
    }

    /// This process's descriptor of socket `s`; for a socket it has none of
    /// (a connection the server accepted) a duplicate of the server's
    /// (`ControlMsg::SocketDup`), kept from then on.
    pub(crate) fn kernel_fd(&self, s: u32) -> io::Result<RawFd> {
        if let Some(fd) = self.conn.kfds.get(s) {
            return Ok(fd);
        }
        let mut got = self
            .conn
            .control()
            .call(&ControlMsg::SocketDup { handle: s }, &[])?;
        if got.len() != 1 {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        let fd = move_high(got.remove(0).into_raw_fd());
        self.conn.kfds.set(s, fd);
        Ok(fd)
    }

    /// bind(2) on this process's own descriptor.
    pub(crate) fn kernel_bind(&self, s: u32, sockaddr: &[u8]) -> io::Result<()> {
        let fd = self.kernel_fd(s)?;
        // SAFETY: `sockaddr` is readable for its length.
        check(unsafe {
            libc::syscall(
                libc::SYS_bind,
                fd,
                sockaddr.as_ptr(),
                sockaddr.len() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// listen(2) on this process's own descriptor.
    pub(crate) fn kernel_listen(&self, s: u32, backlog: i32) -> io::Result<()> {
        let fd = self.kernel_fd(s)?;
        // SAFETY: plain syscall with integer arguments.
        check(unsafe { libc::syscall(libc::SYS_listen, fd, backlog) }).map(drop)
    }

    /// getsockname(2) on this process's descriptor, if it has one.
    pub(crate) fn kernel_getsockname(&self, s: u32, out: &mut [u8]) -> Option<io::Result<usize>> {
        let fd = self.conn.kfds.get(s)?;
        let mut ss = [0u8; 128];
        let mut len = ss.len() as libc::socklen_t;
        // SAFETY: `ss` is writable for `len` bytes.
        let r = check(unsafe {
            libc::syscall(
                libc::SYS_getsockname,
                fd,
                ss.as_mut_ptr(),
                &mut len as *mut libc::socklen_t,
            )
        });
        Some(r.map(|_| {
            let full = (len as usize).min(ss.len());
            let n = full.min(out.len());
            out[..n].copy_from_slice(&ss[..n]);
            full
        }))
    }

    /// setsockopt(2) of a kernel option: on this process's descriptor when
    /// it has one (and at the server too for the options it must know);
    /// else at the server, and on a duplicate here if the server's
    /// allow-list refuses it (so the kernel checks this process's
    /// credentials, whatever the option).
    pub(crate) fn kernel_setsockopt(
        &self,
        s: u32,
        level: i32,
        name: i32,
        value: &[u8],
        at_server: impl Fn() -> io::Result<()>,
    ) -> io::Result<()> {
        if let Some(fd) = self.conn.kfds.get(s) {
            sys_setsockopt(fd, level, name, value)?;
            return if server_must_know(level, name) {
                at_server()
            } else {
                Ok(())
            };
        }
        match at_server() {
            Err(e) if is_eperm(&e) => sys_setsockopt(self.kernel_fd(s)?, level, name, value),
            r => r,
        }
    }

    /// getsockopt(2) of a kernel option, where [`Client::kernel_setsockopt`]
    /// would set it.
    pub(crate) fn kernel_getsockopt(
        &self,
        s: u32,
        level: i32,
        name: i32,
        out: &mut [u8],
        at_server: impl Fn(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        if let Some(fd) = self.conn.kfds.get(s) {
            return sys_getsockopt(fd, level, name, out);
        }
        match at_server(out) {
            Err(e) if is_eperm(&e) => sys_getsockopt(self.kernel_fd(s)?, level, name, out),
            r => r,
        }
    }

    /// Every socket of this attachment that has a descriptor in this process,
    /// with it (for a forked child, whose new attachment inherits the same
    /// socket ids: see [`Client::adopt_kernel_fds`]).
    pub fn kernel_fds(&self) -> Vec<(u32, RawFd)> {
        self.conn.kfds.all()
    }

    /// Takes over descriptors listed by [`Client::kernel_fds`] in the parent
    /// of a fork (this process owns its copies): they are closed with their
    /// sockets.
    pub fn adopt_kernel_fds(&self, fds: &[(u32, RawFd)]) {
        for &(s, fd) in fds {
            self.conn.kfds.set(s, fd);
        }
    }

    /// Closes this process's own descriptor of socket `s`, if any (the
    /// socket was handed back with `ControlMsg::Export`).
    pub fn forget_kernel_fd(&self, s: u32) {
        self.conn.kfds.forget(s);
    }

    /// One message on the attachment's control socket and the server's
    /// answer (with the descriptors it carried), serialized with every other
    /// control exchange of this attachment (for the preload library's fork,
    /// exec and sendfile messages).
    pub fn control_exchange(
        &self,
        msg: &ControlMsg,
        fds: &[RawFd],
    ) -> io::Result<(ControlMsg, Vec<OwnedFd>)> {
        self.conn.control().exchange(msg, fds)
    }

    /// The lock of [`Client::control_exchange`]: held across fork(2), so the
    /// child never inherits it held by another thread.
    pub fn control_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.conn.control().lock()
    }
}
