//! The atomics, fences and futex calls of the receive/accept rings and the
//! send queues: std's and the kernel's, or loom's when the crate is built
//! with `--cfg loom` for the model tests (`src/loom_tests.rs`).
//!
//! Under loom the control blocks ([`crate::eager::RecvRingCtl`],
//! [`crate::sendq::SendQueueCtl`]) hold loom atomics and are built on the
//! heap by the model tests, never mapped, so the handshakes the model checks
//! are the very functions the server and the host call. A futex wait cannot
//! be modelled: under loom `wait` returns at once (the model checks the
//! decision to sleep instead) and `wake_all` does nothing (the model checks
//! that the waker saw the sleeper).

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering};

use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout` (see [`crate::futex::wait`]).
#[cfg(not(loom))]
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    crate::futex::wait(word, expected, timeout)
}

/// Wakes every thread sleeping on `word` (see [`crate::wake_batch::wake_all`]).
#[cfg(not(loom))]
pub fn wake_all(word: &AtomicU32) {
    crate::wake_batch::wake_all(word)
}

/// Wakes at most `n` threads sleeping on `word` (see [`crate::wake_batch::wake`]).
#[cfg(not(loom))]
pub fn wake(word: &AtomicU32, n: i32) {
    crate::wake_batch::wake(word, n)
}

#[cfg(loom)]
pub fn wait(_word: &AtomicU32, _expected: u32, _timeout: Duration) {}

#[cfg(loom)]
pub fn wake(_word: &AtomicU32, _n: i32) {}

#[cfg(loom)]
pub fn wake_all(_word: &AtomicU32) {}

/// A 32-bit atomic word, std's or (under loom) loom's: handshake cores
/// over words of the mapped channel block (std atomics) take this, so the
/// loom model runs the very same functions on loom's atomics.
pub trait Word {
    fn load(&self, o: Ordering) -> u32;
    fn store(&self, v: u32, o: Ordering);
    fn fetch_add(&self, v: u32, o: Ordering) -> u32;
    fn fetch_sub(&self, v: u32, o: Ordering) -> u32;
}

macro_rules! impl_word {
    ($t:ty) => {
        impl Word for $t {
            fn load(&self, o: Ordering) -> u32 {
                <$t>::load(self, o)
            }
            fn store(&self, v: u32, o: Ordering) {
                <$t>::store(self, v, o)
            }
            fn fetch_add(&self, v: u32, o: Ordering) -> u32 {
                <$t>::fetch_add(self, v, o)
            }
            fn fetch_sub(&self, v: u32, o: Ordering) -> u32 {
                <$t>::fetch_sub(self, v, o)
            }
        }
    };
}

impl_word!(std::sync::atomic::AtomicU32);
#[cfg(loom)]
impl_word!(loom::sync::atomic::AtomicU32);
