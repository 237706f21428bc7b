//! Receive rings filled by the engine (io_uring's `IORING_OP_RECV`, behind
//! a linked one-byte MSG_PEEK, see `Engine::submit_recv`) instead of a `recv(2)` per readiness: one
//! receive per ring in flight
//! (`Sock::recv_op`), into the contiguous free span after `tail` (at most
//! to the ring's end); its completion publishes what arrived and submits
//! the next (`sweep::on_received`). A ring with too little room pauses as
//! before (nothing in flight then); the host's kick resumes it.
//!
//! The kernel writes into the host's region after the submission: the
//! region stays mapped until the completion is reaped (the submission
//! holds it, `Host::region`), and a socket that closes cancels its receive
//! first (`Engine::forget`). A ring that stops or is released while a
//! receive is in flight (exec, fork, `TCPS_EAGER_RECV` off) first
//! *settles* it: cancelled and waited for, what it received published.
//! Where the engine executes no receives (epoll) the ring is filled with
//! `recv(2)` on readiness (`recv::fill_recv`): the same semantics.

use super::recv::{fill_recv, publish, room_or_pause};
use super::ring::Eager;
use crate::calls::common::Ctx;
use crate::host::Host;
use crate::token::Token;
use std::os::fd::AsRawFd;
use tcps_proto::eager::RecvRingProducer;
use tracing::warn;

/// Fills socket `sid`'s receive ring: through the engine where it executes
/// receives, else with system calls now. Whether anything was published
/// now (a receive in flight publishes on its completion).
pub(crate) fn fill_ring(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    if submit(cx, host, sid) {
        return false;
    }
    fill_recv(host, sid)
}

/// The token of socket `sid`'s receive number `seq`.
fn token(hkey: usize, sid: u32, gen: u16, seq: u8) -> u64 {
    Token::Received {
        host: hkey,
        sock: sid as usize,
        gen,
        seq,
    }
    .encode()
}

/// Submits a receive into the free span of socket `sid`'s ring unless one
/// is in flight or the ring is paused or ended. False when the engine
/// executes no receives (or refused this one): fill with system calls.
fn submit(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    if !cx.engine.submits_ops() {
        return false;
    }
    let keep = host.region.clone();
    let Host {
        region,
        sockets,
        eager_paused,
        ..
    } = host;
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return true;
    };
    let (fd, gen) = (sock.fd.as_raw_fd(), sock.gen);
    let Eager::Recv(st) = &mut sock.eager else {
        return true;
    };
    if sock.recv_op.is_some() || st.paused || st.ended {
        return true;
    }
    let Some(ring) = region.recv_ring(sid).map(RecvRingProducer::new) else {
        return true;
    };
    let (mut used, c) = ring.look(st.tail, st.consumed, 1);
    st.consumed = c;
    let Some(free) = room_or_pause(&ring, st, &mut used, eager_paused, sid) else {
        return true; // paused: the host's kick resumes it
    };
    let (p, n) = ring.span_ptr(st.tail, free);
    let seq = sock.op_seq.wrapping_add(1);
    // SAFETY: p..p+n is the free span of this socket's ring inside the
    // host's region (span_ptr bounds it), which `keep` keeps mapped until
    // the completion is reaped. The host reads only head..tail; one that
    // writes here only corrupts its own stream. `tail` does not move
    // while the receive is in flight (only its completion moves it).
    let sent = unsafe {
        cx.engine.submit_recv(
            fd,
            p,
            n as u32,
            token(cx.hkey, sid, gen, seq),
            crate::engine::Keep::Mapped(keep),
        )
    };
    if !sent {
        return false;
    }
    sock.op_seq = seq;
    sock.recv_op = Some(seq);
    true
}

/// Applies a receive's result to socket `sid`'s ring: bytes published, an
/// end (0: EOF, an error) published as the ring's end. Whether anything
/// was published. A cancelled receive (or one the kernel asks to retry)
/// published nothing.
pub(crate) fn received(host: &mut Host, sid: u32, res: i32) -> bool {
    if res == -libc::ECANCELED || res == -libc::EAGAIN || res == -libc::EINTR {
        return false;
    }
    let Host {
        region,
        sockets,
        stats,
        arrivals,
        ..
    } = host;
    let Some(Eager::Recv(st)) = sockets.get_mut(sid as usize).map(|s| &mut s.eager) else {
        return false; // unbound meanwhile: its host closed the socket
    };
    let Some(ring) = region.recv_ring(sid).map(RecvRingProducer::new) else {
        return false;
    };
    if st.ended {
        return false;
    }
    let (used, c) = ring.look(st.tail, st.consumed, 1);
    st.consumed = c;
    let end = match res {
        0 => Some(Ok(())),
        n if n > 0 => {
            let k = (n as u32).min(ring.size() - used);
            st.tail = st.tail.wrapping_add(k);
            stats.recvs_eager += 1;
            stats.bytes_eager += u64::from(k);
            stats.bytes_received += u64::from(k);
            None
        }
        e => Some(Err(-e)),
    };
    publish(&ring, st, stats, arrivals, true, used == 0, end);
    true
}

/// Settles socket `sid`'s receive in flight, if any, before its ring stops
/// or is released: cancelled and waited for, what it received published.
/// Whether one was in flight (the ring then receives no more until it is
/// filled again: `sweep::advance`).
pub(crate) fn settle(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return false;
    };
    let Some(seq) = s.recv_op.take() else {
        return false;
    };
    let t = token(cx.hkey, sid, s.gen, seq);
    match cx.engine.settle(t) {
        Some(res) => {
            received(host, sid, res);
        }
        None => warn!(
            host = host.id,
            sock = sid,
            "a receive into a ring did not complete when cancelled; what it receives is lost"
        ),
    }
    true
}

/// Settles the receives in flight of every ring of `host` (a fork
/// snapshot stops them); the sockets that had one.
pub(crate) fn settle_all(cx: &mut Ctx<'_>, host: &mut Host) -> Vec<u32> {
    let ids: Vec<u32> = host
        .sockets
        .iter()
        .filter(|(_, s)| s.recv_op.is_some())
        .map(|(id, _)| id as u32)
        .collect();
    ids.into_iter().filter(|&id| settle(cx, host, id)).collect()
}
