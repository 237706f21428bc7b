//! fork() support: a forked child inherits its parent's sockets.
//!
//! The server keeps sockets per attached host, so a child process (which
//! attaches on its own) would otherwise lose the sockets it inherited as
//! fds. Before fork(2) the parent asks for a **snapshot** (`ControlMsg::Fork`
//! with a random nonce): every socket of the host is dup()ed as it is at
//! that moment, exactly the kernel's fork semantics (both processes then
//! share each socket; either may close its copy). The child attaches and
//! presents the nonce (`ControlMsg::Inherit`); the server moves the
//! snapshot into the child's table under the same socket ids.
//!
//! Bytes the server already read ahead for the parent (process-ahead,
//! `docs/PROTOCOL.md` §10) are no longer in the kernel socket, so the
//! snapshot carries them: the unread part of a receive ring (from the server's
//! `consumed`, clamped with the host's `head`, to `tail`) or of a pull
//! buffer, with the end of stream if one was read. The child's socket starts
//! with them in a pull buffer (its `Recv`s are answered from there first,
//! then from the kernel). They also stay where they were for the parent:
//! both processes share the socket as under the kernel, but bytes read
//! ahead before the fork reach both if both read them (under the kernel,
//! whichever reads first gets them). A parent's receive ring stops receiving
//! ahead at the snapshot (`END_STOPPED` after its bytes, its policy `Off`),
//! so later bytes stay in the kernel for whichever process reads; a pull
//! buffer is left as it is. A classic fork-per-connection server (accept,
//! fork, the child reads the request, the parent closes its copy) thus
//! finds the request in the child.
//!
//! exec(2) is the other way across process images: `ControlMsg::Export`
//! takes one socket out of the host's table and hands the kernel socket
//! itself to the host, which puts it where its placeholder fd was, so the
//! new program image gets a plain kernel socket ([`export`]).
//!
//! Right after fork(2) the parent names the child (`ControlMsg::Forked`,
//! [`forked`]; child 0: the fork failed, the snapshot is dropped at once).
//! A snapshot is claimed once, with its nonce, only by that child (or,
//! before the parent named it, by a child of the parent: its `PPid`, read
//! from /proc by the server; any uid, since a child that dropped privileges
//! — an nginx worker — keeps its fds under the kernel too) or by the parent
//! itself after exec(2) (same uid). It is dropped (its descriptors closed)
//! as soon as nobody can claim it any more: its child is gone (exited, a
//! zombie), or, with no child named, its parent is gone — as the kernel
//! closes a dead process's sockets, so a peer sees the connection end.
//! Otherwise it expires unclaimed after [`snapshot::TTL`]. Snapshots are
//! checked by the workers' periodic sweep ([`sweep`], a few per pass in
//! turn) and a claimed one when its nonce is presented; no message reads
//! /proc for any other snapshot, so a message's cost does not grow with
//! what other users hold (`pending.rs`).
//!
//! A `Fork` is admitted before any work on the host's sockets
//! ([`admit_fork`]): a repeated nonce whose snapshot waits is EBUSY, and
//! the dup()s are charged to the user's descriptors per second
//! (`--max-fork-fds-per-sec-per-user`, EAGAIN beyond). A host's failed
//! claims are limited ([`MAX_FAILED_CLAIMS`]).
//!
//! Each snapshot holds a dup() of every socket of its host, so snapshots
//! are budgeted per user (the parent's uid, [`Budget`]): at most
//! `--max-fork-snapshots-per-user` waiting, holding at most
//! `--max-fork-fds-per-user` descriptors in all; a snapshot beyond either
//! is refused with EAGAIN (fork(2)'s errno for a resource limit) and
//! changes nothing. Per user, not per host: a snapshot outlives its
//! parent's attachment (below), so a host that detaches and attaches again
//! must not get a fresh budget.
//!
//! A remote host (`fabric`) forks on another node, whose processes this
//! server cannot see in /proc: its snapshot is bound to the authenticated
//! peer instead — claimed only by a remote host of the same fabric
//! address and mapped uid (so never by another node's host, nor by a
//! local one), with the nonce, and, once the parent named it, only by
//! that child's pid; it expires after [`snapshot::REMOTE_TTL`] unclaimed (a child
//! claims within its attach, right after fork). The fabric thread lets a
//! remote host claim once per attachment (a wrong nonce is not retried).
//!
//! A host that detaches leaves its snapshots pending: the parent of an
//! exec(2) detaches (its control socket closes with the old image) before
//! the new image attaches and claims, and a child may attach after its
//! parent went. They still count against the user's budget until claimed
//! or expired.

mod pending;
mod snapshot;

use crate::calls::eager::handover;
use crate::host::{Host, Sock};
pub use pending::sweep;
use snapshot::{Inherited, Snapshot};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;
use tcps_proto::handshake::ControlMsg;
use tracing::{debug, info, warn};

/// `Inherit` claims of one host that may find nothing: a child claims
/// once, right after it attaches; beyond these it is ENOENT at once.
pub const MAX_FAILED_CLAIMS: u32 = 4;

/// Snapshots waiting for a child (those nobody can claim go with the
/// workers' sweep): a hot upgrade waits a moment for them to be claimed.
pub fn pending_count() -> usize {
    pending::with(|p| p.snaps.len())
}

/// Drops every pending snapshot (a hot upgrade does not carry them: the
/// operator's upgrade is not at the mercy of a user's fork); how many, by
/// uid. A child that claims one later gets ENOENT and says so.
pub fn drop_all() -> Vec<(u32, usize)> {
    let snaps = pending::with(|p| std::mem::take(&mut p.snaps));
    let mut by_uid: Vec<(u32, usize)> = Vec::new();
    for s in &snaps {
        match by_uid.iter_mut().find(|(u, _)| *u == s.uid) {
            Some((_, n)) => *n += 1,
            None => by_uid.push((s.uid, 1)),
        }
    }
    by_uid
}

/// `ControlMsg::Forked`: the parent's fork(2) of snapshot `nonce` made
/// process `child` (0: it failed; the snapshot is dropped). A snapshot
/// already claimed (the child was quick) or dropped is no error.
pub fn forked(host: &Host, nonce: u32, child: u32) -> Result<(), i32> {
    let mut guard = pending::lock();
    let Some(p) = guard.as_mut().map(|p| &mut p.snaps) else {
        return Ok(());
    };
    if let Some(pos) = p.iter().position(|s| s.made_by(host, nonce)) {
        if child == 0 {
            p.swap_remove(pos);
        } else {
            p[pos].child_pid = Some(child);
        }
    }
    Ok(())
}

/// What one user's pending snapshots may hold.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub max_snapshots: usize,
    pub max_fds: usize,
    /// Descriptors dup()ed per second (0: no limit).
    pub fds_per_sec: usize,
}

impl Budget {
    pub fn of(cfg: &crate::config::Config) -> Budget {
        Budget {
            max_snapshots: cfg.max_fork_snapshots_per_user,
            max_fds: cfg.max_fork_fds_per_user,
            fds_per_sec: cfg.max_fork_fds_per_sec_per_user,
        }
    }
}

/// Whether a new snapshot of `sockets` descriptors for user `uid` fits the
/// budget next to `pending` (EAGAIN otherwise). A snapshot replaced under
/// the same parent and nonce does not count.
fn fits(pending: &[Snapshot], uid: u32, replaced: (u32, u32), sockets: usize, b: Budget) -> bool {
    let mine = pending
        .iter()
        .filter(|s| s.uid == uid && (s.parent_pid, s.nonce) != replaced);
    let (snaps, fds) = mine.fold((0usize, 0usize), |(n, f), s| (n + 1, f + s.sockets.len()));
    snaps < b.max_snapshots && fds.saturating_add(sockets) <= b.max_fds
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, i32> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Whether `ControlMsg::Fork` of `nonce` may snapshot `host`'s sockets,
/// checked before any work on them (memory only): EBUSY if this process's
/// snapshot of `nonce` waits already, EAGAIN when the user's snapshots are
/// at their budget or dup()ed their descriptors per second. Charges the
/// dup()s (of every socket: an upper bound) to the user's rate.
pub fn admit_fork(host: &mut Host, nonce: u32, budget: Budget) -> Result<(), i32> {
    let n = host.sockets.len();
    pending::with(|p| admit(p, host, nonce, n, budget)).map_err(|why| refuse(host, n, why))
}

/// `ControlMsg::Fork`, admitted (`admit_fork`): snapshot every socket of
/// `host` under `nonce`. EAGAIN when the user's snapshots reached their
/// budget meanwhile.
pub fn snapshot(host: &mut Host, nonce: u32, budget: Budget) -> Result<(), i32> {
    // Connections accepted ahead that the parent has not taken are not the
    // child's to inherit: it could never name them.
    let untaken = handover::untaken_ids(host);
    let wanted = host.sockets.len().saturating_sub(untaken.len());
    // Admitted before (`admit_fork`); the budget is checked again under
    // the lock when the snapshot is stored (another worker may have stored
    // one of the same user meanwhile).
    let replaced = (host.pid, nonce);
    let mut sockets = Vec::with_capacity(wanted);
    for (id, s) in host.sockets.iter() {
        if untaken.contains(&(id as u32)) {
            continue;
        }
        sockets.push(Inherited {
            id: id as u32,
            fd: dup(&s.fd)?,
            nonblocking: s.nonblocking,
            rcv_timeout: s.rcv_timeout,
            snd_timeout: s.snd_timeout,
            policy: s.policy,
            unread: None,
        });
    }
    // Checked again under the lock, held until the snapshot is stored
    // (another worker may have stored one of the same user meanwhile).
    let mut guard = pending::lock();
    let p = &mut guard.get_or_insert_with(Default::default).snaps;
    if !fits(p, host.uid, replaced, sockets.len(), budget) {
        drop(guard);
        return Err(refuse(host, sockets.len(), Refusal::Budget));
    }
    // Only once every dup() succeeded and the budget allows (a refused
    // snapshot changes nothing): carry what was read ahead, and stop the
    // parent's rings.
    let mut carried = 0;
    for i in &mut sockets {
        i.unread = handover::take_unread_for_fork(host, i.id);
        if let Some(u) = &i.unread {
            carried += 1;
            debug!(
                host = host.id,
                sock = i.id,
                bytes = u.bytes.len(),
                end = ?u.end,
                "fork: bytes read ahead carried to the child"
            );
        }
    }
    info!(
        host = host.id,
        pid = host.pid,
        sockets = sockets.len(),
        carried,
        "fork: sockets snapshotted for a child"
    );
    p.retain(|s| !s.made_by(host, nonce));
    p.push(Snapshot {
        nonce,
        parent_pid: host.pid,
        child_pid: None,
        uid: host.uid,
        peer: host.fabric_peer,
        made: Instant::now(),
        sockets,
    });
    Ok(())
}

/// Why a snapshot is refused.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Refusal {
    /// This process's snapshot of this nonce waits already (a fork takes a
    /// fresh nonce; a repeat would only redo the dup()s): EBUSY.
    Repeated,
    /// The user's pending snapshots are at their budget: EAGAIN.
    Budget,
    /// The user's snapshots dup()ed their descriptors per second: EAGAIN.
    Rate,
}

/// Whether a snapshot of `wanted` sockets of `host` under `nonce` may be
/// made; charges its dup()s to the user's rate if so. Memory only.
fn admit(
    p: &mut pending::Pending,
    host: &Host,
    nonce: u32,
    wanted: usize,
    b: Budget,
) -> Result<(), Refusal> {
    if p.snaps.iter().any(|s| s.made_by(host, nonce)) {
        return Err(Refusal::Repeated);
    }
    if !fits(&p.snaps, host.uid, (host.pid, nonce), wanted, b) {
        return Err(Refusal::Budget);
    }
    if !p.charge(host.uid, wanted, b.fds_per_sec, b.max_fds) {
        return Err(Refusal::Rate);
    }
    Ok(())
}

/// Logs a refused snapshot (as a warning on the host's 1st, 2nd, 4th, ...
/// refusal of a budget); its errno.
fn refuse(host: &mut Host, sockets: usize, why: Refusal) -> i32 {
    let what = match why {
        Refusal::Repeated => return libc::EBUSY,
        Refusal::Budget => {
            "the user's pending snapshots are at their budget \
             (--max-fork-snapshots-per-user, --max-fork-fds-per-user)"
        }
        Refusal::Rate => {
            "the user's snapshots dup()ed their descriptors per second \
             (--max-fork-fds-per-sec-per-user)"
        }
    };
    if host.note_budget_refusal() {
        warn!(
            host = host.id,
            pid = host.pid,
            uid = host.uid,
            sockets,
            refusals = host.budget_refusals,
            "fork: snapshot refused: {what}"
        );
    }
    libc::EAGAIN
}

/// The parent pid of `pid` (from /proc), if it can be read.
fn ppid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Takes the snapshot `nonce` names if `host` may claim it. Looked up by
/// nonce in memory first: /proc (the claimant's parent, the snapshot's
/// owner) is read only for a snapshot of that nonce.
fn take(host: &Host, nonce: u32) -> Option<Snapshot> {
    let mut guard = pending::lock();
    let p = &mut guard.as_mut()?.snaps;
    // A remote host's pid is its node's: not in this /proc.
    let mut parent: Option<Option<u32>> = host.remote.then_some(None);
    let pos = p.iter().position(|s| {
        s.nonce == nonce && s.may_claim(host, *parent.get_or_insert_with(|| ppid(host.pid)))
    })?;
    let snap = p.swap_remove(pos);
    // Its owner gone (not swept yet): nobody's any more; dropped.
    snap.claimable().then_some(snap)
}

/// `ControlMsg::Inherit`: move snapshot `nonce` into `host` (a fresh child).
/// ENOENT: no such snapshot for this process; EEXIST: an id is taken.
pub fn claim(host: &mut Host, nonce: u32) -> Result<(), i32> {
    if host.failed_claims >= MAX_FAILED_CLAIMS {
        return Err(libc::ENOENT);
    }
    let Some(snap) = take(host, nonce) else {
        host.failed_claims += 1;
        return Err(libc::ENOENT);
    };
    let n = snap.sockets.len();
    for i in snap.sockets {
        host.next_gen = host.next_gen.wrapping_add(1) & crate::token::GEN_MASK;
        // The parent may hold the description too: guard it (`guard`).
        let held = crate::guard::HostHeld::of(std::os::fd::AsRawFd::as_raw_fd(&i.fd));
        let mut s = Sock::new(i.fd, host.next_gen, i.nonblocking, host.uid);
        s.host_held = held;
        s.rcv_timeout = i.rcv_timeout;
        s.snd_timeout = i.snd_timeout;
        s.policy = i.policy;
        if !host.sockets.insert_at(i.id as usize, s) {
            warn!(
                host = host.id,
                id = i.id,
                "inherit: socket id already taken"
            );
            return Err(libc::EEXIST);
        }
        if let Some(u) = i.unread {
            handover::start_pull_with(host, i.id, u);
        }
    }
    info!(
        host = host.id,
        pid = host.pid,
        parent = snap.parent_pid,
        sockets = n,
        "fork: child inherited its parent's sockets"
    );
    Ok(())
}

/// `ControlMsg::Export`: removes socket `id` from `host` and returns the
/// kernel socket for the host. EBUSY while calls or polls are parked on it
/// or its ring or pull buffer holds what the host has not taken; the host
/// then leaves it offloaded. Otherwise what a close would release is
/// released (engine registration, admission count, send queue).
pub fn export(
    host: &mut Host,
    cx: &mut crate::calls::Ctx<'_>,
    id: u32,
) -> (ControlMsg, Option<OwnedFd>) {
    let reply = |errno| ControlMsg::Reply { handle: id, errno };
    let Some(s) = host.socket(id) else {
        return (reply(libc::EBADF), None);
    };
    if !s.readers.is_empty() || !s.writers.is_empty() || !s.pollers.is_empty() {
        return (reply(libc::EBUSY), None);
    }
    // A ring or pull buffer holding bytes (connections) the host has not
    // taken: those would be lost. (A receive or accepts in flight into the
    // ring are settled first: what they got counts.)
    let settled = crate::calls::eager::ringop::settle(cx, host, id)
        | crate::calls::eager::acceptop::settle(cx, host, id);
    if !handover::release_for_export(host, id) {
        if settled {
            crate::calls::eager::sweep::advance(cx, host, id);
        }
        return (reply(libc::EBUSY), None);
    }
    match crate::calls::take_for_export(cx, host, id) {
        Some(fd) => {
            info!(
                host = host.id,
                pid = host.pid,
                id,
                "exec: socket handed back to the host's kernel"
            );
            (reply(0), Some(fd))
        }
        None => (reply(libc::EBADF), None),
    }
}

#[cfg(test)]
mod tests {
    use super::snapshot::{running, REMOTE_TTL, TTL};
    use super::*;
    use std::time::Duration;

    fn snap(uid: u32, parent_pid: u32, nonce: u32, sockets: usize) -> Snapshot {
        let sockets = (0..sockets)
            .map(|id| Inherited {
                id: id as u32,
                // SAFETY: eventfd returns a fresh descriptor (checked).
                fd: unsafe {
                    let fd = libc::eventfd(0, libc::EFD_CLOEXEC);
                    assert!(fd >= 0);
                    OwnedFd::from_raw_fd(fd)
                },
                nonblocking: false,
                rcv_timeout: None,
                snd_timeout: None,
                policy: crate::config::EagerPolicy::default(),
                unread: None,
            })
            .collect();
        Snapshot {
            nonce,
            parent_pid,
            child_pid: None,
            uid,
            peer: None,
            made: Instant::now(),
            sockets,
        }
    }

    #[test]
    fn a_snapshot_nobody_can_claim_is_dropped() {
        let me = std::process::id();
        // Its parent runs (this process): kept.
        assert!(snap(0, me, 1, 1).claimable());
        // Its parent is gone and named no child: nobody can claim it.
        let gone = 0x3fff_fff0;
        assert!(!running(gone));
        assert!(!snap(0, gone, 1, 1).claimable());
        // The named child decides, not the parent.
        let mut s = snap(0, me, 1, 1);
        s.child_pid = Some(gone);
        assert!(!s.claimable());
        // A child that exited and was not reaped yet (a zombie) cannot
        // claim either.
        let mut kid = std::process::Command::new("true").spawn().unwrap();
        let t = Instant::now();
        while running(kid.id()) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        s.child_pid = Some(kid.id());
        assert!(!s.claimable(), "a zombie child");
        kid.wait().unwrap();
        // Too old: expired whoever runs.
        let mut old = snap(0, me, 1, 1);
        old.made = Instant::now() - TTL;
        assert!(!old.claimable());
    }

    /// A remote snapshot: only the same fabric peer and uid, only the named
    /// child once named, and never through /proc (expiry only).
    #[test]
    fn a_remote_snapshot_is_claimed_only_by_its_peer() {
        let node: std::net::IpAddr = "10.0.0.2".parse().unwrap();
        let other: std::net::IpAddr = "10.0.0.3".parse().unwrap();
        let mut s = snap(7, 0x3fff_fff0, 1, 1);
        s.peer = Some(node);
        assert!(
            s.claimable(),
            "a parent pid of another node is not looked up"
        );
        assert!(
            s.peer_may_claim(Some(node), 7, 42),
            "before the child is named"
        );
        assert!(!s.peer_may_claim(Some(other), 7, 42), "another node");
        assert!(!s.peer_may_claim(None, 7, 42), "a local host");
        assert!(!s.peer_may_claim(Some(node), 8, 42), "another credential");
        s.child_pid = Some(43);
        assert!(!s.peer_may_claim(Some(node), 7, 42), "not the named child");
        assert!(s.peer_may_claim(Some(node), 7, 43));
        s.made = Instant::now() - REMOTE_TTL;
        assert!(!s.claimable(), "expired");
        // A local snapshot is never a remote host's.
        assert!(!snap(7, 1, 1, 1).peer_may_claim(Some(node), 7, 1));
    }

    #[test]
    fn budget_counts_a_users_snapshots_and_descriptors() {
        let b = Budget {
            max_snapshots: 2,
            max_fds: 10,
            fds_per_sec: 0,
        };
        let p = vec![snap(1, 100, 1, 4), snap(2, 200, 1, 9)];
        // User 1: one snapshot of 4 held.
        assert!(fits(&p, 1, (100, 2), 6, b));
        assert!(!fits(&p, 1, (100, 2), 7, b), "descriptors");
        // Replacing the same nonce does not count the old one.
        assert!(fits(&p, 1, (100, 1), 10, b));
        // User 2 is not user 1.
        assert!(!fits(&p, 2, (200, 2), 2, b));
        let p = vec![snap(1, 100, 1, 1), snap(1, 101, 1, 1)];
        assert!(!fits(&p, 1, (100, 2), 1, b), "snapshots");
    }
}
