//! The ready log: the ids of a host's sockets whose receive or accept ring
//! the server just published into (bytes, a connection, an end, an
//! unbind), in the order it published them. It lets a host's epoll (and
//! `tcps::EventQueue`) look only at the sockets that moved since its last
//! look, O(ready) instead of O(interest): the ring updates feed a per-set
//! ready list (`docs/PROTOCOL.md` §11).
//!
//! One log per host region, in the header page at [`READY_LOG_OFFSET`]:
//! [`READY_LOG_SLOTS`] socket ids and a free-running `tail`. Only the
//! worker serving the host appends; any number of host readers each keep
//! their own cursor. A reader that falls a whole log behind may have lost
//! entries: it is told so ([`ReadyLogReader::read`] returns `false`) and
//! looks at every socket once instead.
//!
//! Who writes what:
//!
//! * server: `slots` (release: a reader lapped while it read learns it),
//!   then `tail` (release: a reader that acquires `tail`
//!   sees the slot and, since the append follows the ring's own `tail`
//!   store, the ring's new state);
//! * host: `host_waiting` (a doorbell sleeper watching the whole log, in
//!   units of [`BELL_SLEEPER`]).
//!
//! The sleep handshake is the rings' Dekker pair: the host sleeps with
//! `host_waiting += BELL_SLEEPER; fence; re-check tail`; the server appends
//! with `store tail; fence; load host_waiting` (the fence is the ring
//! publish's own: [`crate::eager`]'s `wake_if_waiting`, which then reports
//! a doorbell sleeper of either the ring or the log).
//!
//! The server never reads back what it wrote except `tail`, which it
//! masks into the slot index: a host that scribbles on its log only
//! confuses its own readers.

use crate::eager::ctl::BELL_SLEEPER;
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
use crate::wake::{bell_slot, Woke};

/// Socket ids the log holds (a power of two).
#[cfg(not(loom))]
pub const READY_LOG_SLOTS: u32 = 512;
/// Under loom the log is built on the heap from loom's atomics: a few do.
#[cfg(loom)]
pub const READY_LOG_SLOTS: u32 = 4;
/// Where the log starts in the region's header page.
pub const READY_LOG_OFFSET: usize = 1024;

/// The log's shared memory: `tail` and `host_waiting` on lines of their
/// own, then the slots.
#[repr(C, align(64))]
pub struct ReadyLogCtl {
    /// Server-written: ids appended (free-running).
    pub tail: AtomicU32,
    _pad0: [u8; 60],
    /// Host-written: doorbell sleepers watching the log ([`BELL_SLEEPER`] each).
    pub host_waiting: AtomicU32,
    _pad1: [u8; 4],
    /// Host-written: the doorbell slots ([`DOORBELL_SLOTS`], one per
    /// sleeping thread) of the sleepers registered on the log.
    pub bell_slots: AtomicU64,
    _pad2: [u8; 48],
    /// Server-written: socket ids, `slots[seq % READY_LOG_SLOTS]`.
    pub slots: [AtomicU32; READY_LOG_SLOTS as usize],
}

/// Bytes of the log.
pub const READY_LOG_SIZE: usize = 128 + 4 * READY_LOG_SLOTS as usize;

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<ReadyLogCtl>() == READY_LOG_SIZE);
#[cfg(not(loom))]
const _: () = assert!(READY_LOG_OFFSET + READY_LOG_SIZE <= crate::layout::HEADER_SIZE);
// The log starts after the header's fields.
const _: () = assert!(std::mem::size_of::<crate::layout::RegionHeader>() <= READY_LOG_OFFSET);

#[cfg(all(test, loom))]
impl ReadyLogCtl {
    /// An empty log on the heap, for the model tests.
    pub(crate) fn zeroed() -> Self {
        ReadyLogCtl {
            tail: AtomicU32::new(0),
            _pad0: [0; 60],
            host_waiting: AtomicU32::new(0),
            _pad1: [0; 4],
            bell_slots: AtomicU64::new(0),
            _pad2: [0; 48],
            slots: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

/// A ring's place in its host's ready log: the log and the ring's id.
#[derive(Clone, Copy)]
pub(crate) struct LogEntry<'a> {
    pub log: &'a ReadyLogCtl,
    pub id: u32,
}

/// Appends socket `id` (server side). The caller fences and loads
/// `host_waiting` next (the ring publish's `wake_if_waiting`).
pub(crate) fn append(log: &ReadyLogCtl, id: u32) {
    // The server is the only writer: `tail` is its own value back, unless
    // the host scribbled on it, which the mask keeps inside the slots.
    let t = log.tail.load(Ordering::Relaxed);
    // Release, so that a reader whose slot load sees this id (lapping an
    // older one) also sees, after its acquire fence, the `tail` stores
    // before it, and knows it was lapped (`ReadyLogReader::read`).
    log.slots[(t & (READY_LOG_SLOTS - 1)) as usize].store(id, Ordering::Release);
    log.tail.store(t.wrapping_add(1), Ordering::Release);
}

/// The log's sleepers to wake: threads on its futex, doorbell slots (read
/// after the caller's fence).
pub(crate) fn sleepers(log: &ReadyLogCtl) -> Woke {
    Woke::read(&log.host_waiting, &log.bell_slots)
}

/// Doorbells a host may have: one per thread sleeping on it at once.
pub const DOORBELL_SLOTS: u32 = 64;

/// A host's view of its ready log. Readers keep their own cursor
/// (a `u32` sequence number, from [`tail`](Self::tail)).
#[derive(Clone, Copy)]
pub struct ReadyLogReader<'a> {
    ctl: &'a ReadyLogCtl,
}

impl<'a> ReadyLogReader<'a> {
    pub fn new(ctl: &'a ReadyLogCtl) -> Self {
        ReadyLogReader { ctl }
    }

    /// Ids appended so far (acquire: the rings they name are published).
    pub fn tail(&self) -> u32 {
        self.ctl.tail.load(Ordering::Acquire)
    }

    /// Pushes the ids appended since `*cursor` onto `out` and moves the
    /// cursor to the end. `false` when some were overwritten before they
    /// were read (the reader fell a whole log behind, or was lapped while reading): `out` may then
    /// miss ids, and the caller must look at everything once.
    pub fn read(&self, cursor: &mut u32, out: &mut Vec<u32>) -> bool {
        let tail = self.tail();
        let from = *cursor;
        *cursor = tail;
        let n = tail.wrapping_sub(from);
        // A whole log behind: the append of `tail` may be overwriting the
        // slot of `from` now.
        if n >= READY_LOG_SLOTS {
            return false;
        }
        for seq in 0..n {
            let slot = (from.wrapping_add(seq) & (READY_LOG_SLOTS - 1)) as usize;
            out.push(self.ctl.slots[slot].load(Ordering::Relaxed));
        }
        // The slots read above are intact unless the server lapped them
        // meanwhile. The append of sequence `s` overwrites the slot of
        // `s - SLOTS` while `tail` is still `s`; the first slot read (of
        // `from`) goes first, when `s = from + SLOTS`. A slot load that saw
        // such an id synchronizes (its release store, this acquire fence)
        // with the append, so the load below sees `tail >= from + SLOTS`.
        fence(Ordering::Acquire);
        let now = self.ctl.tail.load(Ordering::Relaxed);
        now.wrapping_sub(from) < READY_LOG_SLOTS
    }

    /// Registers a sleeper on doorbell `slot` on the log and fences
    /// (Dekker against the append's "store tail; fence; load
    /// host_waiting"): re-check [`tail`](Self::tail) after this, then
    /// sleep on the doorbell.
    pub fn bell_wait_prepare(&self, slot: u32) {
        bell_slot(&self.ctl.bell_slots, slot, true);
        self.ctl
            .host_waiting
            .fetch_add(BELL_SLEEPER, Ordering::AcqRel);
        fence(Ordering::SeqCst);
    }

    /// Unregisters a sleeper of doorbell `slot`.
    pub fn bell_wait_done(&self, slot: u32) {
        self.ctl
            .host_waiting
            .fetch_sub(BELL_SLEEPER, Ordering::AcqRel);
        bell_slot(&self.ctl.bell_slots, slot, false);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn log() -> Box<ReadyLogCtl> {
        // SAFETY: ReadyLogCtl is atomics and bytes, all valid when zero.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn reads_what_was_appended_since_the_cursor() {
        let l = log();
        let r = ReadyLogReader::new(&l);
        let mut cur = r.tail();
        for id in [3, 7, 3] {
            append(&l, id);
        }
        let mut out = Vec::new();
        assert!(r.read(&mut cur, &mut out));
        assert_eq!(out, vec![3, 7, 3]);
        out.clear();
        assert!(r.read(&mut cur, &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn a_reader_a_whole_log_behind_is_told() {
        let l = log();
        let r = ReadyLogReader::new(&l);
        let mut cur = 0;
        for id in 0..READY_LOG_SLOTS + 1 {
            append(&l, id);
        }
        let mut out = Vec::new();
        assert!(!r.read(&mut cur, &mut out));
        // The cursor moved to the end: the next read is whole again.
        append(&l, 9);
        out.clear();
        assert!(r.read(&mut cur, &mut out));
        assert_eq!(out, vec![9]);
    }

    #[test]
    fn a_scribbled_tail_stays_inside_the_slots() {
        let l = log();
        l.tail.store(u32::MAX, Ordering::Relaxed);
        append(&l, 5);
        append(&l, 6);
        assert_eq!(l.tail.load(Ordering::Relaxed), 1);
        assert_eq!(
            l.slots[(READY_LOG_SLOTS - 1) as usize].load(Ordering::Relaxed),
            5
        );
        assert_eq!(l.slots[0].load(Ordering::Relaxed), 6);
    }
}
