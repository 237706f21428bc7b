//! The attachment's send-queue state (the per-socket part is the send side
//! of the socket's record, `crate::socket::SendSide`): io handles, queues
//! of closed sockets still sending, binding generations, the staging pool,
//! the debug mode and the counters.

use super::pool::Pool;
use crate::socket::{Pending, SendSide, Sockets};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// One asynchronous send: which queue (and which binding of it) and which
/// descriptor. [`IoHandle::DONE`] is a send that completed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoHandle(pub u64);

impl IoHandle {
    /// A send that was executed synchronously (the socket has no queue).
    pub const DONE: IoHandle = IoHandle(u64::MAX);

    pub(super) fn new(queue: u32, gen: u32, seq: u32) -> IoHandle {
        IoHandle((u64::from(queue) << 40) | (u64::from(gen & 0xff) << 32) | u64::from(seq))
    }

    pub(super) fn parts(self) -> (u32, u32, u32) {
        (
            (self.0 >> 40) as u32,
            ((self.0 >> 32) & 0xff) as u32,
            self.0 as u32,
        )
    }
}

/// A closed socket's queue whose sends are still going out.
pub(super) struct Orphan {
    pub queue: u32,
    pub pending: VecDeque<Pending>,
}

#[derive(Default)]
pub(super) struct Counters {
    pub sends: AtomicU64,
    pub fallbacks: AtomicU64,
    pub kicks: AtomicU64,
    pub misused: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_copied: AtomicU64,
}

/// The send-queue state of an attachment.
pub(crate) struct SendqShared {
    pub(super) orphans: Mutex<Vec<Orphan>>,
    /// Host-side binding generation of each queue (names stale io handles).
    pub(super) gens: Box<[AtomicU32]>,
    pub(super) pool: OnceLock<Result<Pool, i32>>,
    /// Debug mode: `TCPS_DEBUG_REGISTERED` at attach, or
    /// `Client::set_registered_debug`.
    pub(super) debug: AtomicBool,
    pub(super) counters: Counters,
}

/// Counters for `HostStats`.
#[derive(Clone, Copy, Default)]
pub(crate) struct SendStats {
    pub sends: u64,
    pub fallbacks: u64,
    pub kicks: u64,
    pub misuse: u64,
    pub bytes_sent: u64,
    pub bytes_copied: u64,
}

impl SendqShared {
    pub fn new(send_queues: u32) -> SendqShared {
        SendqShared {
            orphans: Mutex::new(Vec::new()),
            gens: (0..send_queues).map(|_| AtomicU32::new(0)).collect(),
            pool: OnceLock::new(),
            debug: AtomicBool::new(
                crate::settings::setting_str("TCPS_DEBUG_REGISTERED")
                    .is_some_and(|v| v.is_ok_and(|v| v != "0" && !v.is_empty())),
            ),
            counters: Counters::default(),
        }
    }

    /// Adds a socket's own counters to the attachment's (before its send
    /// side is reset).
    pub(super) fn fold_counts(&self, g: &SendSide) {
        self.counters.sends.fetch_add(g.sends, Ordering::Relaxed);
        self.counters
            .bytes_sent
            .fetch_add(g.bytes, Ordering::Relaxed);
    }

    /// The counters: the attachment's and the live sockets'.
    pub fn stats(&self, socks: &Sockets) -> SendStats {
        let c = &self.counters;
        let (mut sends, mut bytes) = (0, 0);
        socks.for_each(|_, k| {
            let g = k.send.lock();
            sends += g.sends;
            bytes += g.bytes;
        });
        SendStats {
            sends: c.sends.load(Ordering::Relaxed) + sends,
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            kicks: c.kicks.load(Ordering::Relaxed),
            misuse: c.misused.load(Ordering::Relaxed),
            bytes_sent: c.bytes_sent.load(Ordering::Relaxed) + bytes,
            bytes_copied: c.bytes_copied.load(Ordering::Relaxed),
        }
    }
}
