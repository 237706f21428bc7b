//! How a socket receives, and what the host tracks of it: the receive mode
//! (told by the server at `socket`/`accept`/`listen`, or asked once with
//! `RecvBind`), O_NONBLOCK and SO_RCVTIMEO, the unanswered shutdown; and
//! the two primitives every ring operation uses: posting a `RecvKick` and
//! waiting on a ring.

use crate::client::Client;
use crate::socket::{Mode, RecvSide, Socket};
use crate::sys::{self, errno};
use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tcps_proto::eager::{
    RecvRingConsumer, END_ERROR, END_STOPPED, KIND_ACCEPT, KIND_BYTES, RECV_MODE_RING,
    SETUP_RECV_PLAIN, SETUP_RECV_RING, SETUP_SENDQ, SOL_TCPS, TCPS_EAGER_RECV,
};
use tcps_proto::Call;

/// The longest single futex sleep on a ring (server liveness checks).
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// A `struct timeval` option value as a timeout (`None`: zero, no limit).
fn timeval(v: &[u8]) -> Option<Duration> {
    let sec = i64::from_ne_bytes(v.get(0..8)?.try_into().ok()?);
    let usec = i64::from_ne_bytes(v.get(8..16)?.try_into().ok()?);
    let t = Duration::from_secs(u64::try_from(sec).ok()?)
        + Duration::from_micros(u64::try_from(usec).ok()?);
    (!t.is_zero()).then_some(t)
}

/// An SO_RCVLOWAT value as the kernel keeps it: negative is "as much as
/// possible", 0 is 1.
fn rcvlowat(v: i32) -> usize {
    if v < 0 {
        (i32::MAX / 2) as usize
    } else {
        v.clamp(1, i32::MAX / 2) as usize
    }
}

impl RecvSide {
    /// The ring is bound with this `mode`: start where the server says the
    /// host is, counting kicks from what it has seen (see
    /// [`RecvRingConsumer::start`]).
    pub(super) fn bind(&mut self, mode: Mode, ring: &RecvRingConsumer<'_>) {
        self.mode = mode;
        self.cur = ring.start();
        self.demand = false;
        self.end_reported = false;
    }
}

impl Client {
    /// The server handed out socket id `s` (`Socket`, `Accept` or an accept
    /// ring record; `setup`: `SETUP_*`): whatever the record kept of an
    /// earlier socket `s` is forgotten (its descriptor, both sides).
    pub(crate) fn new_socket_record(
        &self,
        s: u32,
        nonblocking: bool,
        setup: u32,
        rcvtimeo: Option<Duration>,
        accepted: bool,
    ) {
        let Ok(sock) = self.conn.socks.get_or_insert(s) else {
            return;
        };
        if let Some(fd) = sock.take_kfd() {
            sys::close(fd);
        }
        sock.set_nonblocking(nonblocking);
        self.sendq_new_socket(s, sock, setup & SETUP_SENDQ != 0);
        let mut g = sock.recv.lock();
        let fresh = RecvSide {
            rcvtimeo,
            accepted_open: accepted,
            ..RecvSide::default()
        };
        self.conn.socks.reset_recv(&mut g, fresh);
        if setup & SETUP_RECV_RING != 0 {
            if let Some(ring) = self.conn.recv_ring(s) {
                g.bind(Mode::Bytes, &ring);
            }
        } else if setup & SETUP_RECV_PLAIN != 0 {
            g.mode = Mode::Plain;
        }
    }

    /// A socket whose receive mode is still unknown receives by plain
    /// requests from now on (no `RecvBind`): zero-copy registered receives.
    pub(crate) fn eager_prefer_plain(&self, sock: &Socket) {
        let mut g = sock.recv.lock();
        if g.mode == Mode::Unknown {
            g.mode = Mode::Plain;
        }
    }

    /// `listen` succeeded; `aux == RECV_MODE_RING`: the accept ring is bound.
    pub(crate) fn eager_listened(&self, s: u32, aux: u64) {
        let Ok(sock) = self.conn.socks.get_or_insert(s) else {
            return;
        };
        let mut g = sock.recv.lock();
        match self.conn.recv_ring(s) {
            // listen again on a listener with its ring: nothing changes.
            Some(_) if aux == RECV_MODE_RING && g.mode == Mode::Accept => {}
            Some(ring) if aux == RECV_MODE_RING => g.bind(Mode::Accept, &ring),
            _ => g.mode = Mode::Plain,
        }
    }

    /// Whether `shutdown(s, how)` may go unanswered, noting it if so: the
    /// first SHUT_WR of a connection this library accepted, whose receive
    /// ring shows no error and on which no call failed as a reset
    /// connection does. Such a shutdown cannot fail (ENOTCONN needs a reset
    /// or closed connection, and none has been seen here), so it may take
    /// effect after the call returns. A second one, or any other, waits.
    pub(crate) fn eager_shutdown_unanswered(&self, s: u32, how: i32) -> bool {
        if how != libc::SHUT_WR {
            return false;
        }
        let Some(sock) = self.conn.socks.get(s) else {
            return false;
        };
        let mut g = sock.recv.lock();
        if !g.accepted_open || g.write_shut || g.broken || g.mode != Mode::Bytes {
            return false;
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return false;
        };
        if matches!(ring.end(), END_ERROR | END_STOPPED) {
            return false;
        }
        g.write_shut = true;
        true
    }

    /// O_NONBLOCK of `s` as this library tracks it.
    pub(crate) fn local_nonblocking(&self, s: u32) -> Option<bool> {
        self.conn.socks.get(s)?.nonblocking()
    }

    /// SO_RCVTIMEO of `s` as set through this library.
    pub(crate) fn local_rcvtimeo(&self, s: u32) -> Option<Duration> {
        self.conn.socks.get(s)?.recv.lock().rcvtimeo
    }

    /// `setsockopt` succeeded at the server: note what the host tracks.
    pub(crate) fn eager_setsockopt(&self, s: u32, level: i32, name: i32, value: &[u8]) {
        let Ok(sock) = self.conn.socks.get_or_insert(s) else {
            return;
        };
        let mut g = sock.recv.lock();
        if level == libc::SOL_SOCKET && name == libc::SO_RCVTIMEO {
            g.rcvtimeo = timeval(value);
        } else if level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT {
            // Set on the kernel socket (no ring): noted for
            // `plain_rcvlowat_wait`.
            let v = value
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_ne_bytes);
            g.rcvlowat = v.map_or(1, rcvlowat);
        } else if level == SOL_TCPS && name == TCPS_EAGER_RECV && g.mode == Mode::Plain {
            // A new policy: ask the server again at the next recv.
            g.mode = Mode::Unknown;
        }
    }

    /// SO_RCVLOWAT of a socket with a receive ring is this library's alone:
    /// the ring applies it (`recv.rs`), while the server's kernel socket
    /// keeps the default, since a mark there would hold back the readiness
    /// that drives its reading ahead. `Ok(false)`: no ring, an option as
    /// any other.
    pub(crate) fn eager_set_rcvlowat(&self, s: u32, value: &[u8]) -> io::Result<bool> {
        let sock = self.conn.socks.get_or_insert(s)?;
        if self.recv_mode(s, sock)? != Mode::Bytes {
            return Ok(false);
        }
        let v = value
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_ne_bytes);
        let v = v.ok_or(errno(libc::EINVAL))?;
        sock.recv.lock().rcvlowat = rcvlowat(v);
        Ok(true)
    }

    /// SO_RCVLOWAT of a socket with a receive ring (`None`: ask the kernel).
    pub(crate) fn eager_rcvlowat(&self, s: u32) -> Option<i32> {
        let g = self.conn.socks.get(s)?.recv.lock();
        (g.mode == Mode::Bytes).then_some(g.rcvlowat.max(1) as i32)
    }

    /// The socket's mode, asking the server once (`RecvBind`, one round
    /// trip) if it is not known.
    pub(super) fn recv_mode(&self, s: u32, sock: &Socket) -> io::Result<Mode> {
        let mode = sock.recv.lock().mode;
        if mode != Mode::Unknown {
            return Ok(mode);
        }
        let r = self.simple_call(Call::RecvBind { sock: s });
        let ring = self.conn.recv_ring(s);
        let mode = match r {
            Ok(c) if c.result as u64 == RECV_MODE_RING => match ring.map(|r| r.kind()) {
                Some(KIND_BYTES) => Mode::Bytes,
                Some(KIND_ACCEPT) => Mode::Accept,
                _ => Mode::Plain,
            },
            Ok(_) => Mode::Plain,
            // The server cannot set this socket up: remember.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                Mode::Plain
            }
            // Not now (e.g. not connected yet): a plain request this time,
            // and ask again next time.
            Err(_) => return Ok(Mode::Plain),
        };
        let mut g = sock.recv.lock();
        if g.mode == Mode::Unknown {
            match (mode, ring) {
                (Mode::Bytes | Mode::Accept, Some(ring)) => g.bind(mode, &ring),
                _ => g.mode = mode,
            }
        }
        Ok(g.mode)
    }

    /// Whether `s` is non-blocking; asks the server once if the host does
    /// not know (`F_GETFL`). The caller holds none of the record's locks.
    pub(super) fn nonblocking_of(&self, s: u32, sock: &Socket) -> io::Result<bool> {
        if let Some(nb) = sock.nonblocking() {
            return Ok(nb);
        }
        let getfl = Call::Fcntl {
            sock: s,
            cmd: libc::F_GETFL,
            arg: 0,
        };
        let fl = self.simple_call(getfl)?.result;
        Ok(sock.learn_nonblocking(fl & i64::from(libc::O_NONBLOCK) != 0))
    }

    pub(super) fn post_kick(&self, s: u32) -> io::Result<()> {
        let kicks = &self.conn.socks.recv_counters.kicks;
        kicks.fetch_add(1, Ordering::Relaxed);
        self.conn.post(Call::RecvKick { sock: s })
    }

    /// Sleeps until the ring's `tail` moves from `seen` or `end` is set, at
    /// most one slice and not past `deadline`. `Ok(false)`: the deadline
    /// passed. ECONNRESET if the server died.
    pub(super) fn wait_ring(
        &self,
        ring: &RecvRingConsumer<'_>,
        seen: u32,
        deadline: Option<Instant>,
    ) -> io::Result<bool> {
        let mut slice = WAIT_SLICE;
        if let Some(d) = deadline {
            match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => slice = slice.min(left),
                _ => return Ok(false),
            }
        }
        // Spin first (a reply on a server with cores of its own is
        // microseconds away), then sleep on the ring's futex.
        const MIN_RING_SPIN_NS: u64 = 1_000;
        let mut moved = || Ok(!ring.is_quiet(seen));
        if self
            .conn
            .spin_until(&self.conn.ring_spin_ns, MIN_RING_SPIN_NS, &mut moved)?
        {
            return Ok(true);
        }
        ring.wait(seen, slice);
        // Nothing moved (a timeout, or a spurious wake): is the server there?
        if ring.is_quiet(seen) && !self.conn.server_alive() {
            return Err(errno(libc::ECONNRESET));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eager::recv::tests::region;

    #[test]
    fn bind_starts_at_the_servers_head() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        ring.ctl().head.store(640, Ordering::Relaxed);
        ring.ctl().kicks_seen.store(3, Ordering::Relaxed);
        let mut g = RecvSide {
            end_reported: true,
            demand: true,
            ..RecvSide::default()
        };
        g.bind(Mode::Accept, &RecvRingConsumer::new(ring));
        assert_eq!(
            (g.mode, g.cur.consumed, g.cur.kicks_sent),
            (Mode::Accept, 640, 3)
        );
        assert!(!g.demand && !g.end_reported);
    }

    #[test]
    fn rcvtimeo_values() {
        let tv = |s: i64, us: i64| [s.to_ne_bytes(), us.to_ne_bytes()].concat();
        assert_eq!(timeval(&tv(1, 500_000)), Some(Duration::from_millis(1500)));
        assert_eq!(timeval(&tv(0, 0)), None);
        assert_eq!(timeval(&tv(-1, 0)), None);
        assert_eq!(timeval(&[0u8; 4]), None);
    }
}
