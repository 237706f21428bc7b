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

use crate::ahead::AheadState;
use crate::asyncsend::AsyncState;
use crate::attach::Attached;
use crate::control::Control;
use crate::kernelfd::KernelFds;
use crate::memory::Registry;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tcps_proto::futex;
use tcps_proto::layout::{ChannelCtl, SERVER_DEDICATED_CORES};
use tcps_proto::region::ChannelRef;
use tcps_proto::ring::{self, HostCursor, RingFull};
use tcps_proto::{Completion, Region, Request};

mod lease;
mod state;

pub(crate) use lease::Lease;
use state::ChanState;

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
    /// Requests submitted that expect a completion.
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
    /// Bytes the host library copied (application memory ⇄ channel arena,
    /// including small calls' staging): the host's memory traffic for data.
    pub bytes_copied: u64,
    /// Bytes the server reported sent on the network / received from it.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Asynchronous sends queued, and those that ran synchronously because
    /// no send queue was free.
    pub async_sends: u64,
    pub async_fallbacks: u64,
    /// Kicks: asynchronous sends that found the server not watching their
    /// queue (the others cost no request at all).
    pub kicks: u64,
    /// Debug mode: registered buffers written while their send was in flight.
    pub registered_misuse: u64,
    /// Channel round trips waited on: calls that waited for a completion
    /// (kicks, which get none, are not counted).
    pub round_trips: u64,
    /// recv calls answered from a receive ring (no request at all).
    pub ring_recvs: u64,
    /// accept calls answered from an accept ring.
    pub ring_accepts: u64,
    /// `RecvKick`s posted: a paused ring resumed, or connections wanted
    /// from an empty accept ring.
    pub recv_kicks: u64,
}

impl HostStats {
    /// Host bytes copied per network byte (seed 004's measure; the copying
    /// API is about 1, a zero-copy path 0).
    pub fn copies_per_network_byte(&self) -> f64 {
        self.bytes_copied as f64 / (self.bytes_sent + self.bytes_received).max(1) as f64
    }
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
    copied: AtomicU64,
    net_sent: AtomicU64,
    net_received: AtomicU64,
    round_trips: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
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
    ctl: Control,
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
    /// Registered memory and asynchronous sends (see `asyncsend`).
    pub(crate) memory: Registry,
    pub(crate) asyncs: AsyncState,
    /// Process-ahead receive state (see `ahead`).
    pub(crate) ahead: AheadState,
    /// This process's own descriptor of each socket it made (see `kernelfd`).
    pub(crate) kfds: KernelFds,
    /// Bytes moved by registered (zero-copy) synchronous calls.
    registered_sent: AtomicU64,
    registered_received: AtomicU64,
}

impl Conn {
    pub fn new(a: Attached) -> Conn {
        let layout = *a.region.layout();
        let n = layout.n_channels as usize;
        let max_users = layout.ring_entries.saturating_sub(1).max(1);
        // Spinning pays only when the server polls on cores of its own
        // (`tcps server --cpus`); otherwise a spinning host thread competes
        // for the CPU the server needs to answer it, and sleeping at once is
        // cheaper. TCPS_SPIN_US overrides either way.
        let dedicated =
            a.region.header().server_flags.load(Ordering::Acquire) & SERVER_DEDICATED_CORES != 0;
        let spin_us = std::env::var("TCPS_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(if dedicated { DEFAULT_SPIN_US } else { 0 })
            .min(1_000_000);
        let send_queues = layout.send_queues;
        Conn {
            memory: Registry::new(),
            asyncs: AsyncState::new(send_queues),
            ahead: AheadState::new(),
            kfds: KernelFds::new(),
            registered_sent: AtomicU64::new(0),
            registered_received: AtomicU64::new(0),
            id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
            region: a.region,
            ctl: Control::new(a.ctl),
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
            unsafe { libc::shutdown(self.ctl.raw(), libc::SHUT_RDWR) };
        }
    }

    /// Checks whether the server is still there; marks the attachment dead
    /// if not.
    pub(crate) fn server_alive(&self) -> bool {
        if self.state.load(Ordering::Relaxed) != OPEN {
            return false;
        }
        let mut alive = self.region.header().server_alive.load(Ordering::Acquire) != 0;
        if alive {
            let mut p = libc::pollfd {
                fd: self.ctl.raw(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout.
            let rc = unsafe { libc::poll(&mut p, 1, 0) };
            let gone = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
            if rc > 0 && p.revents & gone != 0 {
                alive = false;
            } else if rc > 0 && p.revents & libc::POLLIN != 0 {
                // Readable: a registration reply another thread is about to
                // read, or end of file.
                let mut b = [0u8; 1];
                // SAFETY: peeking one byte into a local buffer.
                let n = unsafe {
                    libc::recv(
                        self.ctl.raw(),
                        b.as_mut_ptr() as *mut libc::c_void,
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                alive = n != 0;
            }
        }
        if !alive {
            let _ =
                self.state
                    .compare_exchange(OPEN, SERVER_DEAD, Ordering::AcqRel, Ordering::Relaxed);
        }
        alive
    }

    /// The control socket (registration, socket adoption, ...).
    pub(crate) fn control(&self) -> &Control {
        &self.ctl
    }

    /// Send queue `q` (an index the caller got from the layout's range).
    pub(crate) fn send_queue(&self, q: u32) -> tcps_proto::region::SendQueueRef<'_> {
        self.region
            .send_queue(q)
            .expect("send queue indices come from the layout")
    }

    /// Send queue `q`, if the region has one (`q` is a socket id: queue `s`
    /// belongs to socket `s`).
    pub(crate) fn region_send_queue(&self, q: u32) -> Option<tcps_proto::region::SendQueueRef<'_>> {
        self.region.send_queue(q)
    }

    /// Receive ring `r` (of socket id `r`), if the region has one.
    pub(crate) fn recv_ring(&self, r: u32) -> Option<tcps_proto::region::RecvRingRef<'_>> {
        self.region.recv_ring(r)
    }

    /// Counts bytes a registered (zero-copy) call moved.
    pub(crate) fn count_registered(&self, sent: usize, received: usize) {
        self.registered_sent
            .fetch_add(sent as u64, Ordering::Relaxed);
        self.registered_received
            .fetch_add(received as u64, Ordering::Relaxed);
    }

    /// Publishes a request that gets no completion (`AsyncKick`) on some
    /// channel, ringing the doorbell if the server sleeps.
    pub(crate) fn post(&self, req: Request) -> io::Result<()> {
        let index = self.choose();
        let slot = &self.slots[index as usize];
        let ch = self.channel(index);
        let mut full_since = None;
        loop {
            let mut st = slot.lock();
            if !st.announced {
                self.region
                    .header()
                    .channels_used
                    .fetch_max(index + 1, Ordering::AcqRel);
                st.announced = true;
            }
            match st.cursor.submit(&ch, &req) {
                Ok(must_ring) => {
                    drop(st);
                    if must_ring {
                        bump(&slot.stats.doorbells);
                        self.ring_doorbell();
                    }
                    return Ok(());
                }
                Err(RingFull) => {
                    drop(st);
                    let since = *full_since.get_or_insert_with(Instant::now);
                    if !self.server_alive() {
                        return Err(io::Error::from_raw_os_error(libc::ECONNRESET));
                    }
                    if since.elapsed() > RING_FULL_PATIENCE {
                        return Err(io::Error::from_raw_os_error(libc::EIO));
                    }
                    std::thread::yield_now();
                }
            }
        }
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
            s.bytes_copied += st.copied.load(Ordering::Relaxed);
            s.bytes_sent += st.net_sent.load(Ordering::Relaxed);
            s.bytes_received += st.net_received.load(Ordering::Relaxed);
            s.round_trips += st.round_trips.load(Ordering::Relaxed);
        }
        let a = self.asyncs.stats();
        s.async_sends = a.sends;
        s.async_fallbacks = a.fallbacks;
        s.kicks = a.kicks;
        s.registered_misuse = a.misuse;
        s.bytes_copied += a.bytes_copied;
        s.bytes_sent += a.bytes_sent + self.registered_sent.load(Ordering::Relaxed);
        s.bytes_received += self.registered_received.load(Ordering::Relaxed);
        let r = self.ahead.stats();
        s.ring_recvs = r.ring_recvs;
        s.ring_accepts = r.ring_accepts;
        s.recv_kicks = r.recv_kicks;
        s.bytes_received += r.bytes_received;
        s.bytes_copied += r.bytes_copied;
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
