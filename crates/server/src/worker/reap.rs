//! Detaching hosts that hung up or broke the protocol. A host that hung up
//! (its process exited, or closed its channel) with asynchronous sends
//! still queued first *drains*: its sockets close as close(2) at exit
//! closes kernel sockets (the queued bytes go out, then the FIN), and the
//! host stays in the worker's table, its region mapped and its sockets
//! driven by their engine events, until the last job finished or
//! [`DRAIN_LIMIT`] passed. Its channels are not read any more (`doomed`).

use super::Worker;
use crate::calls;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Longest a hung-up host's queued sends may take to go out (a peer that
/// does not read must not hold its memory and slot for ever); what is left
/// then is dropped with its sockets.
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(10);

impl Worker {
    /// Detaches doomed hosts: closes their sockets. A host that hung up
    /// drains first (see the module comment) unless `force` (a hot
    /// upgrade carries no such host).
    pub(super) fn reap_doomed(&mut self, force: bool) {
        if !self.hosts.iter().any(|(_, h)| h.doomed.is_some()) {
            return;
        }
        let now = Instant::now();
        for hkey in self.hosts.keys() {
            let Some(why) = self.hosts.get(hkey).and_then(|h| h.doomed.clone()) else {
                continue;
            };
            if !force && why == "detached" && self.still_draining(hkey, now) {
                continue;
            }
            self.detach(hkey, &why);
        }
    }

    /// Whether hung-up host `hkey` still has queued sends to let out: its
    /// sockets are closed for exit the first time (`calls::close_for_exit`).
    fn still_draining(&mut self, hkey: usize, now: Instant) -> bool {
        let Some((host, mut cx)) = self.host_and_cx(hkey) else {
            return false;
        };
        let Some(until) = host.draining_until else {
            let draining =
                super::guarded(host, "close at exit", |h| calls::close_for_exit(&mut cx, h))
                    .unwrap_or(false);
            if draining {
                host.draining_until = Some(now + DRAIN_LIMIT);
                debug!(
                    host = host.id,
                    pid = host.pid,
                    sockets = host.sockets.len(),
                    "host hung up with sends queued: they go out first"
                );
            }
            return draining;
        };
        if host.sockets.len() == 0 {
            return false;
        }
        if now < until {
            return true;
        }
        warn!(
            host = host.id,
            pid = host.pid,
            sockets = host.sockets.len(),
            limit = ?DRAIN_LIMIT,
            "queued sends of a host that hung up did not go out in time: dropped"
        );
        false
    }

    /// Removes host `hkey` and closes what is left of its sockets.
    fn detach(&mut self, hkey: usize, why: &str) {
        let Some(mut host) = self.hosts.remove(hkey) else {
            return;
        };
        self.awake.removed(hkey);
        let sockets = host.sockets.len();
        calls::close_all(self.engine.as_mut(), &self.shared, &mut host);
        // Its sleepers' wakes are made while its region is mapped.
        self.submit_wakes();
        self.engine.flush();
        self.engine.forget(host.control.as_raw_fd(), 0);
        self.engine.forget(host.doorbell.as_raw_fd(), 0);
        self.shared.stats.detach(&host);
        self.shared.host_gone(host.uid);
        if why == "detached" {
            info!(host = host.id, pid = host.pid, sockets, registrations = host.registry.count(), stats = %host.stats, "host detached; its sockets are closed");
        } else {
            warn!(host = host.id, pid = host.pid, sockets, reason = %why, "host cut off for a protocol violation");
        }
    }
}
