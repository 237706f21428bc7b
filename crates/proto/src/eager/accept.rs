//! The accept ring's two roles: [`AcceptRingProducer`] (the server accepts
//! ahead and writes one 64-byte [`AcceptRecord`] per connection) and
//! [`AcceptRingConsumer`] (the host takes records and adopts the sockets).
//!
//! The same ring and control block as a receive ring (`kind ==
//! KIND_ACCEPT`), counted in record bytes: positions advance by
//! [`ACCEPT_RECORD_SIZE`], and a host `head` inside a record leaves that
//! record outstanding ([`look`](super::ctl::look) with `record = 64`). The
//! handshakes are the receive ring's (see [`super::recv`]): `pause` /
//! `consume` for the lost kick, `publish` / `wait` for the lost wake-up.
//! A kick on an accept ring also says "the host wants connections" (the
//! server accepts ahead only on demand).

use super::ctl::{AcceptRecord, RecvRingCtl, ACCEPT_RECORD_SIZE, KIND_ACCEPT};
use super::recv::{self, RecvCursor, RecvRingConsumer, RecvRingProducer};
use crate::region::RecvRingRef;
use std::time::Duration;

/// The server's side of an accept ring. A view; the server's cursor
/// (`tail`, `consumed`, the published ids) stays in its socket table.
#[derive(Clone, Copy)]
pub struct AcceptRingProducer<'a> {
    inner: RecvRingProducer<'a>,
}

impl<'a> AcceptRingProducer<'a> {
    pub fn new(ring: RecvRingRef<'a>) -> Self {
        AcceptRingProducer {
            inner: RecvRingProducer::new(ring),
        }
    }

    /// Bytes of ring (a multiple of [`ACCEPT_RECORD_SIZE`]).
    pub fn size(&self) -> u32 {
        self.inner.size()
    }

    fn ctl(&self) -> &'a RecvRingCtl {
        self.inner.ring().ctl()
    }

    /// Binds the ring to listener `sid` (see [`RecvRingProducer::bind`]).
    pub fn bind(&self, sid: u32) {
        self.inner.bind(sid, KIND_ACCEPT)
    }

    /// The host's `head`, read once and clamped, in whole records:
    /// `(used, consumed)` in record bytes.
    pub fn look(&self, tail: u32, consumed: u32) -> (u32, u32) {
        self.inner.look(tail, consumed, ACCEPT_RECORD_SIZE)
    }

    /// Writes record `rec` at `pos` (a multiple of 64, inside the free room:
    /// the caller checked [`look`](Self::look)). Published by
    /// [`publish`](Self::publish).
    pub fn write(&self, pos: u32, rec: &AcceptRecord) {
        self.inner.ring().write_record(pos, rec)
    }

    /// See [`RecvRingProducer::stamp`].
    pub fn stamp(&self, seq: u32) {
        self.inner.stamp(seq)
    }

    /// Publishes the records before `tail` (one store for a batch) and wakes
    /// sleeping host threads, at most `records` of them (the records new
    /// since the last wake): as the kernel wakes one blocked `accept` per
    /// connection, not every thread blocked on the listener (64 threads
    /// woken per connection would each take the core and go back to
    /// sleep). A woken thread always takes a record if one is there
    /// before it sleeps again; doorbell sleepers (poll) are all rung, as
    /// the kernel wakes every poller. Returns whom it found waiting.
    pub fn publish(&self, tail: u32, records: u32) -> recv::Woke {
        let threads = records.clamp(1, i32::MAX as u32) as i32;
        recv::publish_waking(
            self.ctl(),
            self.inner.ring().log_entry(),
            tail,
            None,
            threads,
        )
    }

    /// At capacity: publish `tail`, `paused = 1`, fence, re-read `head`
    /// (see [`RecvRingProducer::pause`]). Returns the fresh `(used,
    /// consumed)`.
    pub fn pause(&self, tail: u32, consumed: u32) -> (u32, u32) {
        recv::pause(self.ctl(), tail, consumed, ACCEPT_RECORD_SIZE)
    }

    /// See [`RecvRingProducer::unpause`].
    pub fn unpause(&self) {
        self.inner.unpause()
    }

    /// See [`RecvRingProducer::set_kicks_seen`].
    pub fn set_kicks_seen(&self, kicks: u32) {
        self.inner.set_kicks_seen(kicks)
    }

    /// See [`RecvRingProducer::unbind`].
    pub fn unbind(&self) -> recv::Woke {
        self.inner.unbind()
    }

    /// See [`RecvRingProducer::release`].
    pub fn release(&self) {
        self.inner.release()
    }
}

/// The host's side of an accept ring. A view; the cursor ([`RecvCursor`],
/// in record bytes) stays in the host's per-socket state.
#[derive(Clone, Copy)]
pub struct AcceptRingConsumer<'a> {
    inner: RecvRingConsumer<'a>,
}

impl<'a> AcceptRingConsumer<'a> {
    pub fn new(ring: RecvRingRef<'a>) -> Self {
        AcceptRingConsumer {
            inner: RecvRingConsumer::new(ring),
        }
    }

    /// The byte-ring view of the same ring (`tail`, `end`, `paused`, ...).
    pub fn ring(&self) -> RecvRingConsumer<'a> {
        self.inner
    }

    /// See [`RecvRingConsumer::start`].
    pub fn start(&self) -> RecvCursor {
        self.inner.start()
    }

    /// Whether a whole record is published past `consumed`.
    pub fn ready(&self, consumed: u32) -> bool {
        self.inner.available(self.inner.tail(), consumed) >= ACCEPT_RECORD_SIZE
    }

    /// Takes the next record, if one is published: copies it out, then
    /// consumes it (see [`RecvRingConsumer::consume`]). Returns the record
    /// and whether a kick must be posted.
    pub fn take(&self, cur: &mut RecvCursor) -> Option<(AcceptRecord, bool)> {
        self.take_before(cur, self.inner.tail())
    }

    /// [`take`](Self::take) with `tail` as the caller read it (from
    /// [`RecvRingConsumer::tail`], e.g. to wait on it when nothing is there).
    pub fn take_before(&self, cur: &mut RecvCursor, tail: u32) -> Option<(AcceptRecord, bool)> {
        if self.inner.available(tail, cur.consumed) < ACCEPT_RECORD_SIZE {
            return None;
        }
        let rec = self.inner.ring().read_record(cur.consumed);
        let kick = self.inner.consume(cur, ACCEPT_RECORD_SIZE);
        Some((rec, kick))
    }

    /// See [`RecvRingConsumer::end`].
    pub fn end(&self) -> u32 {
        self.inner.end()
    }

    /// See [`RecvRingConsumer::paused`].
    pub fn paused(&self) -> bool {
        self.inner.paused()
    }

    /// See [`RecvRingConsumer::take_kick`].
    pub fn take_kick(&self, cur: &mut RecvCursor) -> bool {
        self.inner.take_kick(cur)
    }

    /// See [`RecvRingConsumer::wait`].
    pub fn wait(&self, seen: u32, slice: Duration) {
        self.inner.wait(seen, slice)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ctl::{END_NONE, KIND_ACCEPT};
    use super::*;
    use crate::region::test_rings as region;
    use std::sync::atomic::Ordering as O;

    fn rec(sock: u32) -> AcceptRecord {
        AcceptRecord {
            sock,
            addr_len: 16,
            ..AcceptRecord::default()
        }
    }

    #[test]
    fn records_flow_in_order_and_a_batch_is_one_publish() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let (p, c) = (AcceptRingProducer::new(ring), AcceptRingConsumer::new(ring));
        p.bind(0);
        assert_eq!(c.ring().kind(), KIND_ACCEPT);
        let mut cur = c.start();
        let (mut tail, mut consumed) = (0u32, 0u32);
        for round in 0..200u32 {
            let (used, c2) = p.look(tail, consumed);
            consumed = c2;
            assert_eq!(used, 0);
            for k in 0..3 {
                p.write(tail, &rec(round * 3 + k));
                tail = tail.wrapping_add(ACCEPT_RECORD_SIZE);
            }
            assert!(c.take(&mut cur).is_none(), "unpublished");
            p.publish(tail, 3);
            for k in 0..3 {
                let (got, kick) = c.take(&mut cur).unwrap();
                assert_eq!(got, rec(round * 3 + k));
                assert!(!kick);
            }
            assert!(c.take(&mut cur).is_none());
            assert_eq!(c.end(), END_NONE);
        }
    }

    #[test]
    fn take_before_stops_at_the_tail_the_caller_read() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let (p, c) = (AcceptRingProducer::new(ring), AcceptRingConsumer::new(ring));
        p.bind(0);
        let mut cur = c.start();
        let seen = c.ring().tail();
        p.write(0, &rec(1));
        p.publish(ACCEPT_RECORD_SIZE, 1);
        assert!(c.take_before(&mut cur, seen).is_none());
        assert_eq!(cur.consumed, 0, "nothing consumed");
        let (got, _) = c.take_before(&mut cur, c.ring().tail()).unwrap();
        assert_eq!(got, rec(1));
    }

    #[test]
    fn a_head_inside_a_record_leaves_it_outstanding() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let p = AcceptRingProducer::new(ring);
        p.bind(0);
        for i in 0..4 {
            p.write(i * 64, &rec(i));
        }
        p.publish(256, 1);
        ring.ctl().head.store(70, O::Release);
        assert_eq!(p.look(256, 0), (192, 64));
        ring.ctl().head.store(9999, O::Release);
        assert_eq!(p.look(256, 64), (192, 64));
    }

    #[test]
    fn at_capacity_the_producer_pauses_and_the_taker_kicks() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let (p, c) = (AcceptRingProducer::new(ring), AcceptRingConsumer::new(ring));
        p.bind(0);
        let mut cur = c.start();
        let cap = 2 * ACCEPT_RECORD_SIZE;
        let mut tail = 0;
        for i in 0..2 {
            p.write(tail, &rec(i));
            tail += ACCEPT_RECORD_SIZE;
        }
        let (used, consumed) = p.pause(tail, 0);
        assert!(used >= cap, "no room: stays paused");
        assert!(c.paused());
        let (_, kick) = c.take(&mut cur).unwrap();
        assert!(kick, "consumed from a paused ring: kick");
        let (_, kick) = c.take(&mut cur).unwrap();
        assert!(!kick, "the first kick is still unseen");
        p.set_kicks_seen(1);
        assert!(c.take_kick(&mut cur), "an empty listener may ask again");
        let (used, _) = p.look(tail, consumed);
        assert_eq!(used, 0);
        p.unpause();
        assert!(!c.paused());
        p.unbind();
        assert_eq!(ring.ctl().owner.load(O::Acquire), 0);
        p.bind(0);
        p.release();
        assert_eq!(ring.ctl().owner.load(O::Acquire), 0);
        assert_eq!(p.size(), 4096);
    }

    #[test]
    fn a_waiting_taker_wakes_at_publish() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let p = AcceptRingProducer::new(ring);
        p.bind(0);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let c = AcceptRingConsumer::new(r.recv_ring(0).unwrap());
                let mut cur = c.start();
                loop {
                    if let Some((got, _)) = c.take(&mut cur) {
                        return got;
                    }
                    c.wait(0, Duration::from_secs(10));
                }
            });
            while ring.ctl().host_waiting.load(O::Acquire) == 0 {
                std::thread::yield_now();
            }
            p.write(0, &rec(42));
            p.publish(ACCEPT_RECORD_SIZE, 1);
            assert_eq!(h.join().unwrap(), rec(42));
        });
    }
}
