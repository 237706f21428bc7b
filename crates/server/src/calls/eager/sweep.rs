//! What keeps eager sockets going after setup: `Op::RecvBind`, the host's
//! kicks (`Op::RecvKick`), resuming paused rings and throttled pull
//! buffers, and the periodic sweep. Above `blocking` and `poll`: a fill
//! answers parked calls and polls.

use super::accept::bind_accept;
use super::fill;
use super::pullbuf::PULL_FIRST;
use super::ring::{accept_capacity, pause_threshold, Eager};
use super::setup::start_receiving;
use crate::calls::blocking::drive_readers;
use crate::calls::common::{rearm, Ctx, Res};
use crate::calls::poll;
use crate::config::EagerRecv;
use crate::host::Host;
use crate::sys;
use std::os::fd::AsRawFd;
use tcps_proto::eager::{RecvRingProducer, ACCEPT_RECORD_SIZE, RECV_MODE_NONE, RECV_MODE_RING};

/// Reads ahead, then lets parked polls look again and (re)arms the socket.
pub(crate) fn advance(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    if fill(cx, host, sid) {
        recheck_pollers(host, sid);
    }
    if host
        .sockets
        .get(sid as usize)
        .is_some_and(|s| matches!(s.eager, Eager::Pull(_)) && !s.readers.is_empty())
    {
        drive_readers(cx, host, sid);
    }
    let hkey = cx.hkey;
    if let Some(s) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, s);
    }
}

/// `Token::Received`: receive `seq` into socket `sid`'s ring (generation
/// `gen`) completed with `res` (bytes, 0 at EOF, or `-errno`): published,
/// polls look again, and the next receive is submitted (`advance`). On a
/// listener: an accept into its accept ring (`acceptop::on_accepted`).
pub fn on_received(cx: &mut Ctx<'_>, host: &mut Host, sid: usize, gen: u16, seq: u8, res: i32) {
    let sid = sid as u32;
    let Some(s) = host.any_socket_mut(sid) else {
        return; // closed: the receive was cancelled
    };
    if matches!(s.eager, Eager::Accept(_)) {
        // An accept into the listener's accept ring (`acceptop`).
        if super::acceptop::on_accepted(cx, host, sid, gen, seq, res) {
            recheck_pollers(host, sid);
        }
        let hkey = cx.hkey;
        if let Some(s) = host.any_socket_mut(sid) {
            rearm(cx.engine, hkey, sid, s);
        }
        return;
    }
    if s.gen != gen || s.recv_op != Some(seq) {
        return;
    }
    s.recv_op = None;
    if super::ringop::received(host, sid, res) {
        recheck_pollers(host, sid);
    }
    advance(cx, host, sid);
}

pub(crate) fn recheck_pollers(host: &mut Host, sid: u32) {
    let pollers: Vec<usize> = host
        .sockets
        .get(sid as usize)
        .map(|s| s.pollers.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    for pkey in pollers {
        poll::recheck(host, pkey);
    }
}

/// `Op::RecvBind`.
pub(crate) fn recv_bind(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> Res {
    let s = host.socket_mut(sid).ok_or(libc::EBADF)?;
    if let Eager::Accept(a) = &mut s.eager {
        // A host whose non-blocking accept found the ring empty before it
        // ever asked for connections: accept ahead now, before answering,
        // so connections already in the backlog are in the ring when the
        // host looks again (the kernel's accept would have found them).
        a.demanded = true;
        advance(cx, host, sid);
        // Accepts the engine executes: those that found a connection.
        if super::acceptop::accept_backlog(cx, host, sid) {
            recheck_pollers(host, sid);
        }
        return Ok((RECV_MODE_RING as i64, 0));
    }
    if !matches!(s.eager, Eager::None) {
        return Ok((s.eager.mode() as i64, 0));
    }
    let fd = s.fd.as_raw_fd();
    let policy = s.policy;
    if sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).unwrap_or(0) != 0 {
        if !s.readers.is_empty() {
            // Accept requests are parked: they keep the listener.
            return Ok((RECV_MODE_NONE as i64, 0));
        }
        return Ok((bind_accept(host, sid) as i64, 0));
    }
    if policy.recv == EagerRecv::Off || sys::getpeername(fd).is_err() {
        // Off, or not connected (yet): plain requests (the host may ask
        // again later).
        return Ok((RECV_MODE_NONE as i64, 0));
    }
    if !s.readers.is_empty() {
        return Err(libc::EBUSY);
    }
    let mode = start_receiving(host, sid, policy.recv);
    advance(cx, host, sid);
    Ok((mode as i64, 0))
}

/// `Op::RecvKick`: the host consumed from (or wants from) the ring.
pub(crate) fn kick(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    let Some(s) = host.sockets.get_mut(sid as usize).filter(|s| !s.closing) else {
        return;
    };
    let kicks = match &mut s.eager {
        Eager::Recv(b) => {
            b.kicks = b.kicks.wrapping_add(1);
            b.kicks
        }
        Eager::Accept(a) => {
            a.kicks = a.kicks.wrapping_add(1);
            a.demanded = true;
            a.kicks
        }
        _ => return,
    };
    host.stats.recv_kicks += 1;
    if let Some(r) = host.region.recv_ring(sid) {
        RecvRingProducer::new(r).set_kicks_seen(kicks);
    }
    resume(cx, host, sid);
}

/// Clears a pause if the ring has room and reads (accepts)
/// ahead at once.
pub(crate) fn resume(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    let Some(ring) = host.region.recv_ring(sid).map(RecvRingProducer::new) else {
        return;
    };
    let size = ring.size();
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return;
    };
    let open = match &mut s.eager {
        Eager::Recv(b) => {
            if b.paused {
                let (used, c) = ring.look(b.tail, b.consumed, 1);
                b.consumed = c;
                if size - used >= pause_threshold(size) {
                    b.paused = false;
                    ring.unpause();
                }
            }
            !b.paused
        }
        Eager::Accept(a) => {
            if a.paused {
                let cap = accept_capacity(s.policy.accept_size, size) * ACCEPT_RECORD_SIZE;
                let (used, c) = ring.look(a.tail, a.consumed, ACCEPT_RECORD_SIZE);
                a.consumed = c;
                if used < cap {
                    a.paused = false;
                    ring.unpause();
                }
            }
            !a.paused
        }
        _ => false,
    };
    if open {
        host.eager_paused.retain(|&p| p != sid);
        advance(cx, host, sid);
    }
}

/// The periodic sweep: resumes paused rings that have room (a host that
/// did not kick).
pub(crate) fn sweep(cx: &mut Ctx<'_>, host: &mut Host) -> usize {
    if host.eager_paused.is_empty() {
        return 0;
    }
    let mut work = 0;
    for sid in host.eager_paused.clone() {
        let (paused, throttled) =
            host.sockets
                .get(sid as usize)
                .map_or((false, false), |s| match &s.eager {
                    Eager::Recv(b) => (b.paused, false),
                    Eager::Accept(a) => (a.paused, false),
                    Eager::Pull(p) => (false, p.throttled),
                    Eager::None => (false, false),
                });
        if throttled {
            work += usize::from(resume_pull(cx, host, sid));
            continue;
        }
        if !paused {
            host.eager_paused.retain(|&p| p != sid);
            continue;
        }
        resume(cx, host, sid);
        work += usize::from(!host.eager_paused.contains(&sid));
    }
    work
}

/// A pull socket the host's budget stopped reads ahead again once the
/// budget has room (other buffers drained); true if it did.
pub(crate) fn resume_pull(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    if host.pull.room() < PULL_FIRST {
        return false;
    }
    if let Some(Eager::Pull(p)) = host.sockets.get_mut(sid as usize).map(|s| &mut s.eager) {
        p.throttled = false;
    }
    host.eager_paused.retain(|&p| p != sid);
    advance(cx, host, sid);
    true
}
