//! Accept rings: a listener accepts ahead on readiness, admits each
//! connection, sets it up ([`setup_accepted`]) and publishes one
//! `AcceptRecord` per connection.

use super::ring::{accept_capacity, note_paused, AcceptRing, Eager};
use super::setup::setup_accepted;
use crate::arrival::Arrival;
use crate::calls::common::{check_quota, insert_accepted, Ctx};
use crate::config::EagerPolicy;
use crate::host::Host;
use crate::sys::{self, RawAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use tcps_proto::eager::{
    untaken, AcceptRecord, AcceptRingProducer, ACCEPT_ERROR, ACCEPT_RECORD_SIZE, RECV_MODE_NONE,
    RECV_MODE_RING, SETUP_DIRECT,
};
use tracing::debug;

/// Binds listener `sid`'s accept ring if its policy says so; its mode.
pub(crate) fn bind_accept(host: &mut Host, sid: u32) -> u64 {
    let Some(s) = host.socket(sid) else {
        return RECV_MODE_NONE;
    };
    if matches!(s.eager, Eager::Accept(_)) {
        return RECV_MODE_RING;
    }
    if !s.policy.accept || !matches!(s.eager, Eager::None) {
        return RECV_MODE_NONE;
    }
    let Some(ring) = host.region.recv_ring(sid) else {
        return RECV_MODE_NONE;
    };
    AcceptRingProducer::new(ring).bind(sid);
    if let Some(s) = host.socket_mut(sid) {
        s.eager = Eager::Accept(AcceptRing::default());
    }
    RECV_MODE_RING
}

/// `Op::Listen` succeeded: binds the accept ring per policy; the `aux`.
pub(crate) fn on_listen(host: &mut Host, sid: u32) -> u64 {
    bind_accept(host, sid)
}

pub(crate) fn fill_accept(cx: &mut Ctx<'_>, host: &mut Host, lid: u32) -> bool {
    let Some(l) = host.sockets.get_mut(lid as usize) else {
        return false;
    };
    let fd = l.fd.as_raw_fd();
    let policy = l.policy;
    let held = l.host_held;
    let Eager::Accept(mut st) = std::mem::take(&mut l.eager) else {
        return false;
    };
    let published = if st.demanded && !st.paused {
        // The whole batch: accept4 cannot sleep, and accepts as the
        // listener's owner (`guard`).
        let _guard = crate::guard::Guard::accept(held);
        accept_loop(cx, host, lid, fd, policy, &mut st)
    } else {
        false
    };
    if st.paused {
        note_paused(&mut host.eager_paused, lid);
    }
    if let Some(l) = host.sockets.get_mut(lid as usize) {
        l.eager = Eager::Accept(st);
    }
    published
}

pub(crate) fn accept_loop(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    fd: i32,
    policy: EagerPolicy,
    st: &mut AcceptRing,
) -> bool {
    let Some(ring) = host.region.recv_ring(lid).map(AcceptRingProducer::new) else {
        return false;
    };
    let size = ring.size();
    let cap = accept_capacity(policy.accept_size, size) * ACCEPT_RECORD_SIZE;
    let start = st.tail;
    let (mut used, c) = ring.look(st.tail, st.consumed);
    st.consumed = c;
    forget_taken(st);
    let was_empty = used == 0;
    loop {
        if used >= cap {
            // Publish, `paused = 1`, fence, re-read head (the lost-kick
            // handshake, `AcceptRingProducer::pause`).
            let Some(ring) = host.region.recv_ring(lid).map(AcceptRingProducer::new) else {
                break;
            };
            (used, st.consumed) = ring.pause(st.tail, st.consumed);
            forget_taken(st);
            if used < cap {
                ring.unpause();
                continue;
            }
            st.paused = true;
            break;
        }
        // Refuse before accepting: the connection stays in the backlog,
        // and the host's accept sees EMFILE.
        if let Err(e) = check_quota(cx.cfg, host) {
            publish_error(host, lid, st, e);
            break;
        }
        let (nfd, peer) = match sys::accept(fd) {
            Ok(v) => v,
            Err(libc::ECONNABORTED) => continue,
            Err(libc::EINTR) => {
                // The guard cut short an accept the host made blocking:
                // again at the next readiness.
                host.interrupted(fd);
                break;
            }
            Err(libc::EAGAIN) => break,
            Err(e) => {
                accept_failed(host, lid, st, e);
                break;
            }
        };
        match take_connection(cx, host, lid, policy, st, nfd, &peer) {
            Taken::One => used += ACCEPT_RECORD_SIZE,
            Taken::Refused => {}
            Taken::Stop => break,
        }
    }
    publish_moved(host, lid, st, start, was_empty)
}

/// Publishes the records written since `start` (`tail` once), stamping
/// the ring's arrival if it `was_empty`; whether there were any.
pub(crate) fn publish_moved(
    host: &mut Host,
    lid: u32,
    st: &mut AcceptRing,
    start: u32,
    was_empty: bool,
) -> bool {
    let moved = st.tail != start;
    if moved {
        if let Some(ring) = host.region.recv_ring(lid) {
            let ring = AcceptRingProducer::new(ring);
            if was_empty {
                // As for a receive ring (`fill_recv`).
                st.since = Arrival::next(&mut host.arrivals);
                ring.stamp(st.since.seq);
            }
            // One sleeping thread woken per record written since `start`.
            let records = st.tail.wrapping_sub(start) / ACCEPT_RECORD_SIZE;
            let woke = ring.publish(st.tail, records);
            host.stats.count_woke(woke);
        }
    }
    moved
}

/// What became of one connection accepted ahead.
pub(crate) enum Taken {
    /// Published in the ring.
    One,
    /// Reset by admission (or gone at once): the next one.
    Refused,
    /// An error record was published: stop accepting ahead.
    Stop,
}

/// Admits connection `nfd` from `peer` (accepted on listener `lid`),
/// inserts it, sets it up with `policy` and publishes its record at
/// `st.tail` (not yet `tail` itself: `accept_loop` publishes once).
pub(crate) fn take_connection(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    lid: u32,
    policy: EagerPolicy,
    st: &mut AcceptRing,
    nfd: OwnedFd,
    peer: &RawAddr,
) -> Taken {
    if host.balance.decide(&cx.cfg.balance, policy.balance) {
        // Balancing: the host's own kernel socket, taken over the control
        // socket (`ControlMsg::Direct`); no id, no admission count here.
        let handle = host.balance.hand_over(nfd, std::time::Instant::now());
        // Listed with the others, so closing the listener closes it if
        // the host never took it.
        st.published
            .push_back((st.tail, handle, crate::balance::DIRECT_GEN));
        publish_record(host, lid, st, handle, SETUP_DIRECT, peer);
        host.stats.accepts_direct += 1;
        return Taken::One;
    }
    let Some(admitted) = crate::admission::admit(
        cx.cfg,
        &cx.shared.conns_per_addr,
        host,
        lid,
        peer.as_bytes(),
    ) else {
        crate::admission::reset(nfd);
        return Taken::Refused;
    };
    let id = match insert_accepted(cx, host, lid, nfd, false) {
        Ok(id) => id,
        Err(e) => {
            crate::admission::release(host, &cx.shared.conns_per_addr, &admitted);
            publish_error(host, lid, st, e);
            return Taken::Stop;
        }
    };
    let gen = match host.sockets.get_mut(id as usize) {
        Some(s) => {
            s.admitted = admitted;
            s.gen
        }
        None => return Taken::Refused,
    };
    let flags = setup_accepted(cx, host, id, policy);
    st.published.push_back((st.tail, id, gen));
    publish_record(host, lid, st, id, flags, peer);
    host.stats.accepts_eager += 1;
    Taken::One
}

/// Writes connection `sock`'s record at `st.tail` and moves past it (not
/// yet `tail` itself: `accept_loop` publishes once).
fn publish_record(
    host: &mut Host,
    lid: u32,
    st: &mut AcceptRing,
    sock: u32,
    flags: u32,
    peer: &RawAddr,
) {
    let mut rec = AcceptRecord {
        sock,
        flags,
        ..AcceptRecord::default()
    };
    let a = peer.as_bytes();
    let n = a.len().min(rec.addr.len());
    rec.addr[..n].copy_from_slice(&a[..n]);
    rec.addr_len = n as u32;
    if let Some(ring) = host.region.recv_ring(lid) {
        AcceptRingProducer::new(ring).write(st.tail, &rec);
    }
    st.tail = st.tail.wrapping_add(ACCEPT_RECORD_SIZE);
}

/// An accept ahead on listener `lid` failed with `errno`: logged and
/// published (`publish_error`).
pub(crate) fn accept_failed(host: &mut Host, lid: u32, st: &mut AcceptRing, errno: i32) {
    debug!(host = host.id, listener = lid, errno, "accept ahead failed");
    publish_error(host, lid, st, errno);
}

/// Writes an error record (`ACCEPT_ERROR`, the errno in `reserved`) and
/// stops accepting ahead until the host kicks again: each host `accept`
/// while the condition lasts then sees the error once, as with the kernel,
/// and a record never goes stale by being repeated on its own.
pub(crate) fn publish_error(host: &mut Host, lid: u32, st: &mut AcceptRing, errno: i32) {
    let rec = AcceptRecord {
        sock: u32::MAX,
        flags: ACCEPT_ERROR,
        reserved: errno as u32,
        ..AcceptRecord::default()
    };
    if let Some(ring) = host.region.recv_ring(lid) {
        AcceptRingProducer::new(ring).write(st.tail, &rec);
    }
    st.tail = st.tail.wrapping_add(ACCEPT_RECORD_SIZE);
    st.demanded = false;
}

/// Drops the published connections the host has taken (below `consumed`).
pub(crate) fn forget_taken(st: &mut AcceptRing) {
    while let Some(&(pos, _, _)) = st.published.front() {
        if untaken(pos, st.consumed, st.tail) {
            break;
        }
        st.published.pop_front();
    }
}
