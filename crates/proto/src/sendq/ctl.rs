//! The send queue's shared layout: its control block, the descriptor and
//! the pure sequence arithmetic (see the module above for the protocol).

use crate::sync::{AtomicI32, AtomicU32, AtomicU64};

/// Bytes of a send queue's control block.
pub const SQ_CTL_SIZE: usize = 192;

/// A send queue's control block, on three cache lines so that the host's
/// per-send path writes one line and reads only one the server rarely writes.
#[repr(C, align(64))]
pub struct SendQueueCtl {
    /// Host-written: descriptors published (free-running).
    pub head: AtomicU32,
    /// Host-written: non-zero while a host thread sleeps on `done` (futex).
    pub host_waiting: AtomicU32,
    _pad0: [u8; 56],
    /// Server-written: descriptors finished, sent or failed (free-running).
    /// The futex word of a host waiting for credits or an io.
    pub done: AtomicU32,
    /// Server-written: errno of the first descriptor that failed (0: none).
    /// Every later descriptor fails too (the stream has a hole).
    pub error: AtomicI32,
    /// Server-written: index of that descriptor.
    pub error_seq: AtomicU32,
    /// Server-written (debug mode): descriptors whose bytes changed between
    /// submit and send (`DESC_CHECKSUM`).
    pub misuse: AtomicU32,
    /// Server-written: bytes sent from this queue.
    pub bytes_done: AtomicU64,
    _pad1: [u8; 40],
    /// Server-written: non-zero while the server watches `head` (no kick needed).
    pub active: AtomicU32,
    /// Server-written: `Op::AsyncKick` requests of this queue taken.
    pub kicks_seen: AtomicU32,
    /// Server-written: the socket id + 1 the queue is bound to; 0 when free
    /// (after the socket was closed and its sends finished).
    pub owner: AtomicU32,
    _pad2: [u8; 52],
}

// Under loom the atomics are loom's (bigger); the block is then never mapped.
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<SendQueueCtl>() == SQ_CTL_SIZE);

#[cfg(all(test, loom))]
impl SendQueueCtl {
    /// A zeroed control block on the heap, for the model tests.
    pub(crate) fn zeroed() -> Self {
        SendQueueCtl {
            head: AtomicU32::new(0),
            host_waiting: AtomicU32::new(0),
            _pad0: [0; 56],
            done: AtomicU32::new(0),
            error: AtomicI32::new(0),
            error_seq: AtomicU32::new(0),
            misuse: AtomicU32::new(0),
            bytes_done: AtomicU64::new(0),
            _pad1: [0; 40],
            active: AtomicU32::new(0),
            kicks_seen: AtomicU32::new(0),
            owner: AtomicU32::new(0),
            _pad2: [0; 52],
        }
    }
}

/// One asynchronous send: `len` bytes at `off` in registration `mem`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendDesc {
    pub off: u64,
    pub len: u32,
    /// Registration handle (see [`crate::handshake::ControlMsg::Register`]).
    pub mem: u16,
    /// `DESC_*` flags.
    pub flags: u16,
    /// With `DESC_CHECKSUM`: [`checksum`] of the bytes when they were submitted.
    pub checksum: u64,
    pub reserved: u64,
}

const _: () = assert!(std::mem::size_of::<SendDesc>() == 32);

/// `MSG_MORE`: more data follows (the server passes it to `send(2)`).
pub const DESC_MORE: u16 = 1;
/// Debug mode: the server checks the bytes it sends against `checksum` and
/// counts a mismatch in `misuse` (the host wrote into a buffer in flight).
pub const DESC_CHECKSUM: u16 = 2;
pub const DESC_FLAGS: u16 = DESC_MORE | DESC_CHECKSUM;

/// Largest registration handle + 1 (handles are small host-chosen integers).
pub const MAX_REGISTRATIONS: u32 = 1024;

/// Whether descriptor `seq` has finished, given `done` (free-running).
pub fn is_done(seq: u32, done: u32) -> bool {
    done.wrapping_sub(seq).wrapping_sub(1) < (1 << 31)
}

/// FNV-1a, 64 bit: the debug-mode checksum of a registered buffer.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_compares_across_the_wrap() {
        assert!(!is_done(0, 0));
        assert!(is_done(0, 1));
        assert!(is_done(u32::MAX, 0));
        assert!(!is_done(5, 3));
        assert!(is_done(3, 5));
    }

    #[test]
    fn checksum_sees_a_changed_byte() {
        let a = vec![7u8; 1000];
        let mut b = a.clone();
        assert_eq!(checksum(&a), checksum(&b));
        b[999] = 8;
        assert_ne!(checksum(&a), checksum(&b));
    }
}
