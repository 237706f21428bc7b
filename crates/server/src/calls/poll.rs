//! `Poll`: readiness over many sockets, like poll(2). Evaluated at once with
//! one poll(2) over the kernel descriptors; if nothing is ready and the
//! timeout allows, the call is parked on every socket of its set and
//! re-evaluated when any of them reports readiness, or when its deadline
//! (a worker timer) expires.
//!
//! Parked polls are budgeted per host: each holds its socket list and one
//! `pollers` entry per poll entry, and a host may park one per channel
//! slot (channels x ring entries, 16,384 by default) of up to 4,096
//! entries each — about 1.3 GB of server memory. So the entries of a
//! host's parked polls are at most [`MAX_PARKED_POLL_ENTRIES_PER_HOST`]; a
//! poll that would park beyond it fails with ENOMEM (poll(2)'s errno when
//! the kernel cannot hold the poll set).

use super::common::{
    announce_parked, arena_bytes, complete, rearm, write_arena, Ctx, Res, TimerKey,
};
use super::eager::recv;
use super::eager::ring::Eager;
use crate::arrival::Arrival;
use crate::host::{Host, ParkedPoll};
use crate::sys;
use std::cmp::Reverse;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tcps_proto::msg::{ArenaRange, PollEntry};
use tcps_proto::Op;

/// Entries of a host's parked polls at once (about 1.3 MB of server
/// memory): 16 polls of the largest size, or thousands of small ones.
pub const MAX_PARKED_POLL_ENTRIES_PER_HOST: usize = 65536;

/// Poll entries in an arena range (each 8 bytes; `Call::decode` checked
/// that the range holds exactly the count).
pub(crate) fn entry_count(r: ArenaRange) -> usize {
    r.len as usize / 8
}

pub(crate) fn read_entries(host: &Host, ch: u32, r: ArenaRange) -> Vec<PollEntry> {
    arena_bytes(host, ch, r)
        .chunks_exact(8)
        .map(|c| PollEntry {
            sock: u32::from_ne_bytes([c[0], c[1], c[2], c[3]]),
            events: i16::from_ne_bytes([c[4], c[5]]),
            revents: 0,
        })
        .collect()
}

/// Polls the sockets of a poll set once; writes revents back to the arena.
/// Returns how many entries are ready.
pub(crate) fn evaluate_poll(
    host: &mut Host,
    ch: u32,
    r: ArenaRange,
) -> Result<(usize, Vec<PollEntry>), i32> {
    let mut entries = read_entries(host, ch, r);
    let mut pfds = Vec::with_capacity(entries.len());
    let mut idx = Vec::with_capacity(entries.len());
    // Sockets that read (accept) ahead: the server took the kernel's
    // readability, so POLLIN comes from their ring or buffer.
    const READ_SIDE: i16 = libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP;
    for (i, e) in entries.iter_mut().enumerate() {
        match host.socket(e.sock) {
            Some(s) => {
                let events = if s.eager.is_active() {
                    e.events & !READ_SIDE
                } else {
                    e.events
                };
                pfds.push(libc::pollfd {
                    fd: s.fd.as_raw_fd(),
                    events,
                    revents: 0,
                });
                idx.push(i);
            }
            None => e.revents = libc::POLLNVAL,
        }
    }
    if !pfds.is_empty() {
        sys::poll_now(&mut pfds)?;
    }
    for (pfd, &i) in pfds.iter().zip(&idx) {
        let e = &mut entries[i];
        e.revents = pfd.revents;
        if recv::reads_ahead(host, e.sock) {
            e.revents |= recv::poll_revents(host, e.sock, e.events);
        }
    }
    stamp_untimed(host, &entries);
    let ready = entries.iter().filter(|e| e.revents != 0).count();
    let ranks = arrival_ranks(host, &entries, ready);
    let mut out = Vec::with_capacity(entries.len() * 8);
    for (e, rank) in entries.iter().zip(&ranks) {
        out.extend_from_slice(&e.sock.to_ne_bytes());
        // A ready entry's `events` slot carries its arrival rank.
        let slot = if e.revents != 0 { *rank } else { e.events };
        out.extend_from_slice(&slot.to_ne_bytes());
        out.extend_from_slice(&e.revents.to_ne_bytes());
    }
    write_arena(host, ch, r, &out);
    Ok((ready, entries))
}

/// Numbers the first look that finds a socket readable when it keeps no
/// arrival time of its own (a listener without an accept ring: a forked
/// worker's inherited listener before its first accept), so it is ranked
/// after what the server saw arrive before it. Unranked, it came first,
/// and an nginx worker accepted a later connection on such a listener
/// before an earlier one queued in another listener's accept ring.
fn stamp_untimed(host: &mut Host, entries: &[PollEntry]) {
    for e in entries.iter().filter(|e| e.events & IN != 0) {
        let counter = &mut host.arrivals;
        let Some(s) = host.sockets.get_mut(e.sock as usize).filter(|s| !s.closing) else {
            continue;
        };
        if !matches!(s.eager, Eager::None) || e.revents & IN == 0 {
            s.ready_since = None;
        } else if s.ready_since.is_none() {
            s.ready_since = Some(Arrival::next(counter));
        }
    }
}

/// Readiness that an arrival makes.
const IN: i16 = libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP | libc::POLLHUP;

/// The order in which the ready entries became readable, as ranks (0:
/// first; written in the `events` slot of each ready entry so the host
/// reports readiness in arrival order, `docs/PROTOCOL.md` §10). Sockets
/// that read ahead: when their ring or buffer became non-empty, numbered
/// in the order the server observed it; others: the kernel's receive
/// timestamp of their first unread byte, else when a poll first found
/// them readable (`stamp_untimed`). Entries ready only for writing (or
/// with nothing to time) come first, in their order.
fn arrival_ranks(host: &Host, entries: &[PollEntry], ready: usize) -> Vec<i16> {
    let mut ranks = vec![0i16; entries.len()];
    if ready < 2 {
        return ranks;
    }
    let keys: Vec<Option<Arrival>> = entries
        .iter()
        .map(|e| {
            if e.revents & IN == 0 {
                return None;
            }
            if let Some(a) = recv::arrival(host, e.sock) {
                return Some(a);
            }
            let s = host.socket(e.sock)?;
            sys::arrival_ns(s.fd.as_raw_fd())
                .map(|ns| Arrival { seq: 0, ns })
                .or(s.ready_since)
        })
        .collect();
    // Numbers when every timed entry reads ahead (exact, one counter),
    // else the clock (the kernel's stamps and the server's).
    let by_seq = keys.iter().flatten().all(|a| a.seq != 0);
    let newest = host.arrivals;
    let mut order: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].revents != 0)
        .collect();
    order.sort_by_key(|&i| match keys[i] {
        None => (0, 0),
        Some(a) if by_seq => (1, u64::from(u32::MAX - newest.wrapping_sub(a.seq))),
        Some(a) => (1, a.ns),
    });
    for (rank, &i) in order.iter().enumerate() {
        ranks[i] = rank.min(i16::MAX as usize) as i16;
    }
    ranks
}

pub(crate) fn start(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    r: ArenaRange,
    timeout_ms: i64,
) {
    let (ready, entries) = match evaluate_poll(host, ch, r) {
        Ok(v) => v,
        Err(e) => return complete(host, ch, user_data, Op::Poll, Err(e)),
    };
    if ready > 0 || timeout_ms == 0 {
        return complete(host, ch, user_data, Op::Poll, Ok((ready as i64, 0)));
    }
    let parked = host.poll_entries_parked + entry_count(r);
    if parked > MAX_PARKED_POLL_ENTRIES_PER_HOST {
        tracing::debug!(
            host = host.id,
            parked,
            "poll refused: parked poll entries at the budget"
        );
        return complete(host, ch, user_data, Op::Poll, Err(libc::ENOMEM));
    }
    host.poll_entries_parked = parked;
    *cx.next_serial += 1;
    let serial = *cx.next_serial;
    // Negative: forever; a deadline past what an Instant holds, too.
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)));
    let mut socks: Vec<u32> = entries.iter().map(|e| e.sock).collect();
    socks.sort_unstable();
    socks.dedup();
    let pkey = host.polls.insert(ParkedPoll {
        ch,
        user_data,
        entries: r,
        socks: socks.clone(),
        serial,
    });
    if let Some(d) = deadline {
        cx.timers
            .push(Reverse((d, cx.hkey, serial, TimerKey::Poll { pkey })));
    }
    host.stats.parked += 1;
    announce_parked(host, ch, user_data);
    let hkey = cx.hkey;
    // One poller per socket and poll, however many entries name it.
    for e in &entries {
        if let Some(sock) = host.socket_mut(e.sock) {
            match sock.pollers.iter_mut().find(|(k, _)| *k == pkey) {
                Some((_, events)) => *events |= e.events,
                None => sock.pollers.push((pkey, e.events)),
            }
        }
    }
    for sid in socks {
        if let Some(sock) = host.socket_mut(sid) {
            rearm(cx.engine, hkey, sid, sock);
        }
    }
}

pub(crate) fn finish_poll(host: &mut Host, pkey: usize, res: Res) {
    let Some(p) = host.polls.remove(pkey) else {
        return;
    };
    host.poll_entries_parked = host
        .poll_entries_parked
        .saturating_sub(entry_count(p.entries));
    for sid in &p.socks {
        if let Some(s) = host.socket_mut(*sid) {
            s.pollers.retain(|(k, _)| *k != pkey);
        }
    }
    complete(host, p.ch, p.user_data, Op::Poll, res);
}

pub(crate) fn recheck(host: &mut Host, pkey: usize) {
    let Some(p) = host.polls.get(pkey) else {
        return;
    };
    let (ch, r) = (p.ch, p.entries);
    match evaluate_poll(host, ch, r) {
        Ok((0, _)) => {}
        Ok((ready, _)) => finish_poll(host, pkey, Ok((ready as i64, 0))),
        Err(e) => finish_poll(host, pkey, Err(e)),
    }
}

/// A parked poll's timeout expired.
pub(crate) fn on_poll_timeout(host: &mut Host, pkey: usize, serial: u64) {
    let Some(p) = host.polls.get(pkey) else {
        return;
    };
    if p.serial != serial {
        return;
    }
    let (ch, r) = (p.ch, p.entries);
    let res = evaluate_poll(host, ch, r).map(|(ready, _)| (ready as i64, 0));
    finish_poll(host, pkey, res);
}
