//! Calls that may have to wait for their socket: accept, recv, send and
//! connect (and their registered-memory forms). Each is tried at once; one
//! that would block on a blocking socket is parked on the socket's
//! `readers` (accept, recv) or `writers` (send, connect, and a shutdown
//! behind queued sends) queue, in issue order, and the socket is armed in
//! the engine. On readiness the queue is retried front to back.
//!
//! Asynchronous sends are jobs on `writers` too (see `asyncq`); finishing
//! one updates its send queue instead of publishing a completion.

use super::asyncq;
use super::eager::{self, PullEnd, PullTake};
use super::{arena_bytes, check_quota, complete, insert_accepted, write_arena, Ctx, Res, TimerKey};
use crate::admission;
use crate::engine::Engine;
use crate::guard;
use crate::host::{Host, Parked, Sock};
use crate::sys::{self, RawAddr};
use crate::token::Token;
use std::cmp::Reverse;
use std::os::fd::AsRawFd;
use std::time::Instant;
use tcps_proto::msg::{ArenaRange, Call};
use tcps_proto::{addr, Op};
use tracing::{debug, warn};

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

pub(super) fn start(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    op: Op,
    call: Call,
    sid: u32,
) {
    let (flags, is_reader) = match call {
        Call::Recv { flags, .. } | Call::RecvReg { flags, .. } => (flags, true),
        Call::Send { flags, .. } | Call::SendReg { flags, .. } => (flags, false),
        Call::Accept { .. } => (0, true),
        _ => (0, false),
    };
    let allowed = match call {
        Call::Recv { .. } | Call::RecvReg { .. } => RECV_FLAGS,
        Call::Send { .. } | Call::SendReg { .. } => SEND_FLAGS,
        _ => 0,
    };
    if flags & !allowed != 0 {
        return complete(host, ch, user_data, op, Err(libc::EINVAL));
    }
    if host.socket(sid).is_none() {
        return complete(host, ch, user_data, op, Err(libc::EBADF));
    }
    if is_reader && eager::ring_bound(host, sid) {
        // The host receives (accepts) from the socket's ring, not by request.
        return complete(host, ch, user_data, op, Err(libc::EINVAL));
    }
    if let Call::SendReg { data, .. } | Call::RecvReg { data, .. } = call {
        if let Err(e) = host.registry.resolve(data) {
            return complete(host, ch, user_data, op, Err(e));
        }
        // Held until the call finishes: the range stays mapped meanwhile.
        host.registry.hold(data.mem);
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
        serial: 0,
        job: None,
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
        Step::Done(res) => {
            finish(host, &p, res);
            if is_reader {
                // A pull buffer the call drained reads ahead again.
                let hkey = cx.hkey;
                if let Some(s) = host.sockets.get_mut(sid as usize) {
                    if s.ahead.is_active() {
                        rearm(cx.engine, hkey, sid, s);
                    }
                }
            }
        }
        Step::Again => park(cx, host, sid, p, is_reader),
    }
}

/// A shutdown behind queued sends (asynchronous ones included) waits its
/// turn on `writers`, so the FIN follows the data the host sent before.
pub(super) fn start_shutdown(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    call: Call,
    sid: u32,
) {
    let p = Parked {
        ch,
        user_data,
        op: Op::Shutdown,
        call,
        progress: 0,
        nonblocking: false,
        serial: 0,
        job: None,
    };
    if host.socket(sid).is_some_and(|s| !s.writers.is_empty()) {
        park(cx, host, sid, p, false);
    } else {
        let mut p = p;
        if let Step::Done(res) = attempt(cx, host, sid, &mut p) {
            finish(host, &p, res);
        }
    }
}

/// Answers a call that left its queue: a completion on its channel, or for
/// an asynchronous send an update of its send queue. Releases the
/// registration a registered call held.
pub(super) fn finish(host: &mut Host, p: &Parked, res: Res) {
    match (p.job, p.call) {
        (
            _,
            Call::Shutdown {
                reply: false, sock, ..
            },
        ) => {
            if let Err(e) = res {
                debug!(
                    host = host.id,
                    sock,
                    errno = e,
                    "unanswered shutdown failed"
                );
            }
        }
        (Some(job), Call::SendReg { data, .. }) => asyncq::finish_job(host, &job, data, res),
        (_, Call::SendReg { data, .. } | Call::RecvReg { data, .. }) => {
            host.registry.release(data.mem);
            complete(host, p.ch, p.user_data, p.op, res);
        }
        _ => complete(host, p.ch, p.user_data, p.op, res),
    }
}

/// Tells the host's waiting thread that its call is parked (it stops spinning).
pub(super) fn announce_parked(host: &Host, ch: u32, user_data: u64) {
    if let Some(c) = host.region.channel(ch) {
        host.cursors[ch as usize].mark_parked(&c, user_data);
    }
}

fn park(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, mut p: Parked, is_reader: bool) {
    host.stats.parked += 1;
    announce_parked(host, p.ch, p.user_data);
    let hkey = cx.hkey;
    let Some(sock) = host.any_socket_mut(sid) else {
        return;
    };
    *cx.next_serial += 1;
    p.serial = *cx.next_serial;
    let timeout = if is_reader {
        sock.rcv_timeout
    } else {
        sock.snd_timeout
    };
    // A deadline past what an Instant holds is no deadline (forever).
    if let Some(when) = timeout.and_then(|t| Instant::now().checked_add(t)) {
        cx.timers.push(Reverse((
            when,
            hkey,
            p.serial,
            TimerKey::Call { sock: sid },
        )));
    }
    if is_reader {
        sock.readers.push_back(p);
    } else {
        sock.writers.push_back(p);
    }
    rearm(cx.engine, hkey, sid, sock);
}

/// Arms the socket for what its parked calls wait on, unless already armed.
pub(super) fn rearm(engine: &mut dyn Engine, hkey: usize, sid: u32, sock: &mut Sock) {
    let mut want = sock.wanted_mask();
    if want & libc::POLLPRI as u32 != 0 && engine.urgent_needs_pollin() {
        // A readable socket then fires without answering a POLLPRI poll:
        // `on_socket_ready` re-arms such a socket only every sweep.
        want |= libc::POLLIN as u32;
    }
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

/// A recv on a pull socket: answered from its read-ahead buffer (the bytes
/// before anything still in the kernel), end of stream after the data. An
/// empty buffer is filled once now; still empty, the call waits for the
/// read-ahead (never two readers of one kernel socket). `None`: not a pull
/// socket (or MSG_OOB): the kernel path.
fn pull_step(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    p: &mut Parked,
    base: *mut u8,
    total: usize,
    flags: i32,
) -> Option<Step> {
    let pull = matches!(
        host.sockets.get(sid as usize).map(|s| &s.ahead),
        Some(eager::Ahead::Pull(_))
    );
    if !pull || flags & libc::MSG_OOB != 0 {
        return None;
    }
    let waitall = flags & libc::MSG_WAITALL != 0 && flags & libc::MSG_PEEK == 0;
    let mut refilled = false;
    loop {
        // SAFETY: base..base+total is a checked arena or registered range
        // (data_ptr); progress < total.
        let took =
            unsafe { eager::pull_take(host, sid, base.add(p.progress), total - p.progress, flags) };
        let step = match took {
            PullTake::Empty if !refilled => {
                refilled = true;
                if eager::fill(cx, host, sid) {
                    continue;
                }
                if eager::pull_deferring(host, sid) {
                    // Its host's pull budget is spent and nothing is
                    // buffered: the kernel serves this recv.
                    return None;
                }
                would_block_after(p)
            }
            PullTake::Empty => would_block_after(p),
            PullTake::Data(n) => {
                p.progress += n;
                if p.progress == total || !waitall {
                    Step::Done(Ok((p.progress as i64, 0)))
                } else {
                    continue; // MSG_WAITALL: until filled or the end
                }
            }
            PullTake::End(PullEnd::Eof) => Step::Done(Ok((p.progress as i64, 0))),
            PullTake::End(PullEnd::Error(e)) if p.progress == 0 => Step::Done(Err(e)),
            PullTake::End(PullEnd::Error(_)) => Step::Done(Ok((p.progress as i64, 0))),
        };
        if let Step::Done(_) = step {
            if refilled {
                host.stats.recvs_on_demand += 1;
            } else {
                host.stats.recvs_eager += 1;
            }
        }
        return Some(step);
    }
}

/// Would block, for a recv that may already have moved bytes.
fn would_block_after(p: &Parked) -> Step {
    if p.progress > 0 && p.nonblocking {
        Step::Done(Ok((p.progress as i64, 0)))
    } else {
        would_block(p)
    }
}

fn start_connect(host: &mut Host, sid: u32, p: &mut Parked, a: ArenaRange) -> Step {
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
    let fd = s.fd.as_raw_fd();
    let guard = guard::Guard::call(s.host_held);
    let r = sys::connect(fd, &RawAddr::from_bytes(&bytes));
    drop(guard);
    if r == Err(libc::EINTR) {
        host.interrupted(fd);
    }
    // EINTR: the guard cut short a connect the host made blocking; the
    // connection goes on in the background, as after EINPROGRESS.
    match r {
        Ok(()) => Step::Done(Ok((0, 0))),
        Err(libc::EINPROGRESS | libc::EINTR) if p.nonblocking => Step::Done(Err(libc::EINPROGRESS)),
        Err(libc::EINPROGRESS | libc::EINTR) => {
            p.progress = 1;
            Step::Again
        }
        Err(e) => Step::Done(Err(e)),
    }
}

/// Tries a parked (or new) accept, recv, send or connect once more.
fn attempt(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, p: &mut Parked) -> Step {
    let Some((fd, held)) = host
        .sockets
        .get(sid as usize)
        .map(|s| (s.fd.as_raw_fd(), s.host_held))
    else {
        return Step::Done(Err(libc::EBADF));
    };
    // An accept: until it returns, accept4 cannot sleep, and it accepts as
    // the listener's owner (`guard`).
    let _guard = matches!(p.call, Call::Accept { .. }).then(|| guard::Guard::accept(held));
    if let Some(job) = &p.job {
        if let Some(e) = asyncq::job_error(host, job) {
            return Step::Done(Err(e));
        }
    }
    match p.call {
        Call::Accept { addr, flags, .. } => loop {
            // Refuse before accepting: the connection stays in the backlog.
            if let Err(e) = check_quota(cx.cfg, host) {
                return Step::Done(Err(e));
            }
            match sys::accept(fd) {
                Ok((nfd, peer)) => {
                    // Over an admission limit: reset it here and accept the
                    // next one; the host never sees it.
                    let Some(admitted) = admission::admit(
                        cx.cfg,
                        &cx.shared.conns_per_addr,
                        host,
                        sid,
                        peer.as_bytes(),
                    ) else {
                        admission::reset(nfd);
                        continue;
                    };
                    let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
                    let id = match insert_accepted(cx, host, sid, nfd, nonblocking) {
                        Ok(id) => id,
                        Err(e) => {
                            admission::release(host, &cx.shared.conns_per_addr, &admitted);
                            return Step::Done(Err(e));
                        }
                    };
                    if let Some(s) = host.sockets.get_mut(id as usize) {
                        s.admitted = admitted;
                    }
                    host.stats.accepts_on_demand += 1;
                    let policy = host.sockets.get(sid as usize).map(|l| l.policy);
                    let setup = policy.map_or(0, |pol| eager::setup_accepted(cx, host, id, pol));
                    let len = write_arena(host, p.ch, addr, peer.as_bytes());
                    // aux: the address length, and in its high half what
                    // was set up with the accept (SETUP_*).
                    return Step::Done(Ok((id as i64, len | u64::from(setup) << 32)));
                }
                Err(libc::EINTR) => {
                    // The guard cut short an accept the host made blocking.
                    host.interrupted(fd);
                    return would_block(p);
                }
                Err(libc::EAGAIN) | Err(libc::ECONNABORTED) => return would_block(p),
                Err(e) => return Step::Done(Err(e)),
            }
        },
        Call::Recv { flags, .. } | Call::RecvReg { flags, .. } => {
            let Some((base, total)) = data_ptr(host, p) else {
                return Step::Done(Err(libc::EFAULT));
            };
            if total == 0 {
                return Step::Done(Ok((0, 0)));
            }
            let waitall = flags & libc::MSG_WAITALL != 0 && flags & libc::MSG_PEEK == 0;
            if let Some(step) = pull_step(cx, host, sid, p, base, total, flags) {
                return step;
            }
            if p.serial == 0 && p.progress == 0 {
                // Once per request (a parked one is retried).
                host.stats.recvs_on_demand += 1;
            }
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
        Call::Send { flags, .. } | Call::SendReg { flags, .. } => {
            let Some((base, total)) = data_ptr(host, p) else {
                return Step::Done(Err(libc::EFAULT));
            };
            // An asynchronous send is all or nothing: bytes after a failure
            // would leave a hole in the stream.
            let partial_ok = p.job.is_none();
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
                    Err(_) if p.progress > 0 && partial_ok => {
                        return Step::Done(Ok((p.progress as i64, 0)))
                    }
                    Err(e) => return Step::Done(Err(e)),
                }
            }
        }
        Call::Shutdown { how, .. } => Step::Done(sys::shutdown(fd, how).map(|_| (0, 0))),
        Call::Connect { .. } => match sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) if sys::getpeername(fd).is_ok() => Step::Done(Ok((0, 0))),
            Ok(0) => Step::Again,
            Ok(e) | Err(e) => Step::Done(Err(e)),
        },
        _ => Step::Done(Err(libc::EINVAL)),
    }
}

/// The memory a send or recv moves: its arena range, or its registered
/// range (resolved against the server's own registry).
fn data_ptr(host: &Host, p: &Parked) -> Option<(*mut u8, usize)> {
    match p.call {
        Call::Send { data, .. } | Call::Recv { data, .. } => host
            .region
            .channel(p.ch)
            .and_then(|c| c.arena_ptr(data))
            .map(|b| (b, data.len as usize)),
        Call::SendReg { data, .. } | Call::RecvReg { data, .. } => host
            .registry
            .resolve(data)
            .ok()
            .map(|b| (b, data.len as usize)),
        _ => None,
    }
}

/// Drives the socket's write queue; a socket the host closed while
/// asynchronous sends were queued closes for real once the queue is empty.
pub(super) fn drive_writers(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    drive(cx, host, sid, false);
    if host
        .sockets
        .get(sid as usize)
        .is_some_and(|s| s.closing && s.writers.is_empty())
    {
        super::finalize_close(cx, host, sid);
    }
}

/// Retries the parked reads (recv, accept) of a socket in order.
pub(super) fn drive_readers(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    drive(cx, host, sid, true);
}

/// Retries the parked calls of one queue in order until one would block.
fn drive(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, readers: bool) {
    loop {
        let Some(sock) = host.any_socket_mut(sid) else {
            return;
        };
        let q = if readers {
            &mut sock.readers
        } else {
            &mut sock.writers
        };
        let Some(mut p) = q.pop_front() else { return };
        match attempt(cx, host, sid, &mut p) {
            Step::Done(res) => finish(host, &p, res),
            Step::Again => {
                if let Some(sock) = host.any_socket_mut(sid) {
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
    let Some(sock) = host.any_socket_mut(sid32) else {
        return;
    };
    if sock.gen != gen || sock.arm_seq != seq {
        return; // stale: the socket was closed or re-armed since
    }
    sock.armed_mask = 0;
    // Only parked polls wait here: if the readiness answers none of them
    // (and reads nothing ahead), it was a condition they did not ask for,
    // which may last: the socket is re-armed at the next sweep, not at
    // once, so it cannot keep the worker busy.
    let only_polls = !sock.pollers.is_empty() && sock.readers.is_empty() && sock.writers.is_empty();
    let polls_before = host.polls.len();
    // Read (accept) ahead first: a pull socket's parked recvs are then
    // answered from its buffer.
    let published = eager::fill(cx, host, sid32);
    drive(cx, host, sid32, true);
    drive_writers(cx, host, sid32);
    let pollers: Vec<usize> = host
        .socket(sid32)
        .map(|s| s.pollers.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    for pkey in pollers {
        super::poll::recheck(host, pkey);
    }
    if only_polls && !published && host.polls.len() == polls_before {
        if !host.rearm_later.contains(&sid32) {
            host.rearm_later.push(sid32);
        }
        return;
    }
    let hkey = cx.hkey;
    if let Some(sock) = host.any_socket_mut(sid32) {
        rearm(cx.engine, hkey, sid32, sock);
    }
}

/// Re-arms the sockets whose last readiness answered none of their polls
/// (see `on_socket_ready`); called every sweep.
pub(super) fn rearm_deferred(cx: &mut Ctx<'_>, host: &mut Host) -> usize {
    let hkey = cx.hkey;
    let later = std::mem::take(&mut host.rearm_later);
    for &sid in &later {
        if let Some(sock) = host.any_socket_mut(sid) {
            rearm(cx.engine, hkey, sid, sock);
        }
    }
    later.len()
}

/// SO_RCVTIMEO / SO_SNDTIMEO expired for a parked call: it returns what it
/// moved so far, or EAGAIN (as a blocking kernel socket with a timeout does).
pub fn on_call_timeout(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, serial: u64) {
    let Some(sock) = host.any_socket_mut(sid) else {
        return;
    };
    let found = [&mut sock.readers, &mut sock.writers]
        .into_iter()
        .find_map(|q| {
            q.iter()
                .position(|p| p.serial == serial)
                .and_then(|i| q.remove(i))
        });
    let Some(p) = found else {
        return; // completed meanwhile
    };
    let res = match p.call {
        Call::Send { .. } | Call::Recv { .. } | Call::SendReg { .. } | Call::RecvReg { .. }
            if p.progress > 0 =>
        {
            Ok((p.progress as i64, 0))
        }
        Call::Connect { .. } => Err(libc::EINPROGRESS),
        _ => Err(libc::EAGAIN),
    };
    finish(host, &p, res);
    let hkey = cx.hkey;
    if let Some(sock) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, sock);
    }
}
