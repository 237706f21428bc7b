//! Which file descriptors are offloaded sockets.
//!
//! An offloaded socket is a tcps socket id at the server plus a *placeholder*
//! kernel fd (an eventfd) that reserves its number, so the program's other
//! fds can never collide with it, `fcntl(F_GETFL/F_SETFL/F_GETFD/F_SETFD)`
//! and `dup` have something real to act on, and fork and exec carry the
//! number along. Tables are flat arrays of atomics indexed by fd and by
//! socket id: lookups on every call are one load, no lock.
//!
//! Each fd also records the *epoch* of the attachment its socket belongs to
//! (`state.rs`): after the server died and a new one was attached
//! (`--reattach`), the sockets of the dead attachment keep their old ids,
//! which the new server hands out again. The per-id state below belongs to
//! the newest epoch that uses the id; an fd of an older epoch whose id was
//! taken over counts its duplicates by a look at the fd table instead.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// fds and socket ids at or above this are not offloaded (the call falls
/// back or fails with EMFILE; see `sock.rs`).
pub const MAX_FDS: usize = 1 << 18;
pub const MAX_IDS: usize = 1 << 18;

/// fd → `VALID | epoch << EPOCH_SHIFT | id` (0: not ours).
static FDS: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
const VALID: u64 = 1 << 32;
const EPOCH_SHIFT: u32 = 40;
/// One more than the highest fd ever recorded (bounds the looks at FDS).
static HIGH: AtomicUsize = AtomicUsize::new(0);

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
    /// Bumped when the program changed the socket's state with its own
    /// call (connect, shutdown): an edge for every edge-triggered entry,
    /// as the kernel's state change wakes the socket's waiters (`epoll`).
    pub state_seq: AtomicU32,
    /// SO_SNDBUF as read once for the send queue's bound (0: not read;
    /// `sendq.rs`).
    pub sndbuf: AtomicU32,
    /// A listener's: the SO_SNDBUF its accepted connections start with, as
    /// read on the first one (0: not yet; `sendq.rs`).
    pub child_sndbuf: AtomicU32,
    /// An accepted connection's: its listener's id + 1 while that
    /// listener's `child_sndbuf` waits for this connection's read (0: none).
    pub parent: AtomicU32,
    /// A listener opened on every server of a group: it has siblings
    /// (`group.rs`).
    pub siblings: AtomicU32,
    /// What the socket reported of its server's death (`gone.rs`).
    pub reported: AtomicU32,
    /// Nonzero once the connection was seen broken (a poll reported
    /// POLLERR or POLLHUP, a receive failed): its sends go the synchronous
    /// way from then on, so that the kernel's ECONNRESET or EPIPE comes at
    /// the call, as on a kernel socket, instead of an asynchronous send
    /// taking bytes the kernel would refuse (`sendq.rs`).
    pub broken: AtomicU32,
    /// A socket error the preload took from the server's socket on the
    /// program's behalf (a FIONREAD peek that found an RST's ECONNRESET,
    /// which consumes it there): the program's next receive, send or
    /// SO_ERROR reports it, and polls show POLLERR until then, as the
    /// kernel's pending `sk_err` (0: none).
    pub pending_err: AtomicU32,
    /// The attachment epoch whose socket this state is (0: none yet).
    epoch: AtomicU32,
}

static IDS: [IdState; MAX_IDS] = [const {
    IdState {
        refs: AtomicU32::new(0),
        rd_seq: AtomicU32::new(0),
        wr_seq: AtomicU32::new(0),
        full_seq: AtomicU32::new(0),
        state_seq: AtomicU32::new(0),
        sndbuf: AtomicU32::new(0),
        child_sndbuf: AtomicU32::new(0),
        parent: AtomicU32::new(0),
        siblings: AtomicU32::new(0),
        reported: AtomicU32::new(0),
        broken: AtomicU32::new(0),
        pending_err: AtomicU32::new(0),
        epoch: AtomicU32::new(0),
    }
}; MAX_IDS];

/// The per-id state of the other members of a group (`state::slot` 1..):
/// every server hands out the same ids, so each has a table of its own,
/// made when first used.
static GROUP_IDS: [std::sync::OnceLock<&'static [IdState]>; crate::state::MAX_GROUP - 1] =
    [const { std::sync::OnceLock::new() }; crate::state::MAX_GROUP - 1];

/// The per-id table of group place `slot`.
fn table(slot: usize) -> &'static [IdState] {
    if slot == 0 {
        return &IDS;
    }
    let cell = &GROUP_IDS[(slot - 1) % GROUP_IDS.len()];
    cell.get_or_init(|| {
        let layout = std::alloc::Layout::array::<IdState>(MAX_IDS).expect("a fixed size");
        // SAFETY: IdState is atomics only, for which all-zero bytes are
        // the initial value (the statics above are zeros); the zeroed
        // allocation has the array's layout and is never freed.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<IdState>();
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            std::slice::from_raw_parts(p, MAX_IDS)
        }
    })
}

/// The state of socket `id` of attachment `epoch`.
fn state_at(epoch: u32, id: u32) -> &'static IdState {
    &table(crate::state::slot(epoch))[id as usize % MAX_IDS]
}

fn unpack(v: u64) -> Option<(u32, u32)> {
    (v & VALID != 0).then_some(((v >> EPOCH_SHIFT) as u32 & 0xffff, v as u32))
}

/// The attachment epoch and tcps socket id behind `fd`, if `fd` is an
/// offloaded socket.
#[inline]
pub fn lookup_at(fd: i32) -> Option<(u32, u32)> {
    unpack(FDS.get(usize::try_from(fd).ok()?)?.load(Ordering::Acquire))
}

/// The tcps socket id behind `fd`, if `fd` is an offloaded socket (of
/// any attachment).
#[inline]
pub fn lookup(fd: i32) -> Option<u32> {
    lookup_at(fd).map(|(_, id)| id)
}

pub fn fits(fd: i32, id: u32) -> bool {
    (fd as usize) < MAX_FDS && (id as usize) < MAX_IDS && fd >= 0
}

fn pack(epoch: u32, id: u32) -> u64 {
    VALID | u64::from(epoch & 0xffff) << EPOCH_SHIFT | u64::from(id)
}

/// One more fd names socket `id` of attachment `epoch`.
fn count(epoch: u32, id: u32) {
    let st = state_at(epoch, id);
    let owner = st.epoch.load(Ordering::Acquire);
    if epoch > owner {
        // A newer attachment's socket under an id an older one used: the
        // state is this one's from now on.
        st.refs.store(0, Ordering::Relaxed);
        st.epoch.store(epoch, Ordering::Release);
    }
    if epoch >= owner && st.refs.fetch_add(1, Ordering::AcqRel) == 0 {
        // A new socket under a reused id: its SO_SNDBUF is read anew.
        for v in [
            &st.sndbuf,
            &st.child_sndbuf,
            &st.parent,
            &st.siblings,
            &st.broken,
            &st.pending_err,
        ] {
            v.store(0, Ordering::Relaxed);
        }
    }
}

/// One fd less names socket `id` of attachment `epoch`: whether it was the
/// last.
fn uncount(epoch: u32, id: u32) -> bool {
    let st = state_at(epoch, id);
    if st.epoch.load(Ordering::Acquire) == epoch {
        let dec = |r: u32| r.checked_sub(1);
        st.refs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, dec)
            == Ok(1)
    } else {
        // A socket of an older attachment whose id was taken over.
        !all_at().iter().any(|&(_, e, i)| e == epoch && i == id)
    }
}

/// Records `fd` as naming socket `id` of attachment `epoch` (one more
/// reference to it). The caller checked [`fits`]; `epoch` < 2^16.
pub fn insert(fd: i32, epoch: u32, id: u32) {
    count(epoch, id);
    if HIGH.load(Ordering::Relaxed) <= fd as usize {
        HIGH.fetch_max(fd as usize + 1, Ordering::Relaxed);
    }
    FDS[fd as usize].store(pack(epoch, id), Ordering::Release);
}

/// Forgets `fd`. Returns its epoch, id, and whether that was the last fd
/// naming it (then the socket itself must be closed at its server).
pub fn remove(fd: i32) -> Option<(u32, u32, bool)> {
    let slot = FDS.get(usize::try_from(fd).ok()?)?;
    let (epoch, id) = unpack(slot.swap(0, Ordering::AcqRel))?;
    Some((epoch, id, uncount(epoch, id)))
}

/// Moves every fd naming socket `id` of attachment `from` to socket `nid`
/// of attachment `to` (a listener taken over by a new attachment). Returns
/// how many fds moved.
pub fn rebind(from: u32, id: u32, to: u32, nid: u32) -> usize {
    let mut n = 0;
    for (fd, e, i) in all_at() {
        if e != from || i != id {
            continue;
        }
        count(to, nid);
        let moved = FDS[fd as usize]
            .compare_exchange(
                pack(e, i),
                pack(to, nid),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if moved {
            uncount(from, id);
            n += 1;
        } else {
            uncount(to, nid); // closed meanwhile
        }
    }
    n
}

/// The state of socket `id` of attachment `c`.
pub fn id_state(c: &tcps::Client, id: u32) -> &'static IdState {
    &table(crate::state::slot_of(c))[id as usize % MAX_IDS]
}

/// The state of socket `id` of attachment `epoch`.
pub fn id_state_at(epoch: u32, id: u32) -> &'static IdState {
    state_at(epoch, id)
}

/// The program read (or accepted) on `id`: edge-triggered interest re-arms.
#[inline]
pub fn note_read(c: &tcps::Client, id: u32) {
    id_state(c, id).rd_seq.fetch_add(1, Ordering::Relaxed);
}

/// The program wrote (or connected) on `id`.
#[inline]
pub fn note_write(c: &tcps::Client, id: u32) {
    id_state(c, id).wr_seq.fetch_add(1, Ordering::Relaxed);
}

/// The program changed `id`'s connection state with its own call (a
/// connect, a shutdown): edge-triggered interest re-arms in both
/// directions, as the kernel's state change wakes the socket's waiters in
/// both. Without this a socket with no receive ring whose read side was
/// reported before a connect (a fresh socket reports HUP) never reported
/// the connection's later end or reset.
pub fn note_state_change(c: &tcps::Client, id: u32) {
    let st = id_state(c, id);
    st.rd_seq.fetch_add(1, Ordering::Relaxed);
    st.wr_seq.fetch_add(1, Ordering::Relaxed);
    st.state_seq.fetch_add(1, Ordering::Relaxed);
    note_rescan();
}

/// The program saw `id`'s connection broken (see `IdState::broken`).
pub fn note_broken(c: &tcps::Client, id: u32) {
    id_state(c, id).broken.store(1, Ordering::Relaxed);
}

/// Keeps `err` as `id`'s pending socket error (see `IdState::pending_err`).
pub fn keep_error(c: &tcps::Client, id: u32, err: i32) {
    let st = id_state(c, id);
    st.pending_err.store(err as u32, Ordering::Relaxed);
    st.broken.store(1, Ordering::Relaxed);
}

/// Takes `id`'s pending socket error, if any (a call reports it once):
/// one kept here, or the one that ended its receive ring and no call
/// reported yet (the server read it ahead, taking it from its socket).
pub fn take_error(c: &tcps::Client, id: u32) -> Option<i32> {
    take_kept_error(c, id).or_else(|| c.take_ring_error(id))
}

/// Takes the error kept here for `id` (not the ring's: a receive returns
/// the bytes before a ring's error first, as the kernel's does).
pub fn take_kept_error(c: &tcps::Client, id: u32) -> Option<i32> {
    let st = id_state(c, id);
    if st.pending_err.load(Ordering::Relaxed) != 0 {
        if let e @ 1.. = st.pending_err.swap(0, Ordering::Relaxed) {
            return Some(e as i32);
        }
    }
    None
}

/// Whether `id` has a pending socket error (POLLERR).
pub fn has_error(c: &tcps::Client, id: u32) -> bool {
    id_state(c, id).pending_err.load(Ordering::Relaxed) != 0
}

/// Whether `id`'s connection was seen broken.
pub fn is_broken(c: &tcps::Client, id: u32) -> bool {
    id_state(c, id).broken.load(Ordering::Relaxed) != 0
}

/// A send-side call on `id` (write, send*, writev, sendfile) took `took`
/// of the `asked` bytes; an EAGAIN took none. One that took less than it
/// was asked leaves the socket waiting for room, and edge-triggered
/// EPOLLOUT must fire when room appears, as the kernel's SOCK_NOSPACE
/// makes it: a program that saw EAGAIN or a short count waits for that
/// edge and for nothing else (nginx does). Every send-side path ends here
/// with what it returns, so none can leave the edge unarmed.
pub fn note_sent(c: &tcps::Client, id: u32, asked: u64, took: u64) {
    if took < asked {
        id_state(c, id).full_seq.fetch_add(1, Ordering::Relaxed);
        note_rescan();
    }
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

/// Every offloaded fd with its epoch and id.
pub fn all_at() -> Vec<(i32, u32, u32)> {
    let high = HIGH.load(Ordering::Relaxed).min(MAX_FDS);
    FDS[..high]
        .iter()
        .enumerate()
        .filter_map(|(fd, v)| unpack(v.load(Ordering::Acquire)).map(|(e, id)| (fd as i32, e, id)))
        .collect()
}

/// Whether `f` says yes for some offloaded fd; allocates nothing and
/// writes nothing (a child sharing its parent's memory may call it).
pub fn any_fd(mut f: impl FnMut(i32) -> bool) -> bool {
    let high = HIGH.load(Ordering::Relaxed).min(MAX_FDS);
    FDS[..high]
        .iter()
        .enumerate()
        .any(|(fd, v)| v.load(Ordering::Acquire) & VALID != 0 && f(fd as i32))
}

/// Every offloaded fd of attachment `epoch` and its id (fork, exec).
pub fn all_in(epoch: u32) -> Vec<(i32, u32)> {
    all_at()
        .into_iter()
        .filter_map(|(fd, e, id)| (e == epoch).then_some((fd, id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dups_share_a_socket_until_the_last_close() {
        let (a, b, id) = (MAX_FDS as i32 - 3, MAX_FDS as i32 - 2, 77);
        insert(a, 1, id);
        insert(b, 1, id);
        assert_eq!(lookup(a), Some(id));
        assert_eq!(remove(a), Some((1, id, false)));
        assert_eq!(lookup(a), None);
        assert_eq!(remove(b), Some((1, id, true)));
        assert_eq!(remove(b), None);
    }

    #[test]
    fn a_newer_attachment_takes_an_id_over() {
        let (a, b, c, id) = (
            MAX_FDS as i32 - 13,
            MAX_FDS as i32 - 12,
            MAX_FDS as i32 - 11,
            91,
        );
        // Two fds of the dead attachment 1, then attachment 2 hands out
        // the same id.
        insert(a, 1, id);
        insert(b, 1, id);
        insert(c, 2, id);
        assert_eq!(lookup_at(c), Some((2, id)));
        assert_eq!(lookup_at(a), Some((1, id)));
        // The old socket's last close is found by a look at the table.
        assert_eq!(remove(a), Some((1, id, false)));
        assert_eq!(remove(b), Some((1, id, true)));
        // The new one's count was not disturbed.
        assert_eq!(id_state_at(2, id).refs.load(Ordering::Relaxed), 1);
        assert_eq!(remove(c), Some((2, id, true)));
    }

    #[test]
    fn a_listener_moves_to_a_new_attachment() {
        let (a, b, id, nid) = (MAX_FDS as i32 - 23, MAX_FDS as i32 - 22, 95, 96);
        insert(a, 3, id);
        insert(b, 3, id);
        assert_eq!(rebind(3, id, 4, nid), 2);
        assert_eq!(lookup_at(a), Some((4, nid)));
        assert_eq!(all_in(4), vec![(a, nid), (b, nid)]);
        assert_eq!(remove(a), Some((4, nid, false)));
        assert_eq!(remove(b), Some((4, nid, true)));
    }

    #[test]
    fn each_server_of_a_group_has_its_own_socket_state() {
        // Every server hands out the same ids: place 1's socket 5 is not
        // place 0's.
        let (a, b) = (&table(0)[5], &table(1)[5]);
        assert!(!std::ptr::eq(a, b));
        b.refs.store(3, Ordering::Relaxed);
        assert_eq!(table(1)[5].refs.load(Ordering::Relaxed), 3);
        assert_eq!(table(2)[5].refs.load(Ordering::Relaxed), 0);
        assert_eq!(table(1).len(), MAX_IDS);
        b.refs.store(0, Ordering::Relaxed);
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
