//! Calls that may have to wait for their socket: accept, recv, send and
//! connect (and their registered-memory forms). Each is tried at once; one
//! that would block on a blocking socket is parked on the socket's
//! `readers` (accept, recv) or `writers` (send, connect, and a shutdown
//! behind queued sends) queue, in issue order, and the socket is armed in
//! the engine. On readiness the queue is retried front to back.
//!
//! Asynchronous sends are jobs on `writers` too (see `sendq`); finishing
//! one updates its send queue instead of publishing a completion. One try
//! of a call is `attempt`; answering it is `finish`.

use super::attempt::{attempt, start_connect, Step};
use super::close::finalize_close;
use super::common::{announce_parked, complete, rearm, Ctx, TimerKey};
use super::eager::{self, recv};
use super::finish::finish;
use super::poll;
use crate::host::{Host, Parked};
use std::cmp::Reverse;
use std::time::Instant;
use tcps_proto::msg::Call;
use tcps_proto::Op;

pub(crate) const RECV_FLAGS: i32 =
    libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_DONTWAIT | libc::MSG_OOB | libc::MSG_TRUNC;
pub(crate) const SEND_FLAGS: i32 = libc::MSG_DONTWAIT
    | libc::MSG_MORE
    | libc::MSG_NOSIGNAL
    | libc::MSG_OOB
    | libc::MSG_DONTROUTE
    | libc::MSG_EOR;

pub(crate) fn start(
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
    // Urgent data is not in the ring: `MSG_OOB` asks the kernel socket
    // (without touching the stream the ring carries).
    let urgent = matches!(call, Call::Recv { .. }) && flags & libc::MSG_OOB != 0;
    if is_reader && !urgent && recv::ring_bound(host, sid) {
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
        start_connect(cx, host, sid, &mut p, addr)
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
                    if s.eager.is_active() {
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
pub(crate) fn start_shutdown(
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
        match attempt(cx, host, sid, &mut p) {
            Step::Done(res) => finish(host, &p, res),
            // Submitted to the engine: it waits at the front of the
            // writers for its completion (`sendq::sent`).
            Step::Again => {
                if let Some(s) = host.any_socket_mut(sid) {
                    s.writers.push_back(p);
                }
            }
        }
    }
}

pub(crate) fn park(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, mut p: Parked, is_reader: bool) {
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

/// Drives the socket's write queue; a socket the host closed while
/// asynchronous sends were queued closes for real once the queue is empty.
pub(crate) fn drive_writers(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    drive(cx, host, sid, false);
    if host
        .sockets
        .get(sid as usize)
        .is_some_and(|s| s.closing && s.writers.is_empty())
    {
        finalize_close(cx, host, sid);
    }
}

/// Retries the parked reads (recv, accept) of a socket in order.
pub(crate) fn drive_readers(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    drive(cx, host, sid, true);
}

/// Retries the parked calls of one queue in order until one would block.
pub(crate) fn drive(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, readers: bool) {
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
        poll::recheck(host, pkey);
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
pub(crate) fn rearm_deferred(cx: &mut Ctx<'_>, host: &mut Host) -> usize {
    let hkey = cx.hkey;
    let mut later = std::mem::take(&mut host.rearm_later);
    for &sid in &later {
        if let Some(sock) = host.any_socket_mut(sid) {
            rearm(cx.engine, hkey, sid, sock);
        }
    }
    let n = later.len();
    if host.rearm_later.is_empty() {
        // Back with its room (no allocation at the next deferral).
        later.clear();
        host.rearm_later = later;
    }
    n
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

/// `Cancel`: a signal interrupted the host's wait for the call tagged
/// `target` on channel `ch`. If that call is still parked (on socket
/// `sid`'s queues, or a poll) it completes now, as the kernel's interrupted
/// call returns: with the bytes it already moved, else EINTR. A call that
/// completed meanwhile, an asynchronous send's job and a shutdown are left
/// alone (requests of one channel run in order, so the call was taken
/// before its cancel).
pub(crate) fn cancel(cx: &mut Ctx<'_>, host: &mut Host, ch: u32, sid: u32, target: u64) {
    let mine = |c: u32, u: u64| c == ch && u == target;
    if let Some(i) = host
        .polls_to_start
        .iter()
        .position(|&(c, u, _, _)| mine(c, u))
    {
        host.polls_to_start.remove(i);
        return complete(host, ch, target, Op::Poll, Err(libc::EINTR));
    }
    let parked_poll = host
        .polls
        .iter()
        .find(|(_, p)| mine(p.ch, p.user_data))
        .map(|(k, _)| k);
    if let Some(pkey) = parked_poll {
        return poll::finish_poll(host, pkey, Err(libc::EINTR));
    }
    let Some(sock) = host.any_socket_mut(sid) else {
        return;
    };
    let mut found = None;
    for (readers, q) in [(true, &mut sock.readers), (false, &mut sock.writers)] {
        let at = q
            .iter()
            .position(|p| mine(p.ch, p.user_data) && p.job.is_none() && p.op != Op::Shutdown);
        if let Some(p) = at.and_then(|i| q.remove(i)) {
            found = Some((readers, p));
            break;
        }
    }
    let Some((readers, p)) = found else {
        return; // answered already
    };
    let res = match p.call {
        Call::Send { .. } | Call::Recv { .. } | Call::SendReg { .. } | Call::RecvReg { .. }
            if p.progress > 0 =>
        {
            Ok((p.progress as i64, 0))
        }
        _ => Err(libc::EINTR),
    };
    finish(host, &p, res);
    // The calls queued behind it may go now.
    if readers {
        drive_readers(cx, host, sid);
    } else {
        drive_writers(cx, host, sid);
    }
    let hkey = cx.hkey;
    if let Some(sock) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, sock);
    }
}
