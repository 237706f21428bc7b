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
    /// Remote hosts' fabric links as the fabric thread last published them.
    pub links: crate::links::LinkBoard,
    /// A hot upgrade under way, and the upgrades so far (`upgrade`).
    pub upgrade: UpgradeBoard,
}

/// What the workers do about a hot upgrade once they paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Verdict {
    /// Still deciding: the workers wait.
    #[default]
    Pending,
    /// Refused or failed before exec: the workers resume.
    Resume,
}

/// Where the thread that upgrades (`upgrade::exec`) and the workers meet:
/// the request, each worker's report (its hosts' records as JSON, or why
/// it cannot be carried), the verdict, and the control thread's gate (held
/// by the upgrade while it runs: no host attaches meanwhile; connections
/// wait in the listener's backlog, which the new server inherits).
#[derive(Default)]
pub struct UpgradeBoard {
    pub requested: AtomicBool,
    pub reports: std::sync::Mutex<Vec<(usize, Result<serde_json::Value, String>)>>,
    pub verdict: std::sync::Mutex<Verdict>,
    pub verdict_changed: std::sync::Condvar,
    pub gate: std::sync::Mutex<()>,
    /// Upgrades done (carried across them), refused, and the last refusal.
    pub done: AtomicU64,
    pub refused: AtomicU64,
    pub last_refusal: std::sync::Mutex<String>,
}

impl UpgradeBoard {
    /// `tcps stat`'s `server.upgrade`.
    pub fn to_json(&self) -> serde_json::Value {
        let last = self
            .last_refusal
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        serde_json::json!({
            "done": self.done.load(Ordering::Relaxed),
            "refused": self.refused.load(Ordering::Relaxed),
            "last_refusal": last,
        })
    }
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
        let mut v = crate::stats::report(
            &self.stats,
            self.hosts.load(Ordering::Relaxed),
            self.refused_hosts.load(Ordering::Relaxed),
            uid,
        );
        v["server"]["upgrade"] = self.upgrade.to_json();
        // Links are shown as hosts are: all to root and the server's user.
        let sees_all = crate::stats::sees_all_hosts(uid);
        v["fabric"] = self.links.report(|u| sees_all || u == uid);
        v
    }
}
