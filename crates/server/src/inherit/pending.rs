//! The pending snapshots, server-wide, and what bounds their cost.
//!
//! Every control message's cost is bounded or charged against a budget,
//! and /proc is not read per message (`docs/SECURITY.md`):
//! - a `Fork`'s dup() of every socket is charged against its user's
//!   descriptors per second ([`DupRate`]);
//! - `Fork`, `Forked` and `Inherit` look snapshots up in memory only (a
//!   claim reads /proc for the one snapshot its nonce names);
//! - whether a snapshot's child (or parent) still runs is read from /proc
//!   by the workers' periodic sweep, a few snapshots per pass in turn
//!   ([`SWEEP_CHECKS`]), so its cost does not grow with what users hold.

use super::snapshot::Snapshot;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Snapshots whose owner a sweep checks in /proc at most (round robin).
const SWEEP_CHECKS: usize = 8;

#[derive(Default)]
pub(super) struct Pending {
    pub snaps: Vec<Snapshot>,
    /// Where the next sweep's /proc checks start.
    cursor: usize,
    /// Per uid: descriptors its snapshots may still dup() now.
    rates: HashMap<u32, DupRate>,
}

/// Snapshots waiting for their child, server-wide (the parent and the child
/// may be served by different workers).
static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// The pending snapshots (never reads /proc).
pub(super) fn lock() -> std::sync::MutexGuard<'static, Option<Pending>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the pending snapshots (never reads /proc).
pub(super) fn with<T>(f: impl FnOnce(&mut Pending) -> T) -> T {
    f(lock().get_or_insert_with(Pending::default))
}

/// Drops snapshots nobody can claim (from a worker's periodic sweep), so
/// their descriptors are closed even if no host forks or inherits again.
pub fn sweep() {
    // Never wait for the lock from a worker's loop: another worker holding
    // it is purging already, or will on its own next sweep.
    if let Ok(mut p) = PENDING.try_lock() {
        if let Some(p) = p.as_mut() {
            p.sweep();
        }
    }
}

impl Pending {
    /// Drops expired snapshots (no /proc), then checks up to
    /// [`SWEEP_CHECKS`] owners in /proc, resuming where the last pass
    /// stopped; forgets the rates of users back at their full allowance.
    fn sweep(&mut self) {
        let now = Instant::now();
        self.rates.retain(|_, r| !r.full(now));
        self.snaps.retain(|s| !s.expired());
        let mut i = self.cursor;
        for _ in 0..SWEEP_CHECKS.min(self.snaps.len()) {
            if self.snaps.is_empty() {
                break;
            }
            i %= self.snaps.len();
            if self.snaps[i].owner_running() {
                i += 1;
            } else {
                // The last one moves here: checked next.
                self.snaps.swap_remove(i);
            }
        }
        self.cursor = i;
    }

    /// Charges `n` dup()s to user `uid` (false: over its rate, nothing
    /// charged). `per_sec` 0: no limit.
    pub fn charge(&mut self, uid: u32, n: usize, per_sec: usize, burst: usize) -> bool {
        if per_sec == 0 {
            return true;
        }
        let r = self
            .rates
            .entry(uid)
            .or_insert_with(|| DupRate::new(per_sec, burst));
        r.take(n, Instant::now())
    }
}

/// A token bucket of dup()s: `per_sec` come back each second, up to
/// `cap` (at least one whole snapshot of the user's budget).
pub(super) struct DupRate {
    tokens: f64,
    per_sec: f64,
    cap: f64,
    at: Instant,
}

impl DupRate {
    fn new(per_sec: usize, cap: usize) -> DupRate {
        let cap = cap.max(per_sec) as f64;
        DupRate {
            tokens: cap,
            per_sec: per_sec as f64,
            cap,
            at: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_sec).min(self.cap);
        self.at = now;
    }

    fn full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.cap
    }

    fn take(&mut self, n: usize, now: Instant) -> bool {
        self.refill(now);
        if self.tokens < n as f64 {
            return false;
        }
        self.tokens -= n as f64;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dup_rate_refills_per_second_up_to_its_cap() {
        let t = Instant::now();
        let mut r = DupRate::new(1000, 4096);
        r.at = t;
        assert!(r.take(4096, t), "a whole budget at once");
        assert!(!r.take(1, t), "then nothing");
        assert!(!r.take(600, t + Duration::from_millis(500)));
        assert!(r.take(500, t + Duration::from_millis(500)));
        assert!(r.full(t + Duration::from_secs(60)), "capped");
        assert!(!r.take(4097, t + Duration::from_secs(60)));
    }
}
