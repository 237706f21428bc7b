//! Process-ahead: receive rings (eager receive, *push*) and accept rings
//! (eager accept). The thesis' §4.6.2–4.6.4, without its extra `poll`.
//!
//! A socket with id `s < recv_rings` may have receive ring `s` of the region
//! bound to it (the index is the socket id, so binding needs no allocation
//! and the host knows the ring of every socket it names). A ring is a
//! [`RecvRingCtl`] followed by `rq_bytes` bytes (a power of two):
//!
//! * **Byte rings** (`kind == KIND_BYTES`, a connected socket): the server
//!   `recv(2)`s straight into the ring at `tail % rq_bytes` whenever the
//!   socket is readable and the ring has room, then stores `tail` (release).
//!   The host copies bytes from `head` to `tail` out and stores `head`. A
//!   host `recv` is therefore a local copy: no request, no round trip.
//! * **Accept rings** (`kind == KIND_ACCEPT`, a listener): the server
//!   accepts ahead and writes one 64-byte [`AcceptRecord`] per connection
//!   (records never straddle the wrap, `rq_bytes` being a multiple of 64),
//!   at most `eager_accept_size` records outstanding. Several connections
//!   ready together are published with one store of `tail`.
//!
//! **End of stream.** When `recv(2)` returns 0 or an error, the server
//! stores `end_errno` and then `end` (release) *after* the `tail` of the
//! last data: a host that sees `end` and has consumed up to `tail` reports
//! end-of-file (or the error) — in order, after the data before it. The
//! server writes no more data after `end`.
//!
//! **Backpressure.** The server reads only into free room
//! (`rq_bytes - (tail - head)`, with `head` clamped to `[consumed, tail]`:
//! the host may write anything there). With the ring (nearly) full it stops
//! reading and sets `paused`; the kernel socket buffer fills and TCP's window
//! stops the peer, so memory stays bounded by `rq_bytes` per socket however
//! slow the reader. A host that consumed bytes while `paused` is set posts an
//! `Op::RecvKick` (no completion) unless a kick of its own is still unseen
//! (`kicks_seen`); both sides fence between their store and their load
//! (`paused` / `head`) so a resume is never lost, and the server also
//! re-checks paused rings in its periodic sweep.
//!
//! **Waiting.** A host thread that finds a ring empty and blocks increments
//! `host_waiting`, fences, re-reads `tail`/`end` and futex-waits on `tail`;
//! the server wakes `tail` after publishing when `host_waiting != 0`.

use std::sync::atomic::{AtomicI32, AtomicU32};

/// Bytes of a receive ring's control block.
pub const RQ_CTL_SIZE: usize = 192;

/// `kind`: not bound.
pub const KIND_FREE: u32 = 0;
/// `kind`: a connected socket's received bytes.
pub const KIND_BYTES: u32 = 1;
/// `kind`: a listener's accepted connections ([`AcceptRecord`]s).
pub const KIND_ACCEPT: u32 = 2;

/// `end`: the stream is still open.
pub const END_NONE: u32 = 0;
/// `end`: the peer closed its side (recv returns 0 after the data).
pub const END_EOF: u32 = 1;
/// `end`: the connection failed with `end_errno` (after the data).
pub const END_ERROR: u32 = 2;
/// `end`: the server stopped receiving ahead (`TCPS_EAGER_RECV` set to 0 on
/// a ring socket): after the ring's bytes, receive by `Recv` requests.
pub const END_STOPPED: u32 = 3;

/// A receive ring's control block, on three cache lines like the channel's.
#[repr(C, align(64))]
pub struct RecvRingCtl {
    /// Host-written: bytes (or records × 64) consumed (free-running).
    pub head: AtomicU32,
    /// Host-written: non-zero while a host thread sleeps on `tail` (futex).
    pub host_waiting: AtomicU32,
    _pad0: [u8; 56],
    /// Server-written: bytes (or records × 64) published (free-running).
    /// The futex word of a host waiting for data.
    pub tail: AtomicU32,
    /// Server-written: `END_*`, stored after the last `tail`.
    pub end: AtomicU32,
    /// Server-written: the errno of `END_ERROR`.
    pub end_errno: AtomicI32,
    /// Server-written: non-zero while the server does not read because the
    /// ring is full (the host kicks after consuming).
    pub paused: AtomicU32,
    _pad1: [u8; 48],
    /// Server-written: the socket id + 1 the ring is bound to; 0 when free.
    pub owner: AtomicU32,
    /// Server-written: `KIND_*`.
    pub kind: AtomicU32,
    /// Server-written: `Op::RecvKick` requests of this ring taken.
    pub kicks_seen: AtomicU32,
    _pad2: [u8; 52],
}

const _: () = assert!(std::mem::size_of::<RecvRingCtl>() == RQ_CTL_SIZE);

/// One eagerly accepted connection in a listener's accept ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcceptRecord {
    /// The new connection's socket id (already in the host's socket table).
    pub sock: u32,
    /// `SETUP_*`: what the server set up for it at accept.
    pub flags: u32,
    /// Bytes of `addr` used (a `sockaddr_in` or `sockaddr_in6`).
    pub addr_len: u32,
    pub reserved: u32,
    /// The peer address as raw `sockaddr` bytes.
    pub addr: [u8; 32],
    pub reserved2: [u8; 16],
}

/// Bytes of an [`AcceptRecord`].
pub const ACCEPT_RECORD_SIZE: u32 = 64;
const _: () = assert!(std::mem::size_of::<AcceptRecord>() == ACCEPT_RECORD_SIZE as usize);

/// `AcceptRecord::flags` (and the high half of an `Accept` completion's
/// `aux`): the connection's send queue (index = socket id) is bound, with
/// `head == done == 0` — asynchronous sends need no `AsyncBind`.
pub const SETUP_SENDQ: u32 = 1;
/// ... its receive ring (index = socket id) is bound as a byte ring: the
/// host receives from it, with no `RecvBind`.
pub const SETUP_RECV_RING: u32 = 2;
/// ... it receives by `Recv` requests (eager receive off, or pull, which the
/// server started at accept): no `RecvBind` needed either. Reported at every
/// accept whose receive mode is settled, setup with accept on or off.
pub const SETUP_RECV_PLAIN: u32 = 4;

/// `AcceptRecord::flags`: not a connection but an accept error (`reserved`
/// holds the errno, e.g. `EMFILE` at the host's socket quota). The server
/// stops accepting ahead until the host's next kick, so each `accept` the
/// host makes while the error lasts sees it, as with the kernel.
pub const ACCEPT_ERROR: u32 = 0x8000_0000;

/// Result of `Op::RecvBind` and `Op::Listen`'s `aux`: how the socket
/// receives (or accepts).
pub const RECV_MODE_NONE: u64 = 0;
/// The server reads ahead into a buffer of its own; `recv` is a request
/// answered from it at once (eager receive, *pull*).
pub const RECV_MODE_PULL: u64 = 1;
/// The socket's receive ring is bound (eager receive *push*, or an accept
/// ring for a listener).
pub const RECV_MODE_RING: u64 = 2;

/// `SOL_TCPS`: the `setsockopt`/`getsockopt` level of tcps' own per-socket
/// policy (handled by the TCP server, never passed to the kernel). Values
/// are C `int`s.
pub const SOL_TCPS: i32 = 0x7463_7073; // "tcps"
/// 0 off, 1 pull, 2 push. On a listener: what its accepted connections get.
/// Takes effect when the socket is set up (accept, `RecvBind`); changing it
/// on a socket whose ring is already bound gives `EBUSY`.
pub const TCPS_EAGER_RECV: i32 = 1;
/// On a listener, before `listen`: 0 off, otherwise the accept ring bound
/// (connections accepted ahead, at most what the ring holds).
pub const TCPS_EAGER_ACCEPT: i32 = 2;
/// On a listener: 0/1, set up async send queue and receive ring at accept.
pub const TCPS_SETUP_WITH_ACCEPT: i32 = 3;
/// Bytes the server reads ahead per socket in pull mode (push: the ring
/// size, fixed by the region; reading it back gives the effective size).
pub const TCPS_EAGER_RECV_SIZE: i32 = 4;

/// Bytes a ring with `tail` and host `head` holds, `head` clamped to the
/// window `[consumed, tail]` the server knows to be valid.
pub fn used(tail: u32, head: u32, consumed: u32) -> u32 {
    let span = tail.wrapping_sub(consumed);
    let h = head.wrapping_sub(consumed);
    if h > span {
        span
    } else {
        span - h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_clamps_a_forged_head() {
        assert_eq!(used(100, 40, 0), 60);
        assert_eq!(used(100, 100, 0), 0);
        // head beyond tail (forged): treated as nothing consumed past consumed.
        assert_eq!(used(100, 500, 40), 60);
        // head behind what the server already saw consumed: clamped too.
        assert_eq!(used(100, 10, 40), 60);
        // across the wrap
        assert_eq!(used(5, u32::MAX - 10, u32::MAX - 20), 16);
    }
}
