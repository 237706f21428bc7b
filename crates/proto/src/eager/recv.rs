//! The receive ring's two roles: [`RecvRingProducer`] (the server: it
//! `recv(2)`s into free room and publishes `tail`) and [`RecvRingConsumer`]
//! (the host: it copies bytes out and publishes `head`).
//!
//! Who writes what (see [`crate::eager`] for the whole protocol):
//!
//! * host: `head` (consumed, free-running) and `host_waiting` (sleepers);
//! * server: `tail`, `end`/`end_errno` (after the last `tail`), `paused`,
//!   `kicks_seen`, `owner`/`kind` (binding).
//!
//! Two Dekker handshakes ("store mine; SeqCst fence; load theirs"), so
//! whichever side goes second sees the first:
//!
//! * **lost kick**: server pauses with `store tail; paused = 1; fence; load
//!   head` ([`RecvRingProducer::pause`]); the host consumes with `store
//!   head; fence; load paused` ([`RecvRingConsumer::consume`]). Either the
//!   server's re-read sees the room, or the host sees `paused` and kicks.
//! * **lost wake-up**: the host sleeps with `host_waiting += 1; fence;
//!   re-check tail/end; futex-wait on tail` ([`RecvRingConsumer::wait`]);
//!   the server publishes with `store tail (and end); fence; load
//!   host_waiting; wake` ([`RecvRingProducer::publish`]).
//!
//! The producer never trusts what the host wrote: `head` is read once per
//! look and clamped to `[consumed, tail]` ([`look`]). The consumer clamps a
//! forged `tail` to one ring ([`available`]).

use super::ctl::{
    available, kick_pending, look, used, RecvRingCtl, BELL_SLEEPER, END_EOF, END_ERROR, END_NONE,
    END_STOPPED, KIND_FREE,
};
use crate::ready_log::{self, LogEntry};
use crate::region::RecvRingRef;
use crate::sync::{self, fence, Ordering};
use crate::wake::bell_slot;
pub use crate::wake::Woke;
use std::time::Duration;

/// What a receive (or accept) ring holds, as `tcps stat` shows it: read-only
/// and approximate (the host may move `head` meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSnapshot {
    /// `KIND_*`.
    pub kind: u32,
    /// Bytes (or record bytes) published and not consumed, at most the size.
    pub used: u32,
}

/// Stores `tail` (release: the bytes before it are visible to a host that
/// acquires it), then the end of stream after it (`end_errno` first, `end`
/// last with release, so a host that sees `end` sees the errno and the
/// final `tail`); fences and wakes a host thread sleeping on `tail`.
/// Returns whom it woke.
///
/// The ring's id is then appended to the host's ready log (`log`), after
/// the stores it announces.
pub(crate) fn publish(
    ctl: &RecvRingCtl,
    log: Option<LogEntry<'_>>,
    tail: u32,
    end: Option<Result<(), i32>>,
) -> Woke {
    publish_waking(ctl, log, tail, end, i32::MAX)
}

/// [`publish`], waking at most `threads` of the threads sleeping on
/// `tail` (an accept ring wakes one per new connection).
pub(crate) fn publish_waking(
    ctl: &RecvRingCtl,
    log: Option<LogEntry<'_>>,
    tail: u32,
    end: Option<Result<(), i32>>,
    threads: i32,
) -> Woke {
    ctl.tail.store(tail, Ordering::Release);
    match end {
        Some(Ok(())) => ctl.end.store(END_EOF, Ordering::Release),
        Some(Err(e)) => {
            ctl.end_errno.store(e, Ordering::Relaxed);
            ctl.end.store(END_ERROR, Ordering::Release);
        }
        None => {}
    }
    wake_some(ctl, log, threads)
}

/// Appends the ring to the ready log (if given), then the Dekker half
/// against the host's "host_waiting += 1; fence; load tail" (of the ring,
/// or of the log): the fence orders the stores before it against the loads
/// of `host_waiting`. Threads futex-waiting on `tail` are woken here;
/// doorbell sleepers (counted in `host_waiting` from [`BELL_SLEEPER`] up,
/// on the ring or on the log) are only reported: the server rings their
/// host's doorbell once for the whole pass.
pub(crate) fn wake_if_waiting(ctl: &RecvRingCtl, log: Option<LogEntry<'_>>) -> Woke {
    wake_some(ctl, log, i32::MAX)
}

/// [`wake_if_waiting`], waking at most `threads` futex sleepers.
fn wake_some(ctl: &RecvRingCtl, log: Option<LogEntry<'_>>, threads: i32) -> Woke {
    if let Some(l) = log {
        ready_log::append(l.log, l.id);
    }
    fence(Ordering::SeqCst);
    let mut woke = Woke::read(&ctl.host_waiting, &ctl.bell_slots);
    if let Some(l) = log {
        woke.join(ready_log::sleepers(l.log));
    }
    if woke.thread && threads > 0 {
        sync::wake(&ctl.tail, threads);
    }
    // Sleepers left asleep (their wake is owed) were not woken.
    woke.thread &= threads > 0;
    woke
}

/// Wakes at most `threads` threads futex-sleeping on `tail` (published
/// before), after a fence against their "count, fence, re-read"; whether
/// one was asleep. Doorbell sleepers are not rung again.
pub(crate) fn wake_sleepers(ctl: &RecvRingCtl, threads: i32) -> bool {
    fence(Ordering::SeqCst);
    let thread = Woke::read(&ctl.host_waiting, &ctl.bell_slots).thread;
    if thread && threads > 0 {
        sync::wake(&ctl.tail, threads);
    }
    thread
}

/// The server's pause: publish what it has, then `paused = 1; fence;
/// re-read head` (Dekker against the host's "store head; fence; load
/// paused"). Returns the fresh [`look`].
pub(crate) fn pause(ctl: &RecvRingCtl, tail: u32, consumed: u32, record: u32) -> (u32, u32) {
    ctl.tail.store(tail, Ordering::Release);
    // Relaxed: the fence below orders it before the re-read of `head`.
    ctl.paused.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    look(tail, ctl.head.load(Ordering::Acquire), consumed, record)
}

/// The host's consume: advances `cur` by `n`, stores `head` (release: the
/// server may overwrite the bytes before it only after seeing it), fences
/// against the server's "store paused; fence; load head", then loads
/// `paused`. Returns whether to kick (paused, and no kick of ours unseen).
pub(crate) fn consume(ctl: &RecvRingCtl, cur: &mut RecvCursor, n: u32) -> bool {
    cur.consumed = cur.consumed.wrapping_add(n);
    ctl.head.store(cur.consumed, Ordering::Release);
    fence(Ordering::SeqCst);
    ctl.paused.load(Ordering::Acquire) != 0 && take_kick(ctl, cur)
}

/// Whether to post a kick now (none of ours is unseen); counts it as sent.
pub(crate) fn take_kick(ctl: &RecvRingCtl, cur: &mut RecvCursor) -> bool {
    let seen = ctl.kicks_seen.load(Ordering::Acquire);
    if kick_pending(seen, cur.kicks_sent) {
        return false;
    }
    cur.kicks_sent = seen.wrapping_add(1);
    true
}

/// Nothing new since `seen`: `tail` unmoved and no end (both acquire).
pub(crate) fn is_quiet(ctl: &RecvRingCtl, seen: u32) -> bool {
    ctl.tail.load(Ordering::Acquire) == seen && ctl.end.load(Ordering::Acquire) == END_NONE
}

/// Registers a sleeper (a counter, not a flag: several threads may wait on
/// one ring; `unit` 1 for a futex sleeper, [`BELL_SLEEPER`] for a doorbell
/// sleeper), then fences against the server's "store tail; fence; load
/// host_waiting".
pub(crate) fn wait_prepare(ctl: &RecvRingCtl, unit: u32) {
    ctl.host_waiting.fetch_add(unit, Ordering::AcqRel);
    fence(Ordering::SeqCst);
}

/// Unregisters a sleeper registered with the same `unit`.
pub(crate) fn wait_done(ctl: &RecvRingCtl, unit: u32) {
    ctl.host_waiting.fetch_sub(unit, Ordering::AcqRel);
}

/// The server counts a kick taken (release: with the state the kick
/// changed), then fences before it re-reads `head` (Dekker against the
/// host's "store head; fence; load paused, kicks_seen"): a host that skips
/// a kick because its last one is unseen has stored `head` before looking,
/// so either this re-read sees that `head` or the host sees the kick
/// counted and kicks again. Without the fence both may miss (store
/// buffering; `loom_tests::receive_ring_unseen_kick_is_not_lost` finds it)
/// and the ring stayed paused until the server's 10 ms sweep. One fence per
/// kick, and kicks come only from paused rings.
pub(crate) fn set_kicks_seen(ctl: &RecvRingCtl, kicks: u32) {
    ctl.kicks_seen.store(kicks, Ordering::Release);
    fence(Ordering::SeqCst);
}

/// Reads the host's `head` once (acquire: its copy-out of the bytes before
/// it is done) and clamps it: `(used, consumed)`, see [`look`].
pub(crate) fn look_head(ctl: &RecvRingCtl, tail: u32, consumed: u32, record: u32) -> (u32, u32) {
    look(tail, ctl.head.load(Ordering::Acquire), consumed, record)
}

/// The host's cursor in one receive or accept ring (private memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvCursor {
    /// Bytes (or record bytes) consumed, free-running: what `head` says.
    pub consumed: u32,
    /// `Op::RecvKick`s this host posted for the ring (compared with the
    /// server's `kicks_seen`).
    pub kicks_sent: u32,
}

/// The server's side of a receive ring (eager receive into host memory).
/// A view: build one per use from [`crate::Region::recv_ring`]; the
/// server's own cursor (`tail`, `consumed`, its paused flag) stays in its
/// socket table and is passed in.
#[derive(Clone, Copy)]
pub struct RecvRingProducer<'a> {
    ring: RecvRingRef<'a>,
}

impl<'a> RecvRingProducer<'a> {
    pub fn new(ring: RecvRingRef<'a>) -> Self {
        RecvRingProducer { ring }
    }

    /// The ring's memory (for `span_ptr`, `read_at`).
    pub fn ring(&self) -> RecvRingRef<'a> {
        self.ring
    }

    /// Bytes of ring (a power of two).
    pub fn size(&self) -> u32 {
        self.ring.size()
    }

    /// The contiguous free span at `pos` (at most `max` bytes, up to the
    /// wrap), for `recv(2)`. See [`RecvRingRef::span_ptr`].
    pub fn span_ptr(&self, pos: u32, max: u32) -> (*mut u8, usize) {
        self.ring.span_ptr(pos, max)
    }

    /// Copies ring bytes at `pos` into `dst` (the unread bytes a fork
    /// snapshot takes; get `pos` and the length from [`look`](Self::look)).
    pub fn read_at(&self, pos: u32, dst: &mut [u8]) {
        self.ring.read_at(pos, dst)
    }

    /// Initialises the control block for a new owner (socket `sid`, `KIND_*`
    /// `kind`): everything zero, then `owner` with release, so a host that
    /// sees its id as owner sees the rest reset.
    pub fn bind(&self, sid: u32, kind: u32) {
        let ctl = self.ring.ctl();
        ctl.head.store(0, Ordering::Relaxed);
        ctl.tail.store(0, Ordering::Relaxed);
        ctl.end.store(0, Ordering::Relaxed);
        ctl.end_errno.store(0, Ordering::Relaxed);
        ctl.paused.store(0, Ordering::Relaxed);
        ctl.since.store(0, Ordering::Relaxed);
        ctl.kicks_seen.store(0, Ordering::Relaxed);
        ctl.kind.store(kind, Ordering::Relaxed);
        ctl.binds.fetch_add(1, Ordering::Relaxed);
        ctl.owner.store(sid + 1, Ordering::Release);
    }

    /// Reads the host's `head` once (acquire: the host's copy-out of the
    /// bytes before it is done) and clamps it: `(used, consumed)`, see
    /// [`look`]. `record` is 1 for a byte ring.
    pub fn look(&self, tail: u32, consumed: u32, record: u32) -> (u32, u32) {
        look_head(self.ring.ctl(), tail, consumed, record)
    }

    /// Publishes `tail` and, if given, the end of stream after it; wakes a
    /// sleeping host thread. `end`: `Ok(())` EOF, `Err(errno)` an error.
    /// Returns whom it found waiting (a futex wake was made for threads).
    pub fn publish(&self, tail: u32, end: Option<Result<(), i32>>) -> Woke {
        publish(self.ring.ctl(), self.ring.log_entry(), tail, end)
    }

    /// Records that the next publish makes the ring non-empty, as arrival
    /// `seq` of this host (relaxed: the `tail` store of that publish
    /// releases it; a host that acquires the new `tail` sees this `since`
    /// or a later one).
    pub fn stamp(&self, seq: u32) {
        self.ring.ctl().since.store(seq, Ordering::Relaxed);
    }

    /// The ring is (nearly) full: publishes `tail`, sets `paused`, fences and
    /// re-reads `head`. Returns the fresh `(used, consumed)`: with room after
    /// all, the caller calls [`unpause`](Self::unpause) and goes on;
    /// otherwise it stays paused until a kick or its sweep.
    pub fn pause(&self, tail: u32, consumed: u32, record: u32) -> (u32, u32) {
        pause(self.ring.ctl(), tail, consumed, record)
    }

    /// Clears `paused` (relaxed: the host only uses it to decide whether to
    /// kick; a stale 1 costs one spare kick, and a stale 0 is impossible
    /// since the server sets it only behind the fence in `pause`).
    pub fn unpause(&self) {
        self.ring.ctl().paused.store(0, Ordering::Relaxed);
    }

    /// Publishes how many `Op::RecvKick`s of this ring the server took
    /// (release: with the state the kick changed), then fences: call it
    /// before re-reading `head` with [`look`](Self::look) (the server's
    /// `resume` after a kick does).
    pub fn set_kicks_seen(&self, kicks: u32) {
        set_kicks_seen(self.ring.ctl(), kicks)
    }

    /// Stops receiving ahead: `END_STOPPED` after the last `tail` (release),
    /// then wakes a sleeping host thread (it goes on with requests).
    /// Returns whom it found waiting.
    pub fn stop(&self) -> Woke {
        let ctl = self.ring.ctl();
        ctl.end.store(END_STOPPED, Ordering::Release);
        wake_if_waiting(ctl, self.ring.log_entry())
    }

    /// Unbinds the ring (the socket closes): `kind = FREE`, `owner = 0`
    /// (release), then wakes sleepers so they see the ring gone.
    /// Returns whom it found waiting.
    pub fn unbind(&self) -> Woke {
        self.release();
        wake_if_waiting(self.ring.ctl(), self.ring.log_entry())
    }

    /// Unbinds the ring without waking anybody (it is known idle: `exec`).
    pub fn release(&self) {
        let ctl = self.ring.ctl();
        ctl.kind.store(KIND_FREE, Ordering::Relaxed);
        ctl.owner.store(0, Ordering::Release);
    }

    /// The errno of an `END_ERROR` end, if that is the ring's end (relaxed:
    /// the server wrote both itself).
    pub fn end_error(&self) -> Option<i32> {
        let ctl = self.ring.ctl();
        (ctl.end.load(Ordering::Relaxed) == END_ERROR)
            .then(|| ctl.end_errno.load(Ordering::Relaxed))
    }

    /// For `tcps stat`: what the ring bound to socket `sid` holds, `None` if
    /// it is not bound to `sid`. Read-only; the host's `head` is clamped to
    /// one ring behind `tail`.
    pub fn snapshot(&self, sid: u32) -> Option<RingSnapshot> {
        let ctl = self.ring.ctl();
        if ctl.owner.load(Ordering::Relaxed) != sid.wrapping_add(1) {
            return None;
        }
        let size = self.ring.size();
        let tail = ctl.tail.load(Ordering::Acquire);
        let head = ctl.head.load(Ordering::Relaxed);
        let used = used(tail, head, tail.wrapping_sub(size)).min(size);
        Some(RingSnapshot {
            kind: ctl.kind.load(Ordering::Relaxed),
            used,
        })
    }
}

/// The host's side of a receive ring. A view over the ring; the host's
/// cursor ([`RecvCursor`]) stays in its per-socket state and is passed in.
#[derive(Clone, Copy)]
pub struct RecvRingConsumer<'a> {
    ring: RecvRingRef<'a>,
}

impl<'a> RecvRingConsumer<'a> {
    pub fn new(ring: RecvRingRef<'a>) -> Self {
        RecvRingConsumer { ring }
    }

    pub fn ring(&self) -> RecvRingRef<'a> {
        self.ring
    }

    pub fn size(&self) -> u32 {
        self.ring.size()
    }

    /// The ring was bound: the host starts where the server says it is
    /// (`head`, which the server reset before publishing the bind) and
    /// counts kicks from what the server has seen. Both acquire.
    pub fn start(&self) -> RecvCursor {
        let ctl = self.ring.ctl();
        RecvCursor {
            consumed: ctl.head.load(Ordering::Acquire),
            kicks_sent: ctl.kicks_seen.load(Ordering::Acquire),
        }
    }

    /// `KIND_*` (acquire: after `owner`/`kind`, the rest of the bind).
    pub fn kind(&self) -> u32 {
        self.ring.ctl().kind.load(Ordering::Acquire)
    }

    /// The published `tail` (acquire: the bytes before it are readable).
    pub fn tail(&self) -> u32 {
        self.ring.ctl().tail.load(Ordering::Acquire)
    }

    /// `END_*` (acquire: stored after the last `tail`, so a host that sees
    /// it and then re-reads `tail` has every byte).
    pub fn end(&self) -> u32 {
        self.ring.ctl().end.load(Ordering::Acquire)
    }

    /// The errno of `END_ERROR` (read after [`end`](Self::end)).
    pub fn end_errno(&self) -> i32 {
        self.ring.ctl().end_errno.load(Ordering::Acquire)
    }

    /// The arrival number of the publish that made the ring non-empty
    /// (read after [`tail`](Self::tail), whose acquire orders it).
    pub fn since(&self) -> u32 {
        self.ring.ctl().since.load(Ordering::Relaxed)
    }

    /// Whether the server paused the ring (it waits for a kick).
    pub fn paused(&self) -> bool {
        self.ring.ctl().paused.load(Ordering::Acquire) != 0
    }

    /// Bytes published before `tail` and not consumed, at most a ring.
    pub fn available(&self, tail: u32, consumed: u32) -> u32 {
        available(tail, consumed, self.ring.size())
    }

    /// Copies up to `dst.len()` of the bytes published before `tail` from
    /// `consumed` on (wrapping). Returns how many. Consumes nothing.
    pub fn copy_out(&self, consumed: u32, tail: u32, dst: &mut [u8]) -> usize {
        let n = (self.available(tail, consumed) as usize).min(dst.len());
        self.ring.read_at(consumed, &mut dst[..n]);
        n
    }

    /// A contiguous view of `n` bytes at `pos` (zero-copy receive): see
    /// [`RecvRingRef::span_ptr`].
    pub fn span_ptr(&self, pos: u32, n: u32) -> (*mut u8, usize) {
        self.ring.span_ptr(pos, n)
    }

    /// Whether to post a kick now (none of ours is unseen); counts it as
    /// sent.
    pub fn take_kick(&self, cur: &mut RecvCursor) -> bool {
        take_kick(self.ring.ctl(), cur)
    }

    /// Marks `n` bytes (or a record) consumed: stores `head` (release) and
    /// fences against the server's "store paused; load head". Returns
    /// whether a kick must be posted (the ring is paused and no kick of ours
    /// is unseen; the kick is counted as sent).
    pub fn consume(&self, cur: &mut RecvCursor, n: u32) -> bool {
        consume(self.ring.ctl(), cur, n)
    }

    /// Nothing new since `seen`: `tail` unmoved and no end.
    pub fn is_quiet(&self, seen: u32) -> bool {
        is_quiet(self.ring.ctl(), seen)
    }

    /// Registers a sleeper and fences (see [`wait`](Self::wait)). Re-check
    /// with [`is_quiet`](Self::is_quiet) after this, sleep, then call
    /// [`wait_done`](Self::wait_done).
    pub fn wait_prepare(&self) {
        wait_prepare(self.ring.ctl(), 1)
    }

    /// Unregisters a sleeper.
    pub fn wait_done(&self) {
        wait_done(self.ring.ctl(), 1)
    }

    /// Registers a thread that will sleep on its host doorbell `slot`, not
    /// on this ring's futex, and fences: a publish from now on is reported
    /// to the server as [`Woke::bell`] with the slot in [`Woke::bells`].
    /// Re-check the ring after this.
    pub fn bell_wait_prepare(&self, slot: u32) {
        let ctl = self.ring.ctl();
        bell_slot(&ctl.bell_slots, slot, true);
        wait_prepare(ctl, BELL_SLEEPER)
    }

    /// Unregisters a doorbell sleeper of `slot`.
    pub fn bell_wait_done(&self, slot: u32) {
        let ctl = self.ring.ctl();
        wait_done(ctl, BELL_SLEEPER);
        bell_slot(&ctl.bell_slots, slot, false);
    }

    /// Sleeps until `tail` moves from `seen` or `end` is set, at most
    /// `slice` (or a spurious wake): prepare, re-check, futex-wait, done.
    pub fn wait(&self, seen: u32, slice: Duration) {
        self.wait_prepare();
        if self.is_quiet(seen) {
            sync::wait(&self.ring.ctl().tail, seen, slice);
        }
        self.wait_done();
    }
}

#[cfg(test)]
mod tests {
    use super::super::ctl::{END_EOF, END_ERROR, KIND_BYTES};
    use super::*;
    use crate::region::test_rings as region;
    use std::sync::atomic::Ordering as O;

    /// The server side of a test: receives `data` into the ring at `tail`.
    fn produce(p: &RecvRingProducer<'_>, tail: &mut u32, data: &[u8]) {
        p.ring().write_at(*tail, data);
        *tail = tail.wrapping_add(data.len() as u32);
        p.publish(*tail, None);
    }

    #[test]
    fn bytes_flow_in_order_across_the_wrap() {
        let r = region();
        let (p, c) = (
            RecvRingProducer::new(r.recv_ring(1).unwrap()),
            RecvRingConsumer::new(r.recv_ring(1).unwrap()),
        );
        p.bind(1, KIND_BYTES);
        assert_eq!(c.kind(), KIND_BYTES);
        let mut cur = c.start();
        assert_eq!(cur, RecvCursor::default());
        let (mut tail, mut consumed) = (0u32, 0u32);
        let mut next = 0u8;
        for _ in 0..20 {
            let data: Vec<u8> = (0..1000).map(|i| next.wrapping_add(i as u8)).collect();
            let (used, c2) = p.look(tail, consumed, 1);
            consumed = c2;
            assert!(p.size() - used >= 1000);
            produce(&p, &mut tail, &data);
            let t = c.tail();
            assert_eq!(c.available(t, cur.consumed), 1000);
            let mut out = vec![0u8; 1500];
            assert_eq!(c.copy_out(cur.consumed, t, &mut out), 1000);
            assert_eq!(&out[..1000], &data[..]);
            assert!(!c.consume(&mut cur, 1000), "not paused: no kick");
            next = next.wrapping_add(1000u32 as u8);
        }
        assert_eq!(p.look(tail, consumed, 1), (0, tail));
    }

    #[test]
    fn a_forged_head_is_clamped() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let p = RecvRingProducer::new(ring);
        p.bind(0, KIND_BYTES);
        let mut tail = 0;
        produce(&p, &mut tail, &[1; 100]);
        ring.ctl().head.store(5000, O::Release);
        assert_eq!(p.look(tail, 0, 1), (100, 0));
        ring.ctl().head.store(40, O::Release);
        assert_eq!(p.look(tail, 0, 1), (60, 40));
        ring.ctl().head.store(10, O::Release); // backwards
        assert_eq!(p.look(tail, 40, 1), (60, 40));
        // A forged tail reads at most a ring on the host's side.
        let c = RecvRingConsumer::new(ring);
        assert_eq!(c.available(1 << 20, 0), ring.size());
    }

    #[test]
    fn pause_then_consume_kicks_once_until_seen() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let (p, c) = (RecvRingProducer::new(ring), RecvRingConsumer::new(ring));
        p.bind(1, KIND_BYTES);
        let mut cur = c.start();
        let mut tail = 0;
        p.ring().write_at(0, &[7; 4096]);
        tail += 4096;
        // Full: the pause's re-read finds no room, so it stays paused.
        assert_eq!(p.pause(tail, 0, 1), (4096, 0));
        assert!(c.paused());
        assert!(c.consume(&mut cur, 100), "paused: kick");
        assert!(
            !c.consume(&mut cur, 100),
            "our kick is unseen: no second one"
        );
        p.set_kicks_seen(1);
        assert!(c.consume(&mut cur, 100), "seen: kick again while paused");
        p.set_kicks_seen(2);
        let (used, consumed) = p.look(tail, 0, 1);
        assert_eq!((used, consumed), (4096 - 300, 300));
        p.unpause();
        assert!(!c.paused());
        assert!(!c.consume(&mut cur, 100));
    }

    #[test]
    fn pause_rereads_head_the_host_stored_before() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let (p, c) = (RecvRingProducer::new(ring), RecvRingConsumer::new(ring));
        p.bind(1, KIND_BYTES);
        let mut cur = c.start();
        // The server looked (full), then the host consumed before the pause.
        let tail = 4096;
        assert!(!c.consume(&mut cur, 2048), "not paused yet: no kick");
        assert_eq!(p.pause(tail, 0, 1), (2048, 2048));
        p.unpause();
    }

    #[test]
    fn the_end_comes_after_the_data() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let (p, c) = (RecvRingProducer::new(ring), RecvRingConsumer::new(ring));
        p.bind(1, KIND_BYTES);
        assert_eq!(p.end_error(), None);
        ring.write_at(0, b"bye");
        p.publish(3, Some(Err(libc::ECONNRESET)));
        assert_eq!(c.end(), END_ERROR);
        assert_eq!(c.tail(), 3);
        assert_eq!(c.end_errno(), libc::ECONNRESET);
        assert_eq!(p.end_error(), Some(libc::ECONNRESET));
        assert!(!c.is_quiet(3));
        p.bind(1, KIND_BYTES);
        p.publish(0, Some(Ok(())));
        assert_eq!(c.end(), END_EOF);
        assert_eq!(p.end_error(), None);
        p.bind(1, KIND_BYTES);
        assert!(c.is_quiet(0));
        p.stop();
        assert_eq!(c.end(), END_STOPPED);
    }

    #[test]
    fn a_sleeping_host_is_woken_by_publish() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let p = RecvRingProducer::new(ring);
        p.bind(1, KIND_BYTES);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let c = RecvRingConsumer::new(r.recv_ring(1).unwrap());
                let t0 = std::time::Instant::now();
                while c.is_quiet(0) {
                    c.wait(0, Duration::from_secs(10));
                }
                t0.elapsed()
            });
            while ring.ctl().host_waiting.load(O::Acquire) == 0 {
                std::thread::yield_now();
            }
            ring.write_at(0, b"x");
            p.publish(1, None);
            assert!(h.join().unwrap() < Duration::from_secs(5));
        });
        assert_eq!(ring.ctl().host_waiting.load(O::Acquire), 0);
    }

    #[test]
    fn wait_prepare_counts_sleepers() {
        let r = region();
        let c = RecvRingConsumer::new(r.recv_ring(0).unwrap());
        c.wait_prepare();
        c.wait_prepare();
        assert_eq!(c.ring().ctl().host_waiting.load(O::Relaxed), 2);
        c.wait_done();
        c.wait_done();
        assert_eq!(c.ring().ctl().host_waiting.load(O::Relaxed), 0);
    }

    #[test]
    fn snapshot_and_unbind() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let p = RecvRingProducer::new(ring);
        assert_eq!(p.snapshot(1), None, "not bound");
        p.bind(1, KIND_BYTES);
        let mut tail = 0;
        produce(&p, &mut tail, &[0; 300]);
        ring.ctl().head.store(100, O::Release);
        assert_eq!(
            p.snapshot(1),
            Some(RingSnapshot {
                kind: KIND_BYTES,
                used: 200
            })
        );
        assert_eq!(p.snapshot(0), None, "bound to another socket");
        ring.ctl().head.store(1 << 30, O::Release); // forged
        assert!(p.snapshot(1).unwrap().used <= ring.size());
        p.unbind();
        assert_eq!(ring.ctl().owner.load(O::Acquire), 0);
        assert_eq!(RecvRingConsumer::new(ring).kind(), KIND_FREE);
        assert_eq!(p.snapshot(1), None);
        p.bind(1, KIND_BYTES);
        p.release();
        assert_eq!(p.snapshot(1), None);
    }
}
