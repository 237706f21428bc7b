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
/// pending, the ring's `end`.
fn ring_revents(mode: Mode, events: i16, avail: u32, end: u32, end_reported: bool) -> i16 {
    match mode {
        Mode::Bytes => {
            let mut r = 0;
            if avail > 0 {
                r |= events & READABLE;
            }
            match end {
                END_EOF => r |= events & (READABLE | libc::POLLRDHUP),
                END_ERROR if end_reported => r |= events & (READABLE | libc::POLLRDHUP),
                END_ERROR => r |= (events & READABLE) | libc::POLLERR,
                _ => {}
            }
            r
        }
        Mode::Accept if avail >= ACCEPT_RECORD_SIZE => events & READABLE,
        _ => 0,
    }
}

impl Client {
    /// poll(2) answered from the rings, with no request, when every entry
    /// asks only for readability of a socket with a ring and something is
    /// ready (or `timeout_ms == 0`). `Ok(None)`: ask the server. Either
    /// way, polled listeners whose empty accept ring never got a kick get
    /// one (the server accepts eagerly only once connections are wanted).
    pub(crate) fn ring_poll(
        &self,
        fds: &mut [PollEntry],
        timeout_ms: i32,
    ) -> io::Result<Option<usize>> {
        let local = !fds.is_empty() && fds.iter().all(|f| f.events & !LOCAL_POLL == 0);
        let mut answerable = local;
        let mut ready = 0;
        let mut kicks = Vec::new();
        for f in fds.iter_mut() {
            let Some(sock) = self.conn.socks.get(f.sock) else {
                answerable = false;
                continue;
            };
            let mut g = sock.recv.lock();
            let ring = match (g.mode, self.conn.recv_ring(f.sock)) {
                (Mode::Bytes | Mode::Accept, Some(ring)) => ring,
                _ => {
                    answerable = false;
                    continue;
                }
            };
            let avail = ring.available(ring.tail(), g.cur.consumed);
            let end = ring.end();
            if end == END_STOPPED && avail == 0 {
                // The kernel has the rest: the server answers.
                answerable = false;
            }
            f.revents = ring_revents(g.mode, f.events, avail, end, g.end_reported);
            if f.revents != 0 {
                ready += 1;
            }
            let empty_listener = g.mode == Mode::Accept && avail < ACCEPT_RECORD_SIZE;
            if empty_listener && f.events & READABLE != 0 && !g.demand && ring.take_kick(&mut g.cur)
            {
                g.demand = true;
                kicks.push(f.sock);
            }
        }
        // Demand is signalled even by a poll answered here: a program that
        // polls with timeout 0 and accepts only what is ready would
        // otherwise never see a connection (once per listener, no wait).
        for s in kicks {
            self.post_kick(s)?;
        }
        if answerable && (ready > 0 || timeout_ms == 0) {
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
    fn poll_revents_from_a_ring() {
        let (i, rd) = (libc::POLLIN, libc::POLLRDHUP);
        assert_eq!(ring_revents(Mode::Bytes, i, 0, END_NONE, false), 0);
        assert_eq!(ring_revents(Mode::Bytes, i, 5, END_NONE, false), i);
        assert_eq!(ring_revents(Mode::Bytes, i | rd, 0, END_EOF, false), i | rd);
        assert_eq!(ring_revents(Mode::Bytes, i, 0, END_EOF, false), i);
        assert_eq!(
            ring_revents(Mode::Bytes, i, 0, END_ERROR, false),
            i | libc::POLLERR
        );
        assert_eq!(ring_revents(Mode::Bytes, i, 0, END_ERROR, true), i);
        assert_eq!(ring_revents(Mode::Accept, i, 63, END_NONE, false), 0);
        assert_eq!(ring_revents(Mode::Accept, i, 64, END_NONE, false), i);
        assert_eq!(ring_revents(Mode::Plain, i, 64, END_NONE, false), 0);
    }
}
