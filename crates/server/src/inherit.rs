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
//! snapshot carries them: the unread part of a byte ring (from the server's
//! `consumed`, clamped with the host's `head`, to `tail`) or of a pull
//! buffer, with the end of stream if one was read. The child's socket starts
//! with them in a pull buffer (its `Recv`s are answered from there first,
//! then from the kernel). They also stay where they were for the parent:
//! both processes share the socket as under the kernel, but bytes read
//! ahead before the fork reach both if both read them (under the kernel,
//! whichever reads first gets them). A parent's byte ring stops receiving
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
//! A snapshot is claimed once, with its nonce, only by a child of the parent
//! (its `PPid`, read from /proc by the server; any uid, since a child that
//! dropped privileges — an nginx worker — keeps its fds under the kernel
//! too) or by the parent itself after exec(2) (same uid). It expires
//! unclaimed after [`TTL`] (its descriptors are closed).

use crate::host::{Host, Sock};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tcps_proto::handshake::ControlMsg;
use tracing::{debug, info, warn};

/// How long an unclaimed snapshot is kept.
pub const TTL: Duration = Duration::from_secs(60);

struct Inherited {
    id: u32,
    fd: OwnedFd,
    nonblocking: bool,
    rcv_timeout: Option<Duration>,
    snd_timeout: Option<Duration>,
    /// Process-ahead policy; nothing is bound in the child (its host
    /// library binds with `RecvBind`) unless bytes were carried.
    policy: crate::EagerPolicy,
    /// Bytes read ahead for the parent and not taken by it (and the end of
    /// stream): the child's pull buffer starts with them.
    unread: Option<crate::calls::eager::Unread>,
}

struct Snapshot {
    nonce: u32,
    parent_pid: u32,
    uid: u32,
    made: Instant,
    sockets: Vec<Inherited>,
}

/// Snapshots waiting for their child, server-wide (the parent and the child
/// may be served by different workers).
static PENDING: Mutex<Vec<Snapshot>> = Mutex::new(Vec::new());

fn pending() -> std::sync::MutexGuard<'static, Vec<Snapshot>> {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    p.retain(|s| s.made.elapsed() < TTL);
    p
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

/// `ControlMsg::Fork`: snapshot every socket of `host` under `nonce`.
pub fn snapshot(host: &mut Host, nonce: u32) -> Result<(), i32> {
    let mut sockets = Vec::with_capacity(host.sockets.len());
    // Connections accepted ahead that the parent has not taken are not the
    // child's to inherit: it could never name them.
    let untaken = crate::calls::eager::untaken_ids(host);
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
    // Only once every dup() succeeded (a failed snapshot changes nothing):
    // carry what was read ahead, and stop the parent's rings.
    let mut carried = 0;
    for i in &mut sockets {
        i.unread = crate::calls::eager::take_unread_for_fork(host, i.id);
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
    let mut p = pending();
    p.retain(|s| !(s.parent_pid == host.pid && s.nonce == nonce));
    p.push(Snapshot {
        nonce,
        parent_pid: host.pid,
        uid: host.uid,
        made: Instant::now(),
        sockets,
    });
    Ok(())
}

/// The parent pid of `pid` (from /proc), if it can be read.
fn ppid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `ControlMsg::Inherit`: move snapshot `nonce` into `host` (a fresh child).
/// ENOENT: no such snapshot for this process; EEXIST: an id is taken.
pub fn claim(host: &mut Host, nonce: u32) -> Result<(), i32> {
    let parent = ppid(host.pid);
    let snap = {
        let mut p = pending();
        let pos = p
            .iter()
            .position(|s| {
                s.nonce == nonce
                    && (Some(s.parent_pid) == parent
                        || (s.parent_pid == host.pid && s.uid == host.uid))
            })
            .ok_or(libc::ENOENT)?;
        p.swap_remove(pos)
    };
    let n = snap.sockets.len();
    for i in snap.sockets {
        host.next_gen = host.next_gen.wrapping_add(1) & crate::token::GEN_MASK;
        let mut s = Sock::new(i.fd, host.next_gen, i.nonblocking);
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
            crate::calls::eager::start_pull_with(host, i.id, u);
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
    // taken: those would be lost.
    if !crate::calls::eager::release_for_export(host, id) {
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
