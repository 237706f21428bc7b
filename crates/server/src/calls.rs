//! Executing host calls on kernel sockets.
//!
//! Every call is tried at once with a non-blocking syscall. A call that
//! would block on a blocking socket is *parked* on its socket (accept/recv
//! on `readers`, send/connect on `writers`, in issue order) and its
//! descriptor armed in the engine; when the engine reports readiness the
//! parked calls are retried in order. So one waiting socket never delays
//! another, and calls on one socket complete in the order they were issued.
//!
//! Data moves straight between the kernel and the host's arena: `send`
//! reads from it and `recv` writes into it, with no buffer at the server.

use crate::engine::Engine;
use crate::host::{Host, Parked, ParkedPoll, Sock};
use crate::sys::{self, RawAddr};
use crate::token::{Token, GEN_MASK, MAX_SOCKETS_PER_HOST};
use crate::Config;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
use tcps_proto::msg::{ArenaRange, Call, PollEntry};
use tcps_proto::{addr, futex, Completion, Op, Request};
use tracing::{debug, warn};

/// A call's outcome: `(result, aux)` or an errno.
pub type Res = Result<(i64, u64), i32>;

/// Deadline of a parked poll: (when, host key, poll key, poll serial).
pub type Timers = BinaryHeap<Reverse<(Instant, usize, usize, u64)>>;

/// What a call needs from the worker besides its host.
pub struct Ctx<'a> {
    pub engine: &'a mut dyn Engine,
    pub cfg: &'a Config,
    pub hkey: usize,
    pub timers: &'a mut Timers,
    pub next_serial: &'a mut u64,
}

enum Step {
    Done(Res),
    /// Would block: park (or stay parked) and wait for readiness.
    Again,
}

const RECV_FLAGS: i32 =
    libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_DONTWAIT | libc::MSG_OOB | libc::MSG_TRUNC;
const SEND_FLAGS: i32 = libc::MSG_DONTWAIT
    | libc::MSG_MORE
    | libc::MSG_NOSIGNAL
    | libc::MSG_OOB
    | libc::MSG_DONTROUTE
    | libc::MSG_EOR;

/// Publishes a completion; a host that broke its ring is doomed.
pub fn complete(host: &mut Host, ch: u32, user_data: u64, op: Op, res: Res) {
    let (result, errno, aux) = match res {
        Ok((r, aux)) => (r, 0, aux),
        Err(e) => (-1, e, 0),
    };
    let Some(chan) = host.region.channel(ch) else {
        return;
    };
    let c = Completion {
        user_data,
        op: op as u16,
        _pad: 0,
        errno,
        result,
        aux,
    };
    match host.cursors[ch as usize].complete(&chan, &c) {
        Ok(true) => futex::wake_all(&chan.ctl().cq_tail),
        Ok(false) => {}
        Err(e) => host.doomed = Some(format!("channel {ch}: {e}")),
    }
}

/// Executes (or parks) one request a host published on channel `ch`.
pub fn dispatch(cx: &mut Ctx<'_>, host: &mut Host, ch: u32, req: Request) {
    let call = match Call::decode(&req, host.layout.arena_size) {
        Ok(c) => c,
        Err(why) => {
            host.stats.invalid += 1;
            debug!(host = host.id, ch, ?why, "invalid request");
            let op = Op::from_u16(req.op).unwrap_or(Op::Nop);
            return complete(host, ch, req.user_data, op, Err(libc::EINVAL));
        }
    };
    let Some(op) = Op::from_u16(req.op) else {
        return;
    };
    host.stats.calls[op as usize % 32] += 1;
    let res = match call {
        Call::Nop => Ok((0, 0)),
        Call::Socket {
            domain,
            ty,
            protocol,
        } => new_socket(cx, host, domain, ty, protocol),
        Call::Bind { sock, addr } => bind(cx, host, ch, sock, addr),
        Call::Listen { sock, backlog } => {
            with_fd(host, sock, |fd| sys::listen(fd, backlog).map(|_| (0, 0)))
        }
        Call::Accept { sock, .. }
        | Call::Recv { sock, .. }
        | Call::Send { sock, .. }
        | Call::Connect { sock, .. } => {
            return start_parkable(cx, host, ch, req.user_data, op, call, sock)
        }
        Call::Shutdown { sock, how } => {
            with_fd(host, sock, |fd| sys::shutdown(fd, how).map(|_| (0, 0)))
        }
        Call::Close { sock } => close_socket(cx, host, sock),
        Call::SetSockOpt {
            sock,
            level,
            name,
            value,
        } => setsockopt(host, ch, sock, level, name, value),
        Call::GetSockOpt {
            sock,
            level,
            name,
            value,
        } => getsockopt(host, ch, sock, level, name, value),
        Call::GetSockName { sock, addr } => sockname(host, ch, sock, addr, sys::getsockname),
        Call::GetPeerName { sock, addr } => sockname(host, ch, sock, addr, sys::getpeername),
        Call::Poll {
            entries,
            timeout_ms,
            ..
        } => return start_poll(cx, host, ch, req.user_data, entries, timeout_ms),
        Call::Fcntl { sock, cmd, arg } => fcntl(host, sock, cmd, arg),
    };
    complete(host, ch, req.user_data, op, res);
}

fn with_fd(host: &Host, sock: u32, f: impl FnOnce(i32) -> sys::SysResult<(i64, u64)>) -> Res {
    let s = host.socket(sock).ok_or(libc::EBADF)?;
    f(s.fd.as_raw_fd())
}

/// Admission control per host: EMFILE once the host holds its quota of sockets.
fn check_quota(cx: &Ctx<'_>, host: &mut Host) -> Result<(), i32> {
    if host.sockets.len() >= cx.cfg.max_sockets_per_host.min(MAX_SOCKETS_PER_HOST) {
        host.stats.refused_sockets += 1;
        warn!(
            host = host.id,
            pid = host.pid,
            limit = cx.cfg.max_sockets_per_host,
            "socket refused: per-host quota reached (--max-sockets-per-host)"
        );
        return Err(libc::EMFILE);
    }
    Ok(())
}

fn insert_socket(
    cx: &Ctx<'_>,
    host: &mut Host,
    fd: OwnedFd,
    nonblocking: bool,
) -> Result<u32, i32> {
    check_quota(cx, host)?;
    host.next_gen = host.next_gen.wrapping_add(1) & GEN_MASK;
    let id = host
        .sockets
        .insert(Sock::new(fd, host.next_gen, nonblocking));
    Ok(id as u32)
}

fn new_socket(cx: &Ctx<'_>, host: &mut Host, domain: i32, ty: i32, protocol: i32) -> Res {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EAFNOSUPPORT);
    }
    let flags = ty & (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    if ty & !flags != libc::SOCK_STREAM {
        return Err(libc::ESOCKTNOSUPPORT); // only TCP is offloaded
    }
    if protocol != 0 && protocol != libc::IPPROTO_TCP {
        return Err(libc::EPROTONOSUPPORT);
    }
    check_quota(cx, host)?;
    let fd = sys::socket(domain, libc::SOCK_STREAM, protocol)?;
    let id = insert_socket(cx, host, fd, flags & libc::SOCK_NONBLOCK != 0)?;
    Ok((id as i64, 0))
}

fn arena_bytes(host: &Host, ch: u32, r: ArenaRange) -> Vec<u8> {
    let mut b = vec![0u8; r.len as usize];
    if let Some(c) = host.region.channel(ch) {
        c.copy_from_arena(r.off, &mut b);
    }
    b
}

/// Writes `bytes` (truncated to the range) into the arena; returns the full length.
fn write_arena(host: &Host, ch: u32, r: ArenaRange, bytes: &[u8]) -> u64 {
    let n = bytes.len().min(r.len as usize);
    if let Some(c) = host.region.channel(ch) {
        c.copy_to_arena(r.off, &bytes[..n]);
    }
    bytes.len() as u64
}

fn bind(cx: &Ctx<'_>, host: &mut Host, ch: u32, sock: u32, a: ArenaRange) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let bytes = arena_bytes(host, ch, a);
    let parsed = addr::parse(&bytes).map_err(|e| match e {
        addr::AddrError::TooShort => libc::EINVAL,
        addr::AddrError::UnsupportedFamily(_) => libc::EAFNOSUPPORT,
    })?;
    if !host
        .privileges
        .may_bind(parsed.port(), cx.cfg.unprivileged_port_start)
    {
        warn!(
            host = host.id,
            pid = host.pid,
            uid = host.uid,
            port = parsed.port(),
            "bind refused: host lacks CAP_NET_BIND_SERVICE"
        );
        return Err(libc::EACCES);
    }
    sys::bind(fd, &RawAddr::from_bytes(&bytes)).map(|_| (0, 0))
}

fn setsockopt(host: &Host, ch: u32, sock: u32, level: i32, name: i32, v: ArenaRange) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let value = arena_bytes(host, ch, v);
    if !host.privileges.may_setsockopt(level, name, &value) {
        warn!(
            host = host.id,
            pid = host.pid,
            level,
            name,
            "setsockopt refused: host lacks the capability"
        );
        return Err(libc::EPERM);
    }
    sys::setsockopt(fd, level, name, &value).map(|_| (0, 0))
}

fn getsockopt(host: &Host, ch: u32, sock: u32, level: i32, name: i32, v: ArenaRange) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let mut buf = vec![0u8; v.len as usize];
    let len = sys::getsockopt(fd, level, name, &mut buf)?;
    write_arena(host, ch, v, &buf[..len.min(buf.len())]);
    Ok((0, len as u64))
}

fn sockname(
    host: &Host,
    ch: u32,
    sock: u32,
    a: ArenaRange,
    f: fn(i32) -> sys::SysResult<RawAddr>,
) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let raw = f(fd)?;
    Ok((0, write_arena(host, ch, a, raw.as_bytes())))
}

fn fcntl(host: &mut Host, sock: u32, cmd: i32, arg: i64) -> Res {
    let s = host.socket_mut(sock).ok_or(libc::EBADF)?;
    match cmd {
        libc::F_GETFL => Ok((
            (libc::O_RDWR | if s.nonblocking { libc::O_NONBLOCK } else { 0 }) as i64,
            0,
        )),
        libc::F_SETFL => {
            s.nonblocking = arg & libc::O_NONBLOCK as i64 != 0;
            Ok((0, 0))
        }
        _ => Err(libc::EINVAL),
    }
}

fn close_socket(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) -> Res {
    let s = host.sockets.remove(sock as usize).ok_or(libc::EBADF)?;
    cx.engine.forget(s.fd.as_raw_fd(), 0);
    for p in s.readers.iter().chain(s.writers.iter()) {
        complete(host, p.ch, p.user_data, p.op, Err(libc::EBADF));
    }
    drop(s.fd);
    for (pkey, _) in s.pollers {
        recheck_poll(cx, host, pkey);
    }
    Ok((0, 0))
}

/// Closes every socket of a host that is going away. Parked calls are not
/// answered: the host is dead or being cut off.
pub fn close_all(engine: &mut dyn Engine, host: &mut Host) {
    for k in host.sockets.keys() {
        if let Some(s) = host.sockets.remove(k) {
            engine.forget(s.fd.as_raw_fd(), 0);
        }
    }
}

// ---- calls that may park -------------------------------------------------

fn start_parkable(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    op: Op,
    call: Call,
    sid: u32,
) {
    let (flags, is_reader) = match call {
        Call::Recv { flags, .. } => (flags, true),
        Call::Send { flags, .. } => (flags, false),
        Call::Accept { .. } => (0, true),
        _ => (0, false),
    };
    let allowed = match call {
        Call::Recv { .. } => RECV_FLAGS,
        Call::Send { .. } => SEND_FLAGS,
        _ => 0,
    };
    if flags & !allowed != 0 {
        return complete(host, ch, user_data, op, Err(libc::EINVAL));
    }
    let Some(sock) = host.socket(sid) else {
        return complete(host, ch, user_data, op, Err(libc::EBADF));
    };
    let nonblocking = sock.nonblocking || flags & libc::MSG_DONTWAIT != 0;
    let queued = if is_reader {
        !sock.readers.is_empty()
    } else {
        !sock.writers.is_empty()
    };
    let mut p = Parked {
        ch,
        user_data,
        op,
        call,
        progress: 0,
        nonblocking,
    };
    let step = if queued {
        // Earlier calls on this socket wait: keep the issue order.
        if nonblocking {
            Step::Done(Err(libc::EAGAIN))
        } else {
            Step::Again
        }
    } else if let Call::Connect { addr, .. } = call {
        start_connect(host, sid, &mut p, addr)
    } else {
        attempt(cx, host, sid, &mut p)
    };
    match step {
        Step::Done(res) => complete(host, ch, user_data, op, res),
        Step::Again => park(cx, host, sid, p, is_reader),
    }
}

/// Tells the host's waiting thread that its call is parked (it stops spinning).
fn announce_parked(host: &Host, ch: u32, user_data: u64) {
    if let Some(c) = host.region.channel(ch) {
        host.cursors[ch as usize].mark_parked(&c, user_data);
    }
}

fn park(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, p: Parked, is_reader: bool) {
    host.stats.parked += 1;
    announce_parked(host, p.ch, p.user_data);
    let hkey = cx.hkey;
    let Some(sock) = host.socket_mut(sid) else {
        return;
    };
    if is_reader {
        sock.readers.push_back(p);
    } else {
        sock.writers.push_back(p);
    }
    rearm(cx.engine, hkey, sid, sock);
}

/// Arms the socket for what its parked calls wait on, unless already armed.
fn rearm(engine: &mut dyn Engine, hkey: usize, sid: u32, sock: &mut Sock) {
    let want = sock.wanted_mask();
    if want == 0 || sock.armed_mask & want == want {
        return;
    }
    let mask = want | sock.armed_mask;
    sock.arm_seq = sock.arm_seq.wrapping_add(1);
    let token = Token::Socket {
        host: hkey,
        sock: sid as usize,
        gen: sock.gen,
        seq: sock.arm_seq,
    };
    match engine.arm(sock.fd.as_raw_fd(), token.encode(), mask) {
        Ok(()) => sock.armed_mask = mask,
        Err(e) => warn!(error = %e, "engine could not arm a socket"),
    }
}

fn would_block(p: &Parked) -> Step {
    if p.nonblocking {
        Step::Done(Err(libc::EAGAIN))
    } else {
        Step::Again
    }
}

fn start_connect(host: &Host, sid: u32, p: &mut Parked, a: ArenaRange) -> Step {
    let Some(s) = host.socket(sid) else {
        return Step::Done(Err(libc::EBADF));
    };
    let bytes = arena_bytes(host, p.ch, a);
    if let Err(e) = addr::parse(&bytes) {
        return Step::Done(Err(match e {
            addr::AddrError::TooShort => libc::EINVAL,
            addr::AddrError::UnsupportedFamily(_) => libc::EAFNOSUPPORT,
        }));
    }
    match sys::connect(s.fd.as_raw_fd(), &RawAddr::from_bytes(&bytes)) {
        Ok(()) => Step::Done(Ok((0, 0))),
        Err(libc::EINPROGRESS) if p.nonblocking => Step::Done(Err(libc::EINPROGRESS)),
        Err(libc::EINPROGRESS) => {
            p.progress = 1;
            Step::Again
        }
        Err(e) => Step::Done(Err(e)),
    }
}

/// Tries a parked (or new) accept, recv, send or connect once more.
fn attempt(cx: &Ctx<'_>, host: &mut Host, sid: u32, p: &mut Parked) -> Step {
    let Some(fd) = host.socket(sid).map(|s| s.fd.as_raw_fd()) else {
        return Step::Done(Err(libc::EBADF));
    };
    match p.call {
        Call::Accept { addr, flags, .. } => {
            // Refuse before accepting: the connection stays in the backlog.
            if let Err(e) = check_quota(cx, host) {
                return Step::Done(Err(e));
            }
            match sys::accept(fd) {
                Ok((nfd, peer)) => {
                    let id = match insert_socket(cx, host, nfd, flags & libc::SOCK_NONBLOCK != 0) {
                        Ok(id) => id,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let len = write_arena(host, p.ch, addr, peer.as_bytes());
                    Step::Done(Ok((id as i64, len)))
                }
                Err(libc::EAGAIN) | Err(libc::ECONNABORTED) | Err(libc::EINTR) => would_block(p),
                Err(e) => Step::Done(Err(e)),
            }
        }
        Call::Recv { data, flags, .. } => {
            let Some(base) = host.region.channel(p.ch).and_then(|c| c.arena_ptr(data)) else {
                return Step::Done(Err(libc::EFAULT));
            };
            let total = data.len as usize;
            if total == 0 {
                return Step::Done(Ok((0, 0)));
            }
            let waitall = flags & libc::MSG_WAITALL != 0 && flags & libc::MSG_PEEK == 0;
            loop {
                // SAFETY: base..base+total is a checked range of the host's
                // arena, mapped for the life of `host`; progress < total.
                let r = unsafe {
                    sys::recv(
                        fd,
                        base.add(p.progress),
                        total - p.progress,
                        flags & !libc::MSG_WAITALL,
                    )
                };
                match r {
                    Ok(0) => return Step::Done(Ok((p.progress as i64, 0))),
                    Ok(n) => {
                        p.progress += n;
                        host.stats.bytes_received += n as u64;
                        if p.progress == total || !waitall {
                            return Step::Done(Ok((p.progress as i64, 0)));
                        }
                    }
                    Err(libc::EINTR) => {}
                    Err(libc::EAGAIN) if p.progress > 0 && (p.nonblocking || !waitall) => {
                        return Step::Done(Ok((p.progress as i64, 0)))
                    }
                    Err(libc::EAGAIN) => return would_block(p),
                    Err(_) if p.progress > 0 => return Step::Done(Ok((p.progress as i64, 0))),
                    Err(e) => return Step::Done(Err(e)),
                }
            }
        }
        Call::Send { data, flags, .. } => {
            let Some(base) = host.region.channel(p.ch).and_then(|c| c.arena_ptr(data)) else {
                return Step::Done(Err(libc::EFAULT));
            };
            let total = data.len as usize;
            loop {
                if p.progress == total {
                    return Step::Done(Ok((total as i64, 0)));
                }
                // SAFETY: as for recv; the kernel only reads the range.
                match unsafe { sys::send(fd, base.add(p.progress), total - p.progress, flags) } {
                    Ok(n) => {
                        p.progress += n;
                        host.stats.bytes_sent += n as u64;
                    }
                    Err(libc::EINTR) => {}
                    Err(libc::EAGAIN) if p.nonblocking && p.progress > 0 => {
                        return Step::Done(Ok((p.progress as i64, 0)))
                    }
                    Err(libc::EAGAIN) => return would_block(p),
                    Err(_) if p.progress > 0 => return Step::Done(Ok((p.progress as i64, 0))),
                    Err(e) => return Step::Done(Err(e)),
                }
            }
        }
        Call::Connect { .. } => match sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) if sys::getpeername(fd).is_ok() => Step::Done(Ok((0, 0))),
            Ok(0) => Step::Again,
            Ok(e) | Err(e) => Step::Done(Err(e)),
        },
        _ => Step::Done(Err(libc::EINVAL)),
    }
}

/// Retries the parked calls of one queue in order until one would block.
fn drive(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, readers: bool) {
    loop {
        let Some(sock) = host.socket_mut(sid) else {
            return;
        };
        let q = if readers {
            &mut sock.readers
        } else {
            &mut sock.writers
        };
        let Some(mut p) = q.pop_front() else { return };
        match attempt(cx, host, sid, &mut p) {
            Step::Done(res) => complete(host, p.ch, p.user_data, p.op, res),
            Step::Again => {
                if let Some(sock) = host.socket_mut(sid) {
                    let q = if readers {
                        &mut sock.readers
                    } else {
                        &mut sock.writers
                    };
                    q.push_front(p);
                }
                return;
            }
        }
    }
}

/// The engine reported readiness on a socket.
pub fn on_socket_ready(cx: &mut Ctx<'_>, host: &mut Host, sid: usize, gen: u16, seq: u8) {
    let sid32 = sid as u32;
    let Some(sock) = host.socket_mut(sid32) else {
        return;
    };
    if sock.gen != gen || sock.arm_seq != seq {
        return; // stale: the socket was closed or re-armed since
    }
    sock.armed_mask = 0;
    drive(cx, host, sid32, true);
    drive(cx, host, sid32, false);
    let pollers: Vec<usize> = host
        .socket(sid32)
        .map(|s| s.pollers.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    for pkey in pollers {
        recheck_poll(cx, host, pkey);
    }
    let hkey = cx.hkey;
    if let Some(sock) = host.socket_mut(sid32) {
        rearm(cx.engine, hkey, sid32, sock);
    }
}

// ---- poll ------------------------------------------------------------------

fn read_entries(host: &Host, ch: u32, r: ArenaRange) -> Vec<PollEntry> {
    arena_bytes(host, ch, r)
        .chunks_exact(8)
        .map(|c| PollEntry {
            sock: u32::from_ne_bytes([c[0], c[1], c[2], c[3]]),
            events: i16::from_ne_bytes([c[4], c[5]]),
            revents: 0,
        })
        .collect()
}

/// Polls the sockets of a poll set once; writes revents back to the arena.
/// Returns how many entries are ready.
fn evaluate_poll(host: &Host, ch: u32, r: ArenaRange) -> Result<(usize, Vec<PollEntry>), i32> {
    let mut entries = read_entries(host, ch, r);
    let mut pfds = Vec::with_capacity(entries.len());
    let mut idx = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter_mut().enumerate() {
        match host.socket(e.sock) {
            Some(s) => {
                pfds.push(libc::pollfd {
                    fd: s.fd.as_raw_fd(),
                    events: e.events,
                    revents: 0,
                });
                idx.push(i);
            }
            None => e.revents = libc::POLLNVAL,
        }
    }
    if !pfds.is_empty() {
        sys::poll_now(&mut pfds)?;
    }
    for (pfd, &i) in pfds.iter().zip(&idx) {
        entries[i].revents = pfd.revents;
    }
    let ready = entries.iter().filter(|e| e.revents != 0).count();
    let mut out = Vec::with_capacity(entries.len() * 8);
    for e in &entries {
        out.extend_from_slice(&e.sock.to_ne_bytes());
        out.extend_from_slice(&e.events.to_ne_bytes());
        out.extend_from_slice(&e.revents.to_ne_bytes());
    }
    write_arena(host, ch, r, &out);
    Ok((ready, entries))
}

fn start_poll(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    r: ArenaRange,
    timeout_ms: i64,
) {
    let (ready, entries) = match evaluate_poll(host, ch, r) {
        Ok(v) => v,
        Err(e) => return complete(host, ch, user_data, Op::Poll, Err(e)),
    };
    if ready > 0 || timeout_ms == 0 {
        return complete(host, ch, user_data, Op::Poll, Ok((ready as i64, 0)));
    }
    *cx.next_serial += 1;
    let serial = *cx.next_serial;
    let deadline =
        (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
    let mut socks: Vec<u32> = entries.iter().map(|e| e.sock).collect();
    socks.sort_unstable();
    socks.dedup();
    let pkey = host.polls.insert(ParkedPoll {
        ch,
        user_data,
        entries: r,
        socks: socks.clone(),
        serial,
    });
    if let Some(d) = deadline {
        cx.timers.push(Reverse((d, cx.hkey, pkey, serial)));
    }
    host.stats.parked += 1;
    announce_parked(host, ch, user_data);
    let hkey = cx.hkey;
    for e in &entries {
        if let Some(sock) = host.socket_mut(e.sock) {
            sock.pollers.push((pkey, e.events));
        }
    }
    for sid in socks {
        if let Some(sock) = host.socket_mut(sid) {
            rearm(cx.engine, hkey, sid, sock);
        }
    }
}

fn finish_poll(host: &mut Host, pkey: usize, res: Res) {
    let Some(p) = host.polls.remove(pkey) else {
        return;
    };
    for sid in &p.socks {
        if let Some(s) = host.socket_mut(*sid) {
            s.pollers.retain(|(k, _)| *k != pkey);
        }
    }
    complete(host, p.ch, p.user_data, Op::Poll, res);
}

fn recheck_poll(_cx: &mut Ctx<'_>, host: &mut Host, pkey: usize) {
    let Some(p) = host.polls.get(pkey) else {
        return;
    };
    let (ch, r) = (p.ch, p.entries);
    match evaluate_poll(host, ch, r) {
        Ok((0, _)) => {}
        Ok((ready, _)) => finish_poll(host, pkey, Ok((ready as i64, 0))),
        Err(e) => finish_poll(host, pkey, Err(e)),
    }
}

/// A parked poll's timeout expired.
pub fn on_poll_timeout(host: &mut Host, pkey: usize, serial: u64) {
    let Some(p) = host.polls.get(pkey) else {
        return;
    };
    if p.serial != serial {
        return;
    }
    let (ch, r) = (p.ch, p.entries);
    let res = evaluate_poll(host, ch, r).map(|(ready, _)| (ready as i64, 0));
    finish_poll(host, pkey, res);
}
