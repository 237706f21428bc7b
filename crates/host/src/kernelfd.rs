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

use crate::client::Client;
use crate::socket::Socket;
use crate::sys::{self, check, close, move_high, new_tcp_socket};
use std::io;
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use tcps_proto::handshake::ControlMsg;

/// Socket options the server must also know when the host sets them on its
/// own descriptor: it times out parked calls itself (its copy is
/// non-blocking, so the kernel would ignore them there).
fn server_must_know(level: i32, name: i32) -> bool {
    level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO)
}

fn is_eperm(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EPERM)
}

static NEXT_NONCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl Client {
    /// This process's descriptor of socket `s`, if it has one.
    fn own_fd(&self, s: u32) -> Option<RawFd> {
        self.conn.socks.get(s)?.kfd()
    }

    /// Records `fd` as socket `s`'s (closing one recorded before; closing
    /// `fd` if `s` can have no record).
    fn keep_kernel_fd(&self, s: u32, fd: RawFd) {
        match self.conn.socks.get_or_insert(s) {
            Ok(sock) => sock.set_kfd(fd),
            Err(_) => close(fd),
        }
    }

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
        self.adopt_fd(fd, ty & libc::SOCK_NONBLOCK != 0)
    }

    /// A connection handed over directly (`crate::direct`) goes back to
    /// the server (the native API has only socket ids); its new id.
    pub(crate) fn adopt_kernel_socket(&self, fd: OwnedFd, nonblocking: bool) -> io::Result<u32> {
        self.adopt_fd(move_high(fd.into_raw_fd()), nonblocking)
    }

    /// Hands `fd` to the server (`ControlMsg::SocketAdopt`) and keeps it as
    /// the new socket's own descriptor; closes it on failure.
    fn adopt_fd(&self, fd: RawFd, nonblocking: bool) -> io::Result<u32> {
        let handle = NEXT_NONCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let msg = ControlMsg::SocketAdopt {
            handle,
            nonblocking,
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
                self.new_socket_record(id, nonblocking, 0, None, false);
                self.keep_kernel_fd(id, fd);
                Ok(id)
            }
            Err(e) => {
                close(fd);
                Err(e)
            }
        }
    }

    /// After the server died: every listening socket of which this process
    /// holds its own descriptor stops listening (shutdown(2) of a listener
    /// drops its queue and unlistens it), so that the kernel refuses new
    /// connections instead of queueing them for nobody: load balancers and
    /// health checks then see a dead backend, not a hung one. The
    /// descriptors stay open (the program still holds its placeholders).
    /// Returns how many stopped listening.
    pub fn stop_listening(&self) -> usize {
        let mut n = 0;
        self.conn.socks.for_each(|_, sock| {
            let Some(fd) = sock.kfd() else {
                return;
            };
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt into an int of its size, shutdown(2), both
            // raw system calls on a descriptor this process owns.
            let listening = unsafe {
                libc::syscall(
                    libc::SYS_getsockopt,
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ACCEPTCONN,
                    &mut v as *mut libc::c_int,
                    &mut len as *mut libc::socklen_t,
                ) == 0
                    && v != 0
            };
            // SAFETY: as above.
            if listening && unsafe { libc::syscall(libc::SYS_shutdown, fd, libc::SHUT_RDWR) } == 0 {
                n += 1;
            }
        });
        n
    }

    /// This process's descriptor of socket `s`; for a socket it has none of
    /// (a connection the server accepted) a duplicate of the server's
    /// (`ControlMsg::SocketDup`), kept from then on.
    pub(crate) fn kernel_fd(&self, s: u32) -> io::Result<RawFd> {
        if let Some(fd) = self.own_fd(s) {
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
        self.keep_kernel_fd(s, fd);
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

    /// getsockname(2) (`peer`: getpeername(2)) on this process's
    /// descriptor, if it has one: the same kernel socket the server works
    /// on, so the kernel's own answer, with no round trip.
    pub(crate) fn kernel_getname(
        &self,
        s: u32,
        peer: bool,
        out: &mut [u8],
    ) -> Option<io::Result<usize>> {
        let fd = self.own_fd(s)?;
        let mut ss = [0u8; 128];
        let mut len = ss.len() as libc::socklen_t;
        let nr = if peer {
            libc::SYS_getpeername
        } else {
            libc::SYS_getsockname
        };
        // SAFETY: `ss` is writable for `len` bytes.
        let r = check(unsafe {
            libc::syscall(nr, fd, ss.as_mut_ptr(), &mut len as *mut libc::socklen_t)
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
        if let Some(fd) = self.own_fd(s) {
            sys::setsockopt(fd, level, name, value)?;
            return if server_must_know(level, name) {
                at_server()
            } else {
                Ok(())
            };
        }
        match at_server() {
            Err(e) if is_eperm(&e) => sys::setsockopt(self.kernel_fd(s)?, level, name, value),
            r => r,
        }
    }

    /// fcntl(F_GETFL) on this process's descriptor, if it has one (it
    /// shares the server's open file description, O_NONBLOCK aside, which
    /// the caller takes from the record).
    pub(crate) fn kernel_getfl(&self, s: u32) -> Option<io::Result<i64>> {
        let fd = self.own_fd(s)?;
        // SAFETY: plain syscall with integer arguments.
        Some(check(unsafe {
            libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL)
        }))
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
        if let Some(fd) = self.own_fd(s) {
            return sys::getsockopt(fd, level, name, out);
        }
        match at_server(out) {
            Err(e) if is_eperm(&e) => sys::getsockopt(self.kernel_fd(s)?, level, name, out),
            r => r,
        }
    }

    /// Every socket of this attachment that has a descriptor in this process,
    /// with it (for a forked child, whose new attachment inherits the same
    /// socket ids: see [`Client::adopt_kernel_fds`]).
    pub fn kernel_fds(&self) -> Vec<(u32, RawFd)> {
        self.conn.socks.kernel_fds()
    }

    /// Takes over descriptors listed by [`Client::kernel_fds`] in the parent
    /// of a fork (this process owns its copies): they are closed with their
    /// sockets.
    pub fn adopt_kernel_fds(&self, fds: &[(u32, RawFd)]) {
        for &(s, fd) in fds {
            self.keep_kernel_fd(s, fd);
        }
    }

    /// Closes this process's own descriptor of socket `s`, if any (the
    /// socket was handed back with `ControlMsg::Export`).
    pub fn forget_kernel_fd(&self, s: u32) {
        if let Some(fd) = self.conn.socks.get(s).and_then(Socket::take_kfd) {
            close(fd);
        }
    }

    /// The backlog of socket `s` if it is a listener this process holds a
    /// descriptor of (the kernel's own answer: `SO_ACCEPTCONN`, and
    /// `TCP_INFO`'s `tcpi_sacked`, which holds a listener's backlog).
    /// Works on a dead attachment too: the kernel socket lives on in this
    /// process after the server died.
    pub fn listener_backlog(&self, s: u32) -> Option<i32> {
        let fd = self.own_fd(s)?;
        let mut v = [0u8; 4];
        sys::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, &mut v).ok()?;
        if i32::from_ne_bytes(v) == 0 {
            return None;
        }
        // SAFETY: tcp_info is plain old data; zeroes are a valid value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        // SAFETY: the struct is writable for its size.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                &mut info as *mut libc::tcp_info as *mut u8,
                std::mem::size_of::<libc::tcp_info>(),
            )
        };
        let backlog = match sys::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, buf) {
            Ok(_) if info.tcpi_sacked > 0 => info.tcpi_sacked.min(i32::MAX as u32) as i32,
            _ => libc::SOMAXCONN,
        };
        Some(backlog)
    }

    /// Takes listener `s` of `old` (an attachment whose server died) over:
    /// its descriptor in this process moves to this attachment, the server
    /// adopts it (`ControlMsg::SocketAdopt`) and it listens again with
    /// `backlog`, so the server sets up its accept ring. The kernel socket
    /// is the same one: its address, options and the connections waiting
    /// in its queue are kept. A receive or send timeout set on it is set at
    /// this server too (the server times parked calls out itself). Returns
    /// the new socket id; on failure the descriptor is closed.
    pub fn readopt_listener(
        &self,
        old: &Client,
        s: u32,
        backlog: i32,
        nonblocking: bool,
    ) -> io::Result<u32> {
        let fd = old
            .conn
            .socks
            .get(s)
            .and_then(Socket::take_kfd)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let id = self.adopt_fd(fd, nonblocking)?;
        let r = self.listen(id, backlog).and_then(|()| {
            for name in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
                let mut tv = [0u8; std::mem::size_of::<libc::timeval>()];
                if sys::getsockopt(fd, libc::SOL_SOCKET, name, &mut tv).is_ok()
                    && tv.iter().any(|&b| b != 0)
                {
                    self.setsockopt(id, libc::SOL_SOCKET, name, &tv)?;
                }
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(id),
            Err(e) => {
                let _ = self.close(id);
                Err(e)
            }
        }
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
