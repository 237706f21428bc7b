//! Whom a publish found waiting: the sleepers a ring, a send queue or the
//! ready log counts in its `host_waiting` (futex sleepers, plus
//! [`BELL_SLEEPER`] per doorbell sleeper) and names in its `bell_slots`
//! (the doorbells of those sleepers). The server wakes futex sleepers
//! with its pass's submission ([`crate::wake_batch`]) and rings the named
//! doorbells once per pass.

use crate::eager::ctl::BELL_SLEEPER;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Whom a publish found waiting on a ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woke {
    /// A thread futex-waiting on the ring: woken.
    pub thread: bool,
    /// A thread sleeping on its host doorbell: the server must ring it.
    pub bell: bool,
    /// The doorbells to ring (bit `slot`), as the sleepers registered
    /// them (host-written: only a hint of which of the host's own
    /// doorbells to ring).
    pub bells: u64,
}

impl Woke {
    /// Reads whom a ring's (or queue's, or the ready log's) `host_waiting`
    /// and `bell_slots` name, after the publisher's fence. Acquire: a
    /// sleeper sets its slot's bit before it counts itself in, so the bit
    /// is seen with the count.
    pub(crate) fn read(host_waiting: &AtomicU32, bell_slots: &AtomicU64) -> Woke {
        let mut w = Woke::of(host_waiting.load(Ordering::Acquire));
        if w.bell {
            w.bells = bell_slots.load(Ordering::Relaxed);
        }
        w
    }

    /// Adds whom another word named.
    pub(crate) fn join(&mut self, other: Woke) {
        self.thread |= other.thread;
        self.bell |= other.bell;
        self.bells |= other.bells;
    }

    /// Whom a `host_waiting` count (futex sleepers, plus `BELL_SLEEPER`
    /// per doorbell sleeper) names.
    pub fn of(host_waiting: u32) -> Woke {
        Woke {
            thread: host_waiting & (BELL_SLEEPER - 1) != 0,
            bell: host_waiting >= BELL_SLEEPER,
            bells: 0,
        }
    }

    /// Somebody was waiting.
    pub fn any(self) -> bool {
        self.thread || self.bell
    }
}

/// Sets (before registering: release, the count's acquire-reader sees it)
/// or clears (after unregistering) a doorbell slot's bit in a
/// `bell_slots` word.
pub(crate) fn bell_slot(word: &AtomicU64, slot: u32, on: bool) {
    let bit = 1u64 << (slot % 64);
    if on {
        word.fetch_or(bit, Ordering::Release);
    } else {
        word.fetch_and(!bit, Ordering::Release);
    }
}
