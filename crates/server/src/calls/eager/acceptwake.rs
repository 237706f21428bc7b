//! Waking a thread blocked in `accept` when its connection has data, not
//! before (one wake-up per request instead of two).
//!
//! A connection accepted ahead is published in its listener's accept ring
//! at once — a thread that looks finds it — but a thread *asleep* in
//! `accept` is woken only when the connection's receive ring got its first
//! bytes (or its end), or [`WAKE_AFTER`] later at most. Woken at accept, that
//! thread would take the connection, find its ring empty (the request is
//! still on its way: it follows the handshake by microseconds) and sleep a
//! second time; every wake-up of a thread on another core costs the server
//! an inter-processor interrupt (`docs/BENCHMARKS.md` §15 profile). A
//! connection whose ring already holds bytes, or that has no receive ring,
//! wakes at once; a record the host took meanwhile wakes nobody.

use super::ring::forget_taken;
use super::ring::Eager;
use crate::host::{AcceptWake, Host};
use std::time::{Duration, Instant};
use tcps_proto::eager::AcceptRingProducer;

/// Longest a sleeping acceptor waits for its connection's first bytes (a
/// protocol in which the server speaks first sees its connection this
/// much later, only when no thread was awake to take it).
pub const WAKE_AFTER: Duration = Duration::from_micros(200);

/// Whether connection `sid` (just set up) should wake its acceptor later:
/// it has a receive ring and nothing in it yet.
pub(crate) fn defer(host: &mut Host, lid: u32, sid: u32, now: Instant) -> bool {
    let Some(s) = host.sockets.get(sid as usize) else {
        return false;
    };
    let Eager::Recv(st) = &s.eager else {
        return false;
    };
    if st.ended || st.tail != st.consumed {
        return false;
    }
    host.accept_wakes.push(AcceptWake {
        lid,
        sid,
        sid_gen: s.gen,
        due: now + WAKE_AFTER,
    });
    true
}

/// Connection `sid`'s receive ring published: the wake owed for it, now.
pub(crate) fn on_data(host: &mut Host, sid: u32) {
    if let Some(i) = host.accept_wakes.iter().position(|w| w.sid == sid) {
        let w = host.accept_wakes.swap_remove(i);
        wake(host, w);
    }
}

/// The wakes whose time has come; the earliest still owed.
pub(crate) fn due(host: &mut Host, now: Instant) -> Option<Instant> {
    let mut i = 0;
    while let Some(&w) = host.accept_wakes.get(i) {
        if w.due <= now {
            host.accept_wakes.swap_remove(i);
            wake(host, w);
        } else {
            i += 1;
        }
    }
    host.accept_wakes.iter().map(|w| w.due).min()
}

/// Wakes one thread asleep on listener `w.lid`'s accept ring, unless the
/// connection's record was taken already (or is gone).
fn wake(host: &mut Host, w: AcceptWake) {
    let Host {
        sockets,
        region,
        stats,
        ..
    } = host;
    let same = sockets
        .get(w.sid as usize)
        .is_some_and(|s| s.gen == w.sid_gen);
    let Some(Eager::Accept(st)) = sockets.get_mut(w.lid as usize).map(|l| &mut l.eager) else {
        return;
    };
    let Some(ring) = region.recv_ring(w.lid).map(AcceptRingProducer::new) else {
        return;
    };
    let (_, consumed) = ring.look(st.tail, st.consumed);
    st.consumed = consumed;
    forget_taken(st);
    if same && st.published.iter().any(|&(_, sid, _)| sid == w.sid) && ring.wake(1) {
        stats.wakes += 1;
    }
}
