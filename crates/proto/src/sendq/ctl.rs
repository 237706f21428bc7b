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
    /// Host-written: the doorbell slots of the doorbell sleepers registered
    /// here (as on a receive ring).
    pub bell_slots: AtomicU64,
    _pad0: [u8; 48],
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
    /// Server-written: binds of this queue (free-running), stored before
    /// `owner`: over a fabric a queue bound again to the same socket id
    /// shows a new value here (the host's pump then restarts its `head`).
    pub binds: AtomicU32,
    _pad2: [u8; 48],
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
            bell_slots: AtomicU64::new(0),
            _pad0: [0; 48],
            done: AtomicU32::new(0),
            error: AtomicI32::new(0),
            error_seq: AtomicU32::new(0),
            misuse: AtomicU32::new(0),
            bytes_done: AtomicU64::new(0),
            _pad1: [0; 40],
            active: AtomicU32::new(0),
            kicks_seen: AtomicU32::new(0),
            owner: AtomicU32::new(0),
            binds: AtomicU32::new(0),
            _pad2: [0; 48],
        }
    }
}

/// One asynchronous send: `len` bytes at `off` in registration `mem`, or
/// with [`DESC_FILE`] `len` bytes at offset `off` of file `file` (a file the
/// host handed over with [`crate::handshake::ControlMsg::FileOpen`]; `mem`
/// is then 0).
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
    /// With `DESC_FILE`: the file handle (`ControlMsg::FileOpen`); else 0.
    pub file: u32,
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<SendDesc>() == 32);

/// `MSG_MORE`: more data follows (the server passes it to `send(2)`).
pub const DESC_MORE: u16 = 1;
/// Debug mode: the server checks the bytes it sends against `checksum` and
/// counts a mismatch in `misuse` (the host wrote into a buffer in flight).
pub const DESC_CHECKSUM: u16 = 2;
/// A file range (sendfile): `len` bytes at offset `off` of file `file`,
/// sent by the server from its own copy of the file, in order with the
/// byte sends around it. Not with `DESC_CHECKSUM`.
pub const DESC_FILE: u16 = 4;
pub const DESC_FLAGS: u16 = DESC_MORE | DESC_CHECKSUM | DESC_FILE;

/// Largest `len` of a file descriptor (the server's sendfile limit).
pub const MAX_FILE_LEN: u32 = 1 << 30;

/// What a copied descriptor asks for, once checked
/// ([`SendDesc::entry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `len` bytes at `off` of registration `mem` (the server still
    /// resolves the range against its own registrations).
    Bytes { mem: u16, off: u64, len: u32 },
    /// `len` bytes at `off` of file `file` (the server still looks the
    /// handle up among the files this host handed over).
    File { file: u32, off: u64, len: u32 },
}

impl SendDesc {
    /// Checks the shape of a descriptor the host wrote (known flags,
    /// non-empty; a byte range names a possible registration; a file range
    /// has no checksum, `mem` 0, at most [`MAX_FILE_LEN`] bytes and an end
    /// that fits an `off_t`). `None`: malformed.
    pub fn entry(&self) -> Option<Entry> {
        if self.flags & !DESC_FLAGS != 0 || self.len == 0 {
            return None;
        }
        if self.flags & DESC_FILE == 0 {
            return (u32::from(self.mem) < MAX_REGISTRATIONS).then_some(Entry::Bytes {
                mem: self.mem,
                off: self.off,
                len: self.len,
            });
        }
        let end_fits = self
            .off
            .checked_add(u64::from(self.len))
            .is_some_and(|end| end <= i64::MAX as u64);
        let ok = self.flags & DESC_CHECKSUM == 0
            && self.mem == 0
            && self.len <= MAX_FILE_LEN
            && end_fits;
        ok.then_some(Entry::File {
            file: self.file,
            off: self.off,
            len: self.len,
        })
    }
}

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

    fn file(off: u64, len: u32) -> SendDesc {
        SendDesc {
            off,
            len,
            flags: DESC_FILE | DESC_MORE,
            file: 7,
            ..SendDesc::default()
        }
    }

    #[test]
    fn entries_are_classified_and_checked() {
        let bytes = SendDesc {
            off: 64,
            len: 10,
            mem: 3,
            flags: DESC_MORE | DESC_CHECKSUM,
            ..SendDesc::default()
        };
        assert_eq!(
            bytes.entry(),
            Some(Entry::Bytes {
                mem: 3,
                off: 64,
                len: 10
            })
        );
        assert_eq!(
            file(100, 5).entry(),
            Some(Entry::File {
                file: 7,
                off: 100,
                len: 5
            })
        );
        let max_end = i64::MAX as u64 - u64::from(MAX_FILE_LEN);
        assert!(
            file(max_end, MAX_FILE_LEN).entry().is_some(),
            "end at i64::MAX"
        );
        for bad in [
            file(0, 0),                // empty
            file(0, MAX_FILE_LEN + 1), // too long
            file(i64::MAX as u64, 1),  // end past off_t
            file(u64::MAX, 1),         // offset overflows
            SendDesc {
                mem: 1,
                ..file(0, 1)
            }, // a file range names no registration
            SendDesc {
                flags: DESC_FILE | DESC_CHECKSUM,
                ..file(0, 1)
            },
            SendDesc {
                flags: DESC_FILE | 0x80,
                ..file(0, 1)
            },
        ] {
            assert_eq!(bad.entry(), None, "{bad:?}");
        }
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
