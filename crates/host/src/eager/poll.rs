//! poll(2) answered from the receive and accept rings, with no request,
//! when that settles the call.

use crate::client::Client;
use crate::socket::Mode;
use std::io;
use tcps_proto::eager::{ACCEPT_RECORD_SIZE, END_EOF, END_ERROR, END_STOPPED};
use tcps_proto::msg::PollEntry;

/// poll events a ring answers alone (the error and hang-up bits are always
/// reported by poll(2), so asking for them changes nothing).
const LOCAL_POLL: i16 =
    libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP;
const READABLE: i16 = libc::POLLIN | libc::POLLRDNORM;

/// revents of a poll entry on a ring: `avail` bytes (or record bytes)
/// pending, readable from `lowat` bytes on (SO_RCVLOWAT, as the kernel's
/// tcp_poll), the ring's `end`.
fn ring_revents(
    mode: Mode,
    events: i16,
    (avail, lowat): (u32, u32),
    (end, end_reported, write_shut): (u32, bool, bool),
) -> i16 {
    match mode {
        Mode::Bytes => {
            let mut r = 0;
            if avail >= lowat.max(1) {
                r |= events & READABLE;
            }
            match end {
                // The end of the stream with this side shut down for
                // writing too: both ways shut, a hang-up (tcp_poll).
                END_EOF if write_shut => r |= events & (READABLE | libc::POLLRDHUP) | libc::POLLHUP,
                END_EOF => r |= events & (READABLE | libc::POLLRDHUP),
                // An error end is a connection the kernel closed (an RST, a
                // timeout): shut down both ways, so poll reports hang-up
                // and read hang-up as the kernel's tcp_poll does, and the
                // error until a call took it.
                END_ERROR if end_reported => {
                    r |= events & (READABLE | libc::POLLRDHUP) | libc::POLLHUP
                }
                END_ERROR => {
                    r |= events & (READABLE | libc::POLLRDHUP) | libc::POLLERR | libc::POLLHUP
                }
                _ => {}
            }
            r
        }
        Mode::Accept if avail >= ACCEPT_RECORD_SIZE => events & READABLE,
        _ => 0,
    }
}

/// One entry as its ring shows it now.
enum Look {
    /// The server must answer (no ring, or a stopped one).
    Server,
    /// revents, and when the ring became non-empty (its `since`).
    Ring(i16, u32),
}

/// Whether arrival `a` is not after `b` (numbers wrap).
fn not_after(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) as i32 >= 0
}

impl Client {
    /// One entry from its ring; `kicks` gets a listener whose empty accept
    /// ring never got a kick.
    fn ring_look(&self, f: &PollEntry, kicks: &mut Vec<u32>) -> Look {
        let Some(sock) = self.conn.socks.get(f.sock) else {
            return Look::Server;
        };
        // (The send side's lock is taken and let go before the receive
        // side's: never both at once.)
        let write_shut = sock.send.lock().write_shut;
        let mut g = sock.recv.lock();
        let write_shut = write_shut || g.write_shut;
        let ring = match (g.mode, self.conn.recv_ring(f.sock)) {
            (Mode::Bytes | Mode::Accept, Some(ring)) => ring,
            _ => return Look::Server,
        };
        let avail = ring.available(ring.tail(), g.cur.consumed);
        let since = ring.since();
        let end = ring.end();
        if end == END_STOPPED && avail == 0 {
            return Look::Server; // the kernel has the rest
        }
        let empty_listener = g.mode == Mode::Accept && avail < ACCEPT_RECORD_SIZE;
        if empty_listener && f.events & READABLE != 0 && !g.demand && ring.take_kick(&mut g.cur) {
            g.demand = true;
            kicks.push(f.sock);
        }
        // SO_RCVLOWAT, kept by the library for a ring; a paused ring adds
        // nothing until bytes are consumed, so what it holds is all there
        // is (as a receive takes it), and the ring's size caps the mark.
        let lowat = if g.rcvlowat <= 1 || ring.paused() {
            1
        } else {
            (g.rcvlowat as u32).min(ring.size())
        };
        Look::Ring(
            ring_revents(
                g.mode,
                f.events,
                (avail, lowat),
                (end, g.end_reported, write_shut),
            ),
            since,
        )
    }

    /// Takes the error that ended socket `s`'s receive ring (an RST's
    /// ECONNRESET the server read ahead), if no call reported it yet: what
    /// the kernel's `sock_error` hands SO_ERROR or a send (and clears),
    /// even while bytes before it are unread. None: no such error.
    pub fn take_ring_error(&self, s: u32) -> Option<i32> {
        // One load on the common path (a send): the lock only for an end.
        let ring = self.conn.recv_ring(s)?;
        if ring.end() != END_ERROR {
            return None;
        }
        let sock = self.conn.socks.get(s)?;
        let mut g = sock.recv.lock();
        if g.mode != Mode::Bytes || g.end_reported {
            return None;
        }
        g.end_reported = true;
        let e = ring.end_errno();
        Some(if e > 0 { e } else { libc::EIO })
    }

    /// Whether socket `s`'s receive ring ended with an error that a call
    /// already reported: the kernel's error is cleared then, and POLLERR
    /// (which the server, which read it ahead, would still answer) is gone.
    pub fn ring_error_reported(&self, s: u32) -> bool {
        let Some(ring) = self.conn.recv_ring(s) else {
            return false;
        };
        ring.end() == END_ERROR
            && self.conn.socks.get(s).is_some_and(|sock| {
                let g = sock.recv.lock();
                g.mode == Mode::Bytes && g.end_reported
            })
    }

    /// poll(2) answered from the rings, with no request, when every entry
    /// asks only for readability of a socket with a ring and something is
    /// ready (or `timeout_ms == 0`). `Ok(None)`: ask the server. Either
    /// way, polled listeners whose empty accept ring never got a kick get
    /// one (the server accepts eagerly only once connections are wanted).
    ///
    /// Readiness in arrival order (`docs/PROTOCOL.md` §10): `ranks[i]` of
    /// a ready entry is its place in the order its ring became non-empty
    /// (the server numbers that). The rings are looked at one by one while
    /// the server fills them, so a second look at the entries found empty
    /// adds those that became non-empty no later than the newest one
    /// reported: the server published them first, so they are visible
    /// (acquire of the newer `tail`); newer ones wait for the next call.
    pub(crate) fn ring_poll(
        &self,
        fds: &mut [PollEntry],
        ranks: &mut [u16],
        timeout_ms: i32,
    ) -> io::Result<Option<usize>> {
        let mut answerable = !fds.is_empty() && fds.iter().all(|f| f.events & !LOCAL_POLL == 0);
        let mut kicks = Vec::new();
        let mut since = vec![0u32; fds.len()];
        let mut newest: Option<u32> = None;
        for (i, f) in fds.iter_mut().enumerate() {
            f.revents = 0;
            match self.ring_look(f, &mut kicks) {
                Look::Server => answerable = false,
                Look::Ring(r, s) => {
                    f.revents = r;
                    since[i] = s;
                    if r != 0 && newest.is_none_or(|n| not_after(n, s)) {
                        newest = Some(s);
                    }
                }
            }
        }
        if let (true, Some(newest)) = (answerable, newest) {
            for (i, f) in fds.iter_mut().enumerate() {
                if f.revents != 0 {
                    continue;
                }
                if let Look::Ring(r, s) = self.ring_look(f, &mut kicks) {
                    if r != 0 && not_after(s, newest) {
                        f.revents = r;
                        since[i] = s;
                    }
                }
            }
        }
        // Demand is signalled even by a poll answered here: a program that
        // polls with timeout 0 and accepts only what is ready would
        // otherwise never see a connection (once per listener, no wait).
        for s in kicks {
            self.post_kick(s)?;
        }
        let ready = fds.iter().filter(|f| f.revents != 0).count();
        if answerable && (ready > 0 || timeout_ms == 0) {
            let newest = newest.unwrap_or(0);
            let mut order: Vec<usize> = (0..fds.len()).filter(|&i| fds[i].revents != 0).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(newest.wrapping_sub(since[i])));
            for (rank, &i) in order.iter().enumerate() {
                ranks[i] = rank.min(u16::MAX as usize) as u16;
            }
            return Ok(Some(ready));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcps_proto::eager::END_NONE;

    #[test]
    fn arrival_numbers_compare_across_the_wrap() {
        assert!(not_after(5, 5));
        assert!(not_after(4, 5));
        assert!(!not_after(6, 5));
        assert!(not_after(u32::MAX, 2));
        assert!(!not_after(2, u32::MAX));
    }

    #[test]
    fn poll_revents_from_a_ring() {
        let (i, rd) = (libc::POLLIN, libc::POLLRDHUP);
        assert_eq!(
            ring_revents(Mode::Bytes, i, (0, 1), (END_NONE, false, false)),
            0
        );
        assert_eq!(
            ring_revents(Mode::Bytes, i, (5, 1), (END_NONE, false, false)),
            i
        );
        // SO_RCVLOWAT 10: readable only from 10 bytes on.
        assert_eq!(
            ring_revents(Mode::Bytes, i, (5, 10), (END_NONE, false, false)),
            0
        );
        assert_eq!(
            ring_revents(Mode::Bytes, i, (10, 10), (END_NONE, false, false)),
            i
        );
        assert_eq!(
            ring_revents(Mode::Bytes, i | rd, (0, 1), (END_EOF, false, false)),
            i | rd
        );
        assert_eq!(
            ring_revents(Mode::Bytes, i, (0, 1), (END_EOF, false, false)),
            i
        );
        // Shut down for writing here too: a hang-up.
        assert_eq!(
            ring_revents(Mode::Bytes, i, (0, 1), (END_EOF, false, true)),
            i | libc::POLLHUP
        );
        // An error end (an RST): hang-up both ways, the error until taken.
        let hup = libc::POLLHUP;
        assert_eq!(
            ring_revents(Mode::Bytes, i | rd, (0, 1), (END_ERROR, false, false)),
            i | rd | libc::POLLERR | hup
        );
        assert_eq!(
            ring_revents(Mode::Bytes, i, (0, 1), (END_ERROR, true, false)),
            i | hup
        );
        assert_eq!(
            ring_revents(Mode::Accept, i, (63, 1), (END_NONE, false, false)),
            0
        );
        assert_eq!(
            ring_revents(Mode::Accept, i, (64, 1), (END_NONE, false, false)),
            i
        );
        assert_eq!(
            ring_revents(Mode::Plain, i, (64, 1), (END_NONE, false, false)),
            0
        );
    }
}
