//! The send queue's two roles: [`SendQueueProducer`] (the host writes
//! descriptors and publishes `head`) and [`SendQueueConsumer`] (the server
//! takes descriptors and publishes `done`).
//!
//! Who writes what (see [`crate::sendq`] for the whole protocol):
//!
//! * host: descriptors, `head` (published, free-running), `host_waiting`;
//! * server: `done`, `error`/`error_seq`, `misuse`, `bytes_done`, `active`,
//!   `kicks_seen`, `owner`.
//!
//! Handshakes:
//!
//! * **lost kick**: the host publishes with `write desc; store head
//!   (release); load active, kicks_seen` and kicks when the server is not
//!   watching ([`SendQueueProducer::push`], [`SendQueueProducer::needs_kick`]);
//!   no fence on this hot path. The server leaves a queue with `active = 0;
//!   fence; re-read head` ([`SendQueueConsumer::deactivate`] then
//!   [`SendQueueConsumer::has_new`]) and looks once more a little later
//!   (a host store that raced with the clear sits in that host's store
//!   buffer for microseconds at most), plus a periodic sweep.
//! * **lost wake-up**: the host sleeps with `host_waiting += 1; fence;
//!   re-check done; futex-wait on done` ([`SendQueueProducer::wait`]); the
//!   server publishes with `store done; fence; load host_waiting; wake`
//!   ([`SendQueueConsumer::publish_done`]).
//!
//! The consumer treats everything host-written as hostile: `head` is read
//! once and checked against the credits ([`SendQueueConsumer::pending`]),
//! each descriptor is copied out once ([`SendQueueConsumer::take_desc`]) and
//! its shape checked before the server resolves its memory.

use super::ctl::{is_done, SendDesc, SendQueueCtl};
use crate::eager::BELL_SLEEPER;
use crate::region::SendQueueRef;
use crate::sync::{self, fence, Ordering};
use crate::wake::{bell_slot, Woke};
use std::time::Duration;

/// Dekker against the host's "host_waiting += 1; fence; load done".
/// Threads futex-waiting on `done` are woken; doorbell sleepers (counted
/// from [`BELL_SLEEPER`] up, waiting for room: POLLOUT) are only reported,
/// as on a receive ring. Returns whom it found.
pub(crate) fn wake_if_waiting(ctl: &SendQueueCtl) -> Woke {
    fence(Ordering::SeqCst);
    let woke = Woke::read(&ctl.host_waiting, &ctl.bell_slots);
    if woke.thread {
        sync::wake_all(&ctl.done);
    }
    woke
}

/// The server publishes `done` (release: with the error and counters
/// before it) and wakes a host thread sleeping on it.
pub(crate) fn publish_done(ctl: &SendQueueCtl, done: u32) -> Woke {
    ctl.done.store(done, Ordering::Release);
    wake_if_waiting(ctl)
}

/// The host registers a sleeper (a counter: several threads may wait on
/// one queue) and fences against the server's "store done; fence; load
/// host_waiting"; then re-checks. Returns whether `done` is still `seen`
/// (sleep), registered either way: call [`wait_done`] after.
pub(crate) fn wait_prepare(ctl: &SendQueueCtl, seen: u32) -> bool {
    ctl.host_waiting.fetch_add(1, Ordering::AcqRel);
    fence(Ordering::SeqCst);
    ctl.done.load(Ordering::Acquire) == seen
}

/// The host publishes descriptors up to `head` (release: their bytes).
pub(crate) fn publish_head(ctl: &SendQueueCtl, head: u32) {
    ctl.head.store(head, Ordering::Release);
}

/// The host's kick test after publishing (see
/// [`SendQueueProducer::needs_kick`]).
pub(crate) fn needs_kick(ctl: &SendQueueCtl, kicks_sent: &mut u32) -> bool {
    let kick = ctl.active.load(Ordering::Relaxed) == 0
        && ctl.kicks_seen.load(Ordering::Relaxed) == *kicks_sent;
    if kick {
        *kicks_sent = kicks_sent.wrapping_add(1);
    }
    kick
}

/// The server goes cold: `active = 0`, fence (see
/// [`SendQueueConsumer::deactivate`]).
pub(crate) fn deactivate(ctl: &SendQueueCtl) {
    ctl.active.store(0, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Whether the host published past `ingested`.
pub(crate) fn has_new(ctl: &SendQueueCtl, ingested: u32) -> bool {
    ctl.head.load(Ordering::Acquire) != ingested
}

/// The host unregisters a sleeper.
pub(crate) fn wait_done(ctl: &SendQueueCtl) {
    ctl.host_waiting.fetch_sub(1, Ordering::AcqRel);
}

/// A thread that will sleep on its host doorbell `slot` until `done`
/// moves registers (its slot's bit, then `BELL_SLEEPER`) and fences;
/// re-check room after this.
pub(crate) fn bell_wait_prepare(ctl: &SendQueueCtl, slot: u32) {
    bell_slot(&ctl.bell_slots, slot, true);
    ctl.host_waiting.fetch_add(BELL_SLEEPER, Ordering::AcqRel);
    fence(Ordering::SeqCst);
}

/// Unregisters a doorbell sleeper of `slot`.
pub(crate) fn bell_wait_done(ctl: &SendQueueCtl, slot: u32) {
    ctl.host_waiting.fetch_sub(BELL_SLEEPER, Ordering::AcqRel);
    bell_slot(&ctl.bell_slots, slot, false);
}

/// The host's side of a send queue. A view; the host's cursor (`head`,
/// `done` as last read, kicks sent) stays in its per-socket state.
#[derive(Clone, Copy)]
pub struct SendQueueProducer<'a> {
    sq: SendQueueRef<'a>,
}

impl<'a> SendQueueProducer<'a> {
    pub fn new(sq: SendQueueRef<'a>) -> Self {
        SendQueueProducer { sq }
    }

    /// Descriptors the queue holds (the credit window).
    pub fn entries(&self) -> u32 {
        self.sq.entries()
    }

    /// Before asking for a bind: the host's side starts at 0 (relaxed: the
    /// bind request, published after it, orders it for the server).
    pub fn reset_head(&self) {
        self.sq.ctl().head.store(0, Ordering::Relaxed);
    }

    /// After the bind: the server's `kicks_seen` (the host counts its kicks
    /// from there).
    pub fn kicks_seen(&self) -> u32 {
        self.sq.ctl().kicks_seen.load(Ordering::Acquire)
    }

    /// Whether descriptor `head` may be published, `done` as last read.
    pub fn has_credit(&self, head: u32, done: u32) -> bool {
        head.wrapping_sub(done) < self.sq.entries()
    }

    /// Writes descriptor `*head` and publishes it: `head + 1` stored with
    /// release (the descriptor's bytes before it). Returns its sequence
    /// number. The caller checked [`has_credit`](Self::has_credit).
    pub fn push(&self, head: &mut u32, d: &SendDesc) -> u32 {
        let seq = *head;
        self.sq.write_desc(seq, d);
        *head = seq.wrapping_add(1);
        publish_head(self.sq.ctl(), *head);
        seq
    }

    /// After [`push`](Self::push): whether to post an `Op::AsyncKick` — the
    /// server is not watching and no kick of ours is still on its way (it
    /// would make the server watch). Counts the kick as sent. Relaxed: a
    /// stale `active = 1` is covered by the server's re-read after clearing
    /// it and its second look; the kick request itself fences.
    pub fn needs_kick(&self, kicks_sent: &mut u32) -> bool {
        needs_kick(self.sq.ctl(), kicks_sent)
    }

    /// Descriptors finished (acquire: with `error`, `misuse` before it).
    pub fn done(&self) -> u32 {
        self.sq.ctl().done.load(Ordering::Acquire)
    }

    /// The errno of the first failed descriptor (0: none).
    pub fn error(&self) -> i32 {
        self.sq.ctl().error.load(Ordering::Acquire)
    }

    /// Registered buffers written while in flight (debug mode).
    pub fn misuse(&self) -> u32 {
        self.sq.ctl().misuse.load(Ordering::Acquire)
    }

    /// Whether the server released the queue (`owner == 0`: every send of
    /// the old socket is done).
    pub fn released(&self) -> bool {
        self.sq.ctl().owner.load(Ordering::Acquire) == 0
    }

    /// The outcome of finished descriptor `seq`: its errno if it or an
    /// earlier one failed (`error` acquire, then `error_seq`, which the
    /// server stored before `error`).
    pub fn failed(&self, seq: u32) -> Option<i32> {
        let ctl = self.sq.ctl();
        let e = ctl.error.load(Ordering::Acquire);
        (e != 0 && !is_done(seq, ctl.error_seq.load(Ordering::Relaxed))).then_some(e)
    }

    /// Sleeps until `done` moves from `seen`, at most `max`: registers
    /// (a counter: several threads may wait on one queue), fences against
    /// the server's "store done; fence; load host_waiting", re-checks,
    /// futex-waits, unregisters.
    pub fn wait(&self, seen: u32, max: Duration) {
        let ctl = self.sq.ctl();
        if wait_prepare(ctl, seen) {
            sync::wait(&ctl.done, seen, max);
        }
        wait_done(ctl);
    }

    /// Registers a thread that sleeps on its host doorbell until `done`
    /// moves (room appears), and fences: the next `publish_done` reports
    /// [`Woke::bell`] (and `slot` in [`Woke::bells`]). Re-check the room
    /// after this.
    pub fn bell_wait_prepare(&self, slot: u32) {
        bell_wait_prepare(self.sq.ctl(), slot)
    }

    /// Unregisters a doorbell sleeper of `slot`.
    pub fn bell_wait_done(&self, slot: u32) {
        bell_wait_done(self.sq.ctl(), slot)
    }
}

/// The host published more than its credits allow (it overwrote
/// descriptors): `head` as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrun {
    pub head: u32,
}

/// The server's side of a send queue. A view; the server's cursor
/// (`ingested`, `done`, kicks, hot/cold) stays in its queue table.
#[derive(Clone, Copy)]
pub struct SendQueueConsumer<'a> {
    sq: SendQueueRef<'a>,
}

impl<'a> SendQueueConsumer<'a> {
    pub fn new(sq: SendQueueRef<'a>) -> Self {
        SendQueueConsumer { sq }
    }

    pub fn entries(&self) -> u32 {
        self.sq.entries()
    }

    /// Setting up a queue for a socket the host did not bind itself (setup
    /// with accept): the host's side starts at 0 too.
    pub fn reset_head(&self) {
        self.sq.ctl().head.store(0, Ordering::Relaxed);
    }

    /// Binds the queue to socket `sid` from descriptor `start`: error,
    /// counters and `done` reset, then `owner` (release, so a host that sees
    /// the owner sees the reset).
    pub fn bind(&self, sid: u32, start: u32) {
        let ctl = self.sq.ctl();
        ctl.error_seq.store(0, Ordering::Relaxed);
        ctl.error.store(0, Ordering::Relaxed);
        ctl.misuse.store(0, Ordering::Relaxed);
        ctl.bytes_done.store(0, Ordering::Relaxed);
        ctl.done.store(start, Ordering::Relaxed);
        ctl.binds.fetch_add(1, Ordering::Relaxed);
        ctl.owner.store(sid + 1, Ordering::Release);
    }

    /// Unbinds the queue (its socket closed, its jobs done).
    pub fn unbind(&self) {
        let ctl = self.sq.ctl();
        ctl.active.store(0, Ordering::Relaxed);
        ctl.owner.store(0, Ordering::Release);
    }

    /// Publishes how many `Op::AsyncKick`s of this queue the server took.
    pub fn set_kicks_seen(&self, kicks: u32) {
        self.sq.ctl().kicks_seen.store(kicks, Ordering::Release);
    }

    /// The server watches the queue: the host needs no kick (release).
    pub fn activate(&self) {
        self.sq.ctl().active.store(1, Ordering::Release);
    }

    /// Going cold: `active = 0`, then a fence, so the caller's next
    /// [`has_new`](Self::has_new) sees a `head` the host stored before it
    /// loaded `active` (and otherwise the host sees 0 and kicks).
    pub fn deactivate(&self) {
        deactivate(self.sq.ctl())
    }

    /// After [`deactivate`](Self::deactivate) found new descriptors: stays
    /// hot (relaxed: the host merely skips a kick it would not need).
    pub fn reactivate(&self) {
        self.sq.ctl().active.store(1, Ordering::Relaxed);
    }

    /// Whether the host published past `ingested`.
    pub fn has_new(&self, ingested: u32) -> bool {
        has_new(self.sq.ctl(), ingested)
    }

    /// Reads `head` once (acquire: the descriptors before it are written)
    /// and checks it: the number of new descriptors past `ingested`, or
    /// [`Overrun`] if the host published beyond its credits (`head` more
    /// than `entries` past `ingested` or past `done`).
    pub fn pending(&self, ingested: u32, done: u32) -> Result<u32, Overrun> {
        let head = self.sq.ctl().head.load(Ordering::Acquire);
        let n = head.wrapping_sub(ingested);
        if n > self.sq.entries() || head.wrapping_sub(done) > self.sq.entries() {
            return Err(Overrun { head });
        }
        Ok(n)
    }

    /// Copies descriptor `seq` out (once: the copy is what gets checked and
    /// used). See [`desc_ok`](Self::desc_ok).
    pub fn take_desc(&self, seq: u32) -> SendDesc {
        self.sq.read_desc(seq)
    }

    /// Whether a copied descriptor is well formed ([`SendDesc::entry`]).
    /// The server still resolves its range against its own registrations,
    /// or its file handle against the files this host handed over.
    pub fn desc_ok(d: &SendDesc) -> bool {
        d.entry().is_some()
    }

    /// The host overran its credits: stop watching (`active = 0`), publish
    /// `EPROTO` at `error_seq` (if this is the queue's first error), and wake
    /// host threads waiting for credits: they find the error.
    pub fn fail_overrun(&self, first_error_at: Option<u32>) {
        let ctl = self.sq.ctl();
        ctl.active.store(0, Ordering::Relaxed);
        if let Some(seq) = first_error_at {
            self.set_error(seq, libc::EPROTO);
        }
        let _ = wake_if_waiting(ctl);
    }

    /// The queue's first failure: `error_seq` (relaxed), then `error`
    /// (release: a host that sees the error sees its index).
    pub fn set_error(&self, seq: u32, errno: i32) {
        let ctl = self.sq.ctl();
        ctl.error_seq.store(seq, Ordering::Relaxed);
        ctl.error.store(errno, Ordering::Release);
    }

    /// Counts a buffer written while in flight (debug mode). Only the
    /// server writes `misuse`: load + store, no read-modify-write needed.
    pub fn count_misuse(&self) {
        let ctl = self.sq.ctl();
        let m = ctl.misuse.load(Ordering::Relaxed);
        ctl.misuse.store(m.wrapping_add(1), Ordering::Release);
    }

    /// Adds `n` sent bytes to `bytes_done` (statistics: relaxed).
    pub fn add_bytes_done(&self, n: u64) {
        let ctl = self.sq.ctl();
        let b = ctl.bytes_done.load(Ordering::Relaxed);
        ctl.bytes_done.store(b + n, Ordering::Relaxed);
    }

    /// Publishes `done` (release: with the error and counters before it)
    /// and wakes a host thread sleeping on it.
    /// Returns whom it found waiting.
    pub fn publish_done(&self, done: u32) -> Woke {
        publish_done(self.sq.ctl(), done)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ctl::{DESC_MORE, MAX_REGISTRATIONS};
    use super::*;
    use crate::region::test_rings as region;
    use std::sync::atomic::Ordering as O;

    fn desc(len: u32) -> SendDesc {
        SendDesc {
            off: 64,
            len,
            mem: 3,
            flags: DESC_MORE,
            ..SendDesc::default()
        }
    }

    #[test]
    fn descriptors_flow_and_credits_bound_the_host() {
        let r = region();
        let (p, c) = (
            SendQueueProducer::new(r.send_queue(1).unwrap()),
            SendQueueConsumer::new(r.send_queue(1).unwrap()),
        );
        p.reset_head();
        c.bind(1, 0);
        let mut kicks = p.kicks_seen();
        let (mut head, mut ingested, mut done) = (0u32, 0u32, 0u32);
        for round in 0..10u32 {
            for k in 0..4 {
                assert!(p.has_credit(head, p.done()));
                assert_eq!(p.push(&mut head, &desc(round * 4 + k + 1)), round * 4 + k);
            }
            assert!(
                !p.has_credit(head, p.done()),
                "the queue is the credit window"
            );
            assert_eq!(c.pending(ingested, done), Ok(4));
            for k in 0..4 {
                let d = c.take_desc(ingested.wrapping_add(k));
                assert!(SendQueueConsumer::desc_ok(&d));
                assert_eq!(d, desc(round * 4 + k + 1));
            }
            ingested += 4;
            assert_eq!(c.pending(ingested, done), Ok(0));
            for _ in 0..4 {
                c.add_bytes_done(10);
                done += 1;
                c.publish_done(done);
            }
            assert_eq!(p.done(), done);
            assert_eq!(p.failed(done - 1), None);
        }
        assert_eq!(
            r.send_queue(1).unwrap().ctl().bytes_done.load(O::Relaxed),
            400
        );
        assert!(p.needs_kick(&mut kicks));
        c.unbind();
        assert!(p.released());
    }

    #[test]
    fn a_host_beyond_its_credits_is_an_overrun() {
        let r = region();
        let sq = r.send_queue(0).unwrap();
        let c = SendQueueConsumer::new(sq);
        c.bind(0, 0);
        sq.ctl().head.store(5, O::Release);
        assert_eq!(c.pending(0, 0), Err(Overrun { head: 5 }));
        sq.ctl().head.store(6, O::Release);
        assert_eq!(c.pending(4, 0), Err(Overrun { head: 6 }), "past done");
        sq.ctl().head.store(u32::MAX, O::Release); // "behind"
        assert!(c.pending(0, 0).is_err());
        c.fail_overrun(Some(0));
        let p = SendQueueProducer::new(sq);
        assert_eq!(p.error(), libc::EPROTO);
        assert_eq!(p.failed(0), Some(libc::EPROTO));
        assert_eq!(sq.ctl().active.load(O::Relaxed), 0);
    }

    #[test]
    fn malformed_descriptors_are_refused() {
        let ok = desc(1);
        assert!(SendQueueConsumer::desc_ok(&ok));
        assert!(!SendQueueConsumer::desc_ok(&SendDesc { len: 0, ..ok }));
        assert!(!SendQueueConsumer::desc_ok(&SendDesc { flags: 0x80, ..ok }));
        assert!(!SendQueueConsumer::desc_ok(&SendDesc {
            mem: MAX_REGISTRATIONS as u16,
            ..ok
        }));
    }

    #[test]
    fn errors_fail_their_descriptor_and_every_later_one() {
        let r = region();
        let sq = r.send_queue(0).unwrap();
        let (p, c) = (SendQueueProducer::new(sq), SendQueueConsumer::new(sq));
        c.bind(0, 0);
        c.set_error(2, libc::EPIPE);
        c.publish_done(4);
        assert_eq!(p.failed(1), None);
        assert_eq!(p.failed(2), Some(libc::EPIPE));
        assert_eq!(p.failed(3), Some(libc::EPIPE));
        c.count_misuse();
        c.count_misuse();
        assert_eq!(p.misuse(), 2);
        c.bind(0, 7);
        assert_eq!((p.done(), p.error(), p.misuse()), (7, 0, 0));
    }

    #[test]
    fn kick_only_when_cold_and_no_kick_is_unseen() {
        let r = region();
        let sq = r.send_queue(0).unwrap();
        let (p, c) = (SendQueueProducer::new(sq), SendQueueConsumer::new(sq));
        c.bind(0, 0);
        let mut kicks = p.kicks_seen();
        let mut head = 0;
        p.push(&mut head, &desc(1));
        assert!(p.needs_kick(&mut kicks), "cold: kick");
        p.push(&mut head, &desc(1));
        assert!(!p.needs_kick(&mut kicks), "our kick is on its way");
        c.set_kicks_seen(1);
        c.activate();
        assert!(!p.needs_kick(&mut kicks), "hot: the server watches");
        // Going cold: the re-read after the fence finds what the host stored.
        c.deactivate();
        assert!(c.has_new(0));
        c.reactivate();
        assert!(!p.needs_kick(&mut kicks));
        c.deactivate();
        assert!(!c.has_new(2));
        assert!(p.needs_kick(&mut kicks), "cold again, our kick was seen");
    }

    #[test]
    fn a_waiting_host_is_woken_by_done() {
        let r = region();
        let sq = r.send_queue(0).unwrap();
        let c = SendQueueConsumer::new(sq);
        c.bind(0, 0);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let p = SendQueueProducer::new(r.send_queue(0).unwrap());
                let t0 = std::time::Instant::now();
                while p.done() == 0 {
                    p.wait(0, Duration::from_secs(10));
                }
                t0.elapsed()
            });
            while sq.ctl().host_waiting.load(O::Acquire) == 0 {
                std::thread::yield_now();
            }
            c.publish_done(1);
            assert!(h.join().unwrap() < Duration::from_secs(5));
        });
        assert_eq!(sq.ctl().host_waiting.load(O::Acquire), 0);
    }
}
