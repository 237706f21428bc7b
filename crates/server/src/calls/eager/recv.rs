//! Receive rings (push): binding one to a socket, receiving into it on
//! readiness, stopping it; and the POLLIN readiness of every socket that
//! receives (accepts) eagerly, which comes from its ring or buffer.

use super::pullbuf::PullEnd;
use super::ring::{note_paused, pause_threshold, Eager, RecvRing};
use crate::arrival::Arrival;
use crate::config::EagerRecv;
use crate::host::Host;
use crate::sys;
use std::os::fd::AsRawFd;
use tcps_proto::eager::{AcceptRingProducer, RecvRingProducer, KIND_BYTES};

/// Binds receive ring `sid` to socket `sid` (push). False if it has none.
pub(crate) fn bind_recv(host: &mut Host, sid: u32) -> bool {
    let Some(ring) = host.region.recv_ring(sid) else {
        return false;
    };
    let Some(s) = host.sockets.get_mut(sid as usize).filter(|s| !s.closing) else {
        return false;
    };
    RecvRingProducer::new(ring).bind(sid, KIND_BYTES);
    s.eager = Eager::Recv(RecvRing::default());
    true
}

// Both fills stop at a short read: a `recv` that returned less than it
// asked for emptied the socket's receive queue, so one more `recv` would
// only fetch EAGAIN (a system call per readiness event saved). Nothing is
// lost: the socket is re-armed, and a one-shot arm on a socket with data
// (or a FIN) already queued fires at once.

/// Most bytes read into one ring per readiness event, so one busy socket
/// cannot hold the worker (it stays armed and is served again).
pub(crate) const FILL_BUDGET_RINGS: u32 = 2;

pub(crate) fn fill_recv(host: &mut Host, sid: u32) -> bool {
    let Host {
        region,
        sockets,
        stats,
        eager_paused,
        arrivals,
        ..
    } = host;
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return false;
    };
    let fd = sock.fd.as_raw_fd();
    let Eager::Recv(st) = &mut sock.eager else {
        return false;
    };
    if st.paused || st.ended {
        return false;
    }
    let Some(ring) = region.recv_ring(sid).map(RecvRingProducer::new) else {
        return false;
    };
    let size = ring.size();
    let start = st.tail;
    let (mut used, c) = ring.look(st.tail, st.consumed, 1);
    st.consumed = c;
    let was_empty = used == 0;
    let mut end = None;
    loop {
        if st.tail.wrapping_sub(start) >= FILL_BUDGET_RINGS * size {
            break; // budget spent: the socket stays armed and comes back
        }
        let Some(free) = room_or_pause(&ring, st, &mut used, eager_paused, sid) else {
            break;
        };
        // An urgent byte that came alone is the host's `MSG_OOB` request's.
        let alone = sys::urgent_byte_alone(fd);
        if alone != Ok(false) {
            end = alone.err().map(Err);
            break;
        }
        let (p, n) = ring.span_ptr(st.tail, free);
        // SAFETY: p..p+n is the free span of this socket's ring inside the
        // mapped region (span_ptr bounds it); the host reads only
        // head..tail, and a host that writes here only corrupts its own
        // stream. No Rust reference to the span is formed.
        match unsafe { sys::recv(fd, p, n, 0) } {
            Ok(0) => {
                end = Some(Ok(()));
                break;
            }
            Ok(k) => {
                st.tail = st.tail.wrapping_add(k as u32);
                used += k as u32;
                stats.recvs_eager += 1;
                stats.bytes_eager += k as u64;
                stats.bytes_received += k as u64;
                if k < n {
                    break; // a short read: drained (see above FILL_BUDGET_RINGS)
                }
            }
            Err(libc::EINTR) => {}
            Err(libc::EAGAIN) => break,
            Err(e) => {
                end = Some(Err(e));
                break;
            }
        }
    }
    let moved = st.tail != start || end.is_some();
    publish(&ring, st, stats, arrivals, moved, was_empty, end);
    if moved && !host.accept_wakes.is_empty() {
        super::acceptwake::on_data(host, sid);
    }
    moved
}

/// The free room of ring `st` holding `used` bytes; `None` when it has
/// less than the pause threshold even after re-reading the host's `head`:
/// then it paused (publish, then `paused = 1; fence; re-read head`: the
/// lost-kick handshake, `RecvRingProducer::pause`), the host kicks.
pub(crate) fn room_or_pause(
    ring: &RecvRingProducer,
    st: &mut RecvRing,
    used: &mut u32,
    paused: &mut Vec<u32>,
    sid: u32,
) -> Option<u32> {
    let size = ring.size();
    let threshold = pause_threshold(size);
    if size - *used >= threshold {
        return Some(size - *used);
    }
    (*used, st.consumed) = ring.pause(st.tail, st.consumed, 1);
    if size - *used >= threshold {
        ring.unpause();
        return Some(size - *used);
    }
    st.paused = true;
    note_paused(paused, sid);
    None
}

/// Publishes what a fill `moved` (bytes up to `st.tail`, and `end`): an
/// end is kept, a ring that was empty is numbered readable, and `tail`
/// stored (waking a host thread that sleeps on the ring).
pub(crate) fn publish(
    ring: &RecvRingProducer,
    st: &mut RecvRing,
    stats: &mut crate::host::HostStats,
    arrivals: &mut u32,
    moved: bool,
    was_empty: bool,
    end: Option<Result<(), i32>>,
) {
    if let Some(e) = end {
        st.ended = true;
        st.end = Some(match e {
            Ok(()) => PullEnd::Eof,
            Err(e) => PullEnd::Error(e),
        });
    }
    if moved && was_empty {
        // Readable from now on: numbered in the order observed (hosts
        // report readiness in that order, `docs/PROTOCOL.md` §10).
        st.since = Arrival::next(arrivals);
        ring.stamp(st.since.seq);
    }
    if moved {
        stats.count_woke(ring.publish(st.tail, end));
    }
}

/// Stops socket `sid` receiving ahead into its receive ring (its policy
/// becomes `Off`): the bytes already in the ring stay there for the host,
/// then `END_STOPPED` (stored after the last `tail`) tells it to go on with
/// requests; the kernel keeps everything newer. A ring that already ended
/// (EOF or error published) is left as it is: the host reads the end there.
/// Used by `setsockopt(TCPS_EAGER_RECV, 0)` (before exec) and by a fork
/// snapshot.
pub(crate) fn stop_ring(host: &mut Host, sid: u32) {
    let Some(s) = host.socket_mut(sid) else {
        return;
    };
    s.policy.recv = EagerRecv::Off;
    if !matches!(&s.eager, Eager::Recv(b) if !b.ended) {
        return;
    }
    s.eager = Eager::None;
    host.eager_paused.retain(|&p| p != sid);
    if let Some(ring) = host.region.recv_ring(sid) {
        let woke = RecvRingProducer::new(ring).stop();
        host.stats.count_woke(woke);
    }
}

/// POLLIN-side readiness of a socket that reads ahead, for the events
/// `events` asked: from its ring or buffer, never from the kernel.
pub(crate) fn poll_revents(host: &Host, sid: u32, events: i16) -> i16 {
    let Some(s) = host.socket(sid) else {
        return 0;
    };
    let want_in = events & (libc::POLLIN | libc::POLLRDNORM);
    let want = want_in | (events & libc::POLLRDHUP);
    let ready = |end: Option<Result<(), i32>>, data: bool| -> i16 {
        let mut r = 0;
        if data {
            r |= want_in;
        }
        match end {
            Some(Ok(())) => r |= want_in | (want & libc::POLLRDHUP),
            // An error end: the kernel closed the connection (an RST, a
            // timeout), shut down both ways, as its tcp_poll says.
            Some(Err(_)) => r |= want | libc::POLLERR | libc::POLLHUP,
            None => {}
        }
        r
    };
    match &s.eager {
        Eager::None => 0,
        Eager::Pull(p) => ready(
            p.end.map(|e| match e {
                PullEnd::Eof => Ok(()),
                PullEnd::Error(e) => Err(e),
            }),
            p.len() > 0,
        ),
        Eager::Recv(b) => {
            let Some(r) = host.region.recv_ring(sid).map(RecvRingProducer::new) else {
                return 0;
            };
            let used = r.look(b.tail, b.consumed, 1).0;
            let end = if !b.ended {
                None
            } else {
                Some(r.end_error().map_or(Ok(()), Err))
            };
            ready(end, used > 0)
        }
        Eager::Accept(a) => {
            let Some(r) = host.region.recv_ring(sid).map(AcceptRingProducer::new) else {
                return 0;
            };
            let used = r.look(a.tail, a.consumed).0;
            ready(None, used > 0)
        }
    }
}

/// When socket `sid`, which reads ahead, last became readable as the
/// server saw it (its ring or buffer went from empty to holding data).
pub(crate) fn arrival(host: &Host, sid: u32) -> Option<Arrival> {
    match &host.socket(sid)?.eager {
        Eager::Recv(b) => Some(b.since),
        Eager::Accept(a) => Some(a.since),
        Eager::Pull(p) => Some(p.since),
        Eager::None => None,
    }
}

/// Whether socket `sid` reads ahead (its POLLIN readiness is ours).
pub(crate) fn reads_ahead(host: &Host, sid: u32) -> bool {
    host.socket(sid).is_some_and(|s| s.eager.is_active())
}

/// Whether a `Recv` must be refused (the socket's receive ring is bound: the
/// host reads the ring) or an `Accept` (its accept ring is bound).
pub(crate) fn ring_bound(host: &Host, sid: u32) -> bool {
    host.socket(sid)
        .is_some_and(|s| matches!(s.eager, Eager::Recv(_) | Eager::Accept(_)))
}

/// Whether socket `sid`'s receive ring holds bytes the host never read
/// (the host's `head`, clamped, behind the published `tail`): a close now
/// is a close with unread data, which the kernel answers with an RST.
pub(crate) fn has_unread(host: &Host, sid: u32) -> bool {
    let Some(sock) = host.sockets.get(sid as usize) else {
        return false;
    };
    let Eager::Recv(st) = &sock.eager else {
        return false;
    };
    let Some(ring) = host.region.recv_ring(sid).map(RecvRingProducer::new) else {
        return false;
    };
    ring.look(st.tail, st.consumed, 1).0 > 0
}
