//! Which file descriptors are offloaded sockets.
//!
//! An offloaded socket is a tcps socket id at the server plus a *placeholder*
//! kernel fd (an eventfd) that reserves its number, so the program's other
//! fds can never collide with it, `fcntl(F_GETFL/F_SETFL/F_GETFD/F_SETFD)`
//! and `dup` have something real to act on, and fork and exec carry the
//! number along. Tables are flat arrays of atomics indexed by fd and by
//! socket id: lookups on every call are one load, no lock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// fds and socket ids at or above this are not offloaded (the call falls
/// back or fails with EMFILE; see `sock.rs`).
pub const MAX_FDS: usize = 1 << 18;
pub const MAX_IDS: usize = 1 << 18;

/// fd → `VALID | id` (0: not ours).
static FDS: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
const VALID: u64 = 1 << 32;

/// Per socket id: how many fds name it (dup), and how many read-side and
/// write-side operations the program made on it (the "edges" of
/// edge-triggered epoll; see `epoll.rs`).
pub struct IdState {
    pub refs: AtomicU32,
    pub rd_seq: AtomicU32,
    pub wr_seq: AtomicU32,
    /// Bumped when a write or sendfile found the send queue full (EAGAIN
    /// or a short count): the kernel's SOCK_NOSPACE, after which room
    /// appearing is an EPOLLOUT edge (`epoll.rs`).
    pub full_seq: AtomicU32,
    /// SO_SNDBUF as read once for the send queue's bound (0: not read;
    /// `sendq.rs`).
    pub sndbuf: AtomicU32,
}

static IDS: [IdState; MAX_IDS] = [const {
    IdState {
        refs: AtomicU32::new(0),
        rd_seq: AtomicU32::new(0),
        wr_seq: AtomicU32::new(0),
        full_seq: AtomicU32::new(0),
        sndbuf: AtomicU32::new(0),
    }
}; MAX_IDS];

/// The tcps socket id behind `fd`, if `fd` is an offloaded socket.
#[inline]
pub fn lookup(fd: i32) -> Option<u32> {
    let v = FDS.get(usize::try_from(fd).ok()?)?.load(Ordering::Acquire);
    (v & VALID != 0).then_some(v as u32)
}

pub fn fits(fd: i32, id: u32) -> bool {
    (fd as usize) < MAX_FDS && (id as usize) < MAX_IDS && fd >= 0
}

/// Records `fd` as naming `id` (one more reference to `id`). The caller
/// checked [`fits`].
pub fn insert(fd: i32, id: u32) {
    let st = &IDS[id as usize];
    if st.refs.fetch_add(1, Ordering::AcqRel) == 0 {
        // A new socket under a reused id: its SO_SNDBUF is read anew.
        st.sndbuf.store(0, Ordering::Relaxed);
    }
    FDS[fd as usize].store(VALID | u64::from(id), Ordering::Release);
}

/// Forgets `fd`. Returns its id and whether that was the last fd naming it
/// (then the socket itself must be closed at the server).
pub fn remove(fd: i32) -> Option<(u32, bool)> {
    let slot = FDS.get(usize::try_from(fd).ok()?)?;
    let v = slot.swap(0, Ordering::AcqRel);
    if v & VALID == 0 {
        return None;
    }
    let id = v as u32;
    let last = IDS[id as usize].refs.fetch_sub(1, Ordering::AcqRel) == 1;
    Some((id, last))
}

pub fn id_state(id: u32) -> &'static IdState {
    &IDS[(id as usize) % MAX_IDS]
}

/// The program read (or accepted) on `id`: edge-triggered interest re-arms.
#[inline]
pub fn note_read(id: u32) {
    id_state(id).rd_seq.fetch_add(1, Ordering::Relaxed);
}

/// The program wrote (or connected) on `id`.
#[inline]
pub fn note_write(id: u32) {
    id_state(id).wr_seq.fetch_add(1, Ordering::Relaxed);
}

/// A write or sendfile on `id` found no room (EAGAIN or a short count).
pub fn note_full(id: u32) {
    id_state(id).full_seq.fetch_add(1, Ordering::Relaxed);
    note_rescan();
}

/// Bumped when readiness may have changed in a way the server's ready log
/// does not announce (a send queue found full, a local shutdown): epoll
/// sets look at all their entries once (`epoll.rs`).
static RESCAN: AtomicU32 = AtomicU32::new(0);

pub fn note_rescan() {
    RESCAN.fetch_add(1, Ordering::Release);
}

pub fn rescan_epoch() -> u32 {
    RESCAN.load(Ordering::Acquire)
}

/// Every offloaded fd and its id (fork, exec).
pub fn all() -> Vec<(i32, u32)> {
    FDS.iter()
        .enumerate()
        .filter_map(|(fd, v)| {
            let v = v.load(Ordering::Acquire);
            (v & VALID != 0).then_some((fd as i32, v as u32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dups_share_a_socket_until_the_last_close() {
        let (a, b, id) = (MAX_FDS as i32 - 3, MAX_FDS as i32 - 2, 77);
        insert(a, id);
        insert(b, id);
        assert_eq!(lookup(a), Some(id));
        assert_eq!(remove(a), Some((id, false)));
        assert_eq!(lookup(a), None);
        assert_eq!(remove(b), Some((id, true)));
        assert_eq!(remove(b), None);
    }

    #[test]
    fn bounds() {
        assert!(!fits(-1, 0));
        assert!(!fits(MAX_FDS as i32, 0));
        assert!(!fits(0, MAX_IDS as u32));
        assert_eq!(lookup(-5), None);
        assert_eq!(lookup(i32::MAX), None);
    }
}
