//! Accept rings filled by the engine (io_uring's `IORING_OP_ACCEPT`)
//! instead of `accept4(2)` on readiness: while the host wants connections
//! (`demanded`) and the ring has room, up to [`MAX_IN_FLIGHT`] accepts wait
//! in the kernel on the listener, each with its own [`AcceptSlot`] (the
//! peer's address, then the connection), each holding one record's room
//! (so a completion always has room: the ring never overflows); a
//! completion admits and publishes its connection as `accept::accept_loop`
//! does (`take_connection`: balancing's direct handover, admission, setup
//! with accept) and submits the next. A full ring pauses as before (no
//! accept is in flight then); the host's kick resumes it. Submitted with
//! the pass's batch: no system call per connection.
//!
//! Not multishot: a multishot accept writes every connection's address
//! into the one buffer it was given (overwritten when it takes several in
//! one go), so the address would cost a getpeername(2) per connection,
//! the system call this saves. Single accepts with a slot each report the
//! address with the connection; the kernel wakes one waiting accept per
//! connection (exclusive wake-ups).
//!
//! Accepts run with the listener owner's credentials (a personality
//! registered once per owner under `guard::Guard::accept`), so connections
//! belong to the host's uid as with `accept4`. Errors are published as
//! today (`publish_error`); a connection accepted while the host is at its
//! socket quota is kept (`AcceptRing::held`), as the kernel's backlog
//! would keep it, and published first when the host asks again. Closing
//! the listener cancels its accepts (`Engine::close`); a connection an
//! accept took meanwhile is closed with its slot. Exec first *settles*
//! them ([`settle`]). Where the engine executes no accepts (epoll) the ring
//! is filled by `accept4` on readiness (`accept::fill_accept`).

use super::accept::{accept_failed, forget_taken, publish_error, publish_moved, take_connection};
use super::ring::{accept_capacity, note_paused, AcceptRing, Eager};
use crate::calls::common::{check_quota, Ctx};
use crate::config::EagerPolicy;
use crate::engine::AcceptSlot;
use crate::guard::{Guard, HostHeld};
use crate::host::Host;
use crate::sys::RawAddr;
use crate::token::{Token, MAX_SOCKETS_PER_HOST};
use std::os::fd::{AsRawFd, RawFd};
use tcps_proto::eager::{AcceptRingProducer, ACCEPT_RECORD_SIZE};

/// Most accepts in flight per listener.
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// What an accept needs of its listener.
struct Listener {
    fd: RawFd,
    gen: u16,
    policy: EagerPolicy,
    held: Option<HostHeld>,
}

/// Takes listener `lid`'s accept ring state out of its socket (put back
/// with [`put`]); `None` if it has none (or is not generation `gen`).
fn take(host: &mut Host, lid: u32, gen: Option<u16>) -> Option<(Listener, AcceptRing)> {
    let s = host.sockets.get_mut(lid as usize)?;
    if gen.is_some_and(|g| g != s.gen) || !matches!(s.eager, Eager::Accept(_)) {
        return None;
    }
    let l = Listener {
        fd: s.fd.as_raw_fd(),
        gen: s.gen,
        policy: s.policy,
        held: s.host_held,
    };
    let Eager::Accept(st) = std::mem::take(&mut s.eager) else {
        return None;
    };
    Some((l, st))
}

fn put(host: &mut Host, lid: u32, st: AcceptRing) {
    if st.paused {
        note_paused(&mut host.eager_paused, lid);
    }
    if let Some(s) = host.sockets.get_mut(lid as usize) {
        s.eager = Eager::Accept(st);
    }
}

/// The token of listener `lid`'s accept number `seq`: a `Received`, as the
/// receives that fill receive rings (`sweep::on_received` tells them apart).
fn token(hkey: usize, lid: u32, gen: u16, seq: u8) -> u64 {
    Token::Received {
        host: hkey,
        sock: lid as usize,
        gen,
        seq,
    }
    .encode()
}

/// Fills listener `lid`'s accept ring through the engine: `Some(whether
/// anything was published now)`, `None` where the engine executes no
/// accepts (fill with `accept4`).
pub(crate) fn fill(cx: &mut Ctx<'_>, host: &mut Host, lid: u32) -> Option<bool> {
    if !cx.engine.submits_ops() {
        return None;
    }
    let Some((l, mut st)) = take(host, lid, None) else {
        return Some(false);
    };
    let start = st.tail;
    let published = !st.paused && top_up(cx, host, lid, &l, &mut st, start, false);
    put(host, lid, st);
    Some(published)
}

/// Publishes held-back connections, keeps the accepts in flight up to the
/// room, quota and [`MAX_IN_FLIGHT`], pauses a full ring, and publishes
/// what was written since `start`. Whether anything was published.
fn top_up(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    l: &Listener,
    st: &mut AcceptRing,
    start: u32,
    was_empty: bool,
) -> bool {
    let region = host.region.clone();
    let Some(ring) = region.recv_ring(lid).map(AcceptRingProducer::new) else {
        return false;
    };
    let cap = accept_capacity(l.policy.accept_size, ring.size()) * ACCEPT_RECORD_SIZE;
    let (used, c) = ring.look(st.tail, st.consumed);
    st.consumed = c;
    forget_taken(st);
    let was_empty = was_empty || (used == 0 && st.tail == start);
    publish_held(cx, host, lid, l, st, cap);
    for _ in 0..2 {
        let (used, c) = ring.look(st.tail, st.consumed);
        st.consumed = c;
        if used < cap {
            if st.demanded && st.held.is_empty() {
                submit(cx, host, lid, l, st, cap - used);
            }
            break;
        }
        // Full (nothing in flight then: each kept its room): publish,
        // `paused = 1`, fence, re-read head (`AcceptRingProducer::pause`).
        let (used, c) = ring.pause(st.tail, st.consumed);
        st.consumed = c;
        forget_taken(st);
        if used >= cap {
            st.paused = true;
            break;
        }
        ring.unpause(); // the host took some meanwhile: go on
    }
    publish_moved(host, lid, st, start, was_empty)
}

/// Publishes the connections held back at the quota while there is room.
fn publish_held(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    l: &Listener,
    st: &mut AcceptRing,
    cap: u32,
) {
    while st.demanded && !st.held.is_empty() {
        let room = host
            .region
            .recv_ring(lid)
            .map(AcceptRingProducer::new)
            .is_some_and(|r| r.look(st.tail, st.consumed).0 < cap);
        if !room {
            return;
        }
        if let Err(e) = check_quota(cx.cfg, host) {
            return publish_error(host, lid, st, e);
        }
        if let Some((nfd, peer)) = st.held.pop_front() {
            take_connection(cx, host, lid, l.policy, st, nfd, &peer);
        }
    }
}

/// Submits accepts while fewer than the room (`free` bytes, less what the
/// accepts in flight keep), the host's socket quota and [`MAX_IN_FLIGHT`]
/// are in flight. At the quota with none in flight: EMFILE, as
/// `accept_loop` (the connection stays in the backlog).
fn submit(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    l: &Listener,
    st: &mut AcceptRing,
    free: u32,
) {
    let rooms = (free / ACCEPT_RECORD_SIZE) as usize;
    let limit = cx.cfg.max_sockets_per_host.min(MAX_SOCKETS_PER_HOST);
    let quota = limit.saturating_sub(host.sockets.len());
    if quota == 0 && st.inflight.is_empty() {
        let e = check_quota(cx.cfg, host).err().unwrap_or(libc::EMFILE);
        return publish_error(host, lid, st, e);
    }
    let want = rooms.min(quota).min(MAX_IN_FLIGHT);
    if st.inflight.len() >= want {
        return;
    }
    let personality = l.held.and_then(|h| {
        cx.engine.personality(h.owner).or_else(|| {
            // The accepts' credentials: the worker's while it accepts as
            // the listener's owner (registered once per owner).
            let _owner = Guard::accept(Some(h));
            cx.engine.register_personality(h.owner)
        })
    });
    let Some(sock) = host.sockets.get_mut(lid as usize) else {
        return;
    };
    while st.inflight.len() < want {
        // A number no accept in flight has (one may wait for long).
        let mut seq = sock.op_seq;
        loop {
            seq = seq.wrapping_add(1);
            if !st.inflight.iter().any(|&(s, _)| s == seq) {
                break;
            }
        }
        // A slot an earlier accept left (connection caching), else new.
        let slot = st.spare_slots.pop().unwrap_or_else(AcceptSlot::new);
        let t = token(cx.hkey, lid, l.gen, seq);
        if !cx.engine.submit_accept(l.fd, slot.clone(), personality, t) {
            return; // readiness then (the ring is armed for POLLIN)
        }
        sock.op_seq = seq;
        st.inflight.push((seq, slot));
    }
}

/// Applies accept `slot`'s completion (`res`: the descriptor, also in the
/// slot, or `-errno`): its connection published (held back at the quota),
/// or its error published while the host wants connections.
fn apply(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    l: &Listener,
    st: &mut AcceptRing,
    slot: &AcceptSlot,
    res: i32,
) {
    if let Some((nfd, storage, len)) = slot.take() {
        let peer = RawAddr { storage, len };
        if let Err(e) = check_quota(cx.cfg, host) {
            st.held.push_back((nfd, peer));
            if st.demanded {
                publish_error(host, lid, st, e);
            }
            return;
        }
        take_connection(cx, host, lid, l.policy, st, nfd, &peer);
        return;
    }
    match -res {
        // Cancelled (the listener closes, exec), or nothing after all.
        libc::ECANCELED | libc::ECONNABORTED | libc::EAGAIN | libc::EINTR => {}
        e if st.demanded && res < 0 => accept_failed(host, lid, st, e),
        _ => {}
    }
}

/// `Token::Received` on listener `lid` (generation `gen`): accept `seq`
/// completed with `res`. Published, and the next submitted. Whether
/// anything was published (parked polls look again).
pub(crate) fn on_accepted(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    gen: u16,
    seq: u8,
    res: i32,
) -> bool {
    let Some((l, mut st)) = take(host, lid, Some(gen)) else {
        return false; // the slot closes a connection nobody takes
    };
    let Some(i) = st.inflight.iter().position(|&(s, _)| s == seq) else {
        put(host, lid, st);
        return false;
    };
    let (_, slot) = st.inflight.swap_remove(i);
    let start = st.tail;
    let was_empty = host
        .region
        .recv_ring(lid)
        .is_some_and(|r| AcceptRingProducer::new(r).look(st.tail, st.consumed).0 == 0);
    apply(cx, host, lid, &l, &mut st, &slot, res);
    if st.spare_slots.len() < MAX_IN_FLIGHT {
        st.spare_slots.extend(AcceptSlot::recycle(slot));
    }
    let published = if st.paused {
        publish_moved(host, lid, &mut st, start, was_empty)
    } else {
        top_up(cx, host, lid, &l, &mut st, start, was_empty)
    };
    put(host, lid, st);
    published
}

/// Listener `lid`'s host asks for connections for the first time: those
/// already waiting in the kernel's backlog are in the ring before it is
/// answered (as `accept4` ahead would have put them there, and the
/// kernel's accept would have found them): the accepts just submitted that
/// completed at once are applied now, and those they replace.
pub(crate) fn accept_backlog(cx: &mut Ctx<'_>, host: &mut Host, lid: u32) -> bool {
    let mut published = false;
    for _ in 0..64 {
        let Some((gen, seqs)) = host.sockets.get(lid as usize).and_then(|s| match &s.eager {
            Eager::Accept(a) => Some((s.gen, a.inflight.iter().map(|x| x.0).collect::<Vec<_>>())),
            _ => None,
        }) else {
            break;
        };
        let tokens: Vec<u64> = seqs.iter().map(|&q| token(cx.hkey, lid, gen, q)).collect();
        let done = cx.engine.complete_now(&tokens);
        if done.is_empty() {
            break;
        }
        for ev in done {
            if let Some(Token::Received { seq, .. }) = Token::decode(ev.token) {
                published |= on_accepted(cx, host, lid, gen, seq, ev.res);
            }
        }
    }
    published
}

/// Settles listener `lid`'s accepts in flight before its ring is released
/// (exec): each cancelled and waited for, a connection one took published.
/// Whether any was in flight (the ring then accepts no more until it is
/// filled again).
pub(crate) fn settle(cx: &mut Ctx<'_>, host: &mut Host, lid: u32) -> bool {
    let Some((l, mut st)) = take(host, lid, None) else {
        return false;
    };
    let any = !st.inflight.is_empty();
    let start = st.tail;
    for (seq, slot) in std::mem::take(&mut st.inflight) {
        match cx.engine.settle(token(cx.hkey, lid, l.gen, seq)) {
            Some(res) => apply(cx, host, lid, &l, &mut st, &slot, res),
            None => st.inflight.push((seq, slot)), // still in flight
        }
    }
    publish_moved(host, lid, &mut st, start, false);
    put(host, lid, st);
    any
}
