//! What a socket does eagerly ([`Eager`]) and the server's private state
//! of its receive or accept ring (its cursor: `tail`, `consumed`, paused).
//! The control-block handshakes are `tcps_proto::eager`'s
//! `RecvRingProducer` and `AcceptRingProducer`.

use super::pullbuf::{PullBuf, PullEnd};
use crate::arrival::Arrival;
use crate::engine::AcceptSlot;
use crate::sys::RawAddr;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use tcps_proto::eager::{ACCEPT_RECORD_SIZE, RECV_MODE_NONE, RECV_MODE_PULL, RECV_MODE_RING};

/// What a socket does eagerly, before its host asks.
#[derive(Debug, Default)]
pub enum Eager {
    /// Nothing: requests go to the kernel.
    #[default]
    None,
    /// Receive ring `sid` is bound (push).
    Recv(RecvRing),
    /// Accept ring `sid` is bound (a listener).
    Accept(AcceptRing),
    /// Receiving into a pull buffer at the server (pull).
    Pull(PullBuf),
}

impl Eager {
    /// Whether POLLIN readiness of the socket comes from here rather than
    /// from the kernel. A pull socket that holds nothing and may not read
    /// ahead (its host's budget is spent) is served by the kernel meanwhile.
    pub fn is_active(&self) -> bool {
        match self {
            Eager::None => false,
            Eager::Pull(p) => !p.deferring(),
            _ => true,
        }
    }

    /// Whether the server wants to hear that the kernel socket is readable.
    pub fn wants_readable(&self) -> bool {
        match self {
            Eager::None => false,
            Eager::Recv(b) => !b.paused && !b.ended,
            // Accepts in flight wait for connections by themselves.
            Eager::Accept(a) => a.demanded && !a.paused && a.inflight.is_empty(),
            Eager::Pull(p) => p.end.is_none() && !p.full() && !p.throttled,
        }
    }

    pub(crate) fn mode(&self) -> u64 {
        match self {
            Eager::None => RECV_MODE_NONE,
            Eager::Recv(_) | Eager::Accept(_) => RECV_MODE_RING,
            Eager::Pull(_) => RECV_MODE_PULL,
        }
    }
}

/// The server's private state of a bound receive ring (never read back from
/// shared memory except the host's `head`, clamped).
#[derive(Debug, Default)]
pub struct RecvRing {
    /// What the host had consumed when the server last looked (clamped).
    pub(crate) consumed: u32,
    /// Bytes published.
    pub(crate) tail: u32,
    pub(crate) paused: bool,
    /// `end` was published: nothing more is read.
    pub(crate) ended: bool,
    /// What `end` was (kept here: the ring's copy is host-writable).
    pub(crate) end: Option<PullEnd>,
    pub(crate) kicks: u32,
    /// When the ring last became non-empty (as the server saw it).
    pub(crate) since: Arrival,
}

/// The server's private state of a bound accept ring.
#[derive(Debug, Default)]
pub struct AcceptRing {
    pub(crate) consumed: u32,
    pub(crate) tail: u32,
    pub(crate) paused: bool,
    /// The host asked for connections (its first `RecvKick`).
    pub(crate) demanded: bool,
    pub(crate) kicks: u32,
    /// Connections published and maybe not yet taken: (position, socket id,
    /// generation), oldest first.
    pub(crate) published: VecDeque<(u32, u32, u16)>,
    /// When the ring last became non-empty (as the server saw it).
    pub(crate) since: Arrival,
    /// Accepts in flight at the engine (io_uring: `acceptop`), by their
    /// number: each has one record's room kept for it.
    pub(crate) inflight: Vec<(u8, Arc<AcceptSlot>)>,
    /// Slots of accepts that completed, for the next ones (`acceptop`).
    pub(crate) spare_slots: Vec<Arc<AcceptSlot>>,
    /// Connections accepted by the engine while their host was at its
    /// socket quota: kept, as the kernel's backlog would keep them, and
    /// published first when the host asks again.
    pub(crate) held: VecDeque<(OwnedFd, RawAddr)>,
}

/// With less free room than this a ring pauses (the host kicks after
/// consuming): `min(4096, size / 4)`.
pub fn pause_threshold(size: u32) -> u32 {
    4096.min(size / 4)
}

/// Most accept records outstanding in a ring of `size` bytes.
pub fn accept_capacity(accept_size: u32, size: u32) -> u32 {
    accept_size.min(size / ACCEPT_RECORD_SIZE).max(1)
}

pub(crate) fn note_paused(list: &mut Vec<u32>, sid: u32) {
    if !list.contains(&sid) {
        list.push(sid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_threshold_is_4k_or_a_quarter() {
        assert_eq!(pause_threshold(32 * 1024), 4096);
        assert_eq!(pause_threshold(4096), 1024);
        assert_eq!(pause_threshold(8192), 2048);
        assert_eq!(pause_threshold(16 << 20), 4096);
    }

    #[test]
    fn accept_capacity_is_bounded_by_the_ring() {
        assert_eq!(accept_capacity(64, 32 * 1024), 64);
        assert_eq!(accept_capacity(1000, 4096), 64);
        assert_eq!(accept_capacity(0, 4096), 1);
    }
}
