//! A worker's part in a hot upgrade (`crate::upgrade`): pausing (answer
//! parked calls, let sends at the engine finish, settle receives and
//! accepts, report its hosts' records, wait for the verdict) and, in the
//! new binary, taking its hosts back from the record.

use super::Worker;
use crate::shared::Verdict;
use crate::upgrade::quiesce;
use crate::upgrade::record::HostRecord;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long queued sends, connects and shutdowns may take to finish
/// before the upgrade is refused (a peer that does not read).
const DRAIN: Duration = Duration::from_secs(2);

impl Worker {
    /// The upgrading thread asked the workers to pause: report this
    /// worker's hosts and wait. Returns when the upgrade was refused (the
    /// worker goes on); on success the process execs meanwhile.
    pub(super) fn upgrade_pause(&mut self) {
        self.adopt_hosts();
        for hkey in self.hosts.keys() {
            if let Some(h) = self.hosts.get_mut(hkey) {
                quiesce::answer_parked(h);
            }
        }
        self.wake_hosts();
        let drained = self.drain_writers();
        for hkey in self.hosts.keys() {
            self.for_host(hkey, "upgrade settle", quiesce::settle);
        }
        self.wake_hosts();
        self.engine.flush();
        // Hosts that left or broke the protocol meanwhile are not carried
        // (nor those whose sends still drain: `drain_writers` gave them
        // their time).
        self.reap_doomed(true);
        let report = drained.and_then(|()| {
            let hosts: Result<Vec<HostRecord>, String> =
                self.hosts.iter().map(|(_, h)| quiesce::record(h)).collect();
            serde_json::to_value(hosts?).map_err(|e| e.to_string())
        });
        let board = &self.shared.upgrade;
        if let Ok(mut r) = board.reports.lock() {
            r.push((self.index, report));
        }
        let mut v = board.verdict.lock().unwrap_or_else(|e| e.into_inner());
        while *v == Verdict::Pending {
            v = board
                .verdict_changed
                .wait(v)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(v);
        info!(worker = self.index, "hot upgrade off: the worker resumes");
        for hkey in self.hosts.keys() {
            self.for_host(hkey, "upgrade resume", quiesce::resume);
        }
        self.engine.flush();
    }

    /// Runs the engine until no host is busy (`quiesce::busy`: writers,
    /// sends in flight, direct connections or replies not taken; bounded
    /// by [`DRAIN`]).
    fn drain_writers(&mut self) -> Result<(), String> {
        let start = Instant::now();
        while self.hosts.iter().any(|(_, h)| quiesce::busy(h)) {
            if start.elapsed() >= DRAIN {
                return Err("sends queued at the server did not finish within 2 s (a peer that does not read?), or direct connections or control replies were not taken".into());
            }
            self.poll_engine(Some(Duration::from_millis(1)));
            self.fire_timers(Instant::now());
            self.wake_hosts();
            self.engine.flush();
        }
        Ok(())
    }

    /// The new binary: takes back the hosts the old one recorded for this
    /// worker; its engine watches and fills them from now on.
    pub fn restore(&mut self, records: Vec<HostRecord>) -> std::io::Result<()> {
        for r in records {
            let host = crate::upgrade::restore::host(r, &self.cfg, &self.shared)?;
            let hkey = self.install(host);
            self.for_host(hkey, "upgrade restore", quiesce::resume);
        }
        self.engine.flush();
        if self.hosts.len() > 0 {
            info!(
                worker = self.index,
                hosts = self.hosts.len(),
                "hosts carried across the upgrade"
            );
        }
        Ok(())
    }

    /// Whether an upgrade asks this worker to pause.
    pub(super) fn upgrade_requested(&self) -> bool {
        let asked = self.shared.upgrade.requested.load(Ordering::Relaxed);
        if asked && self.shared.stopping.load(Ordering::Relaxed) {
            warn!("an upgrade asked during shutdown is ignored");
            return false;
        }
        asked
    }
}
