//! What every call module needs, below all of them: the worker's context
//! ([`Ctx`]), publishing a completion, the host's socket table (quota,
//! insertion), the channel arena, and arming a socket in the engine.

use crate::config::Config;
use crate::engine::Engine;
use crate::host::{Host, Sock};
use crate::sys;
use crate::token::{Token, GEN_MASK, MAX_SOCKETS_PER_HOST};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;
use tcps_proto::msg::ArenaRange;
use tcps_proto::ring::ServerCursor;
use tcps_proto::{Completion, Op};
use tracing::warn;

/// A call's outcome: `(result, aux)` or an errno.
pub type Res = Result<(i64, u64), i32>;

/// What a timer fires for: a parked poll (by its slab key) or a parked
/// socket call (by its socket); the timer's serial names the exact call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKey {
    Poll { pkey: usize },
    Call { sock: u32 },
}

/// Deadlines of parked calls: (when, host key, serial, what).
pub type Timers = BinaryHeap<Reverse<(Instant, usize, u64, TimerKey)>>;

/// What a call needs from the worker besides its host.
pub struct Ctx<'a> {
    pub engine: &'a mut dyn Engine,
    pub cfg: &'a Config,
    pub shared: &'a crate::shared::Shared,
    pub hkey: usize,
    pub timers: &'a mut Timers,
    pub next_serial: &'a mut u64,
}

/// Publishes a completion; a host that broke its ring is doomed.
pub fn complete(host: &mut Host, ch: u32, user_data: u64, op: Op, res: Res) {
    let (result, errno, aux) = match res {
        Ok((r, aux)) => (r, 0, aux),
        Err(e) => (-1, e, 0),
    };
    let Some(chan) = host.region.channel(ch) else {
        return;
    };
    host.stats.round_trips += 1;
    let c = Completion {
        user_data,
        op: op as u16,
        stamp: 0,
        errno,
        result,
        aux,
    };
    match host.cursors[ch as usize].complete(&chan, &c) {
        // A thread sleeps on the channel: woken once at the end of the
        // worker's pass, however many completions the pass publishes
        // there (`wake_owed`).
        Ok(true) => {
            if !host.wakes_owed.contains(&ch) {
                host.wakes_owed.push(ch);
            }
        }
        Ok(false) => {}
        Err(e) => host.doomed = Some(format!("channel {ch}: {e}")),
    }
}

/// Wakes the host threads sleeping on the channels that got completions
/// in this pass: one futex wake per channel per pass, not per completion
/// (issue 14 item 5). The handshake is whole: each `complete` stored its
/// `cq_tail`, fenced and saw `host_waiting` before this; only the wake is
/// later (by the rest of the pass).
pub fn wake_owed(host: &mut Host) {
    // By index, then cleared: the list keeps its room (no allocation at
    // the next pass's first completion).
    for i in 0..host.wakes_owed.len() {
        if let Some(chan) = host.region.channel(host.wakes_owed[i]) {
            host.stats.wakes += 1;
            // Deferred on the worker's thread: the engine makes it (and
            // counts a system call if it is one).
            ServerCursor::wake_host(&chan);
        }
    }
    host.wakes_owed.clear();
}

/// Admission control per host: EMFILE once the host holds its quota of sockets.
pub(crate) fn check_quota(cfg: &Config, host: &mut Host) -> Result<(), i32> {
    if let Err(budget) = crate::fdbudget::room(host.uid) {
        host.stats.refused_sockets += 1;
        if host.note_budget_refusal() {
            warn!(
                host = host.id,
                pid = host.pid,
                uid = host.uid,
                refusals = host.budget_refusals,
                "socket refused: at {budget}"
            );
        }
        return Err(libc::EMFILE);
    }
    if host.sockets.len() >= cfg.max_sockets_per_host.min(MAX_SOCKETS_PER_HOST) {
        host.stats.refused_sockets += 1;
        warn!(
            host = host.id,
            pid = host.pid,
            limit = cfg.max_sockets_per_host,
            "socket refused: per-host quota reached (--max-sockets-per-host)"
        );
        return Err(libc::EMFILE);
    }
    Ok(())
}

/// Inserts a connection accepted on `listener`: its close checks SO_LINGER
/// only if the listener's (which it inherited) was on, looked up once per
/// listener, not per connection.
pub(crate) fn insert_accepted(
    cx: &Ctx<'_>,
    host: &mut Host,
    listener: u32,
    fd: OwnedFd,
    nonblocking: bool,
) -> Result<u32, i32> {
    let lingers = match host.sockets.get_mut(listener as usize) {
        Some(l) => *l
            .listener_lingers
            .get_or_insert_with(|| sys::lingers(l.fd.as_raw_fd())),
        None => true,
    };
    let id = insert_socket(cx.cfg, host, fd, nonblocking)?;
    if let Some(s) = host.sockets.get_mut(id as usize) {
        s.may_linger = lingers;
    }
    Ok(id)
}

/// Gives a kernel socket an id in the host's table (EMFILE at its quota).
pub(crate) fn insert_socket(
    cfg: &Config,
    host: &mut Host,
    fd: OwnedFd,
    nonblocking: bool,
) -> Result<u32, i32> {
    check_quota(cfg, host)?;
    host.next_gen = host.next_gen.wrapping_add(1) & GEN_MASK;
    let mut sock = Sock::new(fd, host.next_gen, nonblocking, host.uid);
    if let Some((readers, writers)) = host.spare_queues.pop() {
        // A closed socket's queues, with their room (connection caching).
        (sock.readers, sock.writers) = (readers, writers);
    }
    let id = host.sockets.insert(sock);
    if let Some(s) = host.sockets.get_mut(id) {
        s.policy = cfg.eager;
    }
    Ok(id as u32)
}

pub(crate) fn arena_bytes(host: &Host, ch: u32, r: ArenaRange) -> Vec<u8> {
    let mut b = vec![0u8; r.len as usize];
    if let Some(c) = host.region.channel(ch) {
        c.copy_from_arena(r.off, &mut b);
    }
    b
}

/// Writes `bytes` (truncated to the range) into the arena; returns the full length.
pub(crate) fn write_arena(host: &Host, ch: u32, r: ArenaRange, bytes: &[u8]) -> u64 {
    let n = bytes.len().min(r.len as usize);
    if let Some(c) = host.region.channel(ch) {
        c.copy_to_arena(r.off, &bytes[..n]);
    }
    bytes.len() as u64
}

/// Tells the host's waiting thread that its call is parked (it stops spinning).
pub(crate) fn announce_parked(host: &Host, ch: u32, user_data: u64) {
    if let Some(c) = host.region.channel(ch) {
        host.cursors[ch as usize].mark_parked(&c, user_data);
    }
}

/// Arms the socket for what its parked calls wait on, unless already armed.
pub(crate) fn rearm(engine: &mut dyn Engine, hkey: usize, sid: u32, sock: &mut Sock) {
    let mut want = sock.wanted_mask();
    if want & libc::POLLPRI as u32 != 0 && engine.urgent_needs_pollin() {
        // A readable socket then fires without answering a POLLPRI poll:
        // `on_socket_ready` re-arms such a socket only every sweep.
        want |= libc::POLLIN as u32;
    }
    if want == 0 || sock.armed_mask & want == want {
        return;
    }
    let mask = want | sock.armed_mask;
    sock.arm_seq = sock.arm_seq.wrapping_add(1);
    let token = Token::Socket {
        host: hkey,
        sock: sid as usize,
        gen: sock.gen,
        seq: sock.arm_seq,
    };
    match engine.arm(sock.fd.as_raw_fd(), token.encode(), mask) {
        Ok(()) => sock.armed_mask = mask,
        Err(e) => warn!(error = %e, "engine could not arm a socket"),
    }
}
