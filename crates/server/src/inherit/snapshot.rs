//! A fork snapshot: the sockets of a parent, dup()ed for its child, and
//! who may claim it.

use crate::calls::eager::handover;
use crate::host::Host;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// How long an unclaimed snapshot is kept.
pub const TTL: Duration = Duration::from_secs(60);
/// How long a remote host's unclaimed snapshot is kept: whether its child
/// still runs cannot be seen from here, so this is what holds its
/// sockets after a child died before claiming.
pub const REMOTE_TTL: Duration = Duration::from_secs(10);

pub(super) struct Inherited {
    pub(super) id: u32,
    pub(super) fd: OwnedFd,
    pub(super) nonblocking: bool,
    pub(super) rcv_timeout: Option<Duration>,
    pub(super) snd_timeout: Option<Duration>,
    /// Process-ahead policy; nothing is bound in the child (its host
    /// library binds with `RecvBind`) unless bytes were carried.
    pub(super) policy: crate::config::EagerPolicy,
    /// Bytes read ahead for the parent and not taken by it (and the end of
    /// stream): the child's pull buffer starts with them.
    pub(super) unread: Option<handover::Unread>,
}

pub(super) struct Snapshot {
    pub(super) nonce: u32,
    pub(super) parent_pid: u32,
    /// The child the parent named after fork(2) (`ControlMsg::Forked`).
    pub(super) child_pid: Option<u32>,
    pub(super) uid: u32,
    /// A remote parent's fabric address (`Host::fabric_peer`).
    pub(super) peer: Option<std::net::IpAddr>,
    pub(super) made: Instant,
    pub(super) sockets: Vec<Inherited>,
}

impl Snapshot {
    /// Whether someone may still claim it: young enough, and its child (or,
    /// none named yet, its parent) still running.
    pub(super) fn claimable(&self) -> bool {
        !self.expired() && self.owner_running()
    }

    /// Older than its time to live (no /proc).
    pub(super) fn expired(&self) -> bool {
        let ttl = if self.peer.is_some() { REMOTE_TTL } else { TTL };
        self.made.elapsed() >= ttl
    }

    /// Whether its child (or, none named yet, its parent) still runs (read
    /// from /proc; a remote one's cannot be seen: it only expires).
    pub(super) fn owner_running(&self) -> bool {
        self.peer.is_some() || running(self.child_pid.unwrap_or(self.parent_pid))
    }

    /// A remote snapshot (or claimant): the same authenticated peer (fabric
    /// address and credential's uid), then the named child or the parent
    /// itself; pids are that node's, not checkable here.
    pub(super) fn peer_may_claim(
        &self,
        peer: Option<std::net::IpAddr>,
        uid: u32,
        pid: u32,
    ) -> bool {
        let same_peer = self.peer.is_some() && self.peer == peer && self.uid == uid;
        let child = self.child_pid.is_none_or(|c| c == pid);
        same_peer && (child || self.parent_pid == pid)
    }

    /// Whether it is `host`'s own (made by the process `host` is, on the
    /// same node: pids of two nodes may be equal).
    pub(super) fn made_by(&self, host: &Host, nonce: u32) -> bool {
        self.parent_pid == host.pid && self.peer == host.fabric_peer && self.nonce == nonce
    }
}

impl Snapshot {
    /// Whether `host` (whose parent is `parent`) may take it: its child (the
    /// one the parent named, or before that any child of the parent), or
    /// the parent itself after exec(2), as the same user.
    pub(super) fn may_claim(&self, host: &Host, parent: Option<u32>) -> bool {
        if self.peer.is_some() || host.fabric_peer.is_some() {
            return self.peer_may_claim(host.fabric_peer, host.uid, host.pid);
        }
        let child = match self.child_pid {
            Some(child) => child == host.pid,
            None => Some(self.parent_pid) == parent,
        };
        child || (self.parent_pid == host.pid && self.uid == host.uid)
    }
}

/// Whether process `pid` exists and is not a zombie (/proc/PID/stat).
pub(super) fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}
