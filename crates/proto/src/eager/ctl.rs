//! The receive/accept ring's shared layout: its control block, the accept
//! record, the constants both sides agree on, and the pure position
//! arithmetic (see the module above for the protocol).

use crate::sync::{AtomicI32, AtomicU32, AtomicU64};

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

/// What `host_waiting` of a ring (or of the ready log, or a send queue)
/// goes up by for a thread that sleeps on its host doorbell rather than on
/// the ring's futex; the low 16 bits count futex sleepers.
pub const BELL_SLEEPER: u32 = 1 << 16;

/// A receive ring's control block, on three cache lines like the channel's.
#[repr(C, align(64))]
pub struct RecvRingCtl {
    /// Host-written: bytes (or records × 64) consumed (free-running).
    pub head: AtomicU32,
    /// Host-written: non-zero while a host thread sleeps on `tail` (futex).
    pub host_waiting: AtomicU32,
    /// Host-written: the doorbell slots of the doorbell sleepers registered
    /// here (bit `slot`; `tcps_proto::ready_log::DOORBELL_SLOTS`).
    pub bell_slots: AtomicU64,
    _pad0: [u8; 48],
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
    /// Server-written: the host's arrival number (one counter per host,
    /// in the order the server observed readiness) of the publish that
    /// made the ring non-empty; stored before that `tail` (which releases
    /// it). Hosts order readiness by it (`docs/PROTOCOL.md` §10).
    pub since: AtomicU32,
    _pad1: [u8; 44],
    /// Server-written: the socket id + 1 the ring is bound to; 0 when free.
    pub owner: AtomicU32,
    /// Server-written: `KIND_*`.
    pub kind: AtomicU32,
    /// Server-written: `Op::RecvKick` requests of this ring taken.
    pub kicks_seen: AtomicU32,
    /// Server-written: binds of this ring (free-running), stored before
    /// `owner`: a pump over a fabric tells a rebind to the same socket id
    /// from the same binding by it (`docs/ARCHITECTURE.md`, "The channel
    /// over a fabric"). Local hosts need not read it.
    pub binds: AtomicU32,
    _pad2: [u8; 48],
}

// Under loom the atomics are loom's (bigger); the block is then never mapped.
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RecvRingCtl>() == RQ_CTL_SIZE);

#[cfg(all(test, loom))]
impl RecvRingCtl {
    /// A zeroed control block on the heap, for the model tests.
    pub(crate) fn zeroed() -> Self {
        RecvRingCtl {
            head: AtomicU32::new(0),
            host_waiting: AtomicU32::new(0),
            bell_slots: AtomicU64::new(0),
            _pad0: [0; 48],
            tail: AtomicU32::new(0),
            end: AtomicU32::new(0),
            end_errno: AtomicI32::new(0),
            paused: AtomicU32::new(0),
            since: AtomicU32::new(0),
            _pad1: [0; 44],
            owner: AtomicU32::new(0),
            kind: AtomicU32::new(0),
            kicks_seen: AtomicU32::new(0),
            binds: AtomicU32::new(0),
            _pad2: [0; 48],
        }
    }
}

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
/// ... the connection is not at the server at all (*direct*, balancing:
/// `docs/ARCHITECTURE.md` "Balancing"): the record's `sock` (an `Accept`
/// completion's result) is a handle, not a socket id, and the host takes
/// the kernel socket with `ControlMsg::Direct { handle }` (SCM_RIGHTS) and
/// makes its calls on it itself. Only a host that said it takes direct
/// connections (`ControlMsg::Direct { handle: 0 }`) gets any.
pub const SETUP_DIRECT: u32 = 8;

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
/// On a listener: 0/1, whether the server may hand its new connections to
/// the host as kernel sockets when it is the bottleneck (balancing; 1 by
/// default, and no effect under `tcps server --balance off`).
pub const TCPS_BALANCE: i32 = 5;

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

/// Bytes a ring holds after the host stored `head`, and the new clamped
/// `consumed` (the server's view). Accept rings count whole records
/// (`record` = [`ACCEPT_RECORD_SIZE`]): a `head` inside a record leaves that
/// record outstanding. Byte rings pass `record` = 1.
pub fn look(tail: u32, head: u32, consumed: u32, record: u32) -> (u32, u32) {
    let mut used = used(tail, head, consumed);
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

/// Bytes published and not consumed, at most a ring's worth (the host's
/// view: a forged `tail` cannot make the host read past what the ring holds).
pub fn available(tail: u32, consumed: u32, size: u32) -> u32 {
    tail.wrapping_sub(consumed).min(size)
}

/// Whether a kick of ours is still unseen: the server's `kicks_seen` is
/// behind the kicks we sent. (Seen *ahead* of sent means late kicks of an
/// earlier binding were counted: nothing of ours is pending.)
pub fn kick_pending(seen: u32, sent: u32) -> bool {
    (seen.wrapping_sub(sent) as i32) < 0
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

    #[test]
    fn available_is_at_most_a_ring() {
        assert_eq!(available(100, 40, 4096), 60);
        assert_eq!(available(100_000, 0, 4096), 4096); // forged tail
        assert_eq!(available(5, u32::MAX - 4, 4096), 10);
    }

    #[test]
    fn kick_pending_compares_across_the_wrap() {
        assert!(!kick_pending(3, 3));
        assert!(kick_pending(2, 3));
        assert!(!kick_pending(4, 3)); // late kicks of an earlier binding
        assert!(kick_pending(u32::MAX, 0));
    }
}
