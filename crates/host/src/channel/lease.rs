//! One call's exchange on a checked-out channel: submit, spin, sleep, drain,
//! hand over other threads' completions, release.

use super::conn::{bump, Backoff, Conn, Slot, LAST_CHANNEL, MIN_SPIN_NS, SLEEP_SLICE, STAGE};
use super::state::{round_up, ChanState, Use, UseState};
use crate::interrupt::{self, Mark};
use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tcps_proto::msg::Call;
use tcps_proto::region::ChannelRef;
use tcps_proto::ring::{self, HostCursor, RingFull};
use tcps_proto::{Completion, Request};

/// A call's watch for signals while it waits (see `crate::interrupt`):
/// once a handler ran, the server is asked once to cancel the call.
struct Interrupt {
    mark: Mark,
    sock: u32,
    cancelled: bool,
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
    pub(super) index: u32,
    /// Tag of this lease's current (or last) request, which identifies its
    /// entry in the users table; 0: no entry (an unbound staged lease).
    pub(super) tag: u64,
    /// The reserved range (while bound) and its length.
    pub(super) off: u32,
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
    pub(super) fn new(
        conn: &'a Conn,
        index: u32,
        dead_errno: i32,
        len: u32,
        staged: bool,
    ) -> Lease<'a> {
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

    /// Counts bytes the library copied (see `HostStats::bytes_copied`).
    /// Several threads may share the slot, hence the atomic add.
    fn count_copy(&self, n: usize) {
        self.slot
            .stats
            .copied
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts bytes the server moved on the network for this call.
    pub fn count_network(&self, sent: usize, received: usize) {
        let st = &self.slot.stats;
        st.net_sent.fetch_add(sent as u64, Ordering::Relaxed);
        st.net_received
            .fetch_add(received as u64, Ordering::Relaxed);
    }

    /// Copies `src` into the call's range at `off`; EINVAL if it does not fit.
    pub fn put(&mut self, off: u32, src: &[u8]) -> io::Result<()> {
        let (off, end) = (off as usize, off as usize + src.len());
        if end > self.len as usize {
            return Err(errno(libc::EINVAL));
        }
        self.count_copy(src.len());
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
        self.count_copy(dst.len());
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
        let on_socket = tcps_proto::Op::from_u16(req.op).is_some_and(tcps_proto::Op::names_socket);
        if on_socket && self.conn.socks.closed_unanswered(req.sock) {
            return Err(errno(libc::EBADF));
        }
        let mark = Mark::new();
        let c = loop {
            let intr = Interrupt {
                mark,
                sock: req.sock,
                cancelled: false,
            };
            let (seen, must_ring) = self.submit(&mut req)?;
            if must_ring {
                self.conn.ring_doorbell();
            }
            let c = self.wait(seen, must_ring, intr)?;
            self.slot.stats.round_trips.fetch_add(1, Ordering::Relaxed);
            // The server answered the parked call before it finished and
            // moved nothing (a hot upgrade): the same request again, to
            // the server that runs now (`tcps_proto::msg::ERETRY`).
            if c.errno != tcps_proto::msg::ERETRY {
                break c;
            }
            // A signal handler ran meanwhile: the call is interrupted, as
            // it would have been had the server answered its cancel.
            if mark.seen() {
                return Err(interrupt::eintr());
            }
        };
        if c.op != req.op {
            return Err(errno(libc::EIO));
        }
        if c.errno != 0 {
            if on_socket {
                self.conn.socks.note_error(req.sock, c.errno);
            }
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
                self.count_copy(n);
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
                    let seen = HostCursor::consumed(&self.ch);
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
                self.count_copy(n);
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
                    let seen = HostCursor::consumed(&self.ch);
                    return Ok((seen, must_ring));
                }
                // Impossible while each channel carries fewer calls than it
                // has ring slots, unless the server stopped taking requests
                // or the ring indices were tampered with: give the server a
                // while, then give up.
                Err(RingFull) => {
                    let tail = st.cursor.next_request();
                    drop(st);
                    self.conn.wait_for_room(&self.ch, tail, &mut full_since)?;
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
                    self.count_copy(n);
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
            self.count_copy(n);
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
        let seen = HostCursor::consumed(&self.ch);
        drop(st);
        if wake {
            HostCursor::wake_sleepers(&self.ch);
        }
        (c, seen)
    }

    /// Waits for our completion: spin first (no system call) unless spinning
    /// cannot pay off — the server was asleep (`rang`, unless only this host
    /// was dormant: it needs a wake-up and a CPU), or enough other threads already spin — then sleep on the
    /// futex.
    fn wait(&mut self, seen: u32, rang: bool, intr: Interrupt) -> io::Result<Completion> {
        // A dormant host rings, but the server is awake (it polls other
        // hosts) and sees the bell within a pass: spinning still pays.
        let rang = rang && !HostCursor::server_polls(&self.ch);
        let mut spun = None;
        if !rang && self.conn.spin_budget_ns.load(Ordering::Relaxed) > 0 {
            if self.conn.spinners.fetch_add(1, Ordering::AcqRel) < self.conn.max_spinners {
                let start = Instant::now();
                let r = self.spin_wait(seen);
                self.conn.spinners.fetch_sub(1, Ordering::AcqRel);
                if let Some(c) = r {
                    return Ok(c);
                }
                spun = Some(start);
            } else {
                self.conn.spinners.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let r = self.sleep_wait(intr);
        if let Some(start) = spun {
            let conn = self.conn;
            conn.spin_would_have_paid(&conn.spin_budget_ns, start.elapsed());
        }
        r
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
        let budget = conn.spin_budget_ns.load(Ordering::Relaxed);
        let max = conn.spin.as_nanos() as u64;
        let start = Instant::now();
        let mut i = 0u32;
        let entries = self.ch.ring_entries();
        loop {
            // The next completion's slot stamp is the signal: one cache line
            // from the server. Only when other calls share the channel can
            // another thread have taken ours meanwhile; then `cq_tail` moving
            // tells. (Polling `cq_tail` always would pull the server's line
            // away from it on every completion.)
            let head = HostCursor::consumed(&self.ch);
            let published = self.ch.completion_stamp(head) == ring::stamp(head, entries);
            let shared = self.slot.users.load(Ordering::Relaxed) > 1;
            if published || (shared && HostCursor::published(&self.ch) != seen) {
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
            if HostCursor::parked(&self.ch, self.tag) {
                return None;
            }
            if start.elapsed().as_nanos() as u64 >= budget {
                conn.spin_budget_ns
                    .store((budget / 2).max(MIN_SPIN_NS.min(max)), Ordering::Relaxed);
                return None;
            }
        }
    }

    /// A signal handler ran during the wait (`hit`: the futex said so):
    /// ask the server once to complete the call now (it answers with what
    /// the call moved, else EINTR; a call it answered already is not
    /// touched). The request follows ours on the same channel, so the
    /// server has taken ours first.
    fn cancel_if_interrupted(&self, intr: &mut Interrupt, hit: bool) {
        if intr.cancelled || !(hit || intr.mark.seen()) {
            return;
        }
        intr.cancelled = true;
        let cancel = Call::Cancel {
            sock: intr.sock,
            target: self.tag,
        };
        // A server gone answers nothing anyway: the wait ends below.
        let _ = self.conn.post_on(self.index, cancel);
    }

    fn sleep_wait(&mut self, mut intr: Interrupt) -> io::Result<Completion> {
        let slot = self.slot;
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
                if let Some(tail) = HostCursor::register_sleeper(&self.ch) {
                    bump(&slot.stats.sleeps);
                    sleep_on = Some(tail);
                } else {
                    // Published meanwhile: drain it on the next turn.
                    unregister(&mut st, &self.ch);
                }
            }
            drop(st);
            if wake {
                HostCursor::wake_sleepers(&self.ch);
            }
            if let Some(c) = got {
                return Ok(c);
            }
            if !self.conn.is_open() {
                return Err(errno(libc::ECONNRESET));
            }
            self.cancel_if_interrupted(&mut intr, false);
            if let Some(tail) = sleep_on {
                // Everything up to `tail` was drained under the lock, so our
                // completion changes `cq_tail` from `tail`: the wait returns
                // at once, or the server's wake (host_waiting is set) ends it.
                let hit =
                    interrupt::futex_interrupted(|| HostCursor::sleep(&self.ch, tail, SLEEP_SLICE));
                unregister(&mut slot.lock(), &self.ch);
                self.cancel_if_interrupted(&mut intr, hit);
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
fn unregister(st: &mut ChanState, ch: &ChannelRef<'_>) {
    st.sleepers = st.sleepers.saturating_sub(1);
    if st.sleepers == 0 {
        HostCursor::clear_waiting(ch);
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
