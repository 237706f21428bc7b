//! The host's side of an attachment: the pool of channels, checking one out,
//! and one request/completion exchange on it (submit, doorbell, spin, sleep,
//! server liveness).

use crate::attach::Attached;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};
use tcps_proto::futex;
use tcps_proto::region::ChannelRef;
use tcps_proto::ring::{HostCursor, RingFull};
use tcps_proto::{Completion, Region, Request};

/// How long one futex sleep lasts, and how often a sleeping call checks
/// whether the server is still alive.
const SLEEP_SLICE: Duration = Duration::from_millis(100);
/// How long a request ring may stay full before the call fails with EIO.
const RING_FULL_PATIENCE: Duration = Duration::from_secs(1);
/// The adaptive spin budget never shrinks below this (a server polling on
/// its own core answers in about a microsecond).
const MIN_SPIN_NS: u64 = 2_000;
/// Default number of host threads of one attachment that may spin at once.
const DEFAULT_SPINNERS: u32 = 1;
/// Default spin before sleeping, in microseconds (`TCPS_SPIN_US`).
const DEFAULT_SPIN_US: u64 = 50;

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
}

/// Per-channel counters. Only the thread holding the channel writes them, so
/// a load and a store suffice; `stats()` reads them from anywhere.
#[derive(Default)]
struct SlotStats {
    calls: AtomicU64,
    doorbells: AtomicU64,
    sleeps: AtomicU64,
    spins_satisfied: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// What a channel's holder owns privately.
#[derive(Default)]
struct ChanState {
    cursor: HostCursor,
    /// The last request tag used on this channel.
    tag: u64,
    /// Whether `channels_used` already covers this channel.
    announced: bool,
}

/// One channel of the pool; a cache line pair of its own.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    state: Mutex<ChanState>,
    stats: SlotStats,
}

/// An attachment to a server.
pub(crate) struct Conn {
    id: u64,
    region: Region,
    ctl: OwnedFd,
    doorbell: OwnedFd,
    slots: Box<[Slot]>,
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
        let n = a.region.layout().n_channels as usize;
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
            slots: (0..n).map(|_| Slot::default()).collect(),
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

    /// Takes a free channel for one exchange, preferring the one this thread
    /// used last. `dead_errno` is returned if the attachment dies meanwhile.
    pub fn checkout(&self, dead_errno: i32) -> io::Result<Lease<'_>> {
        let (conn, hint) = LAST_CHANNEL.try_with(Cell::get).unwrap_or((0, 0));
        if conn == self.id {
            if let Some(l) = self.try_lease(hint) {
                return Ok(l);
            }
        }
        let mut round = 0u32;
        loop {
            for i in 0..self.slots.len() as u32 {
                if let Some(l) = self.try_lease(i) {
                    let _ = LAST_CHANNEL.try_with(|c| c.set((self.id, i)));
                    return Ok(l);
                }
            }
            self.check_open(dead_errno)?;
            // Every channel is busy (blocking calls in other threads): back
            // off, gently at first.
            round += 1;
            if round < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50 * u64::from(round.min(1000) / 64)));
            }
        }
    }

    fn try_lease(&self, index: u32) -> Option<Lease<'_>> {
        let slot = self.slots.get(index as usize)?;
        let mut state = match slot.state.try_lock() {
            Ok(g) => g,
            // A panic while holding a channel leaves at most a stale
            // completion behind, which `exchange` skips.
            Err(TryLockError::Poisoned(p)) => {
                slot.state.clear_poison();
                p.into_inner()
            }
            Err(TryLockError::WouldBlock) => return None,
        };
        let ch = self.region.channel(index)?;
        if !state.announced {
            self.region
                .header()
                .channels_used
                .fetch_max(index + 1, Ordering::AcqRel);
            state.announced = true;
        }
        Some(Lease {
            conn: self,
            ch,
            state,
            stats: &slot.stats,
        })
    }

    pub fn stats(&self) -> HostStats {
        let mut s = HostStats::default();
        for slot in self.slots.iter() {
            let st = &slot.stats;
            s.calls += st.calls.load(Ordering::Relaxed);
            s.doorbells += st.doorbells.load(Ordering::Relaxed);
            s.sleeps += st.sleeps.load(Ordering::Relaxed);
            s.spins_satisfied += st.spins_satisfied.load(Ordering::Relaxed);
        }
        s
    }
}

/// Exclusive use of one channel; returned to the pool on drop.
pub(crate) struct Lease<'a> {
    conn: &'a Conn,
    ch: ChannelRef<'a>,
    state: MutexGuard<'a, ChanState>,
    stats: &'a SlotStats,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Lease<'_> {
    /// Bytes of data arena of this channel.
    pub fn arena_size(&self) -> u32 {
        self.ch.arena_size()
    }

    /// Copies `src` into the arena at `off`; EINVAL if it does not fit.
    pub fn put(&self, off: u32, src: &[u8]) -> io::Result<()> {
        if self.ch.copy_to_arena(off, src) {
            Ok(())
        } else {
            Err(errno(libc::EINVAL))
        }
    }

    /// Copies arena bytes at `off` into `dst`; EIO if out of range (the
    /// caller bounds lengths by what it asked for, so this means a bug).
    pub fn get(&self, off: u32, dst: &mut [u8]) -> io::Result<()> {
        if self.ch.copy_from_arena(off, dst) {
            Ok(())
        } else {
            Err(errno(libc::EIO))
        }
    }

    /// Runs one request to completion. A completion with a non-zero errno
    /// becomes that error; otherwise `result` is non-negative.
    pub fn exchange(&mut self, mut req: Request) -> io::Result<Completion> {
        let st = &mut *self.state;
        st.tag = st.tag.wrapping_add(1);
        let tag = st.tag;
        req.user_data = tag;
        bump(&self.stats.calls);
        let mut full_since = None;
        let must_ring = loop {
            match st.cursor.submit(&self.ch, &req) {
                Ok(r) => break r,
                // Impossible with one call in flight per channel unless the
                // server stopped taking requests or the ring indices were
                // tampered with: give the server a while, then give up.
                Err(RingFull) => {
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
        };
        if must_ring {
            self.conn.ring_doorbell();
            bump(&self.stats.doorbells);
        }
        let c = self.wait(tag, must_ring)?;
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

    /// Takes the completion tagged `tag`, skipping stale ones.
    fn reap(&mut self, tag: u64) -> Option<io::Result<Completion>> {
        loop {
            let c = self.state.cursor.reap(&self.ch)?;
            if c.user_data == tag {
                return Some(Ok(c));
            }
            // An older tag answers a call abandoned earlier: skip it. A
            // newer one is a server bug.
            if tag.wrapping_sub(c.user_data) as i64 <= 0 {
                return Some(Err(errno(libc::EIO)));
            }
        }
    }

    /// Waits for the completion tagged `tag`: spin first (no system call)
    /// unless spinning cannot pay off — the server was asleep (`rang`: it
    /// needs a wake-up and a CPU), or enough other threads already spin —
    /// then sleep on the futex.
    fn wait(&mut self, tag: u64, rang: bool) -> io::Result<Completion> {
        if !rang && self.conn.spin_budget_ns.load(Ordering::Relaxed) > 0 {
            if self.conn.spinners.fetch_add(1, Ordering::AcqRel) < self.conn.max_spinners {
                let r = self.spin_wait(tag);
                self.conn.spinners.fetch_sub(1, Ordering::AcqRel);
                if let Some(r) = r {
                    return r;
                }
            } else {
                self.conn.spinners.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.sleep_wait(tag)
    }

    /// Spins until the completion arrives, the server says the call is
    /// parked, or the spin budget runs out.
    ///
    /// The budget adapts (like an adaptive mutex): a spin that runs out
    /// halves it, a completion that arrives after more than half of it
    /// doubles it, within `[MIN_SPIN_NS, TCPS_SPIN_US]`. With a server polling
    /// on a core of its own completions arrive in about a microsecond and the
    /// budget stays large; when the server has to share a CPU, spinning only
    /// steals that CPU and the budget shrinks.
    fn spin_wait(&mut self, tag: u64) -> Option<io::Result<Completion>> {
        let conn = self.conn;
        let budget = conn.spin_budget_ns.load(Ordering::Relaxed);
        let max = conn.spin.as_nanos() as u64;
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if let Some(r) = self.reap(tag) {
                if r.is_ok() {
                    bump(&self.stats.spins_satisfied);
                }
                let took = start.elapsed().as_nanos() as u64;
                if took > budget / 2 {
                    conn.spin_budget_ns
                        .store((budget * 2).min(max), Ordering::Relaxed);
                }
                return Some(r);
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i & 31 != 0 {
                continue;
            }
            // A parked call waits for its socket (a client's request, a
            // connection): sleep now instead of burning the CPU the
            // application and the server need.
            if self.state.cursor.is_parked(&self.ch, tag) {
                return None;
            }
            if start.elapsed().as_nanos() as u64 >= budget {
                conn.spin_budget_ns
                    .store((budget / 2).max(MIN_SPIN_NS.min(max)), Ordering::Relaxed);
                return None;
            }
        }
    }

    fn sleep_wait(&mut self, tag: u64) -> io::Result<Completion> {
        let mut last_check = Instant::now();
        loop {
            if let Some(r) = self.reap(tag) {
                return r;
            }
            if !self.conn.is_open() {
                return Err(errno(libc::ECONNRESET));
            }
            if let Some(tail) = self.state.cursor.prepare_sleep(&self.ch) {
                bump(&self.stats.sleeps);
                futex::wait(&self.ch.ctl().cq_tail, tail, SLEEP_SLICE);
                self.state.cursor.finish_sleep(&self.ch);
            }
            if last_check.elapsed() >= SLEEP_SLICE {
                last_check = Instant::now();
                if !self.conn.server_alive() {
                    // A completion may have landed just before the server
                    // went away.
                    if let Some(r) = self.reap(tag) {
                        return r;
                    }
                    return Err(errno(libc::ECONNRESET));
                }
            }
        }
    }
}
