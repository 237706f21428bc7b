//! Sockets leaving eager receive: unbinding the ring when the host closes
//! a socket, releasing it for `exec`, and what a fork snapshot takes along
//! (connections accepted ahead and never taken, bytes received and unread).

use super::pullbuf::{PullBuf, PullEnd};
use super::recv::stop_ring;
use super::ring::forget_taken;
use super::ring::Eager;
use crate::config::EagerRecv;
use crate::host::Host;
use std::collections::VecDeque;
use tcps_proto::eager::{untaken, AcceptRingProducer, RecvRingProducer, ACCEPT_RECORD_SIZE};

/// The host closes socket `sid` (or the socket goes away): its ring is
/// unbound (`owner = 0`) before its id can be reused. Returns the
/// connections an accept ring published and the host never took, (socket
/// id, generation): the caller closes them too (`close::unbind_eager`).
pub(crate) fn unbind(host: &mut Host, sid: u32) -> VecDeque<(u32, u32, u16)> {
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return VecDeque::new();
    };
    let eager = std::mem::take(&mut s.eager);
    host.eager_paused.retain(|&p| p != sid);
    let ring = host.region.recv_ring(sid);
    let orphans = match eager {
        Eager::Accept(mut a) => {
            if let Some(r) = ring {
                let (_, c) = AcceptRingProducer::new(r).look(a.tail, a.consumed);
                a.consumed = c;
                forget_taken(&mut a);
            }
            a.published
        }
        Eager::None | Eager::Pull(_) => return VecDeque::new(),
        Eager::Recv(_) => VecDeque::new(),
    };
    // Unbound (`owner = 0`), and a host thread sleeping on the ring woken
    // to see it gone.
    if let Some(r) = ring {
        let woke = RecvRingProducer::new(r).unbind();
        host.stats.count_woke(woke);
    }
    orphans
}

/// Socket ids published in accept rings and not (yet) taken by the host:
/// a fork snapshot leaves them out (the child could never name them).
pub fn untaken_ids(host: &Host) -> Vec<u32> {
    let mut ids = Vec::new();
    for (lid, s) in host.sockets.iter() {
        let Eager::Accept(a) = &s.eager else { continue };
        let Some(r) = host.region.recv_ring(lid as u32) else {
            continue;
        };
        let (_, consumed) = AcceptRingProducer::new(r).look(a.tail, a.consumed);
        for &(pos, id, gen) in &a.published {
            if untaken(pos, consumed, a.tail)
                && host.sockets.get(id as usize).is_some_and(|s| s.gen == gen)
            {
                ids.push(id);
            }
        }
    }
    ids
}

/// For `exec`: a socket whose ring or buffer holds nothing the host has not
/// read is unbound and may leave the server; otherwise false (EBUSY).
pub fn release_for_export(host: &mut Host, sid: u32) -> bool {
    let Some(s) = host.sockets.get(sid as usize) else {
        return false;
    };
    let ring = host.region.recv_ring(sid).map(RecvRingProducer::new);
    let idle = match &s.eager {
        Eager::None => return true,
        Eager::Pull(p) => p.len() == 0,
        Eager::Recv(b) => ring.is_some_and(|r| r.look(b.tail, b.consumed, 1).0 == 0),
        // Connections held back at the quota (`acceptop`) count as unread.
        Eager::Accept(a) => {
            a.held.is_empty()
                && ring.is_some_and(|r| r.look(a.tail, a.consumed, ACCEPT_RECORD_SIZE).0 == 0)
        }
    };
    if !idle {
        return false;
    }
    if let Some(s) = host.sockets.get_mut(sid as usize) {
        s.eager = Eager::None;
    }
    host.eager_paused.retain(|&p| p != sid);
    // Idle: no host thread sleeps on it (the host is about to exec).
    if let Some(r) = ring {
        r.release();
    }
    true
}

/// Bytes socket `sid` read ahead that its host has not taken, and the end
/// of stream after them: what a forked child gets with the socket.
#[derive(Debug)]
pub struct Unread {
    pub bytes: Vec<u8>,
    pub end: Option<PullEnd>,
}

/// For a fork snapshot: copies what socket `sid` read ahead and its host
/// has not taken (`None`: nothing, and no end). A receive ring is copied from
/// the server's `consumed` (clamped with the host's `head`, `RecvRingProducer::look`) to
/// `tail`, and then stops receiving ahead ([`stop_ring`]), so later bytes
/// stay in the kernel for whichever process reads them; a pull buffer is
/// copied and left as it is.
pub fn take_unread_for_fork(host: &mut Host, sid: u32) -> Option<Unread> {
    let Host {
        region, sockets, ..
    } = host;
    let s = sockets.get_mut(sid as usize)?;
    let unread = match &mut s.eager {
        Eager::None | Eager::Accept(_) => return None,
        Eager::Pull(p) => Unread {
            bytes: p.buf[p.lo..p.hi].to_vec(),
            end: p.end,
        },
        Eager::Recv(b) => {
            let mut bytes = Vec::new();
            if let Some(ring) = region.recv_ring(sid).map(RecvRingProducer::new) {
                let (used, c) = ring.look(b.tail, b.consumed, 1);
                b.consumed = c;
                bytes.resize(used as usize, 0);
                ring.read_at(c, &mut bytes);
            }
            let unread = Unread { bytes, end: b.end };
            stop_ring(host, sid);
            unread
        }
    };
    (!unread.bytes.is_empty() || unread.end.is_some()).then_some(unread)
}

/// For a forked child: socket `sid` (just inherited, nothing bound) starts
/// pulling with `unread` already in its buffer (its `Recv`s are answered
/// from there first, then from the kernel; its `RecvBind` gets
/// `RECV_MODE_PULL`). The buffer holds at least those bytes.
pub fn start_pull_with(host: &mut Host, sid: u32, unread: Unread) {
    let account = host.pull.clone();
    let Some(s) = host.socket_mut(sid) else {
        return;
    };
    s.policy.recv = EagerRecv::Pull;
    let n = unread.bytes.len();
    let mut pb = PullBuf::new((s.policy.recv_size as usize).max(n), account);
    pb.buf = unread.bytes;
    pb.hi = n;
    pb.end = unread.end;
    // Counted even beyond the budget: the bytes were read already.
    pb.recount();
    s.eager = Eager::Pull(pb);
}
