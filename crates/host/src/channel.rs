//! The host's side of an attachment: the pool of channels, checking a piece
//! of one out for a call, and the request/completion exchanges of that call
//! (submit, doorbell, spin, sleep, server liveness).
//!
//! # Several calls per channel
//!
//! A channel's rings have `ring_entries` slots and the server completes
//! requests in any order (a call that would block is parked and completed
//! later), so one channel carries calls of several host threads at once.
//! Each [`Slot`] keeps the host's state of its channel behind a mutex that
//! is held only for short critical sections (submit, drain, release), never
//! while waiting:
//!
//! * the [`HostCursor`] and the last request tag;
//! * the *users* table: one entry per call holding a piece of the channel
//!   (its current tag, its arena range, where its request is). It is the
//!   arena allocator (first fit over the gaps between ranges), the set of
//!   tags in flight (a completion whose tag is not in flight is stray:
//!   dropped and counted, nobody fails) and the index of
//! * the *mailbox*: completions a thread drained for another thread;
//! * how many host threads sleep on the channel's futex.
//!
//! A `users` counter mirrors the table's size outside the lock for checkout.
//!
//! **Checkout** prefers an idle channel (no users): the thread's last one,
//! then the first idle one. There a call gets what it asks for up to 15/16
//! of the arena (the rest stays free for calls that may come to share the
//! channel while this one is parked). When every channel is
//! in use (calls parked at the server: blocking recv/accept/poll on idle
//! connections) a call *shares* the channel with the fewest users that has
//! room: fewer than `ring_entries - 1` users (so the request ring never
//! fills and the server's completion credits never run out) and an arena
//! gap. A sharing call gets at most a sixteenth of the channel's free arena
//! (send and recv move less per request: a blocking send loops over chunks,
//! a recv returns less, as BSD allows), but at least what it must have (an
//! address, an option, a poll array). Only when no channel has ring and
//! arena room does a thread back off and retry.
//!
//! **Small calls** (at most [`STAGE`] bytes of arena: addresses, options,
//! small sends and recvs, no data at all) are *staged*: checkout only picks
//! a channel; the lease mirrors its range in a buffer of its own; `exchange`
//! reserves the range, copies the input in and submits under one lock, and
//! the drain that finds the completion copies the range out and releases
//! it. A small call therefore locks its channel twice (submit, drain), and
//! holds arena only while its request is in flight. Larger calls reserve
//! their range at checkout and release it on drop.
//!
//! **Waiting** for the completion tagged with the call's tag: spin (adaptive
//! budget, at most `TCPS_SPINNERS` threads, stop early when the server says
//! the call is parked) watching `cq_tail` without the lock; when it moved
//! past what was drained, lock and drain *every* available completion (ours
//! is taken, others go to the mailbox). Then sleep: under the lock drain,
//! register as a sleeper, set `host_waiting`, fence, re-read `cq_tail`;
//! sleep on the futex only if nothing new was published. The completion we
//! wait for is published after that read, so it changes `cq_tail` from the
//! value we sleep on, and the server wakes every waiter on `cq_tail` while
//! `host_waiting` is set (it stays set while any thread of the channel is
//! registered). A thread that files another thread's completion in the
//! mailbox also wakes the channel's sleepers.
//!
//! A call's range is freed once its completion was taken and its output
//! copied out. A lease dropped while its request is still in flight (the
//! thread unwinds, or gives up because the server died) leaves its entry
//! `Abandoned`: the range is freed when that completion is drained.

use crate::attach::Attached;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tcps_proto::futex;
use tcps_proto::layout::ChannelCtl;
use tcps_proto::region::ChannelRef;
use tcps_proto::ring::{self, HostCursor, RingFull};
use tcps_proto::{Completion, Region, Request};

/// How long one futex sleep lasts, and how often a sleeping call checks
/// whether the server is still alive.
const SLEEP_SLICE: Duration = Duration::from_millis(100);
/// How long a request ring may stay full before the call fails with EIO.
const RING_FULL_PATIENCE: Duration = Duration::from_secs(1);
/// The adaptive spin budget never shrinks below this (a server polling on
/// its own core answers in about a microsecond).
const MIN_SPIN_NS: u64 = 10_000;
/// Default number of host threads of one attachment that may spin at once.
const DEFAULT_SPINNERS: u32 = 1;
/// Default spin before sleeping, in microseconds (`TCPS_SPIN_US`).
const DEFAULT_SPIN_US: u64 = 50;
/// Calls with at most this many bytes of arena are staged (see [`Lease`]).
pub(crate) const STAGE: usize = 256;
/// Arena ranges start and end on multiples of this (poll arrays need 8).
const GRANULE: u32 = 64;
/// A call on an idle channel leaves 1/SHARE_DIV of the arena free, and a
/// call sharing a channel gets at most 1/SHARE_DIV of its free arena (at
/// least a granule, and at least what it must have): a parked call never
/// takes all the room, the grants shrink geometrically, and a channel's ring
/// slots, not its arena, bound how many parked calls it carries.
const SHARE_DIV: u32 = 16;

const OPEN: u8 = 0;
const SERVER_DEAD: u8 = 1;
const DETACHED: u8 = 2;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (connection id, channel index) this thread used last.
    static LAST_CHANNEL: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

/// Call counters; see [`crate::Client::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Request/completion exchanges.
    pub calls: u64,
    /// Doorbell rings (eventfd writes: the server was asleep).
    pub doorbells: u64,
    /// Futex sleeps while waiting for a completion.
    pub sleeps: u64,
    /// Exchanges whose completion arrived while spinning (no sleep).
    pub spins_satisfied: u64,
    /// Calls that shared a channel with other calls in flight (every
    /// channel was in use).
    pub shared: u64,
    /// Completions a thread drained for another thread sharing its channel
    /// (handed over through the channel's mailbox).
    pub handed_off: u64,
    /// Completions whose tag belonged to no call in flight (dropped).
    pub stray_completions: u64,
}

/// Per-channel counters, written under the channel's lock (so a load and a
/// store suffice); `stats()` reads them from anywhere.
#[derive(Default)]
struct SlotStats {
    calls: AtomicU64,
    doorbells: AtomicU64,
    sleeps: AtomicU64,
    spins_satisfied: AtomicU64,
    shared: AtomicU64,
    handed_off: AtomicU64,
    stray: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

fn round_up(n: u32) -> u32 {
    n.div_ceil(GRANULE) * GRANULE
}

/// Where a user's current request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UseState {
    /// No request in flight (before the first submit, after a completion
    /// was taken).
    Idle,
    /// Submitted; the completion has not been drained yet.
    Waiting,
    /// Drained by another thread into the mailbox; the owner has not taken
    /// it yet.
    Arrived,
    /// The lease was dropped while its request was in flight: free the
    /// range when the completion is drained.
    Abandoned,
}

/// A call holding a piece of the channel.
#[derive(Clone, Copy, Debug)]
struct Use {
    /// Tag of the user's current (or last) request; identifies the entry.
    tag: u64,
    /// Arena range reserved: `off .. off + size` (multiples of GRANULE;
    /// size 0 for calls without arena traffic).
    off: u32,
    size: u32,
    state: UseState,
}

/// A channel's host-side state, shared by the calls using it.
struct ChanState {
    cursor: HostCursor,
    /// The last request tag used on this channel (tags start at 1).
    tag: u64,
    /// Users; those with arena bytes sorted by `off`. Capacity `max_users`
    /// (never reallocates).
    uses: Vec<Use>,
    /// Completions drained on behalf of another thread (its entry is
    /// `Arrived`). At most one per user, so it never reallocates either.
    mailbox: Vec<Completion>,
    /// Host threads asleep (or about to sleep) on this channel's futex.
    sleepers: u32,
    /// Whether `channels_used` already covers this channel.
    announced: bool,
}

impl ChanState {
    fn new(max_users: u32) -> ChanState {
        ChanState {
            cursor: HostCursor::default(),
            tag: 0,
            uses: Vec::with_capacity(max_users as usize),
            mailbox: Vec::with_capacity(max_users as usize),
            sleepers: 0,
            announced: false,
        }
    }

    fn next_tag(&mut self) -> u64 {
        self.tag = self.tag.wrapping_add(1).max(1);
        self.tag
    }

    fn find(&self, tag: u64) -> Option<usize> {
        self.uses.iter().position(|u| u.tag == tag)
    }

    /// Inserts a user at `at` (appending without a memmove when it can).
    fn add(&mut self, at: usize, u: Use) -> usize {
        if at >= self.uses.len() {
            self.uses.push(u);
            self.uses.len() - 1
        } else {
            self.uses.insert(at, u);
            at
        }
    }

    /// Removes user `i`, keeping the order of the others (and its mail).
    fn free(&mut self, i: usize) {
        if self.uses[i].state == UseState::Arrived {
            let tag = self.uses[i].tag;
            self.mailbox.retain(|c| c.user_data != tag);
        }
        if i + 1 == self.uses.len() {
            self.uses.pop();
        } else {
            self.uses.remove(i);
        }
    }

    /// Takes the completion filed for user `i` from the mailbox.
    fn take_mail(&mut self, i: usize) -> Option<Completion> {
        if self.uses[i].state != UseState::Arrived {
            return None;
        }
        let tag = self.uses[i].tag;
        let k = self.mailbox.iter().position(|c| c.user_data == tag)?;
        self.uses[i].state = UseState::Idle;
        Some(self.mailbox.swap_remove(k))
    }

    /// Adds a user tagged `tag` with an arena range of at least `min` and
    /// up to `want` bytes. An idle channel grants `want` up to 15/16 of the
    /// arena (the rest is headroom for sharers); a shared one at most a
    /// sixteenth of its free arena. Returns (index, offset, length granted),
    /// or `None` if the channel has no room.
    #[inline]
    fn alloc(
        &mut self,
        arena: u32,
        max_users: u32,
        min: u32,
        want: u32,
        tag: u64,
    ) -> Option<(usize, u32, u32)> {
        if self.uses.is_empty() {
            // The common case: an idle channel. All of the request at 0, but
            // leave sharers some headroom: this call may park for long.
            let len = want.min(arena - arena / SHARE_DIV).max(min);
            self.uses.push(Use {
                tag,
                off: 0,
                size: round_up(len),
                state: UseState::Idle,
            });
            return Some((0, 0, len));
        }
        if self.uses.len() >= max_users as usize {
            return None;
        }
        let target = {
            let used: u32 = self.uses.iter().map(|u| u.size).sum();
            let free = arena.saturating_sub(used);
            want.min((free / SHARE_DIV).max(GRANULE)).max(min)
        };
        let mut entry = Use {
            tag,
            off: 0,
            size: 0,
            state: UseState::Idle,
        };
        if target == 0 {
            return Some((self.add(usize::MAX, entry), 0, 0));
        }
        let need = round_up(target);
        // First fit; remember the largest gap for a smaller grant.
        let mut pos = 0u32;
        let mut largest = (0u32, 0u32, 0usize); // (size, off, insert index)
        let mut found = None;
        for i in 0..=self.uses.len() {
            let end = match self.uses.get(i) {
                Some(u) if u.size == 0 => continue,
                Some(u) => u.off,
                None => arena,
            };
            let gap = end.saturating_sub(pos);
            if gap >= need {
                found = Some((pos, target, i));
                break;
            }
            if gap > largest.0 {
                largest = (gap, pos, i);
            }
            if let Some(u) = self.uses.get(i) {
                pos = u.off + u.size;
            }
        }
        let (off, len, at) = match found {
            Some(f) => f,
            None if largest.0 >= round_up(min.max(1)) => {
                (largest.1, target.min(largest.0), largest.2)
            }
            None => return None,
        };
        entry.off = off;
        entry.size = round_up(len);
        Some((self.add(at, entry), off, len))
    }
}

/// One channel of the pool; a cache line pair of its own.
#[repr(align(128))]
struct Slot {
    state: Mutex<ChanState>,
    /// `state.uses.len()`, readable without the lock (checkout's scan).
    users: AtomicU32,
    stats: SlotStats,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, ChanState> {
        // Nothing panics while holding the lock; should something, the state
        // is still consistent entry by entry.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An attachment to a server.
pub(crate) struct Conn {
    id: u64,
    region: Region,
    ctl: OwnedFd,
    doorbell: OwnedFd,
    slots: Box<[Slot]>,
    /// Most calls one channel carries at once: `ring_entries - 1`.
    max_users: u32,
    state: AtomicU8,
    spin: Duration,
    /// Host threads spinning for a completion right now, and the most allowed
    /// (`TCPS_SPINNERS`, default 1): on an oversubscribed machine more
    /// spinners would only steal the CPU the server needs to answer them.
    spinners: AtomicU32,
    max_spinners: u32,
    /// The current adaptive spin budget (see `Lease::spin_wait`).
    spin_budget_ns: AtomicU64,
}

impl Conn {
    pub fn new(a: Attached) -> Conn {
        let layout = *a.region.layout();
        let n = layout.n_channels as usize;
        let max_users = layout.ring_entries.saturating_sub(1).max(1);
        let spin_us = std::env::var("TCPS_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_SPIN_US)
            .min(1_000_000);
        Conn {
            id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
            region: a.region,
            ctl: a.ctl,
            doorbell: a.doorbell,
            slots: (0..n)
                .map(|_| Slot {
                    state: Mutex::new(ChanState::new(max_users)),
                    users: AtomicU32::new(0),
                    stats: SlotStats::default(),
                })
                .collect(),
            max_users,
            state: AtomicU8::new(OPEN),
            spin: Duration::from_micros(spin_us),
            spinners: AtomicU32::new(0),
            spin_budget_ns: AtomicU64::new(spin_us * 1000),
            max_spinners: std::env::var("TCPS_SPINNERS")
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(DEFAULT_SPINNERS),
        }
    }

    /// Bytes of data arena per channel: the largest single transfer.
    pub fn arena_size(&self) -> u32 {
        self.region.layout().arena_size
    }

    pub fn n_channels(&self) -> u32 {
        self.region.layout().n_channels
    }

    /// Fails with `errno` if the attachment is no longer usable.
    pub fn check_open(&self, errno: i32) -> io::Result<()> {
        if self.state.load(Ordering::Relaxed) == OPEN {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(errno))
        }
    }

    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Relaxed) == OPEN
    }

    /// Ends the attachment now: the server sees the control socket hang up
    /// and closes this host's sockets. Calls in flight fail with ECONNRESET,
    /// later ones with ENOTCONN.
    pub fn detach(&self) {
        if self.state.swap(DETACHED, Ordering::AcqRel) != DETACHED {
            // SAFETY: shutdown(2) on a descriptor we own; it stays open (and
            // owned) until drop, only the connection is ended.
            unsafe { libc::shutdown(self.ctl.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Checks whether the server is still there; marks the attachment dead
    /// if not.
    fn server_alive(&self) -> bool {
        if self.state.load(Ordering::Relaxed) != OPEN {
            return false;
        }
        let mut alive = self.region.header().server_alive.load(Ordering::Acquire) != 0;
        if alive {
            let mut p = libc::pollfd {
                fd: self.ctl.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout.
            let rc = unsafe { libc::poll(&mut p, 1, 0) };
            // The server never writes after the Welcome: readable means EOF.
            let gone = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
            alive = !(rc > 0 && p.revents & gone != 0);
        }
        if !alive {
            let _ =
                self.state
                    .compare_exchange(OPEN, SERVER_DEAD, Ordering::AcqRel, Ordering::Relaxed);
        }
        alive
    }

    fn channel(&self, index: u32) -> ChannelRef<'_> {
        self.region
            .channel(index)
            .expect("slots and channels have the same count")
    }

    fn ring_doorbell(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a local buffer to our eventfd. A failure
        // (counter overflow) means the doorbell is already rung.
        unsafe {
            libc::write(
                self.doorbell.as_raw_fd(),
                one.as_ptr() as *const libc::c_void,
                8,
            )
        };
    }

    /// Runs `f` with a piece of a channel for one call: an arena range of at
    /// least `min` and up to `want` bytes (both clamped to the arena; the
    /// lease's [`room`](Lease::room) says how much was granted). Prefers an
    /// idle channel, the one this thread used last first; shares a busy one
    /// when none is idle; waits only while no channel has room. `dead_errno`
    /// is returned if the attachment dies meanwhile.
    ///
    /// A small call (at most [`STAGE`] bytes) only picks a channel here and
    /// gets all it asks for: its bytes are staged in the lease, and its range
    /// is reserved and released inside the submit and drain critical
    /// sections of each request (see [`Lease::exchange`]).
    pub fn with_lease<T>(
        &self,
        dead_errno: i32,
        min: u32,
        want: u32,
        f: impl FnOnce(&mut Lease<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
        let want = want.min(self.arena_size());
        if want as usize <= STAGE {
            // Built in place: a lease with its stage is a few hundred bytes.
            let mut lease = Lease::new(self, self.choose(), dead_errno, want, true);
            return f(&mut lease);
        }
        f(&mut self.checkout(dead_errno, min.min(want), want)?)
    }

    /// Checks out a large call's piece of a channel (see [`with_lease`]).
    fn checkout(&self, dead_errno: i32, min: u32, want: u32) -> io::Result<Lease<'_>> {
        let (conn, hint) = LAST_CHANNEL.try_with(Cell::get).unwrap_or((0, 0));
        if conn == self.id {
            if let Some(l) = self.try_lease(hint, min, want, false) {
                return Ok(l);
            }
        }
        let n = self.slots.len() as u32;
        let mut backoff = Backoff::default();
        loop {
            let idle = (0..n).find_map(|i| self.try_lease(i, min, want, false));
            let lease = idle.or_else(|| {
                let fewest = self.fewest_users();
                self.try_lease(fewest, min, want, true).or_else(|| {
                    (0..n)
                        .filter(|&i| i != fewest && self.users(i) < self.max_users)
                        .find_map(|i| self.try_lease(i, min, want, true))
                })
            });
            if let Some(l) = lease {
                let _ = LAST_CHANNEL.try_with(|c| c.set((self.id, l.index)));
                return Ok(l);
            }
            self.check_open(dead_errno)?;
            backoff.wait();
        }
    }

    fn users(&self, index: u32) -> u32 {
        self.slots[index as usize].users.load(Ordering::Relaxed)
    }

    /// The channel with the fewest users (the first of them).
    fn fewest_users(&self) -> u32 {
        (0..self.slots.len() as u32)
            .min_by_key(|&i| self.users(i))
            .unwrap_or(0)
    }

    /// Picks a channel for a small call without locking anything: this
    /// thread's last channel if idle, else the first idle one, else the one
    /// with the fewest users. Binding (under the lock) re-checks the room.
    fn choose(&self) -> u32 {
        let (conn, hint) = LAST_CHANNEL.try_with(Cell::get).unwrap_or((0, 0));
        if conn == self.id && self.users(hint) == 0 {
            return hint;
        }
        let n = self.slots.len() as u32;
        let i = (0..n)
            .find(|&i| self.users(i) == 0)
            .unwrap_or_else(|| self.fewest_users());
        let _ = LAST_CHANNEL.try_with(|c| c.set((self.id, i)));
        i
    }

    /// Leases channel `index` if it is idle (or, with `share`, if it has
    /// room for one more call), reserving the call's range now.
    fn try_lease(&self, index: u32, min: u32, want: u32, share: bool) -> Option<Lease<'_>> {
        let slot = self.slots.get(index as usize)?;
        if !share && slot.users.load(Ordering::Relaxed) != 0 {
            return None;
        }
        let mut st = slot.lock();
        if !share && !st.uses.is_empty() {
            return None;
        }
        let tag = st.next_tag();
        let (_, off, len) = self.reserve(index, &mut st, min, want, tag)?;
        drop(st);
        let mut l = Lease::new(self, index, 0, len, false);
        l.tag = tag;
        l.off = off;
        Some(l)
    }

    /// Adds a user tagged `tag` to channel `index` (locked as `st`) with a
    /// range of at least `min` and up to `want` bytes. Returns (index in the
    /// users table, offset, length).
    #[inline]
    fn reserve(
        &self,
        index: u32,
        st: &mut ChanState,
        min: u32,
        want: u32,
        tag: u64,
    ) -> Option<(usize, u32, u32)> {
        let slot = &self.slots[index as usize];
        let others = !st.uses.is_empty();
        let (i, off, len) = st.alloc(self.arena_size(), self.max_users, min, want, tag)?;
        slot.users.store(st.uses.len() as u32, Ordering::Relaxed);
        if others {
            bump(&slot.stats.shared);
        }
        if !st.announced {
            self.region
                .header()
                .channels_used
                .fetch_max(index + 1, Ordering::AcqRel);
            st.announced = true;
        }
        Some((i, off, len))
    }

    pub fn stats(&self) -> HostStats {
        let mut s = HostStats::default();
        for slot in self.slots.iter() {
            let st = &slot.stats;
            s.calls += st.calls.load(Ordering::Relaxed);
            s.doorbells += st.doorbells.load(Ordering::Relaxed);
            s.sleeps += st.sleeps.load(Ordering::Relaxed);
            s.spins_satisfied += st.spins_satisfied.load(Ordering::Relaxed);
            s.shared += st.shared.load(Ordering::Relaxed);
            s.handed_off += st.handed_off.load(Ordering::Relaxed);
            s.stray_completions += st.stray.load(Ordering::Relaxed);
        }
        s
    }
}

/// Waiting for room on some channel: yield at first, then sleep a little
/// longer each round (up to ~750 µs).
#[derive(Default)]
struct Backoff(u32);

impl Backoff {
    fn wait(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50 * u64::from(self.0.min(1000) / 64)));
        }
    }
}

/// A call's piece of a channel: an entry in its users table and an arena
/// range of [`room`](Lease::room) bytes. Offsets given to
/// [`put`](Lease::put), [`get`](Lease::get) and in requests passed to
/// [`exchange`](Lease::exchange) are relative to the range.
///
/// A *staged* lease (small calls) mirrors its range in `stage` and holds an
/// entry only while a request is in flight: `exchange` reserves the range,
/// copies the staged input in and submits under one lock; the drain that
/// finds the completion copies the range back into `stage` and releases it.
/// So a small call takes the channel lock twice, and dropping it is free.
/// A large lease reserves its range at checkout and releases it on drop.
pub(crate) struct Lease<'a> {
    conn: &'a Conn,
    slot: &'a Slot,
    ch: ChannelRef<'a>,
    index: u32,
    /// Tag of this lease's current (or last) request, which identifies its
    /// entry in the users table; 0: no entry (an unbound staged lease).
    tag: u64,
    /// The reserved range (while bound) and its length.
    off: u32,
    len: u32,
    /// errno of a checkout that finds the attachment dead (staged leases
    /// check out in `exchange`).
    dead_errno: i32,
    staged: bool,
    stage: [u8; STAGE],
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Drains every published completion. Returns ours (tagged `mine`: its
/// index in the users table, whose entry goes back to `Idle`) and whether
/// one was filed in the mailbox for another call.
#[inline]
fn drain(
    st: &mut ChanState,
    ch: &ChannelRef<'_>,
    slot: &Slot,
    mine: u64,
) -> (Option<(usize, Completion)>, bool) {
    let (mut ours, mut others) = (None, false);
    while let Some(c) = st.cursor.reap(ch) {
        let Some(i) = st.find(c.user_data) else {
            bump(&slot.stats.stray);
            continue;
        };
        match st.uses[i].state {
            UseState::Waiting if c.user_data == mine => {
                st.uses[i].state = UseState::Idle;
                ours = Some((i, c));
            }
            UseState::Waiting => {
                st.uses[i].state = UseState::Arrived;
                st.mailbox.push(c);
                bump(&slot.stats.handed_off);
                others = true;
            }
            UseState::Abandoned => {
                st.free(i);
                slot.users.store(st.uses.len() as u32, Ordering::Relaxed);
                if let Some((j, _)) = &mut ours {
                    if i < *j {
                        *j -= 1;
                    }
                }
            }
            // Nothing in flight under this tag: a duplicate or forged one.
            UseState::Idle | UseState::Arrived => bump(&slot.stats.stray),
        }
    }
    (ours, others)
}

impl<'a> Lease<'a> {
    fn new(conn: &'a Conn, index: u32, dead_errno: i32, len: u32, staged: bool) -> Lease<'a> {
        Lease {
            conn,
            slot: &conn.slots[index as usize],
            ch: conn.channel(index),
            index,
            tag: 0,
            off: 0,
            len,
            dead_errno,
            staged,
            stage: [0; STAGE],
        }
    }

    /// Bytes of arena this call may use (at most what it asked for).
    pub fn room(&self) -> u32 {
        self.len
    }

    /// Copies `src` into the call's range at `off`; EINVAL if it does not fit.
    pub fn put(&mut self, off: u32, src: &[u8]) -> io::Result<()> {
        let (off, end) = (off as usize, off as usize + src.len());
        if end > self.len as usize {
            return Err(errno(libc::EINVAL));
        }
        if self.staged {
            self.stage[off..end].copy_from_slice(src);
            return Ok(());
        }
        if self.ch.copy_to_arena(self.off + off as u32, src) {
            Ok(())
        } else {
            Err(errno(libc::EINVAL))
        }
    }

    /// Copies bytes of the call's range at `off` into `dst`; EIO if out of
    /// range (the caller bounds lengths by what it asked for, so this means
    /// a bug).
    pub fn get(&self, off: u32, dst: &mut [u8]) -> io::Result<()> {
        let (off, end) = (off as usize, off as usize + dst.len());
        if end > self.len as usize {
            return Err(errno(libc::EIO));
        }
        if self.staged {
            dst.copy_from_slice(&self.stage[off..end]);
            return Ok(());
        }
        if self.ch.copy_from_arena(self.off + off as u32, dst) {
            Ok(())
        } else {
            Err(errno(libc::EIO))
        }
    }

    /// Runs one request to completion. `req.buf_off` is relative to the
    /// call's range. A completion with a non-zero errno becomes that error;
    /// otherwise `result` is non-negative.
    pub fn exchange(&mut self, mut req: Request) -> io::Result<Completion> {
        if u64::from(req.buf_off) + u64::from(req.buf_len) > u64::from(self.len) {
            return Err(errno(libc::EINVAL));
        }
        let (seen, must_ring) = self.submit(&mut req)?;
        if must_ring {
            self.conn.ring_doorbell();
        }
        let c = self.wait(seen, must_ring)?;
        if c.op != req.op {
            return Err(errno(libc::EIO));
        }
        if c.errno != 0 {
            return Err(errno(if c.errno > 0 { c.errno } else { libc::EIO }));
        }
        if c.result < 0 {
            return Err(errno(libc::EIO));
        }
        Ok(c)
    }

    /// Moves an unbound staged lease to another channel (its chosen one had
    /// no room when it came to reserve).
    /// An idle one if there is one, else the next in turn; after a round
    /// over all channels without room, back off first.
    fn rechoose(&mut self, tries: &mut u32, backoff: &mut Backoff) -> io::Result<()> {
        self.conn.check_open(self.dead_errno)?;
        let n = self.conn.slots.len() as u32;
        *tries += 1;
        if tries.is_multiple_of(n) {
            backoff.wait();
        }
        let i = (0..n)
            .find(|&i| self.conn.users(i) == 0)
            .unwrap_or((self.index + 1) % n);
        self.index = i;
        self.slot = &self.conn.slots[i as usize];
        self.ch = self.conn.channel(i);
        let _ = LAST_CHANNEL.try_with(|c| c.set((self.conn.id, i)));
        Ok(())
    }

    /// Tags and publishes `req` (an unbound staged lease first reserves its
    /// range and copies its input in). Returns the completion index drained
    /// so far (the wait watches `cq_tail` move past it) and whether the
    /// doorbell must be rung.
    fn submit(&mut self, req: &mut Request) -> io::Result<(u32, bool)> {
        let mut full_since = None;
        let (mut tries, mut backoff) = (0, Backoff::default());
        loop {
            let slot = self.slot;
            let mut st = slot.lock();
            if self.tag == 0 && st.uses.is_empty() && st.announced {
                // The common case, an idle channel: the range is at 0 (an
                // idle channel grants any staged size there). Publish first
                // and keep the books after: nobody drains before we unlock.
                let tag = st.next_tag();
                let n = self.len as usize;
                if n > 0 && !self.ch.copy_to_arena(0, &self.stage[..n]) {
                    return Err(errno(libc::EIO));
                }
                req.user_data = tag;
                if let Ok(must_ring) = st.cursor.submit(&self.ch, req) {
                    st.uses.push(Use {
                        tag,
                        off: 0,
                        size: round_up(self.len),
                        state: UseState::Waiting,
                    });
                    slot.users.store(1, Ordering::Relaxed);
                    (self.tag, self.off) = (tag, 0);
                    bump(&slot.stats.calls);
                    if must_ring {
                        bump(&slot.stats.doorbells);
                    }
                    let seen = self.ch.ctl().cq_head.load(Ordering::Relaxed);
                    return Ok((seen, must_ring));
                }
                // The ring is full: the general path below waits.
            }
            let tag = st.next_tag();
            let i = if self.tag == 0 {
                let Some((i, off, _)) = self
                    .conn
                    .reserve(self.index, &mut st, self.len, self.len, tag)
                else {
                    drop(st);
                    self.rechoose(&mut tries, &mut backoff)?;
                    continue;
                };
                self.tag = tag;
                self.off = off;
                let n = self.len as usize;
                if n > 0 && !self.ch.copy_to_arena(off, &self.stage[..n]) {
                    return Err(errno(libc::EIO));
                }
                i
            } else {
                let i = st.find(self.tag).ok_or_else(|| errno(libc::EIO))?;
                st.uses[i].tag = tag;
                self.tag = tag;
                i
            };
            req.user_data = tag;
            let mut r = *req;
            r.buf_off += self.off;
            match st.cursor.submit(&self.ch, &r) {
                Ok(must_ring) => {
                    st.uses[i].state = UseState::Waiting;
                    bump(&slot.stats.calls);
                    if must_ring {
                        bump(&slot.stats.doorbells);
                    }
                    // Our completion will be published at or after the
                    // host's consumed index, which only holders of the lock
                    // advance.
                    let seen = self.ch.ctl().cq_head.load(Ordering::Relaxed);
                    return Ok((seen, must_ring));
                }
                // Impossible while each channel carries fewer calls than it
                // has ring slots, unless the server stopped taking requests
                // or the ring indices were tampered with: give the server a
                // while, then give up.
                Err(RingFull) => {
                    drop(st);
                    let since = *full_since.get_or_insert_with(Instant::now);
                    if !self.conn.server_alive() {
                        return Err(errno(libc::ECONNRESET));
                    }
                    if since.elapsed() > RING_FULL_PATIENCE {
                        return Err(errno(libc::EIO));
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    /// With the channel locked: drains, and takes our completion if it
    /// arrived (a staged lease copies its range out and releases it).
    /// Returns it and whether sleepers must be woken for others'.
    #[inline]
    fn take_locked(&mut self, st: &mut ChanState) -> (Option<Completion>, bool) {
        if self.staged && st.uses.len() == 1 && st.uses[0].tag == self.tag {
            // The common case: alone on the channel, so the next completion
            // is ours (or stray).
            if let Some(c) = st.cursor.reap(&self.ch) {
                if c.user_data == self.tag && st.uses[0].state == UseState::Waiting {
                    let n = self.len as usize;
                    if n > 0 && !self.ch.copy_from_arena(self.off, &mut self.stage[..n]) {
                        self.stage[..n].fill(0);
                    }
                    st.uses.clear();
                    self.slot.users.store(0, Ordering::Relaxed);
                    self.tag = 0;
                    return (Some(c), false);
                }
                bump(&self.slot.stats.stray);
            }
        }
        let (ours, others) = drain(st, &self.ch, self.slot, self.tag);
        let wake = others && st.sleepers > 0;
        let (i, c) = match ours {
            Some(x) => x,
            None => match st.find(self.tag) {
                Some(i) => match st.take_mail(i) {
                    Some(c) => (i, c),
                    None => return (None, wake),
                },
                None => return (None, wake),
            },
        };
        if self.staged {
            let n = self.len as usize;
            if n > 0 && !self.ch.copy_from_arena(self.off, &mut self.stage[..n]) {
                self.stage[..n].fill(0);
            }
            st.free(i);
            self.slot
                .users
                .store(st.uses.len() as u32, Ordering::Relaxed);
            self.tag = 0;
        }
        (Some(c), wake)
    }

    /// Locks, drains and takes our completion if it arrived (counting it as
    /// satisfied by spinning if `spun`); returns the completion index
    /// drained so far too.
    fn try_take(&mut self, spun: bool) -> (Option<Completion>, u32) {
        let slot = self.slot;
        let mut st = slot.lock();
        let (c, wake) = self.take_locked(&mut st);
        if spun && c.is_some() {
            bump(&slot.stats.spins_satisfied);
        }
        let seen = self.ch.ctl().cq_head.load(Ordering::Relaxed);
        drop(st);
        if wake {
            futex::wake_all(&self.ch.ctl().cq_tail);
        }
        (c, seen)
    }

    /// Waits for our completion: spin first (no system call) unless spinning
    /// cannot pay off — the server was asleep (`rang`: it needs a wake-up and
    /// a CPU), or enough other threads already spin — then sleep on the
    /// futex.
    fn wait(&mut self, seen: u32, rang: bool) -> io::Result<Completion> {
        if !rang && self.conn.spin_budget_ns.load(Ordering::Relaxed) > 0 {
            if self.conn.spinners.fetch_add(1, Ordering::AcqRel) < self.conn.max_spinners {
                let r = self.spin_wait(seen);
                self.conn.spinners.fetch_sub(1, Ordering::AcqRel);
                if let Some(c) = r {
                    return Ok(c);
                }
            } else {
                self.conn.spinners.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.sleep_wait()
    }

    /// Spins until the completion arrives, the server says the call is
    /// parked, or the spin budget runs out. Watches `cq_tail` without the
    /// lock; takes the lock only when it moved past what was drained (our
    /// completion, or one another thread may file for us).
    ///
    /// The budget adapts (like an adaptive mutex): a spin that runs out
    /// halves it, a completion that arrives after more than half of it
    /// doubles it, within `[MIN_SPIN_NS, TCPS_SPIN_US]`. With a server polling
    /// on a core of its own completions arrive in about a microsecond and the
    /// budget stays large; when the server has to share a CPU, spinning only
    /// steals that CPU and the budget shrinks.
    fn spin_wait(&mut self, mut seen: u32) -> Option<Completion> {
        let conn = self.conn;
        let ctl = self.ch.ctl();
        let budget = conn.spin_budget_ns.load(Ordering::Relaxed);
        let max = conn.spin.as_nanos() as u64;
        let start = Instant::now();
        let mut i = 0u32;
        let entries = self.ch.ring_entries();
        loop {
            // The next completion's slot stamp is the fast signal (one cache
            // line from the server); `cq_tail` moving also covers a completion
            // another thread of this channel took for us.
            let head = ctl.cq_head.load(Ordering::Relaxed);
            let published = self.ch.completion_stamp(head) == ring::stamp(head, entries);
            if published || ctl.cq_tail.load(Ordering::Acquire) != seen {
                let (c, now) = self.try_take(true);
                seen = now;
                if let Some(c) = c {
                    let took = start.elapsed().as_nanos() as u64;
                    if took > budget / 2 {
                        conn.spin_budget_ns
                            .store((budget * 2).min(max), Ordering::Relaxed);
                    }
                    return Some(c);
                }
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i & 31 != 0 {
                continue;
            }
            // A parked call waits for its socket (a client's request, a
            // connection): sleep now instead of burning the CPU the
            // application and the server need.
            if ctl.parked_tag.load(Ordering::Acquire) == self.tag as u32 {
                return None;
            }
            if start.elapsed().as_nanos() as u64 >= budget {
                conn.spin_budget_ns
                    .store((budget / 2).max(MIN_SPIN_NS.min(max)), Ordering::Relaxed);
                return None;
            }
        }
    }

    fn sleep_wait(&mut self) -> io::Result<Completion> {
        let slot = self.slot;
        let ctl = self.ch.ctl();
        let mut last_check = Instant::now();
        loop {
            let mut st = slot.lock();
            let (got, wake) = self.take_locked(&mut st);
            let mut sleep_on = None;
            if got.is_none() && self.conn.is_open() {
                // Register, then re-check (Dekker, against the server's
                // "store cq_tail; fence; load host_waiting"). `host_waiting`
                // stays set while any thread of this channel is registered.
                st.sleepers += 1;
                ctl.host_waiting.store(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                let tail = ctl.cq_tail.load(Ordering::Acquire);
                if tail == ctl.cq_head.load(Ordering::Relaxed) {
                    bump(&slot.stats.sleeps);
                    sleep_on = Some(tail);
                } else {
                    // Published meanwhile: drain it on the next turn.
                    unregister(&mut st, ctl);
                }
            }
            drop(st);
            if wake {
                futex::wake_all(&ctl.cq_tail);
            }
            if let Some(c) = got {
                return Ok(c);
            }
            if !self.conn.is_open() {
                return Err(errno(libc::ECONNRESET));
            }
            if let Some(tail) = sleep_on {
                // Everything up to `tail` was drained under the lock, so our
                // completion changes `cq_tail` from `tail`: the wait returns
                // at once, or the server's wake (host_waiting is set) ends it.
                futex::wait(&ctl.cq_tail, tail, SLEEP_SLICE);
                unregister(&mut slot.lock(), ctl);
            }
            if last_check.elapsed() >= SLEEP_SLICE {
                last_check = Instant::now();
                if !self.conn.server_alive() {
                    // A completion may have landed just before the server
                    // went away.
                    if let (Some(c), _) = self.try_take(false) {
                        return Ok(c);
                    }
                    return Err(errno(libc::ECONNRESET));
                }
            }
        }
    }
}

/// A sleeper leaves; the last one clears `host_waiting`.
fn unregister(st: &mut ChanState, ctl: &ChannelCtl) {
    st.sleepers = st.sleepers.saturating_sub(1);
    if st.sleepers == 0 {
        ctl.host_waiting.store(0, Ordering::Relaxed);
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.tag == 0 {
            return; // a staged lease between requests holds nothing
        }
        let mut st = self.slot.lock();
        if let Some(i) = st.find(self.tag) {
            if st.uses[i].state == UseState::Waiting {
                // Still in flight (the thread unwound or gave up): the server
                // may yet write the range; free it when the completion comes.
                st.uses[i].state = UseState::Abandoned;
            } else {
                st.free(i); // and any completion filed for it
            }
        }
        self.slot
            .users
            .store(st.uses.len() as u32, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ChanState {
        ChanState::new(7)
    }

    /// (offset, length) of a new user's range.
    fn al(
        st: &mut ChanState,
        arena: u32,
        max: u32,
        min: u32,
        want: u32,
        tag: u64,
    ) -> Option<(u32, u32)> {
        st.alloc(arena, max, min, want, tag)
            .map(|(_, off, len)| (off, len))
    }

    #[test]
    fn idle_channel_grants_the_request_but_leaves_headroom() {
        let mut st = state();
        assert_eq!(al(&mut st, 16384, 7, 1, 1000, 1), Some((0, 1000)));
        let mut st = state();
        assert_eq!(al(&mut st, 16384, 7, 1, 16384, 1), Some((0, 15360)));
        // The headroom is for sharers.
        assert_eq!(al(&mut st, 16384, 7, 1, 16384, 2), Some((15360, 64)));
        assert_eq!(al(&mut st, 16384, 7, 16, 16, 3), Some((15424, 16)));
        assert_eq!(
            al(&mut st, 16384, 7, 0, 0, 4),
            Some((0, 0)),
            "no arena needed"
        );
        // A must-have beyond the headroom rule is honoured on an idle channel.
        let mut st = state();
        assert_eq!(al(&mut st, 4096, 7, 4000, 4000, 1), Some((0, 4000)));
    }

    #[test]
    fn parked_whole_arena_calls_leave_room_for_small_ones() {
        // Every channel held by a recv with a buffer larger than the arena:
        // a connect (16 bytes) and a poll of 8 sockets still fit.
        let mut st = state();
        let arena = 256 * 1024;
        assert!(al(&mut st, arena, 7, 1, arena, 1).is_some());
        assert!(al(&mut st, arena, 7, 16, 16, 2).is_some());
        assert!(al(&mut st, arena, 7, 64, 64, 3).is_some());
        assert!(al(&mut st, arena, 7, 1, arena, 4).is_some());
    }

    #[test]
    fn sharers_get_a_capped_first_fit_range() {
        let mut st = state();
        assert_eq!(al(&mut st, 65536, 7, 1, 100, 1), Some((0, 100)));
        // Capped at a sixteenth of the free arena (65536 - 128), placed after
        // the first user's granule-rounded range.
        assert_eq!(al(&mut st, 65536, 7, 1, 65536, 2), Some((128, 4088)));
        // A must-have larger than the cap is honoured.
        assert_eq!(
            al(&mut st, 65536, 7, 10_000, 10_000, 3),
            Some((128 + 4096, 10_000))
        );
        // Freeing the first range makes room for a small one at offset 0.
        let i = st.find(1).unwrap();
        st.free(i);
        assert_eq!(al(&mut st, 65536, 7, 64, 64, 4), Some((0, 64)));
        let offs: Vec<u32> = st.uses.iter().map(|u| u.off).collect();
        assert!(offs.windows(2).all(|w| w[0] <= w[1]), "{offs:?}");
        // Sharing a channel whose users need no arena: a sixteenth of it.
        let mut st = state();
        assert_eq!(al(&mut st, 1 << 20, 7, 0, 0, 1), Some((0, 0)));
        assert_eq!(al(&mut st, 1 << 20, 7, 1, 1 << 20, 2), Some((0, 1 << 16)));
    }

    #[test]
    fn ring_room_and_arena_room_bound_the_users() {
        let mut st = ChanState::new(3);
        for t in 1..=3 {
            assert!(al(&mut st, 4096, 3, 0, 0, t).is_some());
        }
        assert_eq!(al(&mut st, 4096, 3, 0, 0, 4), None, "ring room");
        let mut st = state();
        assert_eq!(al(&mut st, 4096, 7, 4032, 4032, 1), Some((0, 4032)));
        // Only one granule left: a sharer takes what there is...
        assert_eq!(al(&mut st, 4096, 7, 1, 1000, 2), Some((4032, 64)));
        // ...then nothing is left for a call that needs arena bytes.
        assert_eq!(al(&mut st, 4096, 7, 1, 1000, 3), None);
        assert_eq!(al(&mut st, 4096, 7, 0, 0, 4), Some((0, 0)));
    }

    #[test]
    fn sharers_leave_room_for_many_more() {
        let mut st = ChanState::new(63);
        let arena = 256 * 1024;
        assert!(al(&mut st, arena, 63, 1, 65536, 1).is_some());
        let mut granted = 1;
        for t in 2..=63 {
            if al(&mut st, arena, 63, 1, 65536, t).is_some() {
                granted += 1;
            }
        }
        assert_eq!(granted, 63, "every ring slot usable by parked recvs");
    }
}
