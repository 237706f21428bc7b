//! The server's descriptors held for hosts' sockets: a per-uid budget and
//! a reserve, so one user filling the server's descriptor table cannot
//! make another host's accept (or the server's own attach) fail.
//!
//! Every socket the server keeps for a host is one of its descriptors
//! (`RLIMIT_NOFILE`). Of that limit, [`RESERVE`] (or a sixteenth, if more)
//! is kept for attaching hosts (control socket, region memfd, doorbell),
//! accepting, files and snapshots; the rest is what all hosts' sockets may
//! hold together, and a user other than root may hold at most
//! `--max-fds-per-uid` of it (default half). A socket beyond either is
//! refused with EMFILE, the host's own limit as the kernel's would be
//! (`calls::check_quota`); nobody else sees it.
//!
//! A socket's descriptor is counted while its `Sock` lives ([`Charge`]
//! dropped with it), whichever way it goes: close, detach, export.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Descriptors kept out of the hosts' sockets' reach at least.
pub const RESERVE: usize = 256;

/// What all hosts' sockets may hold (no limit until `init`).
static TOTAL_MAX: AtomicUsize = AtomicUsize::new(usize::MAX);
/// What one non-root user's may.
static PER_UID_MAX: AtomicUsize = AtomicUsize::new(usize::MAX);
static TOTAL: AtomicUsize = AtomicUsize::new(0);
static PER_UID: Mutex<Option<HashMap<u32, usize>>> = Mutex::new(None);

/// The budgets for a server whose descriptor limit is `nofile`: the
/// hosts' total and a non-root user's share (`per_uid` 0: half the total;
/// never more than it).
pub fn budgets(nofile: usize, per_uid: usize) -> (usize, usize) {
    let total = nofile.saturating_sub(RESERVE.max(nofile / 16));
    let per_uid = if per_uid == 0 {
        total / 2
    } else {
        per_uid.min(total)
    };
    (total, per_uid)
}

/// Sets the budgets from the server's (raised) `RLIMIT_NOFILE`; returns
/// them for the log.
pub fn init(per_uid: usize) -> (usize, usize) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reading into a valid rlimit struct.
    let nofile = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
    } else {
        usize::MAX
    };
    let (total, per_uid) = budgets(nofile, per_uid);
    TOTAL_MAX.store(total, Ordering::Relaxed);
    PER_UID_MAX.store(per_uid, Ordering::Relaxed);
    (total, per_uid)
}

fn held() -> std::sync::MutexGuard<'static, Option<HashMap<u32, usize>>> {
    PER_UID.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a host of `uid` may have one more socket: `Err(what)` names the
/// budget it is at.
pub fn room(uid: u32) -> Result<(), &'static str> {
    if TOTAL.load(Ordering::Relaxed) >= TOTAL_MAX.load(Ordering::Relaxed) {
        return Err("the server's descriptors for hosts' sockets (RLIMIT_NOFILE less a reserve)");
    }
    let mine = held()
        .as_ref()
        .and_then(|m| m.get(&uid).copied())
        .unwrap_or(0);
    if uid != 0 && mine >= PER_UID_MAX.load(Ordering::Relaxed) {
        return Err("the user's descriptors (--max-fds-per-uid)");
    }
    Ok(())
}

/// One socket descriptor counted against `uid` until dropped.
#[derive(Debug)]
pub struct Charge {
    uid: u32,
}

impl Charge {
    /// Counts a descriptor the server holds now (checked with [`room`]
    /// before it was made, where it could be refused).
    pub fn new(uid: u32) -> Charge {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        *held()
            .get_or_insert_with(HashMap::new)
            .entry(uid)
            .or_insert(0) += 1;
        Charge { uid }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        TOTAL.fetch_sub(1, Ordering::Relaxed);
        let mut g = held();
        if let Some(m) = g.as_mut() {
            if let Some(n) = m.get_mut(&self.uid) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&self.uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_keep_a_reserve_and_halve_for_a_user() {
        assert_eq!(budgets(1024, 0), (768, 384));
        assert_eq!(budgets(65536, 0), (61440, 30720));
        assert_eq!(budgets(65536, 1000), (61440, 1000));
        assert_eq!(budgets(1024, 5000), (768, 768), "never above the total");
        assert_eq!(budgets(100, 0), (0, 0));
    }
}
