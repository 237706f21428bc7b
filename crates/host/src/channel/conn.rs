//! The attachment (`Conn`): its region, control socket and doorbell, the
//! pool of channels with their host-side state and counters, the server's
//! liveness, and posting a request that gets no completion.

use super::state::ChanState;
use crate::attach::Attached;
use crate::control::Control;
use crate::memory::Registry;
use crate::sendq::shared::SendqShared;
use crate::socket::Sockets;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tcps_proto::eager::RecvRingConsumer;
use tcps_proto::layout::SERVER_DEDICATED_CORES;
use tcps_proto::ready_log::{ReadyLogReader, DOORBELL_SLOTS};
use tcps_proto::region::ChannelRef;
use tcps_proto::ring::{HostCursor, RingFull};
use tcps_proto::sendq::SendQueueProducer;
use tcps_proto::{Call, Region};

/// How long one futex sleep lasts, and how often a sleeping call checks
/// whether the server is still alive.
pub(super) const SLEEP_SLICE: Duration = Duration::from_millis(100);
/// How long a request ring may stay full before the call fails with EIO.
pub(super) const RING_FULL_PATIENCE: Duration = Duration::from_secs(1);
/// Longest sleep of a thread waiting for room in a full request ring (the
/// server wakes it; this bounds the liveness checks).
const ROOM_SLICE: Duration = Duration::from_millis(10);
/// The adaptive spin budget never shrinks below this (a server polling on
/// its own core answers in about a microsecond).
pub(super) const MIN_SPIN_NS: u64 = 10_000;
/// Default number of host threads of one attachment that may spin at once.
const DEFAULT_SPINNERS: u32 = 1;
/// Default spin before sleeping, in microseconds (`TCPS_SPIN_US`).
const DEFAULT_SPIN_US: u64 = 50;
/// Calls with at most this many bytes of arena are staged (see [`Lease`]).
pub(crate) const STAGE: usize = 256;

const OPEN: u8 = 0;
const SERVER_DEAD: u8 = 1;
const DETACHED: u8 = 2;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (connection id, channel index) this thread used last.
    pub(super) static LAST_CHANNEL: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
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
    /// Times a thread found a request ring full and slept until the server
    /// took requests (it parks, it does not spin).
    pub room_waits: u64,
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
pub(super) struct SlotStats {
    pub(super) calls: AtomicU64,
    pub(super) doorbells: AtomicU64,
    pub(super) sleeps: AtomicU64,
    pub(super) spins_satisfied: AtomicU64,
    pub(super) shared: AtomicU64,
    pub(super) handed_off: AtomicU64,
    pub(super) stray: AtomicU64,
    pub(super) copied: AtomicU64,
    pub(super) net_sent: AtomicU64,
    pub(super) net_received: AtomicU64,
    pub(super) round_trips: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// One channel of the pool; a cache line pair of its own.
#[repr(align(128))]
pub(super) struct Slot {
    pub(super) state: Mutex<ChanState>,
    /// `state.uses.len()`, readable without the lock (checkout's scan).
    pub(super) users: AtomicU32,
    pub(super) stats: SlotStats,
}

impl Slot {
    pub(super) fn lock(&self) -> MutexGuard<'_, ChanState> {
        // Nothing panics while holding the lock; should something, the state
        // is still consistent entry by entry.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An attachment to a server.
pub(crate) struct Conn {
    pub(super) id: u64,
    pub(super) region: Region,
    pub(super) ctl: Control,
    pub(super) doorbell: OwnedFd,
    pub(super) slots: Box<[Slot]>,
    /// Most calls one channel carries at once: `ring_entries - 1`.
    pub(super) max_users: u32,
    pub(super) state: AtomicU8,
    pub(crate) spin: Duration,
    /// Host threads spinning for a completion right now, and the most allowed
    /// (`TCPS_SPINNERS`, default 1): on an oversubscribed machine more
    /// spinners would only steal the CPU the server needs to answer them.
    pub(super) spinners: AtomicU32,
    pub(super) max_spinners: u32,
    /// The current adaptive spin budget (see `Lease::spin_wait`).
    pub(super) spin_budget_ns: AtomicU64,
    /// Registered memory (see `memory`).
    pub(crate) memory: Registry,
    /// The attachment's send-queue state (see `sendq`).
    pub(crate) sendq: SendqShared,
    /// The record of each socket (see `socket`).
    pub(crate) socks: Sockets,
    /// The pipes the server rings for this attachment's ring sleepers, one
    /// per thread sleeping at once, each asked for once (see `ring_wait`).
    pub(crate) host_doorbells: Vec<std::sync::OnceLock<OwnedFd>>,
    /// Which doorbells a sleeping thread holds (see `ring_wait`).
    pub(crate) bells_held: AtomicU64,
    /// How long a doorbell sleeper spins on its rings first (adaptive,
    /// within `[0, spin]`; see `ring_wait`).
    pub(crate) bell_spin_ns: AtomicU64,
    /// How long a blocking receive (or accept) spins on its ring before
    /// the futex sleep (adaptive, see [`Conn::spin_until`]).
    pub(crate) ring_spin_ns: AtomicU64,
    /// Times a thread slept waiting for room in a full request ring.
    pub(super) room_waits: AtomicU64,
    /// Bytes moved by registered (zero-copy) synchronous calls.
    pub(super) registered_sent: AtomicU64,
    pub(super) registered_received: AtomicU64,
    /// Attached over a fabric (`crate::remote`): no socket of this host
    /// has a descriptor here; `socket` and `bind` run at the server.
    pub(crate) remote: bool,
}

impl Conn {
    pub fn new(a: Attached, remote: bool) -> Conn {
        let layout = *a.region.layout();
        let n = layout.n_channels as usize;
        let max_users = layout.ring_entries.saturating_sub(1).max(1);
        // Spinning pays only when the server polls on cores of its own
        // (`tcps server --cpus`); otherwise a spinning host thread competes
        // for the CPU the server needs to answer it, and sleeping at once is
        // cheaper. TCPS_SPIN_US overrides either way.
        let dedicated =
            a.region.header().server_flags.load(Ordering::Acquire) & SERVER_DEDICATED_CORES != 0;
        let spin_us = crate::settings::setting_num::<u64>("TCPS_SPIN_US")
            .unwrap_or(if dedicated { DEFAULT_SPIN_US } else { 0 })
            .min(1_000_000);
        let send_queues = layout.send_queues;
        Conn {
            memory: Registry::new(),
            sendq: SendqShared::new(send_queues),
            socks: Sockets::new(),
            host_doorbells: (0..DOORBELL_SLOTS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            bells_held: AtomicU64::new(0),
            registered_sent: AtomicU64::new(0),
            room_waits: AtomicU64::new(0),
            registered_received: AtomicU64::new(0),
            remote,
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
            bell_spin_ns: AtomicU64::new(spin_us * 1000),
            ring_spin_ns: AtomicU64::new(spin_us * 1000),
            max_spinners: crate::settings::setting_num::<u32>("TCPS_SPINNERS")
                .unwrap_or(DEFAULT_SPINNERS),
        }
    }

    /// Before a futex sleep, when the server polls on cores of its own
    /// (`TCPS_SPIN_US`, default 50 µs then, else 0): looks (`ready`) again
    /// and again for at most `budget` nanoseconds, so an answer that is
    /// microseconds away costs neither a wake-up at the server (a futex
    /// wake, an IPI) nor a sleep here. The budget adapts like an adaptive
    /// mutex: a spin that runs out halves it (not below `min_ns`), one that
    /// ends after more than half of it doubles it (up to the spin), so an
    /// idle wait soon stops spinning. At most `TCPS_SPINNERS` threads of
    /// the attachment spin at once (more would steal the CPU the server and
    /// the other threads need). Returns whether `ready` said yes.
    pub(crate) fn spin_until(
        &self,
        budget_ns: &AtomicU64,
        min_ns: u64,
        ready: &mut dyn FnMut() -> io::Result<bool>,
    ) -> io::Result<bool> {
        let max = self.spin.as_nanos() as u64;
        let budget = budget_ns.load(Ordering::Relaxed);
        if max == 0 || budget == 0 {
            return Ok(false);
        }
        if self.spinners.fetch_add(1, Ordering::AcqRel) >= self.max_spinners {
            self.spinners.fetch_sub(1, Ordering::AcqRel);
            return Ok(false);
        }
        let start = Instant::now();
        let r = loop {
            match ready() {
                Ok(true) => {
                    if start.elapsed().as_nanos() as u64 > budget / 2 {
                        budget_ns.store((budget * 2).min(max), Ordering::Relaxed);
                    }
                    break Ok(true);
                }
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            if start.elapsed().as_nanos() as u64 >= budget {
                budget_ns.store((budget / 2).max(min_ns.min(max)), Ordering::Relaxed);
                break Ok(false);
            }
            std::hint::spin_loop();
        };
        self.spinners.fetch_sub(1, Ordering::AcqRel);
        r
    }

    /// After a wait that spun (`budget_ns` > 0 then) and ran out, then
    /// slept: if the answer came within the longest spin after all
    /// (`waited` since the wait began), spinning would have paid, so the
    /// budget doubles back. Without this it only shrinks on spins that ran
    /// out: a server that was slow for a moment (preempted, a host made
    /// dormant) left every later wait sleeping, and each sleep (a futex
    /// wake at the server, a wake-up here) made the next answer slower
    /// still, so the budget never grew again (pingpong at ~2x its p50).
    pub(crate) fn spin_would_have_paid(&self, budget_ns: &AtomicU64, waited: Duration) {
        if waited < self.spin {
            let max = self.spin.as_nanos() as u64;
            let b = budget_ns.load(Ordering::Relaxed);
            budget_ns.store((b * 2).clamp(1, max), Ordering::Relaxed);
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

    /// Send queue `q` (an index the caller got from the layout's range),
    /// on the host's side.
    pub(crate) fn send_queue(&self, q: u32) -> SendQueueProducer<'_> {
        let sq = self.region.send_queue(q);
        SendQueueProducer::new(sq.expect("send queue indices come from the layout"))
    }

    /// Send queue `q`, if the region has one (`q` is a socket id: queue `s`
    /// belongs to socket `s`).
    pub(crate) fn region_send_queue(&self, q: u32) -> Option<SendQueueProducer<'_>> {
        self.region.send_queue(q).map(SendQueueProducer::new)
    }

    /// Receive ring `r` (of socket id `r`), if the region has one, on the
    /// host's side (an accept ring's view is `AcceptRingConsumer::new(ring.ring())`).
    pub(crate) fn recv_ring(&self, r: u32) -> Option<RecvRingConsumer<'_>> {
        self.region.recv_ring(r).map(RecvRingConsumer::new)
    }

    /// The host's ready log (which rings the server published into).
    pub(crate) fn ready_log(&self) -> ReadyLogReader<'_> {
        ReadyLogReader::new(self.region.ready_log())
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
    pub(crate) fn post(&self, call: Call) -> io::Result<()> {
        self.post_on(self.choose(), call)
    }

    /// Publishes a request that gets no completion on channel `index`
    /// (behind the requests published there before it: `Cancel`).
    pub(crate) fn post_on(&self, index: u32, call: Call) -> io::Result<()> {
        let req = call.encode();
        let slot = &self.slots[index as usize];
        let ch = self.channel(index);
        let mut full_since = None;
        loop {
            let mut st = slot.lock();
            self.announce(index, &mut st);
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
                    let tail = st.cursor.next_request();
                    drop(st);
                    self.wait_for_room(&ch, tail, &mut full_since)?;
                }
            }
        }
    }

    /// The request ring of `ch` was full at `tail` (the index the next
    /// request takes): park on the ring until the server takes requests
    /// (it wakes room waiters after its pops; `ring::HostCursor::room_wait_prepare`),
    /// instead of spinning or yielding the CPU the server needs to drain
    /// it. ECONNRESET if the server is gone, EIO after `RING_FULL_PATIENCE`
    /// (a server that stopped taking requests, or tampered indices).
    pub(super) fn wait_for_room(
        &self,
        ch: &ChannelRef<'_>,
        tail: u32,
        full_since: &mut Option<Instant>,
    ) -> io::Result<()> {
        let since = *full_since.get_or_insert_with(Instant::now);
        if !self.server_alive() {
            return Err(io::Error::from_raw_os_error(libc::ECONNRESET));
        }
        if since.elapsed() > RING_FULL_PATIENCE {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if let Some(head) = HostCursor::room_wait_prepare(ch, tail) {
            self.room_waits.fetch_add(1, Ordering::Relaxed);
            HostCursor::room_wait(ch, head, ROOM_SLICE);
            HostCursor::room_wait_done(ch);
        }
        Ok(())
    }

    /// Makes sure `channels_used` covers channel `index` (locked as `st`):
    /// the server looks at channels below it.
    pub(super) fn announce(&self, index: u32, st: &mut ChanState) {
        if !st.announced {
            self.region
                .header()
                .channels_used
                .fetch_max(index + 1, Ordering::AcqRel);
            st.announced = true;
        }
    }

    pub(super) fn channel(&self, index: u32) -> ChannelRef<'_> {
        self.region
            .channel(index)
            .expect("slots and channels have the same count")
    }

    pub(super) fn ring_doorbell(&self) {
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
        s.room_waits = self.room_waits.load(Ordering::Relaxed);
        s.bytes_sent += self.registered_sent.load(Ordering::Relaxed);
        s.bytes_received += self.registered_received.load(Ordering::Relaxed);
        s
    }
}

/// Waiting for room on some channel: yield at first, then sleep a little
/// longer each round (up to ~750 µs).
#[derive(Default)]
pub(super) struct Backoff(u32);

impl Backoff {
    pub(super) fn wait(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50 * u64::from(self.0.min(1000) / 64)));
        }
    }
}
