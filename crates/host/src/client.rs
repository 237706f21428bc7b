//! [`Client`]: BSD socket calls executed by the TCP server.
//!
//! Each call checks out a piece of a channel (an arena range; see
//! `channel`), puts its input bytes in it, runs one request/completion
//! exchange and copies output bytes back. Arena offsets here are relative to
//! the call's range. Everything in a completion is bounded by what the
//! request offered.

use crate::attach::{self, default_path};
use crate::channel::{Conn, HostStats, Lease};
use crate::socket::Socket;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tcps_proto::eager::SOL_TCPS;
use tcps_proto::msg::{ArenaRange, PollEntry, MAX_ADDR_LEN, MAX_OPT_LEN, MAX_POLL_ENTRIES};
use tcps_proto::{addr, Call, Completion};

/// One entry of [`Client::poll`]: a tcps socket, the events wanted, the
/// events that occurred (`POLLIN`, `POLLOUT`, ... as in poll(2)).
pub type PollFd = PollEntry;

/// recv flags a `Recv` request carries (`MSG_OOB` too: the server's kernel
/// socket has the urgent data); the others the kernel ignores on TCP.
const RECV_FLAGS: i32 =
    libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_DONTWAIT | libc::MSG_OOB | libc::MSG_TRUNC;
const POLL_ENTRY_LEN: usize = std::mem::size_of::<PollEntry>();

/// A host attached to a tcps TCP server. Cheap to clone; all clones share
/// the attachment, which ends when the last one is dropped (or on
/// [`detach`](Client::detach)).
#[derive(Clone)]
pub struct Client {
    pub(crate) conn: Arc<Conn>,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// A range of `len` bytes at arena offset 0 of the call's piece.
fn range(len: usize) -> ArenaRange {
    ArenaRange {
        off: 0,
        len: len as u32,
    }
}

fn socket_id(c: &Completion) -> io::Result<u32> {
    u32::try_from(c.result).map_err(|_| errno(libc::EIO))
}

/// A `usize` result, which must not exceed what was offered.
fn count(c: &Completion, max: usize) -> io::Result<usize> {
    usize::try_from(c.result)
        .ok()
        .filter(|&n| n <= max)
        .ok_or_else(|| errno(libc::EIO))
}

fn parse_addr(b: &[u8]) -> io::Result<SocketAddr> {
    addr::parse(b).map_err(|e| match e {
        addr::AddrError::TooShort => errno(libc::EIO),
        addr::AddrError::UnsupportedFamily(_) => errno(libc::EAFNOSUPPORT),
    })
}

impl Client {
    /// Attaches to the server whose control socket is at `path`.
    pub fn attach(path: impl AsRef<Path>) -> io::Result<Client> {
        let a = attach::attach(path.as_ref())?;
        Ok(Client {
            conn: Arc::new(Conn::new(a, crate::remote::address().is_some())),
        })
    }

    /// Attaches to the server on another node at fabric address `remote`
    /// (`ADDR:PORT`, its `--fabric-listen`), with the secret of
    /// `TCPS_FABRIC_AUTH`, whatever `TCPS_REMOTE` says: a host that uses
    /// several servers holds one `Client` for each.
    pub fn attach_remote(remote: &str) -> io::Result<Client> {
        let a = attach::attach_remote(remote)?;
        Ok(Client {
            conn: Arc::new(Conn::new(a, true)),
        })
    }

    /// Attaches at `$TCPS_SOCKET`, else the default control socket path.
    pub fn attach_default() -> io::Result<Client> {
        Client::attach(default_path())
    }

    /// Ends the attachment now, for every clone: the server closes all of
    /// this host's sockets. Later calls fail with ENOTCONN.
    pub fn detach(&self) {
        self.conn.detach();
    }

    /// Attached to a server on another node (`TCPS_REMOTE`): sockets have
    /// no descriptor in this process, and descriptor passing is not
    /// available (memory registration and fork inheritance are, through
    /// the helper: `crate::remote`).
    pub fn is_remote(&self) -> bool {
        self.conn.remote
    }

    /// The control socket's descriptor (remote: the helper's socketpair,
    /// made without socket(2)): a forked child closes its copy of its
    /// parent's, so that the parent's end is seen when the parent exits.
    pub fn control_fd(&self) -> std::os::fd::RawFd {
        self.conn.control().raw()
    }

    /// False once the server died or the client was detached.
    pub fn is_attached(&self) -> bool {
        self.conn.is_open()
    }

    /// Asks whether the server is still there (a look at the region's
    /// header and a poll of the control socket); false, and the client
    /// detached, if it is gone.
    pub fn check_server(&self) -> bool {
        self.conn.server_alive()
    }

    /// Bytes of data arena per channel. One send/recv request moves at most
    /// 15/16 of it (the rest is kept for calls that may share the channel
    /// while this one waits), and less when it shares a busy channel.
    pub fn arena_size(&self) -> usize {
        self.conn.arena_size() as usize
    }

    /// Channels in the region. Calls beyond this many in flight at once
    /// share channels (each carries up to `ring_entries - 1` calls).
    pub fn n_channels(&self) -> usize {
        self.conn.n_channels() as usize
    }

    /// Counters of this attachment, summed over its channels.
    pub fn stats(&self) -> HostStats {
        let mut s = self.conn.stats();
        let a = self.conn.sendq.stats(&self.conn.socks);
        s.async_sends = a.sends;
        s.async_fallbacks = a.fallbacks;
        s.kicks = a.kicks;
        s.registered_misuse = a.misuse;
        s.bytes_copied += a.bytes_copied;
        s.bytes_sent += a.bytes_sent;
        let r = self.conn.socks.recv_stats();
        s.ring_recvs = r.ring_recvs;
        s.ring_accepts = r.ring_accepts;
        s.recv_kicks = r.recv_kicks;
        s.bytes_received += r.bytes_received;
        s.bytes_copied += r.bytes_copied;
        s
    }

    /// Runs `f` on a checked-out channel with an arena range of at least
    /// `min` and up to `want` bytes (`Lease::room`); `dead` is the errno
    /// when the attachment is gone before the call starts.
    fn with_channel<T>(
        &self,
        dead: i32,
        min: usize,
        want: usize,
        f: impl FnOnce(&mut Lease<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
        self.conn.check_open(dead)?;
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        self.conn.with_lease(dead, clamp(min), clamp(want), f)
    }

    /// A call with no arena traffic.
    pub(crate) fn simple_call(&self, call: Call) -> io::Result<Completion> {
        self.with_channel(libc::ENOTCONN, 0, 0, |l| l.exchange(call.encode()))
    }

    /// A call whose only input is `bytes` at arena offset 0 (`call` gets
    /// their range).
    fn with_input(
        &self,
        call: impl FnOnce(ArenaRange) -> Call,
        bytes: &[u8],
    ) -> io::Result<Completion> {
        self.with_channel(libc::ENOTCONN, bytes.len(), bytes.len(), |l| {
            l.put(0, bytes)?;
            l.exchange(call(range(bytes.len())).encode())
        })
    }

    /// A call whose output is an address or option value at arena offset 0:
    /// returns the completion and the full length (`aux`, at most `max`),
    /// having copied up to `out.len()` bytes of it into `out`.
    fn with_output(
        &self,
        call: impl FnOnce(ArenaRange) -> Call,
        out: &mut [u8],
        max: u32,
    ) -> io::Result<(Completion, usize)> {
        let cap = out.len().min(max as usize);
        self.with_channel(libc::ENOTCONN, cap, cap, |l| {
            let c = l.exchange(call(range(cap)).encode())?;
            // The length is in aux's low half (Accept: SETUP_* in the high one).
            let full = (c.aux & 0xffff_ffff).min(u64::from(max)) as usize;
            let n = full.min(cap);
            l.get(0, &mut out[..n])?;
            Ok((c, full))
        })
    }

    /// Round trip without a socket call (measures the channel itself).
    pub fn nop(&self) -> io::Result<()> {
        self.simple_call(Call::Nop).map(drop)
    }

    /// socket(2): returns the new tcps socket id. `ty` may include
    /// `SOCK_NONBLOCK` / `SOCK_CLOEXEC`.
    ///
    /// The kernel socket is created in this process, under its own
    /// credentials (so are `bind`, `listen` and socket options; see
    /// `kernelfd`), and handed to the server once.
    ///
    /// Attached over a fabric (`TCPS_REMOTE`), the server creates it (and
    /// binds it), checking what the kernel would against the uid the
    /// server maps this host to.
    pub fn socket(&self, domain: i32, ty: i32, protocol: i32) -> io::Result<u32> {
        if self.conn.remote {
            let c = self.simple_call(Call::Socket {
                domain,
                ty: ty & !libc::SOCK_CLOEXEC,
                protocol,
            })?;
            let id = socket_id(&c)?;
            self.new_socket_record(id, ty & libc::SOCK_NONBLOCK != 0, 0, None, false);
            return Ok(id);
        }
        self.new_kernel_socket(domain, ty, protocol)
    }

    pub fn bind(&self, s: u32, addr: &SocketAddr) -> io::Result<()> {
        self.bind_raw(s, &addr::encode(addr))
    }

    /// bind(2) with raw `sockaddr` bytes (at most 128).
    pub fn bind_raw(&self, s: u32, sockaddr: &[u8]) -> io::Result<()> {
        if sockaddr.len() > MAX_ADDR_LEN as usize {
            return Err(errno(libc::EINVAL));
        }
        // An address tcps cannot carry fails as it always did (the kernel
        // would check the length before the family).
        addr::parse(sockaddr).map_err(|e| match e {
            addr::AddrError::TooShort => errno(libc::EINVAL),
            addr::AddrError::UnsupportedFamily(_) => errno(libc::EAFNOSUPPORT),
        })?;
        if self.conn.remote {
            return self
                .with_input(|addr| Call::Bind { sock: s, addr }, sockaddr)
                .map(drop);
        }
        self.kernel_bind(s, sockaddr)
    }

    /// listen(2): this process listens on its own descriptor, then the
    /// server takes the listener over (its accept ring is set up).
    pub fn listen(&self, s: u32, backlog: i32) -> io::Result<()> {
        if !self.conn.remote {
            self.kernel_listen(s, backlog)?;
        }
        let c = self.simple_call(Call::Listen { sock: s, backlog })?;
        self.eager_listened(s, c.aux);
        Ok(())
    }

    /// accept4(2): returns the new socket and the peer's address.
    /// `flags` may hold `SOCK_NONBLOCK` (`SOCK_CLOEXEC` is ignored).
    pub fn accept(&self, s: u32, flags: i32) -> io::Result<(u32, Option<SocketAddr>)> {
        let mut buf = [0u8; MAX_ADDR_LEN as usize];
        let (id, len) = self.accept_raw(s, flags, &mut buf)?;
        // The connection is ours now: an odd address must not lose it.
        Ok((id, addr::parse(&buf[..len.min(buf.len())]).ok()))
    }

    /// accept4(2) writing the peer's raw `sockaddr` into `addr_out` (empty:
    /// not wanted). Returns the new socket and the address's full length,
    /// which may exceed `addr_out.len()` (the copy is then truncated).
    ///
    /// A listener with an accept ring (`docs/PROTOCOL.md` §10) hands out
    /// connections the server accepted eagerly, with no request.
    pub fn accept_raw(&self, s: u32, flags: i32, addr_out: &mut [u8]) -> io::Result<(u32, usize)> {
        self.accept_offloaded(s, flags, addr_out)
    }

    /// The accept itself: (socket id, or a direct connection's handle; the
    /// address's full length; the `SETUP_*` flags). An offloaded
    /// connection has its record already.
    pub(crate) fn accept_setup(
        &self,
        s: u32,
        flags: i32,
        addr_out: &mut [u8],
    ) -> io::Result<(u32, usize, u32)> {
        if let Some(r) = self.ring_accept(s, flags, addr_out)? {
            return Ok(r);
        }
        let flags_out = flags & !libc::SOCK_CLOEXEC;
        let accept = |addr| Call::Accept {
            sock: s,
            addr,
            flags: flags_out,
        };
        let (c, len) = self.with_output(accept, addr_out, MAX_ADDR_LEN)?;
        let id = socket_id(&c)?;
        // aux's high half: what the server set up with the accept (SETUP_*).
        let setup = (c.aux >> 32) as u32;
        if setup & tcps_proto::eager::SETUP_DIRECT == 0 {
            let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
            self.new_socket_record(id, nonblocking, setup, self.local_rcvtimeo(s), true);
        }
        Ok((id, len, setup))
    }

    pub fn connect(&self, s: u32, addr: &SocketAddr) -> io::Result<()> {
        self.connect_raw(s, &addr::encode(addr))
    }

    /// connect(2) with raw `sockaddr` bytes (at most 128).
    pub fn connect_raw(&self, s: u32, sockaddr: &[u8]) -> io::Result<()> {
        if sockaddr.len() > MAX_ADDR_LEN as usize {
            return Err(errno(libc::EINVAL));
        }
        let connect = |addr| Call::Connect { sock: s, addr };
        self.with_input(connect, sockaddr).map(drop)
    }

    /// send(2). Data larger than the call's arena range goes in range-sized
    /// requests; the result is short if a request was (a non-blocking
    /// socket), and an error only if nothing was sent.
    pub fn send(&self, s: u32, buf: &[u8], flags: i32) -> io::Result<usize> {
        let sock = self.conn.socks.get(s);
        if let Some(sock) = sock {
            self.async_error_of(sock)?;
        }
        let flags = sock.map_or(flags, |k| k.request_flags(flags));
        self.with_channel(libc::EPIPE, buf.len().min(1), buf.len(), |l| {
            let chunk = (l.room() as usize).max(1);
            let mut total = 0;
            loop {
                let piece = &buf[total..buf.len().min(total + chunk)];
                let r = Call::Send {
                    sock: s,
                    data: range(piece.len()),
                    flags,
                };
                l.put(0, piece)?;
                let n = match l.exchange(r.encode()).and_then(|c| count(&c, piece.len())) {
                    Ok(n) => n,
                    Err(e) if total == 0 => return Err(e),
                    Err(_) => return Ok(total),
                };
                l.count_network(n, 0);
                total += n;
                if n < piece.len() || total == buf.len() {
                    return Ok(total);
                }
            }
        })
    }

    /// Sends all of `buf` (blocking sockets; a non-blocking one may fail
    /// with EAGAIN part way).
    pub fn send_all(&self, s: u32, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.send(s, buf, 0) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// recv(2): at most [`arena_size`](Client::arena_size) bytes per call
    /// (less when the call shares a busy channel). A socket with a receive
    /// ring (`docs/PROTOCOL.md` §10) is read from it, with no request.
    ///
    /// Flags as the kernel's TCP receive: `MSG_ERRQUEUE` is EAGAIN (nothing
    /// on a TCP socket's error queue here), flags it ignores are ignored,
    /// `MSG_TRUNC` counts and discards without writing `buf`; a
    /// zero-length receive waits and fails as any, and returns 0.
    pub fn recv(&self, s: u32, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        if flags & libc::MSG_ERRQUEUE != 0 {
            return Err(errno(libc::EAGAIN));
        }
        if buf.is_empty() {
            let mut probe = [0u8; 1];
            let peek = flags | libc::MSG_PEEK | libc::MSG_TRUNC;
            return self.recv(s, &mut probe, peek).map(|_| 0);
        }
        let sock = self.conn.socks.get_or_insert(s)?;
        self.async_error_of(sock)?;
        if let Some(n) = self.ring_recv(s, sock, buf, flags)? {
            return Ok(n);
        }
        let mut flags = sock.request_flags(flags & RECV_FLAGS);
        if self.plain_rcvlowat_wait(s, sock, buf.len(), flags)? {
            flags |= libc::MSG_DONTWAIT;
        }
        if flags & libc::MSG_OOB != 0 {
            // The kernel's urgent read never waits; nor may the server's.
            flags |= libc::MSG_DONTWAIT;
        }
        self.with_channel(libc::ENOTCONN, buf.len().min(1), buf.len(), |l| {
            let cap = buf.len().min(l.room() as usize);
            let r = Call::Recv {
                sock: s,
                data: range(cap),
                flags,
            };
            let n = count(&l.exchange(r.encode())?, cap)?;
            l.count_network(0, n);
            if flags & libc::MSG_TRUNC == 0 {
                l.get(0, &mut buf[..n])?;
            }
            Ok(n)
        })
    }

    /// shutdown(2). The first `SHUT_WR` of a connection this library
    /// accepted, with no sign of a reset (nor a failed asynchronous send),
    /// goes without waiting
    /// (`SHUTDOWN_NO_REPLY`; it cannot fail, and the FIN still follows the
    /// socket's earlier sends); any other waits for the server's answer.
    pub fn shutdown(&self, s: u32, how: i32) -> io::Result<()> {
        self.take_async_error(s)?;
        if !self.sendq_failed(s) && self.eager_shutdown_unanswered(s, how) {
            let reply = false;
            self.conn.post(Call::Shutdown {
                sock: s,
                how,
                reply,
            })?;
        } else {
            let reply = true;
            self.simple_call(Call::Shutdown {
                sock: s,
                how,
                reply,
            })?;
        }
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            self.sendq_write_shut(s);
        }
        Ok(())
    }

    /// close(2). Asynchronous sends still in flight are not lost: the
    /// server sends them and then closes (as the kernel does with data in
    /// the send buffer).
    ///
    /// A connection this library accepted and has not closed is closed
    /// without waiting: the request is posted with `CLOSE_NO_REPLY` and
    /// executes after the socket's earlier calls, with no round trip
    /// (close(2) of an open TCP connection cannot fail, and calls on the
    /// id fail with EBADF here until it is handed out again). Any other id
    /// (a listener or other socket from `socket`, whose port a next `bind`
    /// may want; one inherited, already closed or unknown) waits for the
    /// server's answer, as with the kernel.
    pub fn close(&self, s: u32) -> io::Result<()> {
        let accepted_open = self.conn.socks.close_recv(s);
        self.sendq_close(s);
        // Out of the record before the server can hand the id out again; our
        // copy closes after the server's (the port is free on return).
        let kfd = self.conn.socks.get(s).and_then(Socket::take_kfd);
        let res = if accepted_open {
            self.conn.post(Call::Close {
                sock: s,
                reply: false,
            })
        } else {
            let reply = true;
            self.simple_call(Call::Close { sock: s, reply }).map(drop)
        };
        if let Some(fd) = kfd {
            crate::sys::close(fd);
        }
        res
    }

    /// setsockopt(2) with a raw value (at most 256 bytes).
    pub fn setsockopt(&self, s: u32, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
        if value.len() > MAX_OPT_LEN as usize {
            return Err(errno(libc::EINVAL));
        }
        let at_server = || {
            let set = |value| Call::SetSockOpt {
                sock: s,
                level,
                name,
                value,
            };
            self.with_input(set, value).map(drop)
        };
        if level == libc::SOL_SOCKET
            && name == libc::SO_RCVLOWAT
            && self.eager_set_rcvlowat(s, value)?
        {
            return Ok(());
        }
        self.forget_options(s);
        let r = if level == SOL_TCPS {
            at_server()
        } else {
            self.kernel_setsockopt(s, level, name, value, at_server)
        };
        self.forget_options(s);
        r?;
        self.eager_setsockopt(s, level, name, value);
        Ok(())
    }

    pub fn setsockopt_int(&self, s: u32, level: i32, name: i32, v: i32) -> io::Result<()> {
        self.setsockopt(s, level, name, &v.to_ne_bytes())
    }

    /// getsockopt(2): fills `out` (at most 256 bytes used) and returns the
    /// value's length, truncated to the space given as Linux does.
    pub fn getsockopt(&self, s: u32, level: i32, name: i32, out: &mut [u8]) -> io::Result<usize> {
        if level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT {
            if let Some(v) = self.eager_rcvlowat(s) {
                let n = out.len().min(4);
                out[..n].copy_from_slice(&v.to_ne_bytes()[..n]);
                return Ok(n);
            }
        }
        let at_server = |out: &mut [u8]| {
            let get = |value| Call::GetSockOpt {
                sock: s,
                level,
                name,
                value,
            };
            let gen = match self.kept_option(s, level, name, out) {
                Ok(n) => return Ok(n),
                Err(gen) => gen,
            };
            let (_, len) = self.with_output(get, out, MAX_OPT_LEN)?;
            self.keep_option(s, (level, name, gen), out, len);
            Ok(len.min(out.len()))
        };
        if level == SOL_TCPS {
            return at_server(out);
        }
        self.kernel_getsockopt(s, level, name, out, at_server)
    }

    pub fn getsockopt_int(&self, s: u32, level: i32, name: i32) -> io::Result<i32> {
        let mut b = [0u8; 4];
        self.getsockopt(s, level, name, &mut b)?;
        Ok(i32::from_ne_bytes(b))
    }

    pub fn getsockname(&self, s: u32) -> io::Result<SocketAddr> {
        let mut b = [0u8; MAX_ADDR_LEN as usize];
        let n = self.getsockname_raw(s, &mut b)?;
        parse_addr(&b[..n.min(b.len())])
    }

    /// getsockname(2) into raw `sockaddr` bytes; returns the full length.
    pub fn getsockname_raw(&self, s: u32, out: &mut [u8]) -> io::Result<usize> {
        if let Some(r) = self.kernel_getname(s, false, out) {
            return r;
        }
        Ok(self
            .with_output(
                |addr| Call::GetSockName { sock: s, addr },
                out,
                MAX_ADDR_LEN,
            )?
            .1)
    }

    pub fn getpeername(&self, s: u32) -> io::Result<SocketAddr> {
        let mut b = [0u8; MAX_ADDR_LEN as usize];
        let n = self.getpeername_raw(s, &mut b)?;
        parse_addr(&b[..n.min(b.len())])
    }

    /// getpeername(2) into raw `sockaddr` bytes; returns the full length.
    pub fn getpeername_raw(&self, s: u32, out: &mut [u8]) -> io::Result<usize> {
        if let Some(r) = self.kernel_getname(s, true, out) {
            return r;
        }
        Ok(self
            .with_output(
                |addr| Call::GetPeerName { sock: s, addr },
                out,
                MAX_ADDR_LEN,
            )?
            .1)
    }

    /// poll(2) over tcps sockets: sets each `revents`, returns how many
    /// entries have events. `timeout_ms < 0` waits forever. At most 4096
    /// entries (EINVAL beyond).
    ///
    /// Readability of sockets with rings is answered locally when that
    /// settles the call (see `eager::poll`).
    pub fn poll(&self, fds: &mut [PollFd], timeout_ms: i32) -> io::Result<usize> {
        let mut ranks = vec![0u16; fds.len()];
        self.poll_ranked(fds, &mut ranks, timeout_ms)
    }

    /// [`Client::poll`], and the order the ready entries became readable
    /// in: `ranks[i]` (0 first) of each entry with `revents`, as the
    /// server observed the arrivals (`docs/PROTOCOL.md` §10). epoll
    /// reports in this order, as the kernel's ready list does.
    /// `ranks.len()` must be `fds.len()`.
    pub fn poll_ranked(
        &self,
        fds: &mut [PollFd],
        ranks: &mut [u16],
        timeout_ms: i32,
    ) -> io::Result<usize> {
        if fds.len() > MAX_POLL_ENTRIES as usize || ranks.len() != fds.len() {
            return Err(errno(libc::EINVAL));
        }
        if let Some(n) = self.ring_poll(fds, ranks, timeout_ms)? {
            return Ok(n);
        }
        let bytes = fds.len() * POLL_ENTRY_LEN;
        if bytes > self.conn.arena_size() as usize {
            return Err(errno(libc::EINVAL));
        }
        self.with_channel(libc::ENOTCONN, bytes, bytes, |l| {
            for (i, f) in fds.iter().enumerate() {
                let mut e = [0u8; POLL_ENTRY_LEN];
                e[0..4].copy_from_slice(&f.sock.to_ne_bytes());
                e[4..6].copy_from_slice(&f.events.to_ne_bytes());
                l.put((i * POLL_ENTRY_LEN) as u32, &e)?;
            }
            let r = Call::Poll {
                entries: range(fds.len() * POLL_ENTRY_LEN),
                n: fds.len() as u32,
                timeout_ms: timeout_ms.into(),
            };
            let n = count(&l.exchange(r.encode())?, fds.len())?;
            for (i, f) in fds.iter_mut().enumerate() {
                // A ready entry's `events` slot holds its arrival rank.
                let mut e = [0u8; 4];
                l.get((i * POLL_ENTRY_LEN + 4) as u32, &mut e)?;
                f.revents = i16::from_ne_bytes([e[2], e[3]]);
                ranks[i] = u16::from_ne_bytes([e[0], e[1]]);
            }
            Ok(n)
        })
    }

    /// Hands the server the open regular file `fd` (this process keeps its
    /// copy) for [`Client::sendfile`], named `file` from now on
    /// (`ControlMsg::FileOpen`).
    ///
    /// On a server on another node (`TCPS_REMOTE`) no descriptor can cross:
    /// the server opens the file at the same path itself (`Op::FileOpen`),
    /// which it does only under `tcps server --shared-files DIR` for a path
    /// inside DIR holding the same file (size and modification time as
    /// here); otherwise this fails (EOPNOTSUPP, EACCES, ENOENT, ESTALE, …)
    /// and the caller sends the file's bytes itself.
    pub fn file_open(&self, file: u32, fd: std::os::fd::RawFd) -> io::Result<()> {
        if self.conn.remote {
            let (path, size, mtime_ns) = crate::sys::file_identity(fd)?;
            let open = |path| Call::FileOpen {
                handle: file,
                path,
                size,
                mtime_ns,
            };
            return self.with_input(open, &path).map(drop);
        }
        let msg = tcps_proto::handshake::ControlMsg::FileOpen { handle: file };
        self.conn.control().call(&msg, &[fd]).map(drop)
    }

    /// The server forgets file `file` (`ControlMsg::FileClose`, a request
    /// on a server on another node); ranges of it already queued
    /// (`sendfile_async`) are still sent.
    pub fn file_close(&self, file: u32) -> io::Result<()> {
        if self.conn.remote {
            return self.simple_call(Call::FileClose { handle: file }).map(drop);
        }
        let msg = tcps_proto::handshake::ControlMsg::FileClose { handle: file };
        self.conn.control().call(&msg, &[]).map(drop)
    }

    /// sendfile(2) at the server: up to `len` bytes of file `file` (handed
    /// over beforehand with `ControlMsg::FileOpen` on the control socket)
    /// from `offset`, sent on `s` by the server without the bytes passing
    /// through this process. One non-blocking attempt: may send less, or
    /// fail with EAGAIN.
    pub fn sendfile(&self, s: u32, file: u32, offset: u64, len: u32) -> io::Result<usize> {
        let r = Call::SendFile {
            sock: s,
            file,
            offset,
            count: len,
        };
        self.with_channel(libc::EPIPE, 0, 0, |l| {
            let n = count(&l.exchange(r.encode())?, len as usize)?;
            // Sent by the server, copied by nobody: no bytes_copied.
            l.count_network(n, 0);
            Ok(n)
        })
    }

    /// fcntl(2): `F_GETFL` and `F_SETFL` (`O_NONBLOCK`). O_NONBLOCK is
    /// the library's own view (an `accept4(SOCK_NONBLOCK)` of a connection
    /// the server accepted eagerly is non-blocking here, not at the server).
    /// `F_GETFL` of a socket with a descriptor in this process and a known
    /// O_NONBLOCK is answered here, with no round trip.
    pub fn fcntl(&self, s: u32, cmd: i32, arg: i64) -> io::Result<i64> {
        let nb = i64::from(libc::O_NONBLOCK);
        let local = match (cmd, self.local_nonblocking(s)) {
            (libc::F_GETFL, Some(_)) => self.kernel_getfl(s),
            _ => None,
        };
        let mut res = match local {
            Some(r) => r?,
            None => self.simple_call(Call::Fcntl { sock: s, cmd, arg })?.result,
        };
        if cmd == libc::F_SETFL {
            if let Ok(sock) = self.conn.socks.get_or_insert(s) {
                sock.set_nonblocking(arg & nb != 0);
            }
        } else if cmd == libc::F_GETFL {
            match self.local_nonblocking(s) {
                Some(true) => res |= nb,
                Some(false) => res &= !nb,
                None => {}
            }
        }
        Ok(res)
    }

    pub fn set_nonblocking(&self, s: u32, on: bool) -> io::Result<()> {
        let fl = self.fcntl(s, libc::F_GETFL, 0)?;
        let nb = i64::from(libc::O_NONBLOCK);
        let want = if on { fl | nb } else { fl & !nb };
        if want != fl {
            self.fcntl(s, libc::F_SETFL, want)?;
        }
        Ok(())
    }

    /// A listening TCP socket: socket, `SO_REUSEADDR`, bind, listen.
    pub fn tcp_listen(&self, addr: SocketAddr, backlog: i32) -> io::Result<u32> {
        let s = self.socket(domain_of(&addr), libc::SOCK_STREAM, 0)?;
        let r = self
            .setsockopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)
            .and_then(|()| self.bind(s, &addr))
            .and_then(|()| self.listen(s, backlog));
        self.close_on_error(s, r)
    }

    /// A TCP socket connected to `addr` (blocking).
    pub fn tcp_connect(&self, addr: SocketAddr) -> io::Result<u32> {
        let s = self.socket(domain_of(&addr), libc::SOCK_STREAM, 0)?;
        let r = self.connect(s, &addr);
        self.close_on_error(s, r)
    }

    fn close_on_error(&self, s: u32, r: io::Result<()>) -> io::Result<u32> {
        match r {
            Ok(()) => Ok(s),
            Err(e) => {
                let _ = self.close(s);
                Err(e)
            }
        }
    }
}

fn domain_of(a: &SocketAddr) -> i32 {
    match a {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("attached", &self.is_attached())
            .field("channels", &self.n_channels())
            .field("arena_size", &self.arena_size())
            .finish()
    }
}
