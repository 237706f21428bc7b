//! The new binary's side: a [`HostRecord`] back into a [`Host`] with its
//! sockets, rings, queues and registrations, and the server-wide counts
//! (admission) it holds. Arming the engine is the worker's
//! (`worker::pause`): the engine is new, nothing is armed or in flight.

use super::record::{own, EagerRecord, EndRecord, HostRecord, PolicyRecord, SockRecord};
use crate::calls::eager::pullbuf::{PullAccount, PullBuf, PullEnd};
use crate::calls::eager::ring::{AcceptRing, Eager, RecvRing};
use crate::config::{Config, EagerPolicy, EagerRecv};
use crate::guard::HostHeld;
use crate::host::{Admitted, Host, NewHost, QueueState, Sock};
use crate::registry::Budget;
use crate::shared::Shared;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tcps_proto::ring::ServerCursor;
use tcps_proto::Region;

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Host `r` as the old server left it; counted in `shared` (hosts,
/// per-uid hosts, connections per client address).
pub fn host(r: HostRecord, cfg: &Config, shared: &Shared) -> io::Result<Host> {
    let memfd = own(r.memfd)?;
    let size = cfg.layout.region_size() as i64;
    // SAFETY: fstat into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor we own.
    if unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&memfd), &mut st) } != 0
        || st.st_size != size
    {
        return Err(invalid(format!(
            "host {}: its region is {} bytes, this server's geometry {size}: were the options changed?",
            r.id, st.st_size
        )));
    }
    let region = Region::map(memfd.as_fd(), cfg.layout)?;
    let nh = NewHost {
        id: r.id,
        pid: r.pid,
        uid: r.uid,
        region,
        control: own(r.control)?,
        doorbell: own(r.doorbell)?,
        remote: false,
        fabric_peer: None,
        memfd: Some(memfd),
    };
    let mut h = Host::new(nh, cfg.max_pull_bytes_per_host);
    if r.cursors.len() != h.cursors.len() {
        return Err(invalid(format!("host {}: channel count differs", r.id)));
    }
    h.cursors = r
        .cursors
        .iter()
        .map(|&w| ServerCursor::from_words(w))
        .collect();
    for (slot, tx, rx) in r.bells {
        h.host_doorbell.restore(slot, own(tx)?, own(rx)?);
    }
    let unlimited = Budget {
        max_bytes: u64::MAX,
        max_count: u32::MAX,
    };
    for (handle, fd, len) in r.registrations {
        h.registry
            .register(handle, own(fd)?, len, unlimited)
            .map_err(|e| invalid(format!("registration {handle}: errno {e}")))?;
    }
    for (id, fd) in r.files {
        h.files.insert(id, Arc::new(own(fd)?));
    }
    for q in r.queues {
        if let Some(slot) = h.queues.get_mut(q.index as usize) {
            *slot = QueueState {
                owner: q.owner,
                ingested: q.ingested,
                done: q.done,
                error: q.error,
                overrun: q.overrun,
                hot: false,
                kicks: q.kicks,
                last_activity: None,
            };
            if q.owner.is_some() {
                h.bound_queues.push(q.index);
            }
        }
    }
    for s in r.sockets {
        let id = s.id;
        let (sock, paused) = sock(s, &h.pull, h.uid)?;
        if let Some(ip) = sock.admitted.addr {
            shared.conns_per_addr.take(ip, u32::MAX);
        }
        if paused {
            h.eager_paused.push(id);
        }
        if !h.sockets.insert_at(id as usize, sock) {
            return Err(invalid(format!("host {}: socket {id} twice", r.id)));
        }
    }
    // Watched at once (the host may not kick: its queue's `active` is
    // still set from the old server); they cool down as usual.
    for q in h.bound_queues.clone() {
        crate::calls::sendq::queue::make_hot(&mut h, q, std::time::Instant::now());
    }
    h.next_gen = r.next_gen;
    h.arrivals = r.arrivals;
    if r.takes_direct {
        h.balance.set_takes_direct(&cfg.balance);
    }
    shared.hosts.fetch_add(1, Ordering::AcqRel);
    let mut per_uid = shared
        .hosts_per_uid
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *per_uid.entry(h.uid).or_insert(0) += 1;
    Ok(h)
}

/// A socket; whether the sweep must look at it (paused or throttled).
fn sock(r: SockRecord, account: &PullAccount, uid: u32) -> io::Result<(Sock, bool)> {
    let mut s = Sock::new(own(r.fd)?, r.gen, r.nonblocking, uid);
    s.rcv_timeout = r.rcv_timeout_ns.map(Duration::from_nanos);
    s.snd_timeout = r.snd_timeout_ns.map(Duration::from_nanos);
    s.recv_error = r.recv_error;
    s.queue = r.queue;
    s.closing = r.closing;
    s.live_accepted = r.live_accepted;
    s.may_linger = r.may_linger;
    s.listener_lingers = r.listener_lingers;
    s.admitted = Admitted {
        listener: r.admitted_listener,
        addr: r.admitted_addr,
    };
    s.policy = policy(r.policy);
    s.host_held = r.host_held.map(|owner| HostHeld { owner });
    let (eager, paused) = eager(r.eager, account);
    s.eager = eager;
    Ok((s, paused))
}

fn policy(p: PolicyRecord) -> EagerPolicy {
    EagerPolicy {
        accept: p.accept,
        accept_size: p.accept_size,
        recv: match p.recv {
            0 => EagerRecv::Off,
            2 => EagerRecv::Pull,
            _ => EagerRecv::Push,
        },
        recv_size: p.recv_size,
        setup_with_accept: p.setup_with_accept,
        balance: p.balance,
    }
}

fn end(e: EndRecord) -> Option<PullEnd> {
    e.map(|n| {
        if n == 0 {
            PullEnd::Eof
        } else {
            PullEnd::Error(n)
        }
    })
}

fn eager(e: EagerRecord, account: &PullAccount) -> (Eager, bool) {
    match e {
        EagerRecord::None => (Eager::None, false),
        EagerRecord::Recv {
            consumed,
            tail,
            paused,
            ended,
            end: e,
            kicks,
        } => (
            Eager::Recv(RecvRing {
                consumed,
                tail,
                paused,
                ended,
                end: end(e),
                kicks,
                since: Default::default(),
            }),
            paused,
        ),
        EagerRecord::Accept {
            consumed,
            tail,
            paused,
            demanded,
            kicks,
            published,
        } => (
            Eager::Accept(AcceptRing {
                consumed,
                tail,
                paused,
                demanded,
                kicks,
                published: published.into_iter().collect(),
                ..Default::default()
            }),
            paused,
        ),
        EagerRecord::Pull {
            bytes,
            cap,
            end: e,
            throttled,
        } => {
            let mut p = PullBuf::new(cap, account.clone());
            p.hi = bytes.len();
            p.buf = bytes;
            p.end = end(e);
            p.throttled = throttled;
            p.recount();
            (Eager::Pull(p), throttled)
        }
    }
}
