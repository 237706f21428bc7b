//! The host's half of a channel to a remote server (`docs/ARCHITECTURE.md`,
//! "The channel over a fabric"): gathers what the host library wrote into
//! its copy of the region since the last pass — each new request slot
//! after the arena bytes it reads, the channel's line 0 (`cq_head`: the
//! server's completion credits), `channels_used` — into one batch, and
//! applies the server pump's batches to the host's copy, waking the
//! sleepers as the server would: the channels' (futex), and the rings',
//! send queues' and ready log's (`Region::wake_*`; the doorbell sleepers
//! are returned for the caller to ring). Shipped: the channels (the
//! synchronous calls), the receive/accept rings' `head` (a ring bound
//! anew — a new `owner` or `binds` — restarts at 0 here too) and the send
//! queues' descriptors and `head`.
//!
//! `server_sleeping` in the host's copy is the pump's, not the server's:
//! it stays non-zero, so every request the library posts rings the
//! doorbell eventfd the pump sleeps on (one write per post; the pump could
//! clear it while it spins, as the server does).

use tcps_fabric::wire::{self, Spans};
use tcps_proto::layout::Layout;
use tcps_proto::mirror::{zone, Kind, SpanRefused, Writer};
use tcps_proto::msg::{Op, Request};
use tcps_proto::ready_log::READY_LOG_OFFSET;
use tcps_proto::region::{stamp, Region};
use tcps_proto::ring::HostCursor;
use tcps_proto::wake::Woke;

/// Offset of `server_sleeping` (and the server's two words after it).
const SERVER_WORDS: usize = 64;
/// Offset of `channels_used`.
const CHANNELS_USED: usize = 128;

#[derive(Default, Clone)]
struct Chan {
    /// Requests shipped (free-running, as the host's `req_tail`).
    shipped: u32,
    /// Line 0 (`req_tail`, `cq_head`) as last shipped.
    line0: [u8; 8],
}

/// The host pump's state for one attachment.
pub struct HostPump {
    layout: Layout,
    chans: Vec<Chan>,
    used: [u8; 4],
    /// Each receive/accept ring's `head` as last shipped.
    heads: Vec<[u8; 4]>,
    /// Each send queue's `head` as last shipped.
    sq_heads: Vec<u32>,
}

/// Why a server batch could not be applied (the link is then dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Malformed,
    Span(SpanRefused),
}

impl HostPump {
    pub fn new(layout: Layout) -> HostPump {
        HostPump {
            layout,
            chans: vec![Chan::default(); layout.n_channels as usize],
            used: [0; 4],
            heads: vec![[0; 4]; layout.recv_rings as usize],
            sq_heads: vec![0; layout.send_queues as usize],
        }
    }

    /// Marks the copy as the pump's: `server_sleeping` set, so posts ring
    /// the pump's doorbell.
    pub fn init(region: &Region) {
        let _ = region.apply_span(Writer::Server, SERVER_WORDS, &1u32.to_le_bytes());
    }

    /// Gathers the host's new writes into `out`.
    pub fn collect(&mut self, region: &Region, out: &mut Spans) {
        let l = self.layout;
        let mut used = [0u8; 4];
        if region.read_span(CHANNELS_USED, &mut used).is_ok() && used != self.used {
            self.used = used;
            out.push(CHANNELS_USED as u32, &used);
        }
        // Rings and queues before the requests: a kick in this batch finds
        // what it announces already applied at the server.
        self.collect_heads(region, out);
        self.collect_queues(region, out);
        let n = u32::from_le_bytes(used).min(l.n_channels);
        for c in 0..n {
            let Some(ch) = region.channel(c) else {
                continue;
            };
            let base = l.channel_offset(c);
            let chan = &mut self.chans[c as usize];
            while ch.request_stamp(chan.shipped) == stamp(chan.shipped, l.ring_entries) {
                let slot = (chan.shipped & (l.ring_entries - 1)) as usize;
                let at = base + l.requests_offset() + 64 * slot;
                let mut b = [0u8; 64];
                if region.read_span(at, &mut b).is_err() {
                    break;
                }
                ship_in_args(region, &l, base, &b, out);
                out.push(at as u32, &b);
                chan.shipped = chan.shipped.wrapping_add(1);
            }
            let mut line0 = [0u8; 8];
            if region.read_span(base, &mut line0).is_ok() && line0 != chan.line0 {
                chan.line0 = line0;
                out.push(base as u32, &line0);
            }
        }
    }

    /// What the host consumed from its rings (the server's room).
    fn collect_heads(&mut self, region: &Region, out: &mut Spans) {
        for (r, shipped) in self.heads.iter_mut().enumerate() {
            let at = self.layout.recv_ring_offset(r as u32);
            let mut head = [0u8; 4];
            if region.read_span(at, &mut head).is_ok() && head != *shipped {
                *shipped = head;
                out.push(at as u32, &head);
            }
        }
    }

    /// New send-queue descriptors (at most a queue's worth), then `head`.
    fn collect_queues(&mut self, region: &Region, out: &mut Spans) {
        let l = self.layout;
        let e = l.sq_entries;
        for (q, shipped) in self.sq_heads.iter_mut().enumerate() {
            let base = l.send_queue_offset(q as u32);
            let mut w = [0u8; 4];
            if region.read_span(base, &mut w).is_err() {
                continue;
            }
            let head = u32::from_le_bytes(w);
            if head == *shipped {
                continue;
            }
            let n = head.wrapping_sub(*shipped).min(e);
            for seq in head.wrapping_sub(n)..head.wrapping_sub(n).wrapping_add(n) {
                let at = base + 192 + 32 * (seq % e) as usize;
                let mut d = [0u8; 32];
                if region.read_span(at, &mut d).is_ok() {
                    out.push(at as u32, &d);
                }
            }
            out.push(base as u32, &w);
            *shipped = head;
        }
    }

    /// The ring whose line 2 (`owner`…) starts at `off`, if any.
    fn ring_line2(&self, off: usize) -> Option<usize> {
        let l = &self.layout;
        let first = l.recv_rings_offset();
        if off < first {
            return None;
        }
        let r = (off - first) / l.rq_stride();
        (r < l.recv_rings as usize && off == l.recv_ring_offset(r as u32) + 128).then_some(r)
    }

    /// The send queue whose line 2 (`active`, `kicks_seen`, `owner`,
    /// `binds`) starts at `off`, if any.
    fn queue_line2(&self, off: usize) -> Option<usize> {
        let l = &self.layout;
        let q = off.checked_sub(l.send_queues_offset())? / l.sq_stride();
        (q < l.send_queues as usize && off == l.send_queue_offset(q as u32) + 128).then_some(q)
    }

    /// The receive/accept ring whose server lines (1 or 2) `off` is in.
    fn ring_of(&self, off: usize) -> Option<u32> {
        let l = &self.layout;
        let first = l.recv_rings_offset();
        let r = off.checked_sub(first)? / l.rq_stride();
        let rel = off - l.recv_ring_offset(r as u32);
        (r < l.recv_rings as usize && (64..192).contains(&rel)).then_some(r as u32)
    }

    /// The send queue whose server lines (1 or 2) `off` is in.
    fn queue_of(&self, off: usize) -> Option<u32> {
        let l = &self.layout;
        let q = off.checked_sub(l.send_queues_offset())? / l.sq_stride();
        let rel = off - l.send_queue_offset(q as u32);
        (q < l.send_queues as usize && (64..192).contains(&rel)).then_some(q as u32)
    }

    /// Applies a batch from the server pump, then wakes whom it concerns
    /// as the server would have: the sleepers of the channels it completed
    /// into (futex), of the rings and queues it published into and of the
    /// ready log (futex sleepers woken here; the doorbell sleepers are
    /// returned, for the caller to ring their host doorbells).
    pub fn apply(&mut self, region: &Region, header: &[u8], data: &[u8]) -> Result<Woke, Refused> {
        let l = self.layout;
        let mut woken = Vec::new();
        let (mut rings, mut queues, mut log) = (Vec::new(), Vec::new(), false);
        for span in wire::spans(header, data) {
            let (off, bytes) = span.map_err(|_| Refused::Malformed)?;
            let mut off = off as usize;
            let mut bytes = bytes;
            if off == SERVER_WORDS && bytes.len() >= 4 {
                // Not the server's sleeping flag: the pump's (see the module).
                off += 4;
                bytes = &bytes[4..];
                if bytes.is_empty() {
                    continue;
                }
            }
            let (ring, queue) = (self.ring_line2(off), self.queue_line2(off));
            // `owner` and `binds`: either changed, the ring (the queue) was
            // bound anew.
            let mut was = [0u8; 16];
            if ring.is_some() || queue.is_some() {
                let _ = region.read_span(off, &mut was);
            }
            region
                .apply_span(Writer::Server, off, bytes)
                .map_err(Refused::Span)?;
            let changed = |r: std::ops::Range<usize>| bytes.get(r.clone()) != Some(&was[r]);
            if let Some(r) = ring.filter(|_| changed(0..4) || changed(12..16)) {
                // Bound anew: the server's bind stored head = 0 in its copy;
                // head is the host's to write here.
                let at = self.layout.recv_ring_offset(r as u32);
                let _ = region.apply_span(Writer::Host, at, &[0; 4]);
                self.heads[r] = [0; 4];
            }
            if let Some(q) = queue.filter(|_| changed(8..12) || changed(12..16)) {
                // The same for a send queue (its descriptors start at 0):
                // what this pump shipped of the last binding is history.
                let at = self.layout.send_queue_offset(q as u32);
                let _ = region.apply_span(Writer::Host, at, &[0; 4]);
                self.sq_heads[q] = 0;
            }
            let z = zone(&l, off).filter(|z| z.kind == Kind::Slots(32));
            if let Some(z) = z {
                let c = ((z.start - l.channel_offset(0)) / l.channel_stride()) as u32;
                if !woken.contains(&c) {
                    woken.push(c);
                }
            }
            log |= off == READY_LOG_OFFSET;
            if let Some(r) = self.ring_of(off).filter(|r| !rings.contains(r)) {
                rings.push(r);
            }
            if let Some(q) = self.queue_of(off).filter(|q| !queues.contains(q)) {
                queues.push(q);
            }
        }
        for c in woken {
            if let Some(ch) = region.channel(c) {
                HostCursor::wake_sleepers(&ch);
            }
        }
        let mut woke = Woke::default();
        for r in rings {
            join(&mut woke, region.wake_recv_ring(r));
        }
        for q in queues {
            join(&mut woke, region.wake_send_queue(q));
        }
        if log {
            join(&mut woke, region.wake_ready_log());
        }
        Ok(woke)
    }
}

fn join(a: &mut Woke, b: Woke) {
    a.thread |= b.thread;
    a.bell |= b.bell;
    a.bells |= b.bells;
}

/// Ships the arena bytes a request's call reads (its in-arguments), within
/// the arena.
fn ship_in_args(region: &Region, l: &Layout, base: usize, slot: &[u8; 64], out: &mut Spans) {
    let r = Request::from_slot(slot);
    let op = Op::from_u16(r.op);
    let (off, len) = (r.buf_off as usize, r.buf_len as usize);
    let reads = matches!(
        op,
        Some(Op::Send | Op::Bind | Op::Connect | Op::SetSockOpt | Op::Poll | Op::FileOpen)
    );
    let arena = l.arena_size as usize;
    if !reads || len == 0 || off >= arena {
        return;
    }
    let len = len.min(arena - off);
    let at = base + l.arena_offset() + off;
    let mut bytes = vec![0u8; len];
    if region.read_span(at, &mut bytes).is_ok() {
        out.push(at as u32, &bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use tcps_proto::msg::{Completion, Request};
    use tcps_proto::ring::ServerCursor;

    fn layout() -> Layout {
        Layout {
            n_channels: 2,
            ring_entries: 8,
            arena_size: 4096,
            send_queues: 2,
            sq_entries: 8,
            recv_rings: 2,
            rq_bytes: 4096,
        }
    }

    fn region(l: Layout) -> (std::fs::File, Region) {
        let f = crate::remote::tests_memfd(l.region_size());
        let r = Region::map(f.as_fd(), l).unwrap();
        r.init_header();
        (f, r)
    }

    fn apply_all(to: &Region, who: Writer, s: &mut Spans) {
        let (h, d) = s.take();
        for span in wire::spans(&h, &d) {
            let (off, b) = span.unwrap();
            to.apply_span(who, off as usize, b).unwrap();
        }
    }

    #[test]
    fn a_send_crosses_to_the_server_and_its_answer_back() {
        let l = layout();
        let ((_a, host), (_b, server)) = (region(l), region(l));
        HostPump::init(&host);
        let mut pump = HostPump::new(l);
        // The library: channels_used, arguments in the arena, the request.
        host.apply_span(Writer::Host, CHANNELS_USED, &1u32.to_le_bytes())
            .unwrap();
        let arena = l.channel_offset(0) + l.arena_offset();
        host.apply_span(Writer::Host, arena + 8, b"GET / HTTP/1.0")
            .unwrap();
        let mut hc = HostCursor::default();
        let req = Request {
            user_data: 5,
            op: Op::Send as u16,
            sock: 2,
            buf_off: 8,
            buf_len: 14,
            ..Default::default()
        };
        hc.submit(&host.channel(0).unwrap(), &req).unwrap();
        let mut out = Spans::new();
        pump.collect(&host, &mut out);
        apply_all(&server, Writer::Host, &mut out);
        // The worker takes it, reads the bytes and answers.
        let ch = server.channel(0).unwrap();
        let mut sc = ServerCursor::default();
        let got = sc.pop(&ch).unwrap().expect("the worker sees the request");
        assert_eq!((got.user_data, got.buf_len), (5, 14));
        let mut data = [0u8; 14];
        server.read_span(arena + 8, &mut data).unwrap();
        assert_eq!(&data, b"GET / HTTP/1.0");
        sc.complete(
            &ch,
            &Completion {
                user_data: 5,
                op: Op::Send as u16,
                result: 14,
                ..Default::default()
            },
        )
        .unwrap();
        // The server pump's batch (by hand here): the slot, then line 2,
        // then the header words with server_sleeping = 0.
        let mut back = Spans::new();
        let slot = l.channel_offset(0) + l.completions_offset();
        for (off, len) in [
            (slot, 32),
            (l.channel_offset(0) + 128, 12),
            (SERVER_WORDS, 12),
        ] {
            let mut b = vec![0u8; len];
            server.read_span(off, &mut b).unwrap();
            back.push(off as u32, &b);
        }
        let (h, d) = back.take();
        pump.apply(&host, &h, &d).unwrap();
        let c = hc
            .reap(&host.channel(0).unwrap())
            .expect("the host sees the answer");
        assert_eq!((c.user_data, c.result), (5, 14));
        let mut sleeping = [0u8; 4];
        host.read_span(SERVER_WORDS, &mut sleeping).unwrap();
        assert_eq!(
            u32::from_le_bytes(sleeping),
            1,
            "the pump keeps the doorbell rung by posts"
        );
        // The consumed completion's credit goes back; nothing else.
        pump.collect(&host, &mut out);
        let (h, d) = out.take();
        let spans: Vec<_> = wire::spans(&h, &d).map(|s| s.unwrap().0 as usize).collect();
        assert_eq!(
            spans,
            vec![l.channel_offset(0)],
            "only line 0 (cq_head) changed"
        );
    }

    #[test]
    fn ring_heads_are_shipped_and_reset_by_a_rebind() {
        let l = layout();
        let (_a, host) = region(l);
        let mut pump = HostPump::new(l);
        let ring = l.recv_ring_offset(1);
        // The server binds ring 1 (owner 4) and publishes 10 bytes.
        let mut s = Spans::new();
        s.push((ring + 64) as u32, &10u32.to_le_bytes());
        s.push((ring + 128) as u32, &4u32.to_le_bytes());
        let (h, d) = s.take();
        pump.apply(&host, &h, &d).unwrap();
        // The host consumes them: its head goes to the server.
        host.apply_span(Writer::Host, ring, &10u32.to_le_bytes())
            .unwrap();
        let mut out = Spans::new();
        pump.collect(&host, &mut out);
        let (h, d) = out.take();
        let got: Vec<_> = wire::spans(&h, &d).map(|s| s.unwrap()).collect();
        assert!(
            got.contains(&(ring as u32, &10u32.to_le_bytes()[..])),
            "{got:?}"
        );
        // Bound anew (owner 5): head is 0 again, and nothing to ship.
        let mut s = Spans::new();
        s.push((ring + 64) as u32, &0u32.to_le_bytes());
        s.push((ring + 128) as u32, &5u32.to_le_bytes());
        let (h, d) = s.take();
        pump.apply(&host, &h, &d).unwrap();
        let mut head = [0u8; 4];
        host.read_span(ring, &mut head).unwrap();
        assert_eq!(head, [0; 4]);
        pump.collect(&host, &mut out);
        assert!(out.is_empty());
    }

    /// The same socket id bound again (same `owner`, a new `binds`): the
    /// host's `head` restarts at 0 as for a new owner.
    #[test]
    fn a_rebind_to_the_same_socket_id_resets_the_head() {
        let l = layout();
        let (_a, host) = region(l);
        let mut pump = HostPump::new(l);
        let ring = l.recv_ring_offset(1);
        let line2 = |binds: u32| {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&2u32.to_le_bytes()); // owner
            b[12..].copy_from_slice(&binds.to_le_bytes());
            b
        };
        let mut s = Spans::new();
        s.push((ring + 128) as u32, &line2(1));
        let (h, d) = s.take();
        pump.apply(&host, &h, &d).unwrap();
        host.apply_span(Writer::Host, ring, &10u32.to_le_bytes())
            .unwrap();
        let mut s = Spans::new();
        s.push((ring + 128) as u32, &line2(2));
        let (h, d) = s.take();
        pump.apply(&host, &h, &d).unwrap();
        let mut head = [0u8; 4];
        host.read_span(ring, &mut head).unwrap();
        assert_eq!(head, [0; 4], "bound again: head restarts");
        // Unchanged lines shipped again: no reset.
        host.apply_span(Writer::Host, ring, &7u32.to_le_bytes())
            .unwrap();
        let mut s = Spans::new();
        s.push((ring + 128) as u32, &line2(2));
        let (h, d) = s.take();
        pump.apply(&host, &h, &d).unwrap();
        host.read_span(ring, &mut head).unwrap();
        assert_eq!(u32::from_le_bytes(head), 7);
    }

    /// A publish into a ring a doorbell sleeper watches (and into the
    /// ready log) reports its doorbell slot, as the server's publish does.
    #[test]
    fn a_publish_reports_the_doorbell_sleepers_of_the_ring_and_the_log() {
        let l = layout();
        let (_a, host) = region(l);
        let mut pump = HostPump::new(l);
        let ring = l.recv_ring_offset(1);
        let tail = |t: u32| {
            let mut s = Spans::new();
            s.push((ring + 64) as u32, &t.to_le_bytes());
            s.take()
        };
        let (h, d) = tail(5);
        assert_eq!(pump.apply(&host, &h, &d).unwrap().bells, 0, "nobody waits");
        // A sleeper on doorbell 3 registers on the ring (host_waiting,
        // bell_slots), one on doorbell 5 on the ready log.
        let mut w = [0u8; 12];
        w[..4].copy_from_slice(&tcps_proto::eager::ctl::BELL_SLEEPER.to_le_bytes());
        w[4..].copy_from_slice(&(1u64 << 3).to_le_bytes());
        host.apply_span(Writer::Host, ring + 4, &w).unwrap();
        let (h, d) = tail(9);
        let woke = pump.apply(&host, &h, &d).unwrap();
        assert!(woke.bell && woke.bells == 1 << 3, "{woke:?}");
        // The log's `host_waiting`, padding, `bell_slots`.
        let log = READY_LOG_OFFSET + 64;
        host.apply_span(Writer::Host, log, &w[..4]).unwrap();
        host.apply_span(Writer::Host, log + 8, &(1u64 << 5).to_le_bytes())
            .unwrap();
        let mut s = Spans::new();
        s.push(READY_LOG_OFFSET as u32, &1u32.to_le_bytes());
        let (h, d) = s.take();
        assert_eq!(pump.apply(&host, &h, &d).unwrap().bells, 1 << 5);
    }

    #[test]
    fn send_queue_descriptors_go_before_their_head_and_before_the_kick() {
        let l = layout();
        let (_a, host) = region(l);
        let mut pump = HostPump::new(l);
        let q = l.send_queue_offset(1);
        for seq in 0..3u32 {
            let d = [seq as u8 + 1; 32];
            host.apply_span(Writer::Host, q + 192 + 32 * seq as usize, &d)
                .unwrap();
        }
        host.apply_span(Writer::Host, q, &3u32.to_le_bytes())
            .unwrap();
        host.apply_span(Writer::Host, CHANNELS_USED, &1u32.to_le_bytes())
            .unwrap();
        let mut hc = HostCursor::default();
        let kick = Request {
            user_data: 1,
            op: Op::AsyncKick as u16,
            sock: 1,
            ..Default::default()
        };
        hc.submit(&host.channel(0).unwrap(), &kick).unwrap();
        let mut out = Spans::new();
        pump.collect(&host, &mut out);
        let (h, d) = out.take();
        let offs: Vec<usize> = wire::spans(&h, &d).map(|s| s.unwrap().0 as usize).collect();
        let pos = |o: usize| offs.iter().position(|x| *x == o).unwrap();
        let slot = l.channel_offset(0) + l.requests_offset();
        assert!(
            pos(q + 192) < pos(q + 256) && pos(q + 256) < pos(q),
            "descriptors, then head: {offs:?}"
        );
        assert!(pos(q) < pos(slot), "the queue before the kick: {offs:?}");
        // Nothing new: nothing shipped for the queue.
        pump.collect(&host, &mut out);
        let (h, d) = out.take();
        assert!(wire::spans(&h, &d).all(|s| s.unwrap().0 as usize != q));
    }

    /// A send queue bound again to the same socket id (same `owner`, a new
    /// `binds`): the first descriptor of the new binding is shipped even
    /// though `head` is back at the value last shipped.
    #[test]
    fn a_send_queue_bound_again_ships_its_new_descriptors() {
        let l = layout();
        let (_a, host) = region(l);
        let mut pump = HostPump::new(l);
        let q = l.send_queue_offset(1);
        let publish = |pump: &mut HostPump, first: u8| {
            host.apply_span(Writer::Host, q + 192, &[first; 32])
                .unwrap();
            host.apply_span(Writer::Host, q, &1u32.to_le_bytes())
                .unwrap();
            let mut out = Spans::new();
            pump.collect(&host, &mut out);
            let (h, d) = out.take();
            wire::spans(&h, &d).any(|s| s.unwrap() == ((q + 192) as u32, &[first; 32][..]))
        };
        let bind = |pump: &mut HostPump, binds: u32| {
            let mut b = [0u8; 16];
            b[8..12].copy_from_slice(&2u32.to_le_bytes()); // owner: socket 1
            b[12..].copy_from_slice(&binds.to_le_bytes());
            let mut s = Spans::new();
            s.push((q + 128) as u32, &b);
            let (h, d) = s.take();
            pump.apply(&host, &h, &d).unwrap();
        };
        bind(&mut pump, 1);
        assert!(publish(&mut pump, 7), "the first binding's descriptor");
        bind(&mut pump, 2);
        let mut head = [0u8; 4];
        host.read_span(q, &mut head).unwrap();
        assert_eq!(head, [0; 4], "bound again: head restarts");
        assert!(publish(&mut pump, 9), "the second binding's descriptor");
    }

    #[test]
    fn a_bad_server_batch_is_refused() {
        let l = layout();
        let (_a, host) = region(l);
        let mut pump = HostPump::new(l);
        let mut s = Spans::new();
        s.push(CHANNELS_USED as u32, &[1, 0, 0, 0]); // a host field
        let (h, d) = s.take();
        assert_eq!(
            pump.apply(&host, &h, &d),
            Err(Refused::Span(SpanRefused::NotWriter))
        );
        assert_eq!(pump.apply(&host, &h[..2], &d), Err(Refused::Malformed));
    }
}
