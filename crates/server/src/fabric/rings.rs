//! The receive and accept rings of a remote host's region, server side:
//! each pass ships what the server published since the last — the ring's
//! new bytes (one or two spans at the wrap), then its line 1 (`tail`,
//! `end`, `end_errno`, `paused`, `since`) and line 2 (`owner`, `kind`,
//! `kicks_seen`, `binds`) — so the host's copy sees an ordinary publish. A
//! bind restarts a ring at 0 (a new `owner`, or the same socket id bound
//! again: a new `binds`): shipping restarts there too.
//! And the send queues' server lines (credits: `done`; errors) when they
//! change.
//! And the ready log's new slots, then its `tail`.
//!
//! A pass looks at the rings and queues in its watch sets, not at all of
//! them: the bound ones (kept while `owner` is set) and those named since
//! — by a ready-log entry (a publish), a host request or send-queue span,
//! an `Accept` completion or an accept record (a connection bound at
//! accept) — and at every one once per [`FULL_SCAN_EVERY`], a backstop for
//! a change nothing named.

use std::time::{Duration, Instant};
use tcps_fabric::wire::Spans;
use tcps_proto::eager::ctl::{ACCEPT_RECORD_SIZE, KIND_ACCEPT, RQ_CTL_SIZE};
use tcps_proto::layout::Layout;
use tcps_proto::ready_log::{READY_LOG_OFFSET, READY_LOG_SLOTS};
use tcps_proto::region::Region;
use tcps_proto::watch::Watch;

/// How often a pass looks at every ring and queue.
pub const FULL_SCAN_EVERY: Duration = Duration::from_millis(50);
/// How long a ring or queue named (by a request, say, whose call the worker
/// has not run yet) stays watched though not bound, in milliseconds.
pub const KEEP_NAMED: u64 = 50;

const LINE: usize = 64;
/// Line 1's five words and line 2's four (`owner`, `kind`, `kicks_seen`,
/// `binds`).
const L1: usize = 20;
const L2: usize = 16;

#[derive(Clone)]
struct Shadow {
    shipped: u32,
    lines: [u8; L1 + L2],
}

impl Default for Shadow {
    fn default() -> Shadow {
        Shadow {
            shipped: 0,
            lines: [0; L1 + L2],
        }
    }
}

pub struct Rings {
    shadow: Vec<Shadow>,
    /// Each send queue's server lines (line 1: `done`, `error`,
    /// `error_seq`, `misuse`, `bytes_done`; line 2: `active`,
    /// `kicks_seen`, `owner`, `binds`) as last shipped.
    queues: Vec<[u8; 40]>,
    /// The ready log's `tail` as last shipped.
    log_shipped: u32,
    /// The rings and queues a pass looks at, each stamped with when it was
    /// last named or seen bound (`now_ms`).
    ring_watch: Watch,
    queue_watch: Watch,
    /// When the next pass looks at every one.
    full_due: Instant,
    epoch: Instant,
}

fn word(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

impl Rings {
    pub fn new(l: &Layout) -> Rings {
        Rings {
            shadow: vec![Shadow::default(); l.recv_rings as usize],
            queues: vec![[0; 40]; l.send_queues as usize],
            log_shipped: 0,
            ring_watch: Watch::new(l.recv_rings as usize),
            queue_watch: Watch::new(l.send_queues as usize),
            full_due: Instant::now(),
            epoch: Instant::now(),
        }
    }

    /// Socket `sid`'s ring and queue are looked at by the passes of the
    /// next [`KEEP_NAMED`] at least, and for as long as they are bound
    /// (named by a request, a completion or an accept record).
    pub fn watch(&mut self, sid: u32) {
        let now = self.now_ms();
        self.ring_watch.touch(sid, now);
        self.queue_watch.touch(sid, now);
    }

    /// Milliseconds since this pump began, from 1.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The next pass looks at every ring and queue (after something that
    /// may bind many: a fork snapshot claimed).
    pub fn watch_all(&mut self) {
        self.full_due = Instant::now();
    }

    /// The send queues' server lines that changed (credits, errors).
    fn collect_queues(&mut self, l: &Layout, region: &Region, full: bool, out: &mut Spans) {
        let all: Vec<u32>;
        let look = if full {
            all = (0..l.send_queues).collect();
            &all[..]
        } else {
            self.queue_watch.members()
        };
        let mut bound = Vec::new();
        for &q in look {
            let shadow = &mut self.queues[q as usize];
            let base = l.send_queue_offset(q);
            let mut lines = [0u8; 40];
            let (l1, l2) = lines.split_at_mut(24);
            if region.read_span(base + 2 * LINE, l2).is_err()
                || region.read_span(base + LINE, l1).is_err()
            {
                continue;
            }
            if lines != *shadow {
                out.push((base + LINE) as u32, &lines[..24]);
                out.push((base + 2 * LINE) as u32, &lines[24..]);
                *shadow = lines;
            }
            bound.push((q, word(&lines[32..]) != 0));
        }
        let now = self.now_ms();
        keep(&mut self.queue_watch, &bound, now);
    }

    /// The ready log's new slots, then its `tail` (read before the rings:
    /// every publish it announces is in the ring lines read after it and
    /// shipped before it).
    fn collect_log(&mut self, region: &Region, tail: u32, out: &mut Spans) {
        let n = tail.wrapping_sub(self.log_shipped).min(READY_LOG_SLOTS);
        if n == 0 {
            return;
        }
        let slots = READY_LOG_OFFSET + 2 * LINE;
        let start = tail.wrapping_sub(n) % READY_LOG_SLOTS;
        let first = n.min(READY_LOG_SLOTS - start);
        for (at, len) in [(start, first), (0, n - first)] {
            let mut b = vec![0u8; 4 * len as usize];
            let off = slots + 4 * at as usize;
            if len > 0 && region.read_span(off, &mut b).is_ok() {
                out.push(off as u32, &b);
            }
        }
        out.push(READY_LOG_OFFSET as u32, &tail.to_le_bytes());
        self.log_shipped = tail;
    }

    pub fn collect(&mut self, l: &Layout, region: &Region, out: &mut Spans) {
        let mut log_tail = [0u8; 4];
        let log_read = region.read_span(READY_LOG_OFFSET, &mut log_tail).is_ok();
        // An accept record may name a send queue the server bound for the
        // connection (`SETUP_SENDQ`, `done` reset): the queues are read
        // after the rings and shipped before them.
        if log_read {
            self.watch_logged(region, u32::from_le_bytes(log_tail));
        }
        let now = Instant::now();
        let full = now >= self.full_due;
        if full {
            self.full_due = now + FULL_SCAN_EVERY;
        }
        let mut rings = Spans::new();
        self.collect_rings(l, region, full, &mut rings);
        self.collect_queues(l, region, full, out);
        out.append(&mut rings);
        if log_read {
            self.collect_log(region, u32::from_le_bytes(log_tail), out);
        }
    }

    /// The receive and accept rings. An accept record (and a completion,
    /// see `pump`) names a receive ring the server bound before it: the
    /// accept rings are read first and shipped last, so the receive rings'
    /// lines in the same batch are at least as new as what they announce
    /// and are applied before it.
    fn collect_rings(&mut self, l: &Layout, region: &Region, full: bool, out: &mut Spans) {
        let mut accepts = Spans::new();
        let is_accept = |r: u32| {
            let mut kind = [0u8; 4];
            let at = l.recv_ring_offset(r) + 2 * LINE + 4;
            region.read_span(at, &mut kind).is_ok() && u32::from_le_bytes(kind) == KIND_ACCEPT
        };
        let look: Vec<u32> = match full {
            true => (0..l.recv_rings).collect(),
            false => self.ring_watch.members().to_vec(),
        };
        let mut seen = Vec::new();
        // Accept rings first: a record names a connection bound at accept,
        // whose ring and queue this pass must look at too.
        let (acc, rest): (Vec<u32>, Vec<u32>) = look.into_iter().partition(|&r| is_accept(r));
        for &r in &acc {
            seen.push((r, self.collect_ring(l, region, r as usize, &mut accepts)));
        }
        let rest: Vec<u32> = match full {
            true => rest,
            false => (self.ring_watch.members().iter().copied())
                .filter(|r| !acc.contains(r))
                .collect(),
        };
        for r in rest {
            seen.push((r, self.collect_ring(l, region, r as usize, out)));
        }
        let now = self.now_ms();
        keep(&mut self.ring_watch, &seen, now);
        out.append(&mut accepts);
    }

    /// The ids of the rings published into since the last pass (ready-log
    /// slots not shipped yet) join the watch.
    fn watch_logged(&mut self, region: &Region, tail: u32) {
        let n = tail.wrapping_sub(self.log_shipped).min(READY_LOG_SLOTS);
        let slots = READY_LOG_OFFSET + 2 * LINE;
        let now = self.now_ms();
        for seq in tail.wrapping_sub(n)..tail {
            let mut id = [0u8; 4];
            let at = slots + 4 * (seq % READY_LOG_SLOTS) as usize;
            if region.read_span(at, &mut id).is_ok() {
                self.ring_watch.touch(u32::from_le_bytes(id), now);
            }
        }
    }

    /// Ships ring `r`'s news; whether it is bound. An accept ring's new
    /// records put their connections' rings and queues on the watch.
    fn collect_ring(&mut self, l: &Layout, region: &Region, r: usize, out: &mut Spans) -> bool {
        let size = l.rq_bytes;
        let sh = &mut self.shadow[r];
        let base = l.recv_ring_offset(r as u32);
        let mut lines = [0u8; L1 + L2];
        // Line 2 and line 1 first (acquire): the bytes they publish after.
        let (l1, l2) = lines.split_at_mut(L1);
        if region.read_span(base + 2 * LINE, l2).is_err()
            || region.read_span(base + LINE, l1).is_err()
        {
            return false;
        }
        let bound = word(&lines[L1..]) != 0;
        if lines == sh.lines {
            return bound;
        }
        let accept = word(&lines[L1 + 4..]) == KIND_ACCEPT;
        let mut named = Vec::new();
        let (owner, binds) = (L1..L1 + 4, L1 + 12..L1 + 16);
        if lines[owner.clone()] != sh.lines[owner] || lines[binds.clone()] != sh.lines[binds] {
            sh.shipped = 0; // bound anew: the ring restarts at 0
        }
        let tail = word(&lines);
        let n = tail.wrapping_sub(sh.shipped).min(size);
        if n > 0 {
            let start = (tail.wrapping_sub(n) % size) as usize;
            let first = (n as usize).min(size as usize - start);
            for (at, len) in [(start, first), (0, n as usize - first)] {
                let mut b = vec![0u8; len];
                if len > 0 && region.read_span(base + RQ_CTL_SIZE + at, &mut b).is_ok() {
                    out.push((base + RQ_CTL_SIZE + at) as u32, &b);
                    if accept {
                        // Whole 64-byte records, the connection's id first.
                        named.extend(b.chunks_exact(ACCEPT_RECORD_SIZE as usize).map(word));
                    }
                }
            }
        }
        sh.shipped = tail;
        out.push((base + LINE) as u32, &lines[..L1]);
        out.push((base + 2 * LINE) as u32, &lines[L1..]);
        sh.lines = lines;
        for sid in named {
            self.watch(sid);
        }
        bound
    }
}

/// After a pass: what it saw bound stays on the watch; what was named
/// lately stays for [`KEEP_NAMED`]; the rest leaves.
fn keep(w: &mut Watch, seen: &[(u32, bool)], now: u64) {
    for &(i, bound) in seen {
        if bound {
            w.touch(i, now);
        }
    }
    w.retain(|_, stamp| now.saturating_sub(stamp) < KEEP_NAMED);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcps_fabric::wire;
    use tcps_proto::mirror::Writer;

    use crate::fabric::test_region::region;

    fn layout() -> Layout {
        crate::fabric::test_region::layout(1)
    }

    /// The server's publish, by hand: bytes at `pos`, then tail and owner.
    fn publish(server: &Region, l: &Layout, pos: u32, bytes: &[u8], owner: u32) {
        publish_unlogged(server, l, pos, bytes, owner);
        // As the worker's publish: the ring's id in the ready log.
        let mut t = [0u8; 4];
        server.read_span(READY_LOG_OFFSET, &mut t).unwrap();
        let t = u32::from_le_bytes(t);
        let slot = READY_LOG_OFFSET + 2 * LINE + 4 * (t % READY_LOG_SLOTS) as usize;
        server
            .apply_span(Writer::Server, slot, &1u32.to_le_bytes())
            .unwrap();
        server
            .apply_span(Writer::Server, READY_LOG_OFFSET, &(t + 1).to_le_bytes())
            .unwrap();
    }

    /// Ring 1's bytes and lines, with no ready-log entry.
    fn publish_unlogged(server: &Region, l: &Layout, pos: u32, bytes: &[u8], owner: u32) {
        let base = l.recv_ring_offset(1);
        for (i, b) in bytes.iter().enumerate() {
            let at = (pos as usize + i) % l.rq_bytes as usize;
            server
                .apply_span(Writer::Server, base + RQ_CTL_SIZE + at, &[*b])
                .unwrap();
        }
        let tail = pos + bytes.len() as u32;
        server
            .apply_span(Writer::Server, base + LINE, &tail.to_le_bytes())
            .unwrap();
        server
            .apply_span(Writer::Server, base + 2 * LINE, &owner.to_le_bytes())
            .unwrap();
    }

    fn ship(rings: &mut Rings, l: &Layout, server: &Region, host: &Region) -> usize {
        let mut out = Spans::new();
        rings.collect(l, server, &mut out);
        let (h, d) = out.take();
        let mut n = 0;
        for s in wire::spans(&h, &d) {
            let (off, b) = s.unwrap();
            host.apply_span(Writer::Server, off as usize, b).unwrap();
            n += 1;
        }
        n
    }

    fn ring_bytes(host: &Region, l: &Layout, pos: u32, len: usize) -> Vec<u8> {
        let base = l.recv_ring_offset(1);
        (0..len)
            .map(|i| {
                let mut b = [0u8];
                let at = (pos as usize + i) % l.rq_bytes as usize;
                host.read_span(base + RQ_CTL_SIZE + at, &mut b).unwrap();
                b[0]
            })
            .collect()
    }

    /// A pass looks at the rings something named (a publish logged, a
    /// request) and at every ring once per FULL_SCAN_EVERY: a ring that
    /// changed unnamed waits for that scan; a bound one stays watched.
    #[test]
    fn a_pass_looks_at_named_and_bound_rings_and_all_now_and_then() {
        let l = layout();
        let (server, host) = (region(l), region(l));
        let mut rings = Rings::new(&l);
        assert_eq!(
            ship(&mut rings, &l, &server, &host),
            0,
            "the first pass: a full scan"
        );
        publish_unlogged(&server, &l, 0, b"quiet", 2);
        assert_eq!(ship(&mut rings, &l, &server, &host), 0, "named by nothing");
        rings.watch(1);
        assert!(
            ship(&mut rings, &l, &server, &host) > 0,
            "named by a request"
        );
        assert_eq!(ring_bytes(&host, &l, 0, 5), b"quiet");
        publish_unlogged(&server, &l, 5, b"more", 2);
        assert!(
            ship(&mut rings, &l, &server, &host) > 0,
            "bound: still watched"
        );
        publish_unlogged(&server, &l, 9, b"!", 0); // unbound
        assert!(ship(&mut rings, &l, &server, &host) > 0);
        std::thread::sleep(std::time::Duration::from_millis(KEEP_NAMED + 5));
        ship(&mut rings, &l, &server, &host); // unbound and not named lately: dropped
        publish_unlogged(&server, &l, 0, b"late", 4); // bound anew: from 0
        assert_eq!(ship(&mut rings, &l, &server, &host), 0, "no longer watched");
        std::thread::sleep(FULL_SCAN_EVERY);
        assert!(
            ship(&mut rings, &l, &server, &host) > 0,
            "the full scan finds it"
        );
        assert_eq!(ring_bytes(&host, &l, 0, 4), b"late");
    }

    #[test]
    fn send_queue_credits_are_shipped_when_they_change() {
        let l = layout();
        let (server, host) = (region(l), region(l));
        let mut rings = Rings::new(&l);
        let q = l.send_queue_offset(1);
        server
            .apply_span(Writer::Server, q + LINE, &5u32.to_le_bytes())
            .unwrap(); // done
        server
            .apply_span(Writer::Server, q + 2 * LINE + 8, &2u32.to_le_bytes())
            .unwrap(); // owner
        assert_eq!(ship(&mut rings, &l, &server, &host), 2);
        let mut done = [0u8; 4];
        host.read_span(q + LINE, &mut done).unwrap();
        assert_eq!(u32::from_le_bytes(done), 5);
        assert_eq!(ship(&mut rings, &l, &server, &host), 0);
    }

    /// An accept ring is shipped after the receive rings (its record
    /// names one the server bound before it), whatever their indexes.
    #[test]
    fn accept_rings_are_shipped_after_the_receive_rings() {
        let l = layout();
        let server = region(l);
        let mut rings = Rings::new(&l);
        // Ring 0 accepts (kind 2), ring 1 receives.
        let r0 = l.recv_ring_offset(0);
        let mut line2 = [0u8; 8];
        line2[..4].copy_from_slice(&1u32.to_le_bytes());
        line2[4..].copy_from_slice(&KIND_ACCEPT.to_le_bytes());
        server
            .apply_span(Writer::Server, r0 + 2 * LINE, &line2)
            .unwrap();
        server
            .apply_span(Writer::Server, r0 + LINE, &64u32.to_le_bytes())
            .unwrap();
        publish(&server, &l, 0, b"request", 2);
        let mut out = Spans::new();
        rings.collect(&l, &server, &mut out);
        let (h, d) = out.take();
        let offs: Vec<usize> = wire::spans(&h, &d).map(|s| s.unwrap().0 as usize).collect();
        let r1 = l.recv_ring_offset(1);
        let last_r1 = offs.iter().rposition(|&o| o >= r1).unwrap();
        let first_r0 = offs.iter().position(|&o| o >= r0 && o < r1).unwrap();
        assert!(last_r1 < first_r0, "{offs:?}");
    }

    /// The same socket id bound again (a new `binds`, same `owner`): the
    /// ring is shipped from 0 again.
    #[test]
    fn a_rebind_to_the_same_socket_id_restarts_the_ring() {
        let l = layout();
        let (server, host) = (region(l), region(l));
        let mut rings = Rings::new(&l);
        publish(&server, &l, 0, b"old connection", 2);
        ship(&mut rings, &l, &server, &host);
        let base = l.recv_ring_offset(1);
        server
            .apply_span(Writer::Server, base + 2 * LINE + 12, &1u32.to_le_bytes())
            .unwrap();
        publish(&server, &l, 0, b"new", 2);
        ship(&mut rings, &l, &server, &host);
        assert_eq!(ring_bytes(&host, &l, 0, 3), b"new");
        let mut tail = [0u8; 4];
        host.read_span(base + LINE, &mut tail).unwrap();
        assert_eq!(u32::from_le_bytes(tail), 3);
    }

    #[test]
    fn published_bytes_reach_the_host_copy_across_the_wrap_and_a_rebind() {
        let l = layout();
        let (server, host) = (region(l), region(l));
        let mut rings = Rings::new(&l);
        assert_eq!(
            ship(&mut rings, &l, &server, &host),
            0,
            "nothing published, nothing shipped"
        );
        publish(&server, &l, 0, b"first bytes", 2);
        ship(&mut rings, &l, &server, &host);
        assert_eq!(ring_bytes(&host, &l, 0, 11), b"first bytes");
        // Across the wrap: the server's tail moves on to 4096 + 8.
        let pos = 4096 - 4;
        publish(&server, &l, pos, b"wrapping", 2);
        let mut tail = [0u8; 4];
        // (the shipper ships what lies between its last tail and the new one)
        ship(&mut rings, &l, &server, &host);
        host.read_span(l.recv_ring_offset(1) + LINE, &mut tail)
            .unwrap();
        assert_eq!(u32::from_le_bytes(tail), pos + 8);
        assert_eq!(ring_bytes(&host, &l, pos, 8), b"wrapping");
        assert_eq!(
            ship(&mut rings, &l, &server, &host),
            0,
            "no change, no spans"
        );
        // Bound anew (owner 3): the ring restarts at 0.
        publish(&server, &l, 0, b"new socket", 3);
        ship(&mut rings, &l, &server, &host);
        assert_eq!(ring_bytes(&host, &l, 0, 10), b"new socket");
    }
}
