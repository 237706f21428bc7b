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

mod asyncq;
mod blocking;
pub(crate) mod eager;
mod poll;

pub use asyncq::{poll_queues, prepare_sleep};
pub use blocking::on_socket_ready;

use crate::config::Config;
use crate::engine::Engine;
use crate::host::{Host, Sock};
use crate::sys::{self, RawAddr};
use crate::token::{GEN_MASK, MAX_SOCKETS_PER_HOST};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;
use std::time::Instant;
use tcps_proto::msg::{ArenaRange, Call};
use tcps_proto::{futex, Completion, Op, Request};
use tracing::{debug, warn};

/// A call's outcome: `(result, aux)` or an errno.
pub type Res = Result<(i64, u64), i32>;

/// What a timer fires for: a parked poll (by its slab key) or a parked
/// socket call (by its socket); the timer's serial names the exact call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKey {
    Poll { pkey: usize },
    Call { sock: u32 },
}

/// Deadlines of parked calls: (when, host key, serial, what).
pub type Timers = BinaryHeap<Reverse<(Instant, usize, u64, TimerKey)>>;

/// Fires an expired timer of a host.
pub fn on_timer(cx: &mut Ctx<'_>, host: &mut Host, serial: u64, key: TimerKey) {
    match key {
        TimerKey::Poll { pkey } => poll::on_poll_timeout(host, pkey, serial),
        TimerKey::Call { sock } => blocking::on_call_timeout(cx, host, sock, serial),
    }
}

/// What a call needs from the worker besides its host.
pub struct Ctx<'a> {
    pub engine: &'a mut dyn Engine,
    pub cfg: &'a Config,
    pub shared: &'a crate::shared::Shared,
    pub hkey: usize,
    pub timers: &'a mut Timers,
    pub next_serial: &'a mut u64,
}

/// Publishes a completion; a host that broke its ring is doomed.
pub fn complete(host: &mut Host, ch: u32, user_data: u64, op: Op, res: Res) {
    let (result, errno, aux) = match res {
        Ok((r, aux)) => (r, 0, aux),
        Err(e) => (-1, e, 0),
    };
    let Some(chan) = host.region.channel(ch) else {
        return;
    };
    host.stats.round_trips += 1;
    let c = Completion {
        user_data,
        op: op as u16,
        stamp: 0,
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
    if host.doomed.is_some() {
        // Being detached (e.g. `Host::interrupted`): not one call more,
        // also from the rest of the worker's batch for this host.
        return;
    }
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
    // A write-side call lands after the asynchronous sends the host
    // published before it: take them first.
    if let Call::Send { sock, .. }
    | Call::SendReg { sock, .. }
    | Call::Shutdown { sock, .. }
    | Call::Close { sock, .. } = call
    {
        if host.socket(sock).is_some_and(|s| s.queue.is_some()) {
            asyncq::ingest(cx, host, sock);
        }
    }
    let res = match call {
        Call::Nop => Ok((0, 0)),
        Call::Socket { .. } => new_socket(host),
        Call::Bind { sock, .. } => bind(host, sock),
        Call::Listen { sock, backlog } => {
            with_fd(host, sock, |fd| sys::listen(fd, backlog).map(|_| (0, 0)))
                .map(|_| (0, eager::on_listen(host, sock)))
        }
        Call::Accept { sock, .. }
        | Call::Recv { sock, .. }
        | Call::Send { sock, .. }
        | Call::SendReg { sock, .. }
        | Call::RecvReg { sock, .. }
        | Call::Connect { sock, .. } => {
            return blocking::start(cx, host, ch, req.user_data, op, call, sock)
        }
        Call::Shutdown { sock, reply, .. } => {
            if !reply {
                // Unanswered (the host knew the connection open): its
                // completion credit is free now, and `finish` publishes
                // nothing for it.
                host.cursors[ch as usize].retire();
            }
            if host.socket(sock).is_none() {
                if !reply {
                    return;
                }
                Err(libc::EBADF)
            } else {
                return blocking::start_shutdown(cx, host, ch, req.user_data, call, sock);
            }
        }
        Call::AsyncBind { sock, queue, start } => {
            asyncq::bind(host, sock, queue, start, Instant::now())
        }
        Call::AsyncKick { sock } => {
            host.cursors[ch as usize].retire();
            return asyncq::kick(cx, host, sock, Instant::now());
        }
        Call::RecvKick { sock } => {
            host.cursors[ch as usize].retire();
            return eager::kick(cx, host, sock);
        }
        Call::RecvBind { sock } => eager::recv_bind(cx, host, sock),
        Call::Close { sock, reply: false } => {
            // The host did not wait: it closes only sockets it knows are
            // open, so there is no error to tell it (EBADF here means it
            // lied, and hurts nobody else).
            host.cursors[ch as usize].retire();
            if let Err(e) = close_socket(cx, host, sock) {
                debug!(host = host.id, sock, errno = e, "unanswered close failed");
            }
            return;
        }
        Call::Close { sock, reply: true } => close_socket(cx, host, sock),
        Call::SetSockOpt {
            sock,
            level,
            name,
            value,
        } => {
            note_linger(host, sock, level, name);
            setsockopt(host, ch, sock, level, name, value)
        }
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
        } => return poll::start(cx, host, ch, req.user_data, entries, timeout_ms),
        Call::Fcntl { sock, cmd, arg } => fcntl(host, sock, cmd, arg),
        Call::SendFile {
            sock,
            file,
            offset,
            count,
        } => crate::sendfile::call(host, sock, file, offset, count),
    };
    complete(host, ch, req.user_data, op, res);
}

fn with_fd(host: &Host, sock: u32, f: impl FnOnce(i32) -> sys::SysResult<(i64, u64)>) -> Res {
    let s = host.socket(sock).ok_or(libc::EBADF)?;
    f(s.fd.as_raw_fd())
}

/// Admission control per host: EMFILE once the host holds its quota of sockets.
pub(crate) fn check_quota(cfg: &Config, host: &mut Host) -> Result<(), i32> {
    if host.sockets.len() >= cfg.max_sockets_per_host.min(MAX_SOCKETS_PER_HOST) {
        host.stats.refused_sockets += 1;
        warn!(
            host = host.id,
            pid = host.pid,
            limit = cfg.max_sockets_per_host,
            "socket refused: per-host quota reached (--max-sockets-per-host)"
        );
        return Err(libc::EMFILE);
    }
    Ok(())
}

/// Inserts a connection accepted on `listener`: its close checks SO_LINGER
/// only if the listener's (which it inherited) was on, looked up once per
/// listener, not per connection.
pub(crate) fn insert_accepted(
    cx: &Ctx<'_>,
    host: &mut Host,
    listener: u32,
    fd: OwnedFd,
    nonblocking: bool,
) -> Result<u32, i32> {
    let lingers = match host.sockets.get_mut(listener as usize) {
        Some(l) => *l
            .listener_lingers
            .get_or_insert_with(|| sys::lingers(l.fd.as_raw_fd())),
        None => true,
    };
    let id = insert_socket(cx.cfg, host, fd, nonblocking)?;
    if let Some(s) = host.sockets.get_mut(id as usize) {
        s.may_linger = lingers;
    }
    Ok(id)
}

/// Gives a kernel socket an id in the host's table (EMFILE at its quota).
pub(crate) fn insert_socket(
    cfg: &Config,
    host: &mut Host,
    fd: OwnedFd,
    nonblocking: bool,
) -> Result<u32, i32> {
    check_quota(cfg, host)?;
    host.next_gen = host.next_gen.wrapping_add(1) & GEN_MASK;
    let id = host
        .sockets
        .insert(Sock::new(fd, host.next_gen, nonblocking));
    if let Some(s) = host.sockets.get_mut(id) {
        s.policy = cfg.eager;
    }
    Ok(id as u32)
}

/// `Op::Socket` from a local host: refused. A local host creates its
/// kernel sockets itself, under its own credentials, and hands them over
/// with `ControlMsg::SocketAdopt` (`docs/PROTOCOL.md` §6): a socket made
/// here would carry the server's uid, capabilities and network namespace.
/// The op stays in the protocol for a future fabric transport.
fn new_socket(host: &mut Host) -> Res {
    warn!(
        host = host.id,
        pid = host.pid,
        uid = host.uid,
        "socket refused: a local host creates its sockets itself (ControlMsg::SocketAdopt)"
    );
    Err(libc::EPERM)
}

pub(crate) fn arena_bytes(host: &Host, ch: u32, r: ArenaRange) -> Vec<u8> {
    let mut b = vec![0u8; r.len as usize];
    if let Some(c) = host.region.channel(ch) {
        c.copy_from_arena(r.off, &mut b);
    }
    b
}

/// Writes `bytes` (truncated to the range) into the arena; returns the full length.
pub(crate) fn write_arena(host: &Host, ch: u32, r: ArenaRange, bytes: &[u8]) -> u64 {
    let n = bytes.len().min(r.len as usize);
    if let Some(c) = host.region.channel(ch) {
        c.copy_to_arena(r.off, &bytes[..n]);
    }
    bytes.len() as u64
}

/// `Op::Bind` from a local host: refused, like `Op::Socket`. The host
/// binds its own socket, so the kernel checks its own right to the port
/// (CAP_NET_BIND_SERVICE, SO_REUSEPORT groups of the same owner).
fn bind(host: &mut Host, sock: u32) -> Res {
    host.socket(sock).ok_or(libc::EBADF)?;
    warn!(
        host = host.id,
        pid = host.pid,
        uid = host.uid,
        sock,
        "bind refused: a local host binds its own socket (the kernel checks its credentials)"
    );
    Err(libc::EPERM)
}

fn setsockopt(host: &mut Host, ch: u32, sock: u32, level: i32, name: i32, v: ArenaRange) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let value = arena_bytes(host, ch, v);
    if eager::is_tcps_level(level) {
        return eager::setsockopt(host, sock, name, &value);
    }
    let allowed_cc = if level == libc::IPPROTO_TCP && name == libc::TCP_CONGESTION {
        crate::sockopt_policy::allowed_congestion_control()
    } else {
        String::new()
    };
    if let Err(why) = crate::sockopt_policy::may_set(level, name, &value, &allowed_cc) {
        return Err(refused(host, "setsockopt", level, name, why));
    }
    sys::setsockopt(fd, level, name, &value)?;
    // The kernel socket is non-blocking, so it would ignore these: the
    // server times parked calls out itself.
    if level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO) {
        let t = timeval(&value);
        if let Some(s) = host.socket_mut(sock) {
            if name == libc::SO_RCVTIMEO {
                s.rcv_timeout = t;
            } else {
                s.snd_timeout = t;
            }
        }
    }
    Ok((0, 0))
}

/// Logs an option the allow-list refused (debug: a host can ask often);
/// the errno, EPERM.
fn refused(host: &Host, call: &str, level: i32, name: i32, why: &str) -> i32 {
    debug!(
        host = host.id,
        pid = host.pid,
        uid = host.uid,
        level,
        name,
        why,
        "{call} refused"
    );
    libc::EPERM
}

/// Longest SO_RCVTIMEO / SO_SNDTIMEO kept; longer is forever (`None`), as
/// the kernel treats a timeout beyond its longest wait.
const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A `struct timeval` option value as a timeout (`None`: wait forever).
fn timeval(v: &[u8]) -> Option<Duration> {
    let sec = i64::from_ne_bytes(v.get(0..8)?.try_into().ok()?);
    let usec = i64::from_ne_bytes(v.get(8..16)?.try_into().ok()?);
    let d = Duration::from_secs(sec.max(0) as u64)
        .saturating_add(Duration::from_micros(usec.clamp(0, 999_999) as u64));
    (!d.is_zero() && d <= MAX_SOCKET_TIMEOUT).then_some(d)
}

fn getsockopt(host: &Host, ch: u32, sock: u32, level: i32, name: i32, v: ArenaRange) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    if eager::is_tcps_level(level) {
        if v.len < 4 {
            return Err(libc::EINVAL);
        }
        let x = eager::getsockopt(host, sock, name)?;
        write_arena(host, ch, v, &x.to_ne_bytes());
        return Ok((0, 4));
    }
    if let Err(why) = crate::sockopt_policy::may_get(level, name) {
        return Err(refused(host, "getsockopt", level, name, why));
    }
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

/// SO_LINGER set through the server: the socket's close checks it (and a
/// listener's accepted connections look it up again).
fn note_linger(host: &mut Host, sock: u32, level: i32, name: i32) {
    if level == libc::SOL_SOCKET && name == libc::SO_LINGER {
        if let Some(s) = host.socket_mut(sock) {
            s.may_linger = true;
            s.listener_lingers = None;
        }
    }
}

fn close_socket(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) -> Res {
    host.socket(sock).ok_or(libc::EBADF)?;
    // The host reads no more: unbind its ring (or stop pulling) now.
    eager::unbind(cx, host, sock);
    let s = host.socket_mut(sock).ok_or(libc::EBADF)?;
    if !s.has_jobs() {
        finalize_close(cx, host, sock);
        return Ok((0, 0));
    }
    // Asynchronous sends still queued: like close(2) with data in the send
    // buffer, the call returns now and the data still goes out; the socket
    // closes for real when its last job finished. Other parked calls end.
    s.closing = true;
    let readers = std::mem::take(&mut s.readers);
    let (jobs, others): (Vec<_>, Vec<_>) = s.writers.drain(..).partition(|p| p.job.is_some());
    s.writers.extend(jobs);
    let pollers = std::mem::take(&mut s.pollers);
    for p in readers.iter().chain(others.iter()) {
        blocking::finish(host, p, Err(libc::EBADF));
    }
    for (pkey, _) in pollers {
        poll::recheck(host, pkey);
    }
    Ok((0, 0))
}

/// Closes a socket now: answers its parked calls with EBADF, frees its
/// send queue and its slot.
pub(crate) fn finalize_close(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) {
    // Its ring is unbound before its id can be reused.
    eager::unbind(cx, host, sock);
    let Some(s) = host.sockets.remove(sock as usize) else {
        return;
    };
    cx.engine.forget(s.fd.as_raw_fd(), 0);
    crate::admission::release(host, &cx.shared.conns_per_addr, &s.admitted);
    for p in s.readers.iter().chain(s.writers.iter()) {
        blocking::finish(host, p, Err(libc::EBADF));
    }
    crate::closer::close_socket(s.fd, s.may_linger);
    if let Some(q) = s.queue {
        asyncq::unbind(host, q);
    }
    for (pkey, _) in s.pollers {
        poll::recheck(host, pkey);
    }
}

/// `ControlMsg::Export`: takes socket `sock` out of the host's table and
/// releases what `finalize_close` releases (its engine registration, its
/// admission count, its send queue), without closing it: the kernel socket
/// is returned for the host. The caller checked nothing is parked on it.
pub(crate) fn take_for_export(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) -> Option<OwnedFd> {
    let s = host.sockets.remove(sock as usize)?;
    // Also a disarmed epoll registration stays until removed: a later
    // descriptor with the same number could never be armed.
    cx.engine.forget(s.fd.as_raw_fd(), 0);
    crate::admission::release(host, &cx.shared.conns_per_addr, &s.admitted);
    if let Some(q) = s.queue {
        asyncq::unbind(host, q);
    }
    Some(s.fd)
}

/// The backstop every 10 ms: takes what any bound send queue holds, and
/// resumes paused receive/accept rings that have room.
pub fn sweep(cx: &mut Ctx<'_>, host: &mut Host, now: Instant) -> usize {
    asyncq::sweep(cx, host, now) + eager::sweep(cx, host) + blocking::rearm_deferred(cx, host)
}

/// Closes every socket of a host that is going away. Parked calls are not
/// answered: the host is dead or being cut off.
pub fn close_all(engine: &mut dyn Engine, shared: &crate::shared::Shared, host: &mut Host) {
    for k in host.sockets.keys() {
        if let Some(s) = host.sockets.remove(k) {
            engine.forget(s.fd.as_raw_fd(), 0);
            crate::admission::release(host, &shared.conns_per_addr, &s.admitted);
            crate::closer::close_socket(s.fd, s.may_linger);
        }
    }
}
