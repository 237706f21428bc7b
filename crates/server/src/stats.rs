//! `tcps stat`: per-host counters and queue depths.
//!
//! Workers own their hosts, so they *publish*: every [`PUBLISH_EVERY`] (and
//! when a host is adopted) each worker copies its hosts' [`HostStats`] and
//! [`Depths`] into the server-wide [`Board`]; when a host detaches its final
//! counters move into the board's detached totals, so server totals never
//! drop. The control thread answers a [`StatQuery`] (sent instead of a
//! `Hello`) from the board with JSON text, never touching a `Host`.

use crate::host::{Host, HostStats};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tcps_proto::eager::{RecvRingProducer, ACCEPT_RECORD_SIZE, KIND_ACCEPT, KIND_BYTES};
use tcps_proto::handshake::{StatQuery, STAT_CHUNK};
use tcps_proto::{Op, VERSION};
use tracing::debug;

/// How often a worker publishes its hosts' snapshots.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// Longest time the control thread spends sending one reply.
const REPLY_BUDGET: Duration = Duration::from_secs(2);

/// What the workers' passes read of the hosts' channels (issue 15 item 2).
/// A pass reads only the channels of awake hosts: a host whose channels
/// stayed idle is dormant until it rings (`worker::scan`), so these grow
/// with the hosts at work, not with the hosts attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanCounters {
    /// Worker passes.
    pub passes: u64,
    /// Hosts whose channels a pass read, summed over passes.
    pub hosts_looked: u64,
    /// Channels a pass read (the head slot of each), summed over passes.
    pub channels_looked: u64,
    /// Backstop sweeps (every 10 ms, per worker), and the send queues they
    /// looked at (only bound ones), summed over sweeps.
    pub sweeps: u64,
    pub queues_swept: u64,
    /// Times an idle host was made dormant, and woken by its doorbell.
    pub dormant_entered: u64,
    pub dormant_woken: u64,
    /// Dormant hosts found with a request by the backstop look every
    /// 100 ms rather than by their ring (a ring still on its way, or a host
    /// that does not keep the protocol; about 0).
    pub dormant_backstop: u64,
}

impl ScanCounters {
    fn add(&mut self, o: &ScanCounters) {
        self.passes += o.passes;
        self.hosts_looked += o.hosts_looked;
        self.channels_looked += o.channels_looked;
        self.sweeps += o.sweeps;
        self.queues_swept += o.queues_swept;
        self.dormant_entered += o.dormant_entered;
        self.dormant_woken += o.dormant_woken;
        self.dormant_backstop += o.dormant_backstop;
    }

    fn to_json(self, dormant_now: u64) -> Value {
        let per_pass = |n: u64| n as f64 / self.passes.max(1) as f64;
        json!({
            "passes": self.passes,
            "hosts_looked": self.hosts_looked,
            "channels_looked": self.channels_looked,
            "hosts_per_pass": per_pass(self.hosts_looked),
            "channels_per_pass": per_pass(self.channels_looked),
            "sweeps": self.sweeps,
            "queues_swept": self.queues_swept,
            "dormant_entered": self.dormant_entered,
            "dormant_woken": self.dormant_woken,
            "dormant_backstop": self.dormant_backstop,
            "hosts_dormant": dormant_now,
        })
    }
}

/// A host's queues right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Depths {
    /// Calls parked on the host's sockets (`readers` + `writers`, not
    /// counting asynchronous send jobs: those are `send_descs_pending`).
    pub parked_calls: u64,
    /// `Poll` calls parked.
    pub parked_polls: u64,
    /// Sockets the host can name.
    pub sockets: u64,
    /// Sockets closed by the host, still sending their queued asynchronous sends.
    pub sockets_closing: u64,
    /// Bound send queues with descriptors taken and not finished.
    pub send_queues_busy: u64,
    /// Those descriptors (`ingested - done`, summed).
    pub send_descs_pending: u64,
    /// Bytes received ahead into receive rings and not yet consumed.
    pub recv_ring_bytes: u64,
    /// Connections accepted ahead into accept rings and not yet taken.
    pub accept_ring_records: u64,
    /// Bytes allocated by pull buffers (budget: `--max-pull-bytes-per-host`).
    pub pull_buffer_bytes: u64,
    /// Bytes of registered memory mapped (budget:
    /// `--max-registered-bytes-per-host`).
    pub registered_bytes: u64,
}

impl Depths {
    fn add(&mut self, o: &Depths) {
        let Depths {
            parked_calls,
            parked_polls,
            sockets,
            sockets_closing,
            send_queues_busy,
            send_descs_pending,
            recv_ring_bytes,
            accept_ring_records,
            pull_buffer_bytes,
            registered_bytes,
        } = *o;
        self.parked_calls += parked_calls;
        self.parked_polls += parked_polls;
        self.sockets += sockets;
        self.sockets_closing += sockets_closing;
        self.send_queues_busy += send_queues_busy;
        self.send_descs_pending += send_descs_pending;
        self.recv_ring_bytes += recv_ring_bytes;
        self.accept_ring_records += accept_ring_records;
        self.pull_buffer_bytes += pull_buffer_bytes;
        self.registered_bytes += registered_bytes;
    }

    fn to_json(self) -> Value {
        json!({
            "parked_calls": self.parked_calls,
            "parked_polls": self.parked_polls,
            "sockets": self.sockets,
            "sockets_closing": self.sockets_closing,
            "send_queues_busy": self.send_queues_busy,
            "send_descs_pending": self.send_descs_pending,
            "recv_ring_bytes": self.recv_ring_bytes,
            "accept_ring_records": self.accept_ring_records,
            "pull_buffer_bytes": self.pull_buffer_bytes,
            "registered_bytes": self.registered_bytes,
        })
    }
}

/// The queue depths of `host`. Ring positions are in shared memory, which
/// the host may scribble on: a ring counts only if its `owner` names the
/// socket, and its fill is clamped to the ring size.
pub fn depths(host: &Host) -> Depths {
    let mut d = Depths {
        parked_polls: host.polls.len() as u64,
        pull_buffer_bytes: host.pull.held() as u64,
        registered_bytes: host.registry.mapped(),
        ..Depths::default()
    };
    for (sid, s) in host.sockets.iter() {
        if s.closing {
            d.sockets_closing += 1;
        } else {
            d.sockets += 1;
        }
        d.parked_calls +=
            (s.readers.len() + s.writers.iter().filter(|p| p.job.is_none()).count()) as u64;
        let Ok(sid) = u32::try_from(sid) else {
            continue;
        };
        if sid >= host.layout.recv_rings {
            continue;
        }
        let Some(ring) = host.region.recv_ring(sid) else {
            continue;
        };
        let Some(snap) = RecvRingProducer::new(ring).snapshot(sid) else {
            continue;
        };
        let used = u64::from(snap.used);
        match snap.kind {
            KIND_BYTES => d.recv_ring_bytes += used,
            KIND_ACCEPT => d.accept_ring_records += used / ACCEPT_RECORD_SIZE as u64,
            _ => {}
        }
    }
    for q in host.queues.iter().filter(|q| q.owner.is_some()) {
        let pending = q.ingested.wrapping_sub(q.done).min(host.layout.sq_entries) as u64;
        if pending > 0 {
            d.send_queues_busy += 1;
            d.send_descs_pending += pending;
        }
    }
    d
}

/// What the board keeps of one attached host.
#[derive(Clone, Debug)]
pub struct HostSnapshot {
    pub id: u64,
    pub pid: u32,
    pub uid: u32,
    pub attached: SystemTime,
    pub updated: SystemTime,
    pub stats: HostStats,
    pub depths: Depths,
    pub balance: crate::balance::View,
    /// Dormant: the worker does not read its channels until it rings.
    pub dormant: bool,
    /// Attached over the fabric (its process is on another node).
    pub remote: bool,
}

/// The server-wide registry of published snapshots.
#[derive(Default)]
pub struct Board {
    inner: Mutex<BoardInner>,
}

#[derive(Default, Clone)]
struct BoardInner {
    live: HashMap<u64, HostSnapshot>,
    /// Counters of the hosts that detached, summed.
    detached: HostStats,
    detached_hosts: u64,
    /// System calls the workers made (`sys::count`; io_uring_enter once
    /// per enter), added at each publish.
    syscalls: u64,
    /// Heap allocations the workers made (`heap::take_count`), added at
    /// each publish; the publishes' own are left out.
    heap_allocations: u64,
    /// What the workers' passes read, added at each publish.
    scan: ScanCounters,
}

impl Board {
    /// Publishes snapshots of `hosts` (a worker's, every `PUBLISH_EVERY`).
    pub fn publish<'a>(&self, hosts: impl Iterator<Item = &'a Host>) {
        let allocations = crate::heap::take_count();
        let now = SystemTime::now();
        // Compute outside the lock: depths walk every socket.
        let snaps: Vec<_> = hosts
            .map(|h| {
                let who = (h.id, h.pid, h.uid, h.dormant, h.remote);
                (who, h.stats.clone(), depths(h), h.balance.view())
            })
            .collect();
        let syscalls = crate::sys::take_count();
        let Ok(mut b) = self.inner.lock() else {
            return;
        };
        b.syscalls += syscalls;
        b.heap_allocations += allocations;
        for ((id, pid, uid, dormant, remote), stats, depths, balance) in snaps {
            b.live
                .entry(id)
                .and_modify(|s| {
                    s.updated = now;
                    s.stats = stats.clone();
                    s.depths = depths;
                    s.balance = balance;
                    s.dormant = dormant;
                })
                .or_insert_with(|| HostSnapshot {
                    id,
                    pid,
                    uid,
                    attached: now,
                    updated: now,
                    stats,
                    depths,
                    balance,
                    dormant,
                    remote,
                });
        }
        drop(b);
        // The publish's own allocations are not the passes'.
        crate::heap::take_count();
    }

    /// Adds what a worker's passes read since its last call.
    pub fn add_scan(&self, c: &ScanCounters) {
        if let Ok(mut b) = self.inner.lock() {
            b.scan.add(c);
        }
    }

    /// `host` detached (or the server stops): its final counters go into
    /// the detached totals and its entry goes away.
    pub fn detach(&self, host: &Host) {
        let syscalls = crate::sys::take_count();
        let Ok(mut b) = self.inner.lock() else {
            return;
        };
        b.syscalls += syscalls;
        b.live.remove(&host.id);
        add_stats(&mut b.detached, &host.stats);
        b.detached_hosts += 1;
    }

    fn copy(&self) -> BoardInner {
        match self.inner.lock() {
            Ok(b) => b.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// `into += s`, counter by counter (no `..`: a new counter must be added here).
fn add_stats(into: &mut HostStats, s: &HostStats) {
    let HostStats {
        calls,
        parked,
        invalid,
        bytes_sent,
        bytes_received,
        refused_sockets,
        refused_conns,
        async_sends,
        async_failed,
        kicks,
        round_trips,
        accepts_eager,
        accepts_on_demand,
        accepts_direct,
        recvs_eager,
        recvs_on_demand,
        bytes_eager,
        recv_kicks,
        wakes,
        doorbell_rings,
        bell_wants,
        bells_owed: _,
    } = s;
    for (a, b) in into.calls.iter_mut().zip(calls) {
        *a += b;
    }
    into.parked += parked;
    into.invalid += invalid;
    into.bytes_sent += bytes_sent;
    into.bytes_received += bytes_received;
    into.refused_sockets += refused_sockets;
    into.refused_conns += refused_conns;
    into.async_sends += async_sends;
    into.async_failed += async_failed;
    into.kicks += kicks;
    into.round_trips += round_trips;
    into.accepts_eager += accepts_eager;
    into.accepts_on_demand += accepts_on_demand;
    into.accepts_direct += accepts_direct;
    into.recvs_eager += recvs_eager;
    into.recvs_on_demand += recvs_on_demand;
    into.bytes_eager += bytes_eager;
    into.recv_kicks += recv_kicks;
    into.wakes += wakes;
    into.doorbell_rings += doorbell_rings;
    into.bell_wants += bell_wants;
}

fn counters_json(s: &HostStats) -> Value {
    let mut calls = Map::new();
    let mut total = 0u64;
    for op in Op::ALL {
        let n = s.calls[*op as usize % 32];
        total += n;
        calls.insert(op.name().to_string(), json!(n));
    }
    json!({
        "calls": calls,
        "calls_total": total,
        "round_trips": s.round_trips,
        "wakes": s.wakes,
        "doorbell_rings": s.doorbell_rings,
        "accepts_eager": s.accepts_eager,
        "accepts_on_demand": s.accepts_on_demand,
        "accepts_direct": s.accepts_direct,
        "recvs_eager": s.recvs_eager,
        "recvs_on_demand": s.recvs_on_demand,
        "bytes_eager": s.bytes_eager,
        "bytes_sent": s.bytes_sent,
        "bytes_received": s.bytes_received,
        "refused_conns": s.refused_conns,
        "refused_sockets": s.refused_sockets,
        "async_sends": s.async_sends,
        "async_failed": s.async_failed,
        "kicks": s.kicks,
        "recv_kicks": s.recv_kicks,
        "parked": s.parked,
        "invalid": s.invalid,
    })
}

/// A host's balancing (`crate::balance`): the share of new connections
/// handed to it directly, why, and the loads it was decided from.
fn balance_json(v: &crate::balance::View) -> Value {
    json!({
        "share_pct": v.share_pct,
        "reason": v.reason.name(),
        "server_busy_pct": v.server_busy_pct,
        "host_busy_pct": v.host_busy_pct,
        "takes_direct": v.takes_direct,
        "pending_direct": v.pending,
    })
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Root and the server's own user see every host; others their own.
pub fn sees_all_hosts(uid: u32) -> bool {
    // SAFETY: geteuid cannot fail.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

/// The reply to a stat query from `uid`: every host's detail for root and
/// the server's own user, only the viewer's own hosts otherwise; totals
/// always cover every host. `attached` and `refused`: the server's host
/// counts (`Shared::stat_report` passes them).
pub fn report(board: &Board, attached: usize, refused: u64, uid: u32) -> Value {
    let sees_all = sees_all_hosts(uid);
    let b = board.copy();
    let mut live: Vec<&HostSnapshot> = b.live.values().collect();
    live.sort_by_key(|s| s.id);
    let mut total = b.detached.clone();
    let mut total_depths = Depths::default();
    let mut hosts = Vec::new();
    let mut hidden = 0u64;
    for s in &live {
        add_stats(&mut total, &s.stats);
        total_depths.add(&s.depths);
        if sees_all || s.uid == uid {
            hosts.push(json!({
                "id": s.id,
                "pid": s.pid,
                "uid": s.uid,
                "attached_unix_ms": unix_ms(s.attached),
                "updated_unix_ms": unix_ms(s.updated),
                "counters": counters_json(&s.stats),
                "depths": s.depths.to_json(),
                "balance": balance_json(&s.balance),
                "dormant": s.dormant,
                "remote": s.remote,
            }));
        } else {
            hidden += 1;
        }
    }
    json!({
        "version": VERSION,
        "now_unix_ms": unix_ms(SystemTime::now()),
        "server": {
            "pid": std::process::id(),
            "hosts_attached": attached,
            "hosts_refused": refused,
            "hosts_detached": b.detached_hosts,
            "syscalls": b.syscalls,
            "heap_allocations": b.heap_allocations,
            "scan": b.scan.to_json(live.iter().filter(|s| s.dormant).count() as u64),
        },
        "viewer": { "uid": uid, "sees_all_hosts": sees_all },
        "hosts": hosts,
        "hidden_hosts": hidden,
        "detached": {
            "hosts": b.detached_hosts,
            "counters": counters_json(&b.detached),
        },
        "total": {
            "hosts": live.len(),
            "counters": counters_json(&total),
            "depths": total_depths.to_json(),
        },
    })
}

/// Answers a stat query on control connection `fd` (peer `uid`): JSON text
/// in messages of at most `STAT_CHUNK` bytes, then an empty message. A
/// client that does not read is given up on (1 s per message, 2 s in all):
/// the control thread must keep attaching hosts. `report` makes the reply
/// (`Shared::stat_report`).
pub fn answer(fd: RawFd, uid: u32, q: StatQuery, report: impl FnOnce(u32) -> Value) {
    let _ = crate::sys::set_timeout_secs(fd, libc::SO_SNDTIMEO, 1);
    let text = if q.version == VERSION {
        report(uid).to_string()
    } else {
        json!({
            "error": format!(
                "protocol version mismatch: server v{VERSION}, tcps stat v{}",
                q.version
            ),
            "version": VERSION,
        })
        .to_string()
    };
    let start = Instant::now();
    let bytes = text.as_bytes();
    for chunk in bytes.chunks(STAT_CHUNK).chain(std::iter::once(&[][..])) {
        if start.elapsed() > REPLY_BUDGET {
            debug!(uid, "stat client too slow; reply cut short");
            return;
        }
        // SAFETY: chunk is a valid buffer of its length.
        let n = unsafe {
            libc::send(
                fd,
                chunk.as_ptr() as *const libc::c_void,
                chunk.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            debug!(uid, error = %std::io::Error::last_os_error(), "stat reply not sent");
            return;
        }
    }
    debug!(uid, bytes = bytes.len(), "stat query answered");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_keep_detached_hosts() {
        let mut a = HostStats::default();
        a.calls[Op::Send as usize] = 3;
        a.bytes_sent = 10;
        a.round_trips = 4;
        let mut t = HostStats::default();
        add_stats(&mut t, &a);
        add_stats(&mut t, &a);
        assert_eq!(t.calls[Op::Send as usize], 6);
        assert_eq!(t.bytes_sent, 20);
        assert_eq!(t.round_trips, 8);
        let v = counters_json(&t);
        assert_eq!(v["calls"]["Send"], 6);
        assert_eq!(v["calls_total"], 6);
        assert_eq!(v["calls"]["Recv"], 0);
    }

    #[test]
    fn report_of_an_empty_server() {
        let v = report(&Board::default(), 0, 0, 0);
        assert_eq!(v["hosts"].as_array().map(Vec::len), Some(0));
        assert_eq!(v["total"]["counters"]["calls_total"], 0);
        assert_eq!(v["viewer"]["sees_all_hosts"], true);
        assert_eq!(v["version"], VERSION);
    }
}
