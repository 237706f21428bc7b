//! One try of an accept, recv, send, connect or shutdown with a
//! non-blocking syscall: done, or would block ([`Step::Again`]). A recv on
//! a pull socket is answered from its pull buffer.

use super::common::{arena_bytes, check_quota, insert_accepted, write_arena, Ctx, Res};
use super::eager::pullbuf::{PullEnd, PullTake};
use super::eager::ring::Eager;
use super::eager::{self, pull, setup};
use super::sendq::queue;
use super::sendq::uring::Submit;
use crate::admission;
use crate::engine::Keep;
use crate::guard;
use crate::host::{Host, Parked};
use crate::sys::{self, RawAddr};
use std::os::fd::AsRawFd;
use tcps_proto::addr;
use tcps_proto::msg::{ArenaRange, Call};

/// `Parked::progress` of a shutdown or connect whose engine operation is
/// in flight (`sendq::sent` completes only such a call with it).
pub(crate) const OP_IN_FLIGHT: usize = usize::MAX;

pub(crate) enum Step {
    Done(Res),
    /// Would block: park (or stay parked) and wait for readiness.
    Again,
}

pub(crate) fn would_block(p: &Parked) -> Step {
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
pub(crate) fn pull_step(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    p: &mut Parked,
    base: *mut u8,
    total: usize,
    flags: i32,
) -> Option<Step> {
    let pull = matches!(
        host.sockets.get(sid as usize).map(|s| &s.eager),
        Some(Eager::Pull(_))
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
            unsafe { pull::pull_take(host, sid, base.add(p.progress), total - p.progress, flags) };
        let step = match took {
            PullTake::Empty if !refilled => {
                refilled = true;
                if eager::fill(cx, host, sid) {
                    continue;
                }
                if pull::pull_deferring(host, sid) {
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
pub(crate) fn would_block_after(p: &Parked) -> Step {
    if p.progress > 0 && p.nonblocking {
        Step::Done(Ok((p.progress as i64, 0)))
    } else {
        would_block(p)
    }
}

pub(crate) fn start_connect(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    p: &mut Parked,
    a: ArenaRange,
) -> Step {
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
    if !p.nonblocking && connect_op(cx, host, sid, fd, &bytes) {
        p.progress = OP_IN_FLIGHT;
        return Step::Again;
    }
    let Some(s) = host.socket(sid) else {
        return Step::Done(Err(libc::EBADF));
    };
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

/// The number and token of the next operation for the front of socket
/// `sid`'s writers (completed by `sendq::sent`, as a send's).
fn writer_op(hkey: usize, sid: u32, s: &crate::host::Sock) -> (u8, u64) {
    let seq = s.op_seq.wrapping_add(1);
    let token = crate::token::Token::Sent {
        host: hkey,
        sock: sid as usize,
        gen: s.gen,
        seq,
    };
    (seq, token.encode())
}

/// A blocking connect handed to the engine (io_uring's
/// `IORING_OP_CONNECT`, in the pass's batch; the kernel waits for the
/// handshake): it waits on the writers for its completion
/// (`sendq::sent`). False where the engine executes no connects.
fn connect_op(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, fd: i32, addr: &[u8]) -> bool {
    let hkey = cx.hkey;
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return false;
    };
    if s.send_op.is_some() || !cx.engine.submits_ops() {
        return false;
    }
    let addr = Box::new(RawAddr::from_bytes(addr));
    let (ptr, len) = (
        &addr.storage as *const libc::sockaddr_storage as *const libc::sockaddr,
        addr.len,
    );
    let (seq, token) = writer_op(hkey, sid, s);
    // SAFETY: the address lives in its box, held as the `Keep` until the
    // completion is reaped (moving the box does not move it).
    if !unsafe {
        cx.engine
            .submit_connect(fd, ptr, len, token, Keep::Boxed(addr))
    } {
        return false;
    }
    s.op_seq = seq;
    s.send_op = Some(seq);
    true
}

/// Tries a parked (or new) accept, recv, send or connect once more.
pub(crate) fn attempt(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, p: &mut Parked) -> Step {
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
        if host
            .sockets
            .get(sid as usize)
            .is_some_and(|s| s.send_op.is_some())
        {
            // The front job is being sent by the engine (only the front is
            // ever tried): its completion moves it on, not this try.
            return Step::Again;
        }
        if let Some(e) = queue::job_error(host, job) {
            return Step::Done(Err(e));
        }
    }
    match p.call {
        Call::Accept { addr, flags, .. } => try_accept(cx, host, sid, fd, p, addr, flags),
        Call::Recv { flags, .. } | Call::RecvReg { flags, .. } => {
            try_recv(cx, host, sid, fd, p, flags)
        }
        Call::Send { flags, .. } | Call::SendReg { flags, .. } => {
            if p.job.is_some() {
                match super::sendq::uring::submit(cx, host, sid, p, flags) {
                    Submit::Syscall => {}
                    Submit::InFlight => return Step::Again,
                    Submit::Done(res) => return Step::Done(res),
                }
            }
            try_send(host, fd, p, flags)
        }
        Call::SendFile { .. } => {
            super::sendq::file::attempt(host, sid, p).map_or(Step::Again, Step::Done)
        }
        Call::Shutdown { how, .. } => try_shutdown(cx, host, sid, fd, p, how),
        Call::Connect { .. } if host.socket(sid).is_some_and(|s| s.send_op.is_some()) => {
            Step::Again // the engine's connect (`connect_op`) completes it
        }
        Call::Connect { .. } => match sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) if sys::getpeername(fd).is_ok() => Step::Done(Ok((0, 0))),
            Ok(0) => Step::Again,
            Ok(e) | Err(e) => Step::Done(Err(e)),
        },
        _ => Step::Done(Err(libc::EINVAL)),
    }
}

/// A shutdown at the front of the socket's writers (the bytes queued
/// before it have gone): handed to the engine (io_uring's
/// `IORING_OP_SHUTDOWN`, in the pass's batch; it stays at the front, and
/// the calls behind it wait, until its completion, `sendq::sent`), or a
/// system call now.
fn try_shutdown(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    fd: i32,
    p: &mut Parked,
    how: i32,
) -> Step {
    let hkey = cx.hkey;
    // Not on a socket whose close may linger: that close runs on a
    // closer thread (`closer`), which cannot wait for the shutdown's
    // completion as the engine's close does.
    if let Some(s) = host.sockets.get_mut(sid as usize).filter(|s| !s.may_linger) {
        if s.send_op.is_some() {
            // Its own, submitted by an earlier try, or one of a call that
            // left (a connect that timed out): its completion drives on.
            return Step::Again;
        }
        let (seq, token) = writer_op(hkey, sid, s);
        if cx.engine.submit_shutdown(fd, how, token) {
            p.progress = OP_IN_FLIGHT;
            s.op_seq = seq;
            s.send_op = Some(seq);
            return Step::Again;
        }
    }
    Step::Done(sys::shutdown(fd, how).map(|_| (0, 0)))
}

/// An accept (`flags`: accept4's, the peer's address into `addr`): the
/// connection admitted, inserted and set up with its listener's policy.
fn try_accept(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    fd: i32,
    p: &Parked,
    addr: ArenaRange,
    flags: i32,
) -> Step {
    loop {
        // Refuse before accepting: the connection stays in the backlog.
        if let Err(e) = check_quota(cx.cfg, host) {
            return Step::Done(Err(e));
        }
        match sys::accept(fd) {
            Ok((nfd, peer)) => {
                // What is left in the queue is ranked from the next poll
                // that finds it (`poll::stamp_untimed`), as the kernel
                // puts a level-triggered entry it reported at the back.
                if let Some(l) = host.socket_mut(sid) {
                    l.ready_since = None;
                }
                let nfd = match hand_over_direct(cx, host, sid, p, addr, nfd, &peer) {
                    Ok(done) => return done,
                    Err(nfd) => nfd,
                };
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
                let setup = policy.map_or(0, |pol| setup::setup_accepted(cx, host, id, pol));
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
    }
}

/// Balancing: an accepted connection the host gets as its own kernel
/// socket (`crate::balance`); the completion's result is its handle,
/// `SETUP_DIRECT` in `aux`'s high half. `Err`: it stays offloaded.
fn hand_over_direct(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    p: &Parked,
    addr: ArenaRange,
    nfd: std::os::fd::OwnedFd,
    peer: &sys::RawAddr,
) -> Result<Step, std::os::fd::OwnedFd> {
    let allowed = host
        .sockets
        .get(sid as usize)
        .is_some_and(|l| l.policy.balance);
    if !host.balance.decide(&cx.cfg.balance, allowed) {
        return Err(nfd);
    }
    let handle = host.balance.hand_over(nfd, std::time::Instant::now());
    host.stats.accepts_direct += 1;
    let len = write_arena(host, p.ch, addr, peer.as_bytes());
    let setup = u64::from(tcps_proto::eager::SETUP_DIRECT) << 32;
    Ok(Step::Done(Ok((i64::from(handle), len | setup))))
}

/// A recv into the call's arena or registered range: from the pull buffer
/// on a pull socket, else from the kernel.
fn try_recv(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    fd: i32,
    p: &mut Parked,
    flags: i32,
) -> Step {
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
    if p.progress == 0 {
        if let Some(e) = host.socket_mut(sid).and_then(|s| s.recv_error.take()) {
            return Step::Done(Err(e));
        }
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
            Err(e) if p.progress > 0 => {
                if let Some(s) = host.socket_mut(sid) {
                    s.recv_error = Some(e);
                }
                return Step::Done(Ok((p.progress as i64, 0)));
            }
            Err(e) => return Step::Done(Err(e)),
        }
    }
}

/// A send from the call's arena or registered range (an asynchronous
/// send's job, all or nothing).
fn try_send(host: &mut Host, fd: i32, p: &mut Parked, flags: i32) -> Step {
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

/// The memory a send or recv moves: its arena range, or its registered
/// range (resolved against the server's own registry).
pub(crate) fn data_ptr(host: &Host, p: &Parked) -> Option<(*mut u8, usize)> {
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
