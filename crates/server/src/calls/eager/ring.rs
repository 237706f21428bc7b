//! What a socket does eagerly ([`Eager`]), the server's private state of
//! its receive or accept ring, and the ring control-block handshakes the
//! server side performs (publish, pause, bind, unbind, stop).

use super::pullbuf::{PullBuf, PullEnd};
use std::collections::VecDeque;
use std::sync::atomic::{fence, Ordering};
use tcps_proto::futex;
use tcps_proto::recvq::{
    self, RecvRingCtl, ACCEPT_RECORD_SIZE, END_EOF, END_ERROR, KIND_FREE, RECV_MODE_NONE,
    RECV_MODE_PULL, RECV_MODE_RING,
};
use tcps_proto::region::RecvRingRef;

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
            Eager::Accept(a) => a.demanded && !a.paused,
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

/// Bytes a ring holds after the host stored `head`, and the new clamped
/// `consumed`. Accept rings count whole records: a `head` inside a record
/// leaves that record outstanding.
pub fn look(tail: u32, head: u32, consumed: u32, record: u32) -> (u32, u32) {
    let mut used = recvq::used(tail, head, consumed);
    if record > 1 {
        used = used.div_ceil(record) * record;
        used = used.min(tail.wrapping_sub(consumed));
    }
    (used, tail.wrapping_sub(used))
}

/// Whether a record published at `pos` is still in the window
/// `[consumed, tail)` (not yet taken by the host).
pub fn untaken(pos: u32, consumed: u32, tail: u32) -> bool {
    pos.wrapping_sub(consumed) < tail.wrapping_sub(consumed)
}

/// Stores `tail` (release), and the end of stream after it; fences and
/// wakes a host thread sleeping on `tail`.
pub(crate) fn publish(ctl: &RecvRingCtl, tail: u32, end: Option<Result<(), i32>>) {
    ctl.tail.store(tail, Ordering::Release);
    match end {
        Some(Ok(())) => ctl.end.store(END_EOF, Ordering::Release),
        Some(Err(e)) => {
            ctl.end_errno.store(e, Ordering::Relaxed);
            ctl.end.store(END_ERROR, Ordering::Release);
        }
        None => {}
    }
    // Dekker against the host's "host_waiting += 1; fence; load tail".
    fence(Ordering::SeqCst);
    if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
        futex::wake_all(&ctl.tail);
    }
}

/// Initialises ring `r`'s control block for a new owner.
pub(crate) fn init_ring(ring: &RecvRingRef<'_>, sid: u32, kind: u32) {
    let ctl = ring.ctl();
    ctl.head.store(0, Ordering::Relaxed);
    ctl.tail.store(0, Ordering::Relaxed);
    ctl.end.store(0, Ordering::Relaxed);
    ctl.end_errno.store(0, Ordering::Relaxed);
    ctl.paused.store(0, Ordering::Relaxed);
    ctl.kicks_seen.store(0, Ordering::Relaxed);
    ctl.kind.store(kind, Ordering::Relaxed);
    ctl.owner.store(sid + 1, Ordering::Release);
}

pub(crate) fn note_paused(list: &mut Vec<u32>, sid: u32) {
    if !list.contains(&sid) {
        list.push(sid);
    }
}

/// Frees ring `ring` (`kind = FREE`, `owner = 0`): the host sees it
/// unbound. With `wake`, also wakes a host thread sleeping on `tail`
/// (Dekker against its "host_waiting += 1; fence; load owner/tail"); a
/// ring released for export has no such thread (the host is about to
/// exec, and `exec` found the ring idle).
pub(crate) fn free_ring(ring: &RecvRingRef<'_>, wake: bool) {
    let ctl = ring.ctl();
    ctl.kind.store(KIND_FREE, Ordering::Relaxed);
    ctl.owner.store(0, Ordering::Release);
    if !wake {
        return;
    }
    fence(Ordering::SeqCst);
    if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
        futex::wake_all(&ctl.tail);
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

    #[test]
    fn look_clamps_and_counts_whole_records() {
        // bytes: plain clamp
        assert_eq!(look(100, 40, 0, 1), (60, 40));
        assert_eq!(look(100, 1000, 40, 1), (60, 40)); // forged head ahead of tail
        assert_eq!(look(100, 0, 40, 1), (60, 40)); // head moving back
                                                   // records: a head inside a record leaves it outstanding
        assert_eq!(look(256, 64, 0, 64), (192, 64));
        assert_eq!(look(256, 70, 0, 64), (192, 64));
        assert_eq!(look(256, 256, 0, 64), (0, 256));
        assert_eq!(look(256, 5000, 64, 64), (192, 64));
        // across the wrap
        let t = 32u32;
        let c = u32::MAX - 31; // 64 bytes behind t, wrapped
        assert_eq!(look(t, c.wrapping_add(64), c, 64), (0, t));
        assert_eq!(look(t, c, c, 64), (64, c));
    }

    #[test]
    fn untaken_is_the_window_consumed_to_tail() {
        assert!(untaken(64, 64, 128));
        assert!(!untaken(0, 64, 128));
        assert!(!untaken(128, 64, 128));
        let c = u32::MAX - 63;
        assert!(untaken(c, c, c.wrapping_add(128)));
        assert!(untaken(c.wrapping_add(64), c, c.wrapping_add(128)));
        assert!(!untaken(c.wrapping_sub(64), c, c.wrapping_add(128)));
    }
}
