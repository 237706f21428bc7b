//! A worker's side of a hot upgrade, per host: answer what is parked,
//! let what is at the engine finish, then write the host down as a
//! [`HostRecord`] (or say why it cannot be carried).
//!
//! Order: [`answer_parked`] (polls and reading calls get `ERETRY`, which
//! the host library re-issues to the new server; a call that moved bytes
//! returns them, as an interrupted call does), then the worker runs its
//! engine until [`busy`] is false (asynchronous sends, connects
//! and shutdowns finish; a plain send that waits for room is answered
//! too), then [`settle`] (receives and accepts in flight into rings are
//! cancelled and waited for, what they got published), then [`record`].
//! On a refusal [`resume`] starts the rings again.

use super::record::{EagerRecord, HostRecord, PolicyRecord, QueueRecord, SockRecord};
use crate::calls::eager::ring::Eager;
use crate::calls::eager::{acceptop, ringop, sweep};
use crate::calls::{complete, finish, finish_poll, Ctx};
use crate::config::{EagerPolicy, EagerRecv};
use crate::host::{Host, Parked, Sock};
use std::os::fd::AsRawFd;
use tcps_proto::msg::{Call, ERETRY};
use tcps_proto::Op;

/// What an answered parked call returns: the bytes a send or receive
/// moved already, else "issue it again".
fn retry_result(p: &Parked) -> crate::calls::Res {
    match p.call {
        Call::Send { .. } | Call::Recv { .. } | Call::SendReg { .. } | Call::RecvReg { .. }
            if p.progress > 0 =>
        {
            Ok((p.progress as i64, 0))
        }
        _ => Err(ERETRY),
    }
}

/// Whether a parked writer may be answered now: a plain send (not an
/// asynchronous send's job, not a connect or shutdown, which must finish)
/// that the engine is not executing.
fn answerable_writer(p: &Parked, front_in_flight: bool, at_front: bool) -> bool {
    let plain = matches!(p.call, Call::Send { .. } | Call::SendReg { .. });
    p.job.is_none() && plain && !(at_front && front_in_flight)
}

/// Answers every poll and reading call parked at `host`, and every plain
/// send waiting for room: the host library issues them again (`ERETRY`).
pub fn answer_parked(host: &mut Host) {
    for (ch, user_data, _, _) in std::mem::take(&mut host.polls_to_start) {
        complete(host, ch, user_data, Op::Poll, Err(ERETRY));
    }
    for pkey in host.polls.keys() {
        finish_poll(host, pkey, Err(ERETRY));
    }
    for sid in host.sockets.keys() {
        let Some(s) = host.sockets.get_mut(sid) else {
            continue;
        };
        let mut answered: Vec<Parked> = s.readers.drain(..).collect();
        let in_flight = s.send_op.is_some();
        let mut kept = std::collections::VecDeque::new();
        for (i, p) in s.writers.drain(..).enumerate() {
            if answerable_writer(&p, in_flight, i == 0) {
                answered.push(p);
            } else {
                kept.push_back(p);
            }
        }
        s.writers = kept;
        for p in answered {
            let res = retry_result(&p);
            finish(host, &p, res);
        }
    }
}

/// Whether `host` still has something under way that ends by itself: a
/// socket with writers (jobs, connects, shutdowns) or an operation at the
/// engine, direct connections about to be taken, control replies about
/// to be read. The worker keeps running its engine until none has.
pub fn busy(host: &Host) -> bool {
    host.balance.view().pending > 0
        || !host.outbox.is_empty()
        || host
            .sockets
            .iter()
            .any(|(_, s)| !s.writers.is_empty() || s.send_op.is_some())
}

/// Settles the receives and accepts in flight into `host`'s rings.
pub fn settle(cx: &mut Ctx<'_>, host: &mut Host) {
    ringop::settle_all(cx, host);
    let listeners: Vec<u32> = host
        .sockets
        .iter()
        .filter(|(_, s)| matches!(s.eager, Eager::Accept(_)))
        .map(|(id, _)| id as u32)
        .collect();
    for lid in listeners {
        acceptop::settle(cx, host, lid);
    }
}

/// After a refused upgrade: every socket reads (accepts) ahead and is
/// armed again.
pub fn resume(cx: &mut Ctx<'_>, host: &mut Host) {
    for sid in host.sockets.keys() {
        sweep::advance(cx, host, sid as u32);
    }
}

/// Why `host` cannot be carried now, if it cannot.
fn refusal(host: &Host) -> Option<String> {
    if host.remote {
        return Some("a remote (fabric) host is attached".into());
    }
    if host.memfd.is_none() {
        return Some("a host's region has no memfd".into());
    }
    if !host.outbox.is_empty() {
        return Some("a host has control replies it has not read".into());
    }
    if host.balance.view().pending > 0 {
        return Some("direct connections wait to be taken".into());
    }
    if host.polls.len() > 0 || !host.polls_to_start.is_empty() {
        return Some("polls still parked".into());
    }
    for (id, s) in host.sockets.iter() {
        if !s.readers.is_empty() || !s.writers.is_empty() {
            return Some(format!("socket {id} still has calls parked"));
        }
        if s.send_op.is_some() || s.recv_op.is_some() {
            return Some(format!("socket {id} has an operation at the engine"));
        }
        if let Eager::Accept(a) = &s.eager {
            if !a.inflight.is_empty() || !a.held.is_empty() {
                return Some(format!("listener {id} has accepts in flight or held"));
            }
        }
    }
    None
}

/// `host` as a record, or why it cannot be carried.
pub fn record(host: &Host) -> Result<HostRecord, String> {
    if let Some(why) = refusal(host) {
        return Err(format!("host {} (pid {}): {why}", host.id, host.pid));
    }
    let memfd = host.memfd.as_ref().map_or(-1, |m| m.as_raw_fd());
    let queues = host.queues.iter().enumerate();
    Ok(HostRecord {
        id: host.id,
        pid: host.pid,
        uid: host.uid,
        memfd,
        control: host.control.as_raw_fd(),
        doorbell: host.doorbell.as_raw_fd(),
        cursors: host.cursors.iter().map(|c| c.to_words()).collect(),
        bells: host.host_doorbell.carried(),
        registrations: host.registry.carried(),
        files: host
            .files
            .iter()
            .map(|(&id, f)| (id, f.as_raw_fd()))
            .collect(),
        sockets: host
            .sockets
            .iter()
            .map(|(id, s)| sock_record(id as u32, s))
            .collect(),
        queues: queues
            .filter(|(_, q)| q.owner.is_some() || q.ingested != 0 || q.error != 0)
            .map(|(i, q)| QueueRecord {
                index: i as u32,
                owner: q.owner,
                ingested: q.ingested,
                done: q.done,
                error: q.error,
                overrun: q.overrun,
                kicks: q.kicks,
            })
            .collect(),
        next_gen: host.next_gen,
        arrivals: host.arrivals,
        takes_direct: host.balance.view().takes_direct,
    })
}

fn sock_record(id: u32, s: &Sock) -> SockRecord {
    SockRecord {
        id,
        gen: s.gen,
        fd: s.fd.as_raw_fd(),
        nonblocking: s.nonblocking,
        rcv_timeout_ns: s.rcv_timeout.map(|d| d.as_nanos() as u64),
        snd_timeout_ns: s.snd_timeout.map(|d| d.as_nanos() as u64),
        recv_error: s.recv_error,
        queue: s.queue,
        closing: s.closing,
        live_accepted: s.live_accepted,
        may_linger: s.may_linger,
        listener_lingers: s.listener_lingers,
        admitted_listener: s.admitted.listener,
        admitted_addr: s.admitted.addr,
        policy: policy_record(&s.policy),
        eager: eager_record(&s.eager),
        host_held: s.host_held.map(|h| h.owner),
    }
}

fn policy_record(p: &EagerPolicy) -> PolicyRecord {
    PolicyRecord {
        accept: p.accept,
        accept_size: p.accept_size,
        recv: match p.recv {
            EagerRecv::Off => 0,
            EagerRecv::Push => 1,
            EagerRecv::Pull => 2,
        },
        recv_size: p.recv_size,
        setup_with_accept: p.setup_with_accept,
        balance: p.balance,
    }
}

fn end_record(e: Option<crate::calls::eager::pullbuf::PullEnd>) -> Option<i32> {
    use crate::calls::eager::pullbuf::PullEnd;
    e.map(|e| match e {
        PullEnd::Eof => 0,
        PullEnd::Error(n) => n,
    })
}

fn eager_record(e: &Eager) -> EagerRecord {
    match e {
        Eager::None => EagerRecord::None,
        Eager::Recv(r) => EagerRecord::Recv {
            consumed: r.consumed,
            tail: r.tail,
            paused: r.paused,
            ended: r.ended,
            end: end_record(r.end),
            kicks: r.kicks,
        },
        Eager::Accept(a) => EagerRecord::Accept {
            consumed: a.consumed,
            tail: a.tail,
            paused: a.paused,
            demanded: a.demanded,
            kicks: a.kicks,
            published: a.published.iter().copied().collect(),
        },
        Eager::Pull(p) => EagerRecord::Pull {
            bytes: p.buf[p.lo..p.hi].to_vec(),
            cap: p.cap,
            end: end_record(p.end),
            throttled: p.throttled,
        },
    }
}
