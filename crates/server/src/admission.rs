//! Connection admission (thesis §7.2): limits on the connections a listener
//! accepts and on the connections one client address holds, applied at the
//! server so a refused client never reaches the host.
//!
//! Per listener: the listener's `Sock` counts its live accepted connections
//! (`--max-conns-per-listener`). Per address: one map IP → live connections
//! for the whole server, shared by every worker and host
//! (`--max-conns-per-addr`), so a client cannot get around the limit by
//! connecting to several hosts' listeners. Each accepted `Sock` remembers
//! what it counts against (`Admitted`) and gives it back when it closes.

use crate::host::{Admitted, Host};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

/// Live accepted connections per client address, server-wide.
#[derive(Default)]
pub struct AddrCounts(Mutex<HashMap<IpAddr, u32>>);

impl AddrCounts {
    /// Takes one connection for `ip` unless it already holds `limit`.
    pub fn take(&self, ip: IpAddr, limit: u32) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    pub fn give_back(&self, ip: IpAddr) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&ip);
            }
        }
    }
}

/// Gives back what a closing socket counted against.
pub fn release(host: &mut Host, addrs: &AddrCounts, a: &Admitted) {
    if let Some((lid, gen)) = a.listener {
        if let Some(l) = host.sockets.get_mut(lid as usize) {
            if l.gen == gen {
                l.live_accepted = l.live_accepted.saturating_sub(1);
            }
        }
    }
    if let Some(ip) = a.addr {
        addrs.give_back(ip);
    }
}

/// Closes a refused connection with a reset (SO_LINGER 0): the client sees
/// ECONNRESET rather than a connection that was accepted and then ended.
pub fn reset(fd: std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    // struct linger { int l_onoff; int l_linger; } = { 1, 0 }
    let mut bytes = [0u8; std::mem::size_of::<libc::linger>()];
    bytes[..4].copy_from_slice(&1i32.to_ne_bytes());
    let _ = crate::sys::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, &bytes);
    drop(fd);
}

/// Whether listener `sid` of `host` may hand a connection from `peer` (a
/// sockaddr as accept returned it) to the host; if so, what it now counts
/// against. A refusal is counted in the host's stats and logged at debug.
pub fn admit(
    cfg: &crate::config::Config,
    addrs: &AddrCounts,
    host: &mut Host,
    sid: u32,
    peer: &[u8],
) -> Option<Admitted> {
    let mut a = Admitted::default();
    let per_listener = cfg.max_conns_per_listener;
    let per_addr = cfg.max_conns_per_addr;
    if per_listener == 0 && per_addr == 0 {
        return Some(a);
    }
    let ip = tcps_proto::addr::parse(peer)
        .ok()
        .map(|sa| sa.ip().to_canonical());
    let live = host
        .sockets
        .get(sid as usize)
        .map_or(0, |l| l.live_accepted);
    let why = if per_listener > 0 && live >= per_listener {
        Some("per-listener limit reached (--max-conns-per-listener)")
    } else if per_addr > 0 && ip.is_some_and(|ip| !addrs.take(ip, per_addr)) {
        Some("per-address limit reached (--max-conns-per-addr)")
    } else {
        None
    };
    if let Some(why) = why {
        host.stats.refused_conns += 1;
        tracing::debug!(host = host.id, pid = host.pid, listener = sid, peer = ?ip, "connection reset at accept: {why}");
        return None;
    }
    if per_addr > 0 {
        a.addr = ip;
    }
    if per_listener > 0 {
        if let Some(l) = host.sockets.get_mut(sid as usize) {
            l.live_accepted += 1;
            a.listener = Some((sid, l.gen));
        }
    }
    Some(a)
}
