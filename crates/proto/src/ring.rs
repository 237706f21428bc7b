//! The two single-producer/single-consumer rings of a channel and the
//! sleep/wake handshakes around them.
//!
//! Indices are free-running `u32`s; a slot is `index % entries`. A slot is
//! *published* by its stamp: the producer writes the body, then stores
//! [`stamp`]`(index)` into the slot's `stamp` field with release ordering;
//! the consumer at `index` polls that stamp. So a round trip costs one cache
//! line each way (the slot), not two (an index, then the slot). The shared
//! indices (`req_tail`, `req_head`, `cq_head`, `cq_tail`) are still
//! published, but read only when a ring looks full and for sleeping.
//!
//! Each side keeps its cursor in private memory. The server never depends on
//! a value the host can change: it reads only its own head's slot, checks
//! the host's `cq_head` against its own tail, and treats an impossible value
//! as a protocol violation by that host.
//!
//! Sleeping uses the Dekker pattern on both sides: "store my flag; full fence;
//! load the other side's progress". Whichever side goes second sees the first.
//!
//! * server → sleep: store `server_sleeping = 1`, fence, re-check the head
//!   slot of every channel; a host publishing a request stamps the slot,
//!   fences, and rings the doorbell eventfd if it sees `server_sleeping`.
//! * host → sleep: store `host_waiting = 1`, fence, load `cq_tail`, re-check
//!   the completion stamp, then futex-wait on `cq_tail`; the server
//!   publishing a completion stamps it, bumps `cq_tail`, fences, and
//!   futex-wakes if it sees `host_waiting`.
//! * server → stop looking at one host (it is idle; the worker polls
//!   others): store `server_sleeping = HOST_DORMANT`, fence, re-check each
//!   channel's `req_tail`; the host's publish (stamp, `req_tail`, fence,
//!   load `server_sleeping`) then rings the doorbell, which makes the host
//!   awake again (loom model:
//!   `loom_tests::dormant_host_never_misses_a_request`).
//! * host → wait for room (its request ring is full): `room_waiters += 1`,
//!   fence, load `req_head`; still full: futex-wait on `req_head`. The
//!   server, after taking requests from a channel (each pop stores
//!   `req_head`), fences once and futex-wakes if it sees `room_waiters`
//!   (loom model: `loom_tests::request_ring_room_never_misses_a_waiter`).

use crate::layout::RegionHeader;
use crate::msg::{Completion, Request};
pub use crate::region::stamp;
use crate::region::ChannelRef;
use crate::sync::{fence, Ordering, Word};

/// A host broke the ring protocol; the server detaches that host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The host's completion head is ahead of what the server published, or too far behind.
    CompletionHeadInvalid { head: u32, tail: u32 },
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::CompletionHeadInvalid { head, tail } => {
                write!(
                    f,
                    "completion head {head} impossible for server tail {tail}"
                )
            }
        }
    }
}

/// The host side of the room handshake (see the module doc): registers a
/// thread waiting for room in a request ring whose next request index is
/// `tail`, fences, re-reads `head`. Returns the `head` to futex-wait on
/// while the ring is still full (the caller then calls [`room_done`]), or
/// `None` if the server took requests meanwhile (unregistered; retry).
pub(crate) fn room_prepare<W: Word>(waiters: &W, head: &W, tail: u32, entries: u32) -> Option<u32> {
    waiters.fetch_add(1, Ordering::AcqRel);
    fence(Ordering::SeqCst);
    let h = head.load(Ordering::Acquire);
    if tail.wrapping_sub(h) >= entries {
        Some(h)
    } else {
        room_done(waiters);
        None
    }
}

/// A room waiter leaves.
pub(crate) fn room_done<W: Word>(waiters: &W) {
    waiters.fetch_sub(1, Ordering::AcqRel);
}

/// The server side: after storing `req_head` for the requests it took,
/// fences, and says whether a host thread waits for room.
pub(crate) fn room_wanted<W: Word>(waiters: &W) -> bool {
    fence(Ordering::SeqCst);
    waiters.load(Ordering::Relaxed) != 0
}

/// `server_sleeping`: the server may be asleep (every host rings).
pub const SERVER_ASLEEP: u32 = 1;
/// `server_sleeping`: the server is awake but does not look at this host's
/// channels until it rings (it was idle): ringing is needed, but the bell
/// is seen within a pass, so waiting for the completion by spinning pays.
pub const HOST_DORMANT: u32 = 2;

/// The server side of making a host dormant: `server_sleeping =
/// HOST_DORMANT`, then one fence (Dekker against the host's
/// [`publish_request`]). Then each channel is re-checked with
/// [`published_since`].
pub(crate) fn announce_dormant<W: Word>(flag: &W) {
    // Relaxed: the fence orders it before the re-checks.
    flag.store(HOST_DORMANT, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Whether the host published requests past `req_head` (its `req_tail`).
pub(crate) fn published_since<W: Word>(req_tail: &W, req_head: u32) -> bool {
    req_tail.load(Ordering::Acquire) != req_head
}

/// The host side of publishing request `tail - 1` (its slot stamped
/// already): stores `req_tail`, fences, and returns `server_sleeping`
/// (non-zero: ring the doorbell).
pub(crate) fn publish_request<W: Word>(req_tail: &W, tail: u32, flag: &W) -> u32 {
    req_tail.store(tail, Ordering::Release);
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed)
}

/// The server's private view of one channel.
///
/// The server takes a request only when it can be sure its completion will
/// find a free slot: `outstanding` (taken, not yet completed) plus completions
/// the host has not consumed stays below the ring size. So completions are
/// never dropped and never need an overflow queue.
#[derive(Debug, Default, Clone)]
pub struct ServerCursor {
    req_head: u32,
    cq_tail: u32,
    outstanding: u32,
    /// The host's `cq_head` as last read (validated); re-read only when the
    /// completion ring looks full.
    cq_head_seen: u32,
}

impl ServerCursor {
    /// The cursor as four words (`req_head`, `cq_tail`, `outstanding`,
    /// `cq_head_seen`): what a hot upgrade carries across exec.
    pub fn to_words(&self) -> [u32; 4] {
        [
            self.req_head,
            self.cq_tail,
            self.outstanding,
            self.cq_head_seen,
        ]
    }

    /// The cursor [`to_words`](Self::to_words) gave (the server's own
    /// record, never host memory).
    pub fn from_words(w: [u32; 4]) -> ServerCursor {
        ServerCursor {
            req_head: w[0],
            cq_tail: w[1],
            outstanding: w[2],
            cq_head_seen: w[3],
        }
    }

    /// Requests taken but not yet completed (parked calls).
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Reads and validates the host's consumed-completions index.
    fn refresh_cq_head(&mut self, ch: &ChannelRef<'_>) -> Result<(), RingError> {
        let head = ch.ctl().cq_head.load(Ordering::Acquire);
        let unconsumed = self.cq_tail.wrapping_sub(head);
        if unconsumed > ch.ring_entries()
            || head.wrapping_sub(self.cq_head_seen) > ch.ring_entries()
        {
            return Err(RingError::CompletionHeadInvalid {
                head,
                tail: self.cq_tail,
            });
        }
        self.cq_head_seen = head;
        Ok(())
    }

    /// Whether a completion slot is guaranteed for one more request.
    fn has_credit(&mut self, ch: &ChannelRef<'_>) -> Result<bool, RingError> {
        let entries = ch.ring_entries();
        if self.outstanding + self.cq_tail.wrapping_sub(self.cq_head_seen) < entries {
            return Ok(true);
        }
        self.refresh_cq_head(ch)?;
        Ok(self.outstanding + self.cq_tail.wrapping_sub(self.cq_head_seen) < entries)
    }

    /// Whether the host has published a request we have not taken.
    pub fn has_requests(&self, ch: &ChannelRef<'_>) -> bool {
        ch.request_stamp(self.req_head) == stamp(self.req_head, ch.ring_entries())
    }

    /// Takes the next request, copied out of shared memory, if there is one
    /// and its completion is guaranteed a slot.
    pub fn pop(&mut self, ch: &ChannelRef<'_>) -> Result<Option<Request>, RingError> {
        if !self.has_requests(ch) || !self.has_credit(ch)? {
            return Ok(None);
        }
        let req = ch.read_request(self.req_head);
        self.req_head = self.req_head.wrapping_add(1);
        self.outstanding += 1;
        ch.ctl().req_head.store(self.req_head, Ordering::Release);
        Ok(Some(req))
    }

    /// After taking requests from `ch` with [`pop`](Self::pop): whether a
    /// host thread sleeps waiting for room in its request ring (one fence;
    /// call once per channel and pass, not per request). Then
    /// [`wake_room`](Self::wake_room).
    pub fn room_wanted(ch: &ChannelRef<'_>) -> bool {
        room_wanted(&ch.ctl().room_waiters)
    }

    /// Wakes every host thread waiting for room in `ch`'s request ring.
    pub fn wake_room(ch: &ChannelRef<'_>) {
        crate::wake_batch::wake_all(&ch.ctl().req_head);
    }

    /// Tells the host that the request tagged `user_data` is parked: it will
    /// wait for a socket, so spinning for it is wasted CPU.
    pub fn mark_parked(&self, ch: &ChannelRef<'_>, user_data: u64) {
        ch.ctl()
            .parked_tag
            .store(user_data as u32, Ordering::Release);
    }

    /// Ends a request taken with [`pop`](Self::pop) that is answered by no
    /// completion (`Op::AsyncKick`): its reserved completion slot is free again.
    pub fn retire(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// Before the server sleeps: `server_sleeping = 1` in the header of
    /// every attached host's region, then one fence (Dekker against a host's
    /// "stamp the request; fence; load server_sleeping"). After this, re-check
    /// every channel with [`has_requests`](Self::has_requests): a request
    /// published before the fence is seen there, one published after it
    /// finds the flag and rings the doorbell.
    pub fn announce_sleep<'h>(headers: impl IntoIterator<Item = &'h RegionHeader>) {
        for h in headers {
            // Relaxed: the fence below orders it before the re-check.
            h.server_sleeping.store(SERVER_ASLEEP, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    /// The server is awake again (hosts need not ring the doorbell).
    pub fn end_sleep(header: &RegionHeader) {
        header.server_sleeping.store(0, Ordering::Relaxed);
    }

    /// The server stops looking at this host's channels (it was idle):
    /// `server_sleeping = HOST_DORMANT`, one fence. Then re-check every
    /// channel with [`has_published`](Self::has_published): a request
    /// published before the fence is seen there, one published after it
    /// finds the flag and rings the doorbell.
    pub fn announce_dormant(header: &RegionHeader) {
        announce_dormant(&header.server_sleeping);
    }

    /// After a sleep, a host that stays dormant: `server_sleeping` goes
    /// back from `SERVER_ASLEEP` to `HOST_DORMANT` (non-zero throughout, so
    /// no request goes unrung).
    pub fn keep_dormant(header: &RegionHeader) {
        header
            .server_sleeping
            .store(HOST_DORMANT, Ordering::Relaxed);
    }

    /// Whether the host published a request we have not taken, by its
    /// `req_tail` (for [`announce_dormant`](Self::announce_dormant); the
    /// scan itself reads slot stamps).
    pub fn has_published(&self, ch: &ChannelRef<'_>) -> bool {
        published_since(&ch.ctl().req_tail, self.req_head)
    }

    /// Publishes the completion of a request taken with [`pop`](Self::pop).
    /// Returns true if the host is asleep and must be woken (futex on `cq_tail`).
    pub fn complete(&mut self, ch: &ChannelRef<'_>, c: &Completion) -> Result<bool, RingError> {
        debug_assert!(self.outstanding > 0);
        // The credit check in `pop` reserved this slot, unless the host moved
        // its head backwards since, which the re-read reports.
        if self.cq_tail.wrapping_sub(self.cq_head_seen) >= ch.ring_entries() {
            self.refresh_cq_head(ch)?;
            if self.cq_tail.wrapping_sub(self.cq_head_seen) >= ch.ring_entries() {
                return Err(RingError::CompletionHeadInvalid {
                    head: self.cq_head_seen,
                    tail: self.cq_tail,
                });
            }
        }
        ch.write_completion(self.cq_tail, c);
        self.cq_tail = self.cq_tail.wrapping_add(1);
        self.outstanding = self.outstanding.saturating_sub(1);
        ch.ctl().cq_tail.store(self.cq_tail, Ordering::Release);
        fence(Ordering::SeqCst);
        Ok(ch.ctl().host_waiting.load(Ordering::Relaxed) != 0)
    }

    /// Wakes every host thread sleeping on the channel's `cq_tail`: after
    /// [`complete`](Self::complete) returned true, or when the server stops
    /// (the sleepers then see `server_alive == 0`).
    pub fn wake_host(ch: &ChannelRef<'_>) {
        crate::wake_batch::wake_all(&ch.ctl().cq_tail);
    }
}

/// The host's private view of one channel.
#[derive(Debug, Default, Clone)]
pub struct HostCursor {
    req_tail: u32,
    cq_head: u32,
    /// The server's `req_head` as last read; re-read only when the request
    /// ring looks full.
    req_head_seen: u32,
}

/// The request ring is full: wait for the server to take requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFull;

impl HostCursor {
    /// Publishes a request. Returns true if the server may be asleep and the
    /// doorbell must be rung.
    pub fn submit(&mut self, ch: &ChannelRef<'_>, r: &Request) -> Result<bool, RingFull> {
        if self.req_tail.wrapping_sub(self.req_head_seen) >= ch.ring_entries() {
            self.req_head_seen = ch.ctl().req_head.load(Ordering::Acquire);
            if self.req_tail.wrapping_sub(self.req_head_seen) >= ch.ring_entries() {
                return Err(RingFull);
            }
        }
        ch.write_request(self.req_tail, r);
        self.req_tail = self.req_tail.wrapping_add(1);
        let flag = &ch.header().server_sleeping;
        Ok(publish_request(&ch.ctl().req_tail, self.req_tail, flag) != 0)
    }

    /// After a [`submit`](Self::submit) that must ring: whether the server
    /// is awake nonetheless (this host was dormant, `HOST_DORMANT`): it sees
    /// the bell within a pass, so spinning for the completion pays.
    pub fn server_polls(ch: &ChannelRef<'_>) -> bool {
        ch.header().server_sleeping.load(Ordering::Relaxed) == HOST_DORMANT
    }

    /// The index the next request will take (free-running): after
    /// [`RingFull`], what [`room_wait_prepare`](Self::room_wait_prepare)
    /// compares the server's `req_head` with.
    pub fn next_request(&self) -> u32 {
        self.req_tail
    }

    /// A thread that found the request ring full at `tail` (see
    /// [`next_request`](Self::next_request); it may sleep without the
    /// cursor): registers as a room waiter and re-checks (Dekker against
    /// the server's "store req_head; fence; load room_waiters"). Returns
    /// the `req_head` to pass to [`room_wait`](Self::room_wait), then call
    /// [`room_wait_done`](Self::room_wait_done); `None`: the server took
    /// requests meanwhile, post again.
    pub fn room_wait_prepare(ch: &ChannelRef<'_>, tail: u32) -> Option<u32> {
        let ctl = ch.ctl();
        room_prepare(&ctl.room_waiters, &ctl.req_head, tail, ch.ring_entries())
    }

    /// Sleeps while `req_head` is `head`, at most `timeout`.
    pub fn room_wait(ch: &ChannelRef<'_>, head: u32, timeout: std::time::Duration) {
        crate::futex::wait(&ch.ctl().req_head, head, timeout);
    }

    /// The room waiter leaves.
    pub fn room_wait_done(ch: &ChannelRef<'_>) {
        room_done(&ch.ctl().room_waiters);
    }

    /// Whether the next completion has been published.
    pub fn completion_ready(&self, ch: &ChannelRef<'_>) -> bool {
        ch.completion_stamp(self.cq_head) == stamp(self.cq_head, ch.ring_entries())
    }

    /// Completions consumed so far (free-running).
    pub fn cq_head(&self) -> u32 {
        self.cq_head
    }

    /// Takes the next completion, if the server published one.
    pub fn reap(&mut self, ch: &ChannelRef<'_>) -> Option<Completion> {
        if !self.completion_ready(ch) {
            return None;
        }
        let c = ch.read_completion(self.cq_head);
        self.cq_head = self.cq_head.wrapping_add(1);
        ch.ctl().cq_head.store(self.cq_head, Ordering::Release);
        Some(c)
    }

    /// Whether the server parked the request tagged `user_data` (see
    /// [`ServerCursor::mark_parked`]): stop spinning and sleep.
    pub fn is_parked(&self, ch: &ChannelRef<'_>, user_data: u64) -> bool {
        ch.ctl().parked_tag.load(Ordering::Acquire) == user_data as u32
    }

    /// Announces that this host thread is about to sleep on `cq_tail`.
    /// Returns the value to pass to the futex wait, or `None` if a
    /// completion arrived meanwhile (do not sleep). `cq_tail` is read before
    /// the stamp is checked: a completion published after the check bumps
    /// `cq_tail` past the returned value, so the wait cannot miss it.
    pub fn prepare_sleep(&self, ch: &ChannelRef<'_>) -> Option<u32> {
        ch.ctl().host_waiting.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let tail = ch.ctl().cq_tail.load(Ordering::Acquire);
        if self.completion_ready(ch) {
            ch.ctl().host_waiting.store(0, Ordering::Relaxed);
            return None;
        }
        Some(tail)
    }

    pub fn finish_sleep(&self, ch: &ChannelRef<'_>) {
        ch.ctl().host_waiting.store(0, Ordering::Relaxed);
    }

    // Channels shared by several host threads keep their cursor under a lock
    // and sleep without it; the functions below are their handshake (the
    // same fences as `prepare_sleep`, with `cq_head` read from the region
    // since the sleeping thread holds no cursor).

    /// Completions consumed, as published in the region (relaxed: only
    /// holders of the channel's lock advance it).
    pub fn consumed(ch: &ChannelRef<'_>) -> u32 {
        ch.ctl().cq_head.load(Ordering::Relaxed)
    }

    /// Completions published (acquire: their slots are written).
    pub fn published(ch: &ChannelRef<'_>) -> u32 {
        ch.ctl().cq_tail.load(Ordering::Acquire)
    }

    /// Whether the server parked the request tagged `user_data` (for a
    /// thread that spins without the cursor; see [`is_parked`](Self::is_parked)).
    pub fn parked(ch: &ChannelRef<'_>, user_data: u64) -> bool {
        ch.ctl().parked_tag.load(Ordering::Acquire) == user_data as u32
    }

    /// Registers a sleeper of the channel and re-checks (Dekker against the
    /// server's "store cq_tail; fence; load host_waiting"): `host_waiting =
    /// 1`, fence, load `cq_tail`. Returns the `cq_tail` to futex-wait on, or
    /// `None` if completions were published past `cq_head` meanwhile (drain
    /// them; the caller unregisters, see [`clear_waiting`](Self::clear_waiting)).
    pub fn register_sleeper(ch: &ChannelRef<'_>) -> Option<u32> {
        let ctl = ch.ctl();
        ctl.host_waiting.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let tail = ctl.cq_tail.load(Ordering::Acquire);
        (tail == ctl.cq_head.load(Ordering::Relaxed)).then_some(tail)
    }

    /// The channel's last sleeper left: `host_waiting = 0`.
    pub fn clear_waiting(ch: &ChannelRef<'_>) {
        ch.ctl().host_waiting.store(0, Ordering::Relaxed);
    }

    /// Sleeps on `cq_tail` while it is `tail`, at most `timeout`.
    pub fn sleep(ch: &ChannelRef<'_>, tail: u32, timeout: std::time::Duration) {
        crate::futex::wait(&ch.ctl().cq_tail, tail, timeout);
    }

    /// Wakes every thread sleeping on the channel's `cq_tail` (a thread that
    /// drained completions filed for others).
    pub fn wake_sleepers(ch: &ChannelRef<'_>) {
        crate::wake_batch::wake_all(&ch.ctl().cq_tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use crate::msg::Op;
    use crate::region::Region;

    fn region(layout: Layout) -> Region {
        crate::region::test_region(layout)
    }

    fn small() -> Layout {
        Layout {
            n_channels: 2,
            ring_entries: 4,
            arena_size: 4096,
            ..Default::default()
        }
    }

    fn req(tag: u64) -> Request {
        Request {
            user_data: tag,
            op: Op::Nop as u16,
            ..Default::default()
        }
    }

    #[test]
    fn requests_and_completions_flow_in_order() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let (mut h, mut s) = (HostCursor::default(), ServerCursor::default());
        for round in 0..10u64 {
            for i in 0..3 {
                h.submit(&ch, &req(round * 10 + i)).unwrap();
            }
            for i in 0..3 {
                let got = s.pop(&ch).unwrap().unwrap();
                assert_eq!(got.user_data, round * 10 + i);
                s.complete(
                    &ch,
                    &Completion {
                        user_data: got.user_data,
                        ..Default::default()
                    },
                )
                .unwrap();
            }
            assert_eq!(s.pop(&ch).unwrap(), None);
            for i in 0..3 {
                assert_eq!(h.reap(&ch).unwrap().user_data, round * 10 + i);
            }
            assert_eq!(h.reap(&ch), None);
        }
    }

    #[test]
    fn full_request_ring_is_backpressure_not_overwrite() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let mut h = HostCursor::default();
        for i in 0..4 {
            h.submit(&ch, &req(i)).unwrap();
        }
        assert_eq!(h.submit(&ch, &req(99)), Err(RingFull));
        let mut s = ServerCursor::default();
        assert_eq!(s.pop(&ch).unwrap().unwrap().user_data, 0);
        h.submit(&ch, &req(4)).unwrap();
    }

    #[test]
    fn server_takes_no_request_whose_completion_has_no_slot() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let (mut h, mut s) = (HostCursor::default(), ServerCursor::default());
        for i in 0..4 {
            h.submit(&ch, &req(i)).unwrap();
        }
        for _ in 0..4 {
            let q = s.pop(&ch).unwrap().unwrap();
            s.complete(
                &ch,
                &Completion {
                    user_data: q.user_data,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        // Host has not reaped: the completion ring is full.
        h.submit(&ch, &req(4)).unwrap();
        assert_eq!(s.pop(&ch).unwrap(), None);
        h.reap(&ch).unwrap();
        assert_eq!(s.pop(&ch).unwrap().unwrap().user_data, 4);
    }

    #[test]
    fn forged_indices_are_protocol_errors_or_ignored() {
        let r = region(small());
        let ch = r.channel(1).unwrap();
        let mut s = ServerCursor::default();
        // req_tail is informational: the server reads slots by their stamps.
        ch.ctl().req_tail.store(1000, Ordering::Release);
        assert_eq!(s.pop(&ch), Ok(None));
        // A completion head the server never published is a violation once
        // the server needs to look at it.
        let mut h = HostCursor::default();
        for i in 0..4 {
            h.submit(&ch, &req(i)).unwrap();
        }
        for _ in 0..4 {
            let q = s.pop(&ch).unwrap().unwrap();
            s.complete(
                &ch,
                &Completion {
                    user_data: q.user_data,
                    ..Default::default()
                },
            )
            .unwrap();
        }
        ch.ctl().cq_head.store(7, Ordering::Release);
        h.submit(&ch, &req(9)).unwrap_or(false);
        assert!(matches!(
            s.pop(&ch),
            Err(RingError::CompletionHeadInvalid { .. })
        ));
    }

    #[test]
    fn stamps_never_match_the_previous_lap_or_zeroed_memory() {
        for entries in [2u32, 64, 65536] {
            for lap in [0u32, 1, 0x7ffe, 0x7fff, 0x8000, 65535, 1 << 20] {
                let i = lap.wrapping_mul(entries);
                let now = stamp(i, entries);
                assert_ne!(now, 0);
                if lap > 0 {
                    assert_ne!(now, stamp(i.wrapping_sub(entries), entries));
                }
            }
            // Across the wrap of the free-running index.
            assert_ne!(
                stamp(0, entries),
                stamp(0u32.wrapping_sub(entries), entries)
            );
        }
    }

    #[test]
    fn sleep_handshake_sees_late_completion() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let (mut h, mut s) = (HostCursor::default(), ServerCursor::default());
        h.submit(&ch, &req(1)).unwrap();
        let q = s.pop(&ch).unwrap().unwrap();
        assert!(h.prepare_sleep(&ch).is_some());
        let must_wake = s
            .complete(
                &ch,
                &Completion {
                    user_data: q.user_data,
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(must_wake, "server must see the sleeping host");
        h.finish_sleep(&ch);
        assert!(
            h.prepare_sleep(&ch).is_none(),
            "a pending completion means: do not sleep"
        );
    }

    #[test]
    fn shared_sleeper_handshake_sees_a_late_completion() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let (mut h, mut s) = (HostCursor::default(), ServerCursor::default());
        h.submit(&ch, &req(1)).unwrap();
        let q = s.pop(&ch).unwrap().unwrap();
        let tail = HostCursor::register_sleeper(&ch).expect("nothing published yet");
        assert_eq!(tail, HostCursor::published(&ch));
        let c = Completion {
            user_data: q.user_data,
            ..Default::default()
        };
        assert!(s.complete(&ch, &c).unwrap(), "server must see the sleeper");
        // The futex value moved: the sleep returns at once.
        HostCursor::sleep(&ch, tail, std::time::Duration::from_secs(5));
        HostCursor::clear_waiting(&ch);
        assert!(HostCursor::register_sleeper(&ch).is_none());
        HostCursor::clear_waiting(&ch);
        assert_eq!(h.reap(&ch).unwrap().user_data, 1);
        assert_eq!(HostCursor::consumed(&ch), 1);
    }

    #[test]
    fn server_sleep_flag_makes_the_host_ring() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let mut h = HostCursor::default();
        assert!(!h.submit(&ch, &req(1)).unwrap());
        ServerCursor::announce_sleep([r.header()]);
        assert!(
            h.submit(&ch, &req(2)).unwrap(),
            "a sleeping server needs the doorbell"
        );
        ServerCursor::end_sleep(r.header());
        assert!(!h.submit(&ch, &req(3)).unwrap());
    }

    /// Many threads post into a 4-entry request ring that a slow server
    /// drains: a thread that finds it full sleeps on `req_head` (with a
    /// 20 s timeout), and the server wakes it after taking requests. All
    /// requests arrive, and quickly: a lost wake-up costs 20 s.
    #[test]
    fn room_waiters_are_woken_when_the_server_takes_requests() {
        use std::sync::atomic::{AtomicU32, Ordering as O};
        use std::sync::Mutex;
        use std::time::{Duration, Instant};
        const THREADS: u64 = 8;
        const EACH: u64 = 200;
        let r = region(small());
        let host = Mutex::new(HostCursor::default());
        let slept = AtomicU32::new(0);
        let start = Instant::now();
        let seen = std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (r, host, slept) = (&r, &host, &slept);
                sc.spawn(move || {
                    let ch = &r.channel(0).unwrap();
                    for i in 0..EACH {
                        loop {
                            let mut g = host.lock().unwrap();
                            if g.submit(ch, &req(t * EACH + i)).is_ok() {
                                break;
                            }
                            let tail = g.next_request();
                            drop(g);
                            if let Some(head) = HostCursor::room_wait_prepare(ch, tail) {
                                slept.fetch_add(1, O::Relaxed);
                                HostCursor::room_wait(ch, head, Duration::from_secs(20));
                                HostCursor::room_wait_done(ch);
                            }
                        }
                    }
                });
            }
            let server = sc.spawn(|| {
                let ch = r.channel(0).unwrap();
                let mut s = ServerCursor::default();
                let mut seen = vec![false; (THREADS * EACH) as usize];
                let mut got = 0;
                while got < THREADS * EACH {
                    let mut took = 0;
                    while let Some(q) = s.pop(&ch).unwrap() {
                        s.retire(); // a kick: no completion
                        assert!(!std::mem::replace(&mut seen[q.user_data as usize], true));
                        took += 1;
                    }
                    if took > 0 && ServerCursor::room_wanted(&ch) {
                        ServerCursor::wake_room(&ch);
                    }
                    got += took;
                    // A slow server: the ring fills and posters wait.
                    std::thread::sleep(Duration::from_micros(50));
                }
                seen
            });
            server.join().unwrap()
        });
        assert!(seen.iter().all(|&s| s), "every request arrives once");
        assert!(slept.load(O::Relaxed) > 0, "no thread waited for room");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a room waiter slept to its timeout: lost wake-up"
        );
        let ch = r.channel(0).unwrap();
        assert_eq!(ch.ctl().room_waiters.load(O::Relaxed), 0);
    }

    #[test]
    fn parked_hint_names_the_parked_request() {
        let r = region(small());
        let ch = r.channel(0).unwrap();
        let (mut h, mut s) = (HostCursor::default(), ServerCursor::default());
        h.submit(&ch, &req(7)).unwrap();
        let q = s.pop(&ch).unwrap().unwrap();
        assert!(!h.is_parked(&ch, 7));
        s.mark_parked(&ch, q.user_data);
        assert!(h.is_parked(&ch, 7));
        assert!(!h.is_parked(&ch, 8));
        assert!(HostCursor::parked(&ch, 7));
    }
}
