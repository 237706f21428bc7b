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
//! Registered memory (the library's memfds, mapped here as `RegCopy`s
//! when the helper forwards their `Register`): the bytes a new send-queue
//! descriptor or a `SendReg` request names go out as registration spans
//! in the same batch, before the descriptor (and `head`) or the request,
//! so the server sends from its copy what the host queued; what a
//! `RecvReg` received comes back the same way before its completion.
//!
//! `server_sleeping` in the host's copy is the pump's, not the server's:
//! it stays non-zero, so every request the library posts rings the
//! doorbell eventfd the pump sleeps on (one write per post; the pump could
//! clear it while it spins, as the server does).

use tcps_fabric::wire::{self, Spans};
use tcps_proto::layout::Layout;
use tcps_proto::mirror::{zone, Kind, RegCopy, SpanRefused, Writer};
use tcps_proto::msg::{Op, Request};
use tcps_proto::ready_log::READY_LOG_OFFSET;
use tcps_proto::region::{stamp, Region};
use tcps_proto::ring::{HostCursor, ServerCursor};
use tcps_proto::sendq::{DESC_FILE, MAX_REGISTRATIONS};
use tcps_proto::wake::Woke;
use tcps_proto::watch::Watch;

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
    /// The rings and queues the server has bound (a pass looks at these
    /// only: the host writes nowhere else), from their line 2.
    bound_rings: Watch,
    bound_queues: Watch,
    /// The library's registrations, by handle.
    regs: Vec<Option<RegCopy>>,
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
            bound_rings: Watch::new(layout.recv_rings as usize),
            bound_queues: Watch::new(layout.send_queues as usize),
            regs: Vec::new(),
        }
    }

    /// Registration `handle` (the library's memfd, mapped), once the
    /// server took it.
    pub fn add_registration(&mut self, handle: u32, copy: RegCopy) {
        let h = handle as usize;
        if handle >= MAX_REGISTRATIONS {
            return;
        }
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

    /// Marks the copy as the pump's: `server_sleeping` set, so posts ring
    /// the pump's doorbell.
    pub fn init(region: &Region) {
        let _ = region.apply_span(Writer::Server, SERVER_WORDS, &1u32.to_le_bytes());
    }

    /// Gathers the host's new writes into `out`.
    pub fn collect(&mut self, region: &Region, out: &mut Spans) {
        let mut used = [0u8; 4];
        if region.read_span(CHANNELS_USED, &mut used).is_ok() && used != self.used {
            self.used = used;
            out.push(CHANNELS_USED as u32, &used);
        }
        // The requests are read first and shipped last: the library stores
        // a ring's or queue's `head` before it posts a request that relies
        // on it (a kick; a close, which the server runs after every
        // descriptor up to the `head` it sees), so the heads read after the
        // requests are at least that new, and applied before them. (Read
        // the other way round, a descriptor and a close published between
        // the two reads crossed as the close without its descriptor, and
        // the server closed before sending it.)
        let mut requests = Spans::new();
        self.collect_requests(region, u32::from_le_bytes(used), &mut requests);
        self.collect_heads(region, out);
        self.collect_queues(region, out);
        out.append(&mut requests);
    }

    /// The channels' new requests (each after the bytes it names), then
    /// each channel's line 0.
    fn collect_requests(&mut self, region: &Region, used: u32, out: &mut Spans) {
        let l = self.layout;
        let n = used.min(l.n_channels);
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
                let r = Request::from_slot(&b);
                if Op::from_u16(r.op) == Some(Op::SendReg) {
                    ship_reg(
                        &self.regs,
                        r.args[0] as u32,
                        r.args[1],
                        r.args[2] as usize,
                        out,
                    );
                }
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
        for &r in self.bound_rings.members() {
            let shipped = &mut self.heads[r as usize];
            let at = self.layout.recv_ring_offset(r);
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
        for &q in self.bound_queues.members() {
            let shipped = &mut self.sq_heads[q as usize];
            let base = l.send_queue_offset(q);
            let mut w = [0u8; 4];
            if region.read_span(base, &mut w).is_err() {
                continue;
            }
            let head = u32::from_le_bytes(w);
            if head == *shipped {
                continue;
            }
            // A queue bound anew starts again at 0 (the library's
            // `reset_head`): only its new descriptors go.
            let n = match head.wrapping_sub(*shipped) {
                n if n > e => head.min(e),
                n => n,
            };
            for seq in head.wrapping_sub(n)..head.wrapping_sub(n).wrapping_add(n) {
                let at = base + 192 + 32 * (seq % e) as usize;
                let mut d = [0u8; 32];
                if region.read_span(at, &mut d).is_ok() {
                    if let Some((mem, off, len)) = desc_range(&d) {
                        ship_reg(&self.regs, mem, off, len, out);
                    }
                    out.push(at as u32, &d);
                }
            }
            out.push(base as u32, &w);
            *shipped = head;
        }
    }

    /// Applies one server span; a ring's or queue's line 2 among them
    /// updates what is bound (the rings and queues a pass looks at) and,
    /// bound anew, restarts the host's `head` there at 0.
    fn apply_server_span(
        &mut self,
        region: &Region,
        off: usize,
        bytes: &[u8],
    ) -> Result<(), Refused> {
        let ring = self.ring_line2(off);
        let queue = self.queue_line2(off);
        // `owner` and `binds`: either changed, the ring was bound anew.
        let mut was = [0u8; 16];
        if ring.is_some() || queue.is_some() {
            let _ = region.read_span(off, &mut was);
        }
        region
            .apply_span(Writer::Server, off, bytes)
            .map_err(Refused::Span)?;
        // Ring line 2: `owner` then `binds` at 12; queue line 2: `owner`
        // at 8, `binds` at 12.
        let owner_at = if queue.is_some() { 8 } else { 0 };
        let rebound = bytes.get(owner_at..owner_at + 4) != Some(&was[owner_at..owner_at + 4])
            || bytes.get(12..16).is_some_and(|b| b != &was[12..16]);
        let owner_now = |at: usize| {
            let mut w = [0u8; 4];
            region.read_span(at, &mut w).is_ok() && w != [0; 4]
        };
        if let Some(q) = queue {
            match owner_now(off + 8) {
                true => self.bound_queues.touch(q as u32, 1),
                false => self.bound_queues.remove(q as u32),
            }
        }
        if let Some(r) = ring {
            match owner_now(off) {
                true => self.bound_rings.touch(r as u32, 1),
                false => self.bound_rings.remove(r as u32),
            }
        }
        if let Some(q) = queue.filter(|_| rebound) {
            // Bound anew (the server's bind stored head = 0 in its
            // copy): the queue restarts at 0 here too, before the
            // library hears of the binding (it comes later in order).
            let at = self.layout.send_queue_offset(q as u32);
            let _ = region.apply_span(Writer::Host, at, &[0; 4]);
            self.sq_heads[q] = 0;
        }
        if let Some(r) = ring.filter(|_| rebound) {
            // Bound anew: the server's bind stored head = 0 in its copy;
            // head is the host's to write here.
            let at = self.layout.recv_ring_offset(r as u32);
            let _ = region.apply_span(Writer::Host, at, &[0; 4]);
            self.heads[r] = [0; 4];
        }
        Ok(())
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

    /// The channel whose line 2 (`req_head`, `cq_tail`) starts at `off`.
    fn channel_line2(&self, off: usize) -> Option<u32> {
        let l = &self.layout;
        let c = off.checked_sub(l.channel_offset(0))? / l.channel_stride();
        (c < l.n_channels as usize && off == l.channel_offset(c as u32) + 128).then_some(c as u32)
    }

    /// The send queue whose line 2 (`active`…) starts at `off`, if any.
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
        let mut rooms = Vec::new();
        let (mut rings, mut queues, mut log) = (Vec::new(), Vec::new(), false);
        for span in wire::spans(header, data) {
            let (off, bytes) = span.map_err(|_| Refused::Malformed)?;
            if off == wire::REG_SPAN {
                // What a `RecvReg` received; a registration the library
                // dropped meanwhile takes nothing.
                let (handle, at, data) = wire::reg_span(bytes).ok_or(Refused::Malformed)?;
                if let Some(copy) = self.regs.get(handle as usize).and_then(Option::as_ref) {
                    copy.apply(at, data).map_err(Refused::Span)?;
                }
                continue;
            }
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
            self.apply_server_span(region, off, bytes)?;
            let z = zone(&l, off).filter(|z| z.kind == Kind::Slots(32));
            if let Some(z) = z {
                let c = ((z.start - l.channel_offset(0)) / l.channel_stride()) as u32;
                if !woken.contains(&c) {
                    woken.push(c);
                }
            }
            // A channel's line 2 (`req_head` moved): its room waiters.
            rooms.extend(self.channel_line2(off));
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
        for c in rooms {
            if let Some(ch) = region.channel(c).filter(ServerCursor::room_wanted) {
                ServerCursor::wake_room(&ch);
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

/// Ships `len` bytes at `off` of registration `handle` (none if it is
/// unknown or the range is outside it: the server then fails the send).
fn ship_reg(regs: &[Option<RegCopy>], handle: u32, off: u64, len: usize, out: &mut Spans) {
    let Some(copy) = regs.get(handle as usize).and_then(Option::as_ref) else {
        return;
    };
    if len == 0 || len > copy.len() {
        return;
    }
    let mut bytes = vec![0u8; len];
    if copy.read(off, &mut bytes).is_ok() {
        out.push_reg(handle, off, &bytes);
    }
}

/// The registration range a send-queue descriptor (32 bytes) sends from:
/// `(mem, off, len)`, none for a file range.
fn desc_range(d: &[u8; 32]) -> Option<(u32, u64, usize)> {
    let off = u64::from_le_bytes(d[..8].try_into().ok()?);
    let len = u32::from_le_bytes(d[8..12].try_into().ok()?);
    let mem = u16::from_le_bytes([d[12], d[13]]);
    let flags = u16::from_le_bytes([d[14], d[15]]);
    (flags & DESC_FILE == 0).then_some((u32::from(mem), off, len as usize))
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
#[path = "pump_tests.rs"]
mod tests;
