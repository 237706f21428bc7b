//! The server's half of a remote host's channel (`docs/ARCHITECTURE.md`,
//! "The channel over a fabric"): applies the spans the host's pump sent
//! to the server's copy of its region (checked by `proto::mirror`: only
//! host-written zones), and gathers what the server wrote since the last
//! pass into one batch for the host: the channels (requests and
//! completions), the receive and accept rings, send queues and the ready
//! log (`rings`). It holds the server's copies of the host's memory
//! registrations (`control`): the host's registration spans (the bytes
//! of its queued and `SendReg` sends, shipped before the descriptor or
//! request naming them) are written there, bound-checked
//! (`RegCopy::apply`), and what a `RecvReg` received goes back to the
//! host the same way, before its completion.

use std::collections::HashMap;
use tcps_fabric::wire::{self, Spans};
use tcps_proto::eager::ctl::BELL_SLEEPER;
use tcps_proto::layout::Layout;
use tcps_proto::mirror::{zone, Kind, RegCopy, SpanRefused, Writer};
use tcps_proto::msg::{Completion, Op, Request};
use tcps_proto::ready_log::READY_LOG_OFFSET;
use tcps_proto::region::Region;
use tcps_proto::ring::HostCursor;

/// What a request left in the arena for its completion to ship back, and
/// the socket whose ring or queue its call may bind.
#[derive(Clone, Copy, Debug)]
struct Call {
    op: u16,
    sock: u32,
    buf_off: u32,
    buf_len: u32,
    /// `RecvReg`: the registration range it receives into.
    reg: Option<(u32, u64)>,
}

#[derive(Default)]
struct Chan {
    /// Completions shipped (free-running, as `cq_tail`).
    shipped: u32,
    /// Requests applied and not yet answered, by `user_data`.
    calls: HashMap<u64, Call>,
    /// Line 2 (`req_head`, `cq_tail`, `parked_tag`) as last shipped.
    line2: [u8; 12],
}

/// Why a host's batch was refused: the host is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Malformed,
    Span(SpanRefused),
    /// More requests in flight than its rings hold.
    TooManyCalls,
    /// A registration span for a handle it has not registered.
    NoRegistration,
}

/// One remote host's pump state at the server.
pub struct ServerPump {
    layout: Layout,
    chans: Vec<Chan>,
    rings: super::rings::Rings,
    /// The server's header words last shipped (`server_sleeping`, …).
    header: [u8; 12],
    /// The server's copies of the host's registrations, by handle.
    regs: Vec<Option<RegCopy>>,
}

const SERVER_WORDS: usize = 64;

impl ServerPump {
    pub fn new(layout: Layout) -> ServerPump {
        let chans = (0..layout.n_channels).map(|_| Chan::default()).collect();
        ServerPump {
            layout,
            chans,
            rings: super::rings::Rings::new(&layout),
            header: [0xff; 12],
            regs: Vec::new(),
        }
    }

    /// The next pass looks at every ring and queue (a control message was
    /// answered: a fork snapshot claimed binds many).
    pub fn watch_all(&mut self) {
        self.rings.watch_all();
    }

    /// The send queue whose host lines or descriptors `off` is in.
    fn queue_of(&self, off: usize) -> Option<u32> {
        let l = &self.layout;
        if off >= l.recv_rings_offset() {
            return None;
        }
        let q = off.checked_sub(l.send_queues_offset())? / l.sq_stride();
        (q < l.send_queues as usize).then_some(q as u32)
    }

    pub fn has_registration(&self, handle: u32) -> bool {
        self.regs.get(handle as usize).is_some_and(Option::is_some)
    }

    /// The server's copy of registration `handle` (the caller checked the
    /// handle is below `MAX_REGISTRATIONS`).
    pub fn add_registration(&mut self, handle: u32, copy: RegCopy) {
        let h = handle as usize;
        if self.regs.len() <= h {
            self.regs.resize_with(h + 1, || None);
        }
        self.regs[h] = Some(copy);
    }

    pub fn drop_registration(&mut self, handle: u32) {
        if let Some(r) = self.regs.get_mut(handle as usize) {
            *r = None;
        }
    }

    /// A registration span from the host: into the server's copy, inside it.
    fn apply_reg(&self, bytes: &[u8]) -> Result<(), Refused> {
        let (handle, off, data) = wire::reg_span(bytes).ok_or(Refused::Malformed)?;
        let copy = self.regs.get(handle as usize).and_then(Option::as_ref);
        copy.ok_or(Refused::NoRegistration)?
            .apply(off, data)
            .map_err(Refused::Span)
    }

    /// Makes the server's copy of a remote host's region look watched
    /// everywhere, so that the worker reports every publish for the host
    /// as it would for a local host's sleepers: each channel's
    /// `host_waiting` (a completion puts the channel in `wakes_owed`), and
    /// a doorbell sleeper on slot 0 on every ring, queue and the ready log
    /// (a publish owes doorbell 0). The worker rings doorbell 0 — a pipe
    /// this pump asked for — instead of waking a copy nobody sleeps on
    /// (`worker::wake_hosts`), and the pump ships at once. These are host
    /// fields the host pump never ships.
    pub fn init(region: &Region) {
        let l = *region.layout();
        let mut sleeper = [0u8; 12];
        sleeper[..4].copy_from_slice(&BELL_SLEEPER.to_le_bytes());
        sleeper[4..].copy_from_slice(&1u64.to_le_bytes());
        for c in 0..l.n_channels {
            let _ = region.apply_span(Writer::Host, l.channel_offset(c) + 64, &1u32.to_le_bytes());
        }
        for r in 0..l.recv_rings {
            let _ = region.apply_span(Writer::Host, l.recv_ring_offset(r) + 4, &sleeper);
        }
        for q in 0..l.send_queues {
            let _ = region.apply_span(Writer::Host, l.send_queue_offset(q) + 4, &sleeper);
        }
        // The log's `host_waiting`, then (after 4 bytes of padding) its
        // `bell_slots`.
        let log = READY_LOG_OFFSET + 64;
        let _ = region.apply_span(Writer::Host, log, &BELL_SLEEPER.to_le_bytes());
        let _ = region.apply_span(Writer::Host, log + 8, &1u64.to_le_bytes());
    }

    /// Applies a batch from the host. `Ok(true)`: a request was published
    /// (ring the host's doorbell if the server sleeps).
    pub fn apply(&mut self, region: &Region, header: &[u8], data: &[u8]) -> Result<bool, Refused> {
        let mut requests = false;
        for span in wire::spans(header, data) {
            let (off, bytes) = span.map_err(|_| Refused::Malformed)?;
            if off == wire::REG_SPAN {
                self.apply_reg(bytes)?;
                continue;
            }
            let off = off as usize;
            region
                .apply_span(Writer::Host, off, bytes)
                .map_err(Refused::Span)?;
            if let Some(z) = zone(&self.layout, off).filter(|z| z.kind == Kind::Slots(64)) {
                self.note_requests(z.start, bytes)?;
                requests = true;
            } else if let Some(q) = self.queue_of(off) {
                // New descriptors: the queue's credits will move.
                self.rings.watch(q);
            }
        }
        Ok(requests)
    }

    /// Remembers the arena range of each request slot in a span (already
    /// bound-checked as whole slots of one channel's request ring).
    fn note_requests(&mut self, ring_start: usize, bytes: &[u8]) -> Result<(), Refused> {
        let l = &self.layout;
        let c = (ring_start - l.channel_offset(0)) / l.channel_stride();
        let chan = &mut self.chans[c];
        for slot in bytes.chunks_exact(64) {
            let r = Request::from_slot(slot.try_into().map_err(|_| Refused::Malformed)?);
            if Op::from_u16(r.op).is_some_and(Op::names_socket) {
                // Its ring and queue may change (a bind, a kick, a close).
                self.rings.watch(r.sock);
            }
            // Only calls whose results land in the arena are remembered:
            // they always complete (unanswered ops — kicks, unanswered
            // closes — never would, and would pile up here).
            let reg =
                (Op::from_u16(r.op) == Some(Op::RecvReg)).then_some((r.args[0] as u32, r.args[1]));
            if !writes_arena(r.op) && reg.is_none() && !may_bind(r.op) {
                continue;
            }
            if chan.calls.len() >= 2 * l.ring_entries as usize {
                return Err(Refused::TooManyCalls);
            }
            chan.calls.insert(
                r.user_data,
                Call {
                    op: r.op,
                    sock: r.sock,
                    buf_off: r.buf_off,
                    buf_len: r.buf_len,
                    reg,
                },
            );
        }
        Ok(())
    }

    /// Gathers what the server wrote since the last pass: per channel the
    /// new completions (each after the arena bytes it wrote), then the
    /// channel's server line; the header's server words if they changed.
    pub fn collect(&mut self, region: &Region, out: &mut Spans) {
        let l = self.layout;
        // Completions are read first and shipped after the rings: one may
        // name a ring the server bound before it (setup with accept).
        let mut done = Spans::new();
        let out_rings = out;
        let out = &mut done;
        for c in 0..l.n_channels {
            self.collect_channel(region, c, out);
        }
        self.rings.collect(&l, region, out_rings);
        out_rings.append(&mut done);
        let out = out_rings;
        let mut words = [0u8; 12];
        if region.read_span(SERVER_WORDS, &mut words).is_ok() && words != self.header {
            self.header = words;
            out.push(SERVER_WORDS as u32, &words);
        }
    }
}

/// What a `RecvReg` received (`n` bytes at `off` of registration
/// `handle`), back to the host's copy before its completion.
fn ship_received(copy: Option<&RegCopy>, handle: u32, off: u64, n: i64, out: &mut Spans) {
    let (Some(copy), Ok(n)) = (copy, usize::try_from(n)) else {
        return;
    };
    let mut bytes = vec![0u8; n];
    if n > 0 && copy.read(off, &mut bytes).is_ok() {
        out.push_reg(handle, off, &bytes);
    }
}

impl ServerPump {
    /// Channel `c`'s new completions (each after the bytes it wrote for
    /// the host), then its server line (`req_head`, `cq_tail`) if it moved:
    /// requests answered by no completion (kicks) free ring room too.
    fn collect_channel(&mut self, region: &Region, c: u32, out: &mut Spans) {
        let l = self.layout;
        let Some(ch) = region.channel(c) else {
            return;
        };
        let tail = HostCursor::published(&ch);
        let chan = &mut self.chans[c as usize];
        let base = l.channel_offset(c);
        while chan.shipped != tail {
            let slot = (chan.shipped & (l.ring_entries - 1)) as usize;
            let at = base + l.completions_offset() + 32 * slot;
            let mut b = [0u8; 32];
            if region.read_span(at, &mut b).is_err() {
                break;
            }
            let done = Completion::from_slot(&b);
            if let Some(call) = chan.calls.remove(&done.user_data) {
                // The call may have bound the socket's ring or queue (a
                // connection set up at accept: the new one's): looked at in
                // this pass, so the binding ships before the completion
                // that tells the host of it.
                if may_bind(call.op) {
                    self.rings.watch(call.sock);
                }
                if Op::from_u16(call.op) == Some(Op::Accept) && done.errno == 0 {
                    self.rings.watch(done.result as u32);
                }
                if let Some((handle, off)) = call.reg.filter(|_| done.errno == 0) {
                    let copy = self.regs.get(handle as usize).and_then(Option::as_ref);
                    ship_received(copy, handle, off, done.result, out);
                }
                let n = out_len(call, &done);
                if n > 0 {
                    let a = base + l.arena_offset() + call.buf_off as usize;
                    let mut bytes = vec![0u8; n];
                    if region.read_span(a, &mut bytes).is_ok() {
                        out.push(a as u32, &bytes);
                    }
                }
            }
            out.push(at as u32, &b);
            chan.shipped = chan.shipped.wrapping_add(1);
        }
        let mut line = [0u8; 12];
        let at = base + 2 * SERVER_WORDS;
        if region.read_span(at, &mut line).is_ok() && line != chan.line2 {
            chan.line2 = line;
            out.push(at as u32, &line);
        }
    }
}

/// Whether a call of this op may bind its socket's receive ring or send
/// queue (or, `Accept`, a new connection's) before its completion. Each
/// always completes, so remembering it cannot pile up.
fn may_bind(op: u16) -> bool {
    matches!(
        Op::from_u16(op),
        Some(Op::AsyncBind | Op::RecvBind | Op::Listen | Op::Accept | Op::Connect | Op::SetSockOpt)
    )
}

/// Whether a call of this op writes results into its arena range.
fn writes_arena(op: u16) -> bool {
    matches!(
        Op::from_u16(op),
        Some(Op::Recv | Op::Accept | Op::GetSockName | Op::GetPeerName | Op::GetSockOpt | Op::Poll)
    )
}

/// The bytes of the arena a completion's call wrote for the host: its
/// out-arguments, never more than the request's own range (which the
/// server's decoder bound-checked before running the call).
fn out_len(call: Call, done: &Completion) -> usize {
    let len = call.buf_len as usize;
    let n = match Op::from_u16(call.op) {
        _ if done.errno != 0 => 0,
        Some(Op::Recv) => done.result.max(0) as usize,
        Some(Op::Accept | Op::GetSockName | Op::GetPeerName | Op::GetSockOpt) => done.aux as usize,
        Some(Op::Poll) => len,
        _ => 0,
    };
    n.min(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcps_proto::ring::ServerCursor;

    use crate::fabric::test_region::region;

    fn layout() -> Layout {
        crate::fabric::test_region::layout(2)
    }

    /// The host's half, by hand: the request slot and channel lines 0/1.
    fn ship_request(host: &Region, l: &Layout) -> Spans {
        let mut s = Spans::new();
        for (off, len) in [
            (l.channel_offset(0) + l.requests_offset(), 64),
            (l.channel_offset(0), 128),
        ] {
            let mut b = vec![0u8; len];
            host.read_span(off, &mut b).unwrap();
            s.push(off as u32, &b);
        }
        s
    }

    /// After `init` every publish of the worker owes doorbell 0 (the
    /// pump's): on each ring, each queue and the ready log.
    #[test]
    fn init_makes_every_publish_owe_doorbell_0() {
        let l = layout();
        let server = region(l);
        for r in 0..l.recv_rings {
            assert_eq!(server.wake_recv_ring(r).bells, 0);
        }
        ServerPump::init(&server);
        for r in 0..l.recv_rings {
            let w = server.wake_recv_ring(r);
            assert!(w.bell && !w.thread && w.bells == 1, "ring {r}: {w:?}");
        }
        for q in 0..l.send_queues {
            assert_eq!(server.wake_send_queue(q).bells, 1, "queue {q}");
        }
        let w = server.wake_ready_log();
        assert!(w.bell && w.bells == 1, "ready log: {w:?}");
    }

    #[test]
    fn a_recv_crosses_both_pumps() {
        let l = layout();
        let (host, server) = (region(l), region(l));
        let mut pump = ServerPump::new(l);
        let mut hc = HostCursor::default();
        let req = Request {
            user_data: 9,
            op: Op::Recv as u16,
            sock: 1,
            buf_off: 64,
            buf_len: 100,
            ..Default::default()
        };
        hc.submit(&host.channel(0).unwrap(), &req).unwrap();
        let (h, d) = ship_request(&host, &l).take();
        assert_eq!(pump.apply(&server, &h, &d), Ok(true));
        let ch = server.channel(0).unwrap();
        let mut sc = ServerCursor::default();
        let got = sc.pop(&ch).unwrap().expect("the worker sees the request");
        assert_eq!((got.user_data, got.buf_off, got.buf_len), (9, 64, 100));
        // The worker receives 5 bytes into the arena and completes.
        let arena = l.channel_offset(0) + l.arena_offset();
        server
            .apply_span(Writer::Server, arena + 64, b"hello")
            .unwrap();
        let done = Completion {
            user_data: 9,
            op: Op::Recv as u16,
            result: 5,
            ..Default::default()
        };
        sc.complete(&ch, &done).unwrap();
        let mut out = Spans::new();
        pump.collect(&server, &mut out);
        let (h, d) = out.take();
        // The host's pump applies them (its copy trusts the server's writes).
        for span in wire::spans(&h, &d) {
            let (off, bytes) = span.unwrap();
            host.apply_span(Writer::Server, off as usize, bytes)
                .unwrap();
        }
        let c = hc
            .reap(&host.channel(0).unwrap())
            .expect("the host sees the completion");
        assert_eq!((c.user_data, c.result), (9, 5));
        let mut data = [0u8; 5];
        host.read_span(arena + 64, &mut data).unwrap();
        assert_eq!(&data, b"hello");
        // Only the bytes the call wrote crossed back, not its whole range.
        assert!(d.len() < 100, "shipped {} bytes", d.len());
        // Nothing new: nothing shipped.
        pump.collect(&server, &mut out);
        assert!(out.is_empty());
    }

    /// Requests that are never answered (kicks) must not pile up and get
    /// the host cut off.
    #[test]
    fn unanswered_requests_are_not_remembered() {
        let l = layout();
        let (host, server) = (region(l), region(l));
        let mut pump = ServerPump::new(l);
        let mut hc = HostCursor::default();
        let mut sc = ServerCursor::default();
        let ch_s = server.channel(0).unwrap();
        for i in 0..10 * l.ring_entries as u64 {
            let kick = Request {
                user_data: i,
                op: Op::RecvKick as u16,
                sock: 1,
                ..Default::default()
            };
            let slot = (hc.next_request() & (l.ring_entries - 1)) as usize;
            hc.submit(&host.channel(0).unwrap(), &kick).unwrap();
            let mut s = Spans::new();
            let at = l.channel_offset(0) + l.requests_offset() + 64 * slot;
            let mut b = vec![0u8; 64];
            host.read_span(at, &mut b).unwrap();
            s.push(at as u32, &b);
            let (h, d) = s.take();
            assert_eq!(pump.apply(&server, &h, &d), Ok(true), "kick {i}");
            sc.pop(&ch_s).unwrap().expect("taken");
            sc.retire();
            // The server took it: the host's ring has room again.
            let mut line = [0u8; 12];
            server
                .read_span(l.channel_offset(0) + 128, &mut line)
                .unwrap();
            host.apply_span(Writer::Server, l.channel_offset(0) + 128, &line)
                .unwrap();
        }
        assert!(pump.chans[0].calls.is_empty());
    }

    #[test]
    fn a_host_writing_server_fields_is_refused() {
        let l = layout();
        let server = region(l);
        let mut pump = ServerPump::new(l);
        let mut s = Spans::new();
        s.push((l.channel_offset(0) + 128) as u32, &1u32.to_le_bytes()); // cq_tail
        let (h, d) = s.take();
        assert_eq!(
            pump.apply(&server, &h, &d),
            Err(Refused::Span(SpanRefused::NotWriter))
        );
        assert_eq!(pump.apply(&server, &h, &d[..3]), Err(Refused::Malformed));
    }

    /// A fresh registration copy of `len` bytes (a sealed memfd, as the
    /// fabric thread makes) and a second mapping standing for the worker's.
    fn registration(len: usize) -> (RegCopy, RegCopy) {
        use std::os::fd::AsFd;
        let fd = crate::sys::memfd(c"reg-test", len).unwrap();
        let a = RegCopy::map(fd.as_fd(), len).unwrap();
        (a, RegCopy::map(fd.as_fd(), len).unwrap())
    }

    #[test]
    fn registration_spans_land_in_the_copy_only_inside() {
        let l = layout();
        let server = region(l);
        let mut pump = ServerPump::new(l);
        let (copy, worker) = registration(4096);
        pump.add_registration(5, copy);
        let mut s = Spans::new();
        s.push_reg(5, 4090, b"bytes!");
        let (h, d) = s.take();
        assert_eq!(pump.apply(&server, &h, &d), Ok(false));
        let mut got = [0u8; 6];
        worker.read(4090, &mut got).unwrap();
        assert_eq!(&got, b"bytes!", "the worker's mapping sees them");
        for (handle, off, why) in [
            (5, 4091, Refused::Span(SpanRefused::Outside)),
            (6, 0, Refused::NoRegistration),
        ] {
            let mut s = Spans::new();
            s.push_reg(handle, off, b"bytes!");
            let (h, d) = s.take();
            assert_eq!(pump.apply(&server, &h, &d), Err(why), "{handle} {off}");
        }
        pump.drop_registration(5);
        let mut s = Spans::new();
        s.push_reg(5, 0, b"x");
        let (h, d) = s.take();
        assert_eq!(pump.apply(&server, &h, &d), Err(Refused::NoRegistration));
    }

    /// What a `RecvReg` received goes back before its completion.
    #[test]
    fn a_recv_into_a_registration_comes_back_before_its_completion() {
        let l = layout();
        let (host, server) = (region(l), region(l));
        let mut pump = ServerPump::new(l);
        let (copy, worker) = registration(4096);
        pump.add_registration(2, copy);
        let mut hc = HostCursor::default();
        let mut req = Request {
            user_data: 4,
            op: Op::RecvReg as u16,
            sock: 1,
            ..Default::default()
        };
        req.args[..3].copy_from_slice(&[2, 100, 50]);
        hc.submit(&host.channel(0).unwrap(), &req).unwrap();
        let (h, d) = ship_request(&host, &l).take();
        assert_eq!(pump.apply(&server, &h, &d), Ok(true));
        let ch = server.channel(0).unwrap();
        let mut sc = ServerCursor::default();
        sc.pop(&ch).unwrap().expect("taken");
        worker.apply(100, b"received").unwrap();
        let done = Completion {
            user_data: 4,
            op: Op::RecvReg as u16,
            result: 8,
            ..Default::default()
        };
        sc.complete(&ch, &done).unwrap();
        let mut out = Spans::new();
        pump.collect(&server, &mut out);
        let (h, d) = out.take();
        let got: Vec<_> = wire::spans(&h, &d).map(|s| s.unwrap()).collect();
        let reg = got
            .iter()
            .position(|(o, _)| *o == wire::REG_SPAN)
            .expect("shipped");
        assert_eq!(
            wire::reg_span(got[reg].1),
            Some((2, 100, &b"received"[..])),
            "only what was received"
        );
        let slot = (l.channel_offset(0) + l.completions_offset()) as u32;
        assert!(reg < got.iter().position(|(o, _)| *o == slot).unwrap());
    }
}
