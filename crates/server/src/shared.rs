//! What the acceptor, the workers and the metrics thread share.

use crate::admission::AddrCounts;
use crate::stats::Board;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// State shared by the acceptor and the workers.
#[derive(Default)]
pub struct Shared {
    pub stopping: AtomicBool,
    /// Hosts attached (admission control counts against --max-hosts).
    pub hosts: AtomicUsize,
    /// Hosts attached per uid (`--max-hosts-per-uid`).
    pub hosts_per_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    pub refused_hosts: AtomicU64,
    /// Live accepted connections per client address (--max-conns-per-addr).
    pub conns_per_addr: AddrCounts,
    /// Hosts' counters and queue depths as the workers last published them (`tcps stat`).
    pub stats: Board,
}

impl Shared {
    /// A host left (detached, cut off, or dropped): its slot and its uid's
    /// slot are free again.
    pub fn host_gone(&self, uid: u32) {
        self.hosts.fetch_sub(1, Ordering::AcqRel);
        let mut per_uid = self.hosts_per_uid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per_uid.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_uid.remove(&uid);
            }
        }
    }

    /// The `tcps stat` reply for `uid` (see `stats::report`).
    pub fn stat_report(&self, uid: u32) -> serde_json::Value {
        crate::stats::report(
            &self.stats,
            self.hosts.load(Ordering::Relaxed),
            self.refused_hosts.load(Ordering::Relaxed),
            uid,
        )
    }
}
