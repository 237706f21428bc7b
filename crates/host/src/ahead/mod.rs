//! Process-ahead on the host (`docs/PROTOCOL.md` §10): receiving from a
//! socket's receive ring and accepting from a listener's accept ring with
//! no request, and the per-socket state that goes with it.
//!
//! Every socket id `s` the host knows has a [`RecvState`] in a two-level
//! table (`crate::table`), behind a spin lock of its own (separate from the
//! asynchronous-send state, so a receiving thread and a sending thread of
//! one connection do not contend):
//!
//! * **mode**: `Unknown` until the server said how the socket receives:
//!   at accept (`SETUP_RECV_RING`), at `listen` (`aux == RECV_MODE_RING`),
//!   or by `RecvBind` on the first `recv`/`accept` (sockets inherited over
//!   fork, connected sockets). `Plain` sockets (mode none or pull) use
//!   ordinary requests; `Bytes` and `Accept` sockets their ring `s`.
//! * the ring position this host consumed (`head` in shared memory is a
//!   copy the server reads), the kicks it posted, whether it told the server
//!   it wants connections (accept rings start accepting ahead only then);
//! * O_NONBLOCK and SO_RCVTIMEO as this library tracks them: a socket
//!   accepted ahead is blocking at the server whatever `accept4`'s flags
//!   say, so non-blocking-ness is a host matter (and requests of a socket
//!   that is non-blocking here carry `MSG_DONTWAIT`);
//! * whether an `END_ERROR` was reported (once; later recvs return 0).
//!
//! **Consuming** (under the socket's lock, which serializes threads that
//! receive or accept on one socket): copy from the private position up to
//! `tail` (acquire), store `head` (release), fence, and if the server
//! `paused` the ring post a `RecvKick` unless a kick of ours is unseen.
//! **Waiting** on an empty ring: `host_waiting += 1`, fence, re-read `tail`
//! and `end`, futex-wait on `tail` in 100 ms slices (server liveness),
//! bounded by SO_RCVTIMEO (EAGAIN).
//!
//! A fork child attaches anew (`crates/preload/src/fork.rs`), so its
//! `Client` starts with every socket `Unknown`: rings it inherited live in
//! the parent's region, and its first recv/accept asks the server again.

use crate::client::Client;
use crate::table::{SockTable, SpinGuard};
use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tcps_proto::futex;
use tcps_proto::msg::PollEntry;
use tcps_proto::recvq::{
    AcceptRecord, ACCEPT_ERROR, ACCEPT_RECORD_SIZE, END_EOF, END_ERROR, END_NONE, END_STOPPED,
    KIND_ACCEPT, KIND_BYTES, RECV_MODE_RING, SETUP_RECV_PLAIN, SETUP_RECV_RING, SETUP_SENDQ,
    SOL_TCPS, TCPS_EAGER_RECV,
};
use tcps_proto::region::RecvRingRef;
use tcps_proto::{Op, Request};

/// The longest single futex sleep on a ring (server liveness checks).
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// recv flags a ring serves (`MSG_OOB` is EINVAL: the ring has no urgent
/// data; anything else the server would refuse too).
const RING_RECV_FLAGS: i32 =
    libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_DONTWAIT | libc::MSG_TRUNC;
/// poll events a ring answers alone (the error and hang-up bits are always
/// reported by poll(2), so asking for them changes nothing).
const LOCAL_POLL: i16 =
    libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP;
const READABLE: i16 = libc::POLLIN | libc::POLLRDNORM;

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// How a socket receives (or accepts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Not known: the first recv/accept asks the server (`RecvBind`).
    #[default]
    Unknown,
    /// Ordinary `Recv`/`Accept` requests (no ring: eager receive off or
    /// pull, or a listener without an accept ring).
    Plain,
    /// The socket's byte ring is bound.
    Bytes,
    /// The listener's accept ring is bound.
    Accept,
}

/// The host's process-ahead state of one socket (behind its spin lock).
#[derive(Default)]
pub(crate) struct RecvState {
    mode: Mode,
    /// Ring position consumed (free-running; `head` is its public copy).
    consumed: u32,
    /// `RecvKick`s posted for this binding (see [`kick_pending`]).
    kicks_sent: u32,
    /// Accept ring: a kick told the server connections are wanted.
    demand: bool,
    /// The ring's `END_ERROR` was returned (once; later recvs get 0).
    end_reported: bool,
    /// O_NONBLOCK as this library tracks it (`None`: not known here, e.g.
    /// a socket inherited over fork; the server's flag is then asked once).
    nonblocking: Option<bool>,
    /// SO_RCVTIMEO as set through this library (`None`: no limit).
    rcvtimeo: Option<Duration>,
    /// A connection this library accepted and has not closed: closing it
    /// cannot fail and frees nothing another call could be waiting for
    /// (its port is the listener's), so `close` need not wait for the
    /// answer. Sockets from `socket` (listeners, bound ports that a next
    /// `bind` may want again) are closed with a round trip.
    accepted_open: bool,
    /// A first `shutdown(SHUT_WR)` went unanswered (the next waits).
    write_shut: bool,
    /// A call on the socket failed as a reset or closed connection would
    /// (ECONNRESET, EPIPE, ...): a shutdown must ask the server.
    broken: bool,
    /// Closed without waiting for the answer: until the id is handed out
    /// again, calls on it fail with EBADF here, since a call on another
    /// channel could overtake the close at the server.
    closed_unanswered: bool,
    /// Counters, summed by `stats` and folded into [`AheadState`] when the
    /// entry is reset (no shared atomic on the receive path).
    recvs: u64,
    accepts: u64,
    bytes: u64,
    copied: u64,
}

impl RecvState {
    /// The ring is bound with this `mode`: start where the server says the
    /// host is (`head`, which the server set before publishing the bind)
    /// and count kicks from what it has seen.
    fn bind(&mut self, mode: Mode, ring: &RecvRingRef<'_>) {
        let ctl = ring.ctl();
        self.mode = mode;
        self.consumed = ctl.head.load(Ordering::Acquire);
        self.kicks_sent = ctl.kicks_seen.load(Ordering::Acquire);
        self.demand = false;
        self.end_reported = false;
    }

    /// Whether to post a kick now (none of ours is unseen); counts it as sent.
    fn take_kick(&mut self, ring: &RecvRingRef<'_>) -> bool {
        let seen = ring.ctl().kicks_seen.load(Ordering::Acquire);
        if kick_pending(seen, self.kicks_sent) {
            return false;
        }
        self.kicks_sent = seen.wrapping_add(1);
        true
    }

    /// Marks `n` bytes (or a record) consumed: stores `head` (release) and
    /// fences against the server's "store paused; load head". Returns
    /// whether a kick must be posted (the server paused the ring).
    fn consume(&mut self, ring: &RecvRingRef<'_>, n: u32) -> bool {
        let ctl = ring.ctl();
        self.consumed = self.consumed.wrapping_add(n);
        ctl.head.store(self.consumed, Ordering::Release);
        fence(Ordering::SeqCst);
        ctl.paused.load(Ordering::Acquire) != 0 && self.take_kick(ring)
    }
}

/// Whether a kick of ours is still unseen: the server's `kicks_seen` is
/// behind the kicks we sent. (Seen *ahead* of sent means late kicks of an
/// earlier binding were counted: nothing of ours is pending.)
fn kick_pending(seen: u32, sent: u32) -> bool {
    (seen.wrapping_sub(sent) as i32) < 0
}

/// Bytes published and not consumed, at most a ring's worth (a forged
/// `tail` cannot make the host read past what the ring holds).
fn available(tail: u32, consumed: u32, size: u32) -> u32 {
    tail.wrapping_sub(consumed).min(size)
}

/// Copies up to `dst.len()` of the bytes published before `tail` from the
/// ring at `consumed` (wrapping). Returns how many.
fn copy_out(ring: &RecvRingRef<'_>, consumed: u32, tail: u32, dst: &mut [u8]) -> usize {
    let n = (available(tail, consumed, ring.size()) as usize).min(dst.len());
    ring.read_at(consumed, &mut dst[..n]);
    n
}

/// A `struct timeval` option value as a timeout (`None`: zero, no limit).
fn timeval(v: &[u8]) -> Option<Duration> {
    let sec = i64::from_ne_bytes(v.get(0..8)?.try_into().ok()?);
    let usec = i64::from_ne_bytes(v.get(8..16)?.try_into().ok()?);
    let t = Duration::from_secs(u64::try_from(sec).ok()?)
        + Duration::from_micros(u64::try_from(usec).ok()?);
    (!t.is_zero()).then_some(t)
}

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

/// Counters of reset entries, and the kicks.
#[derive(Default)]
struct Counters {
    recvs: AtomicU64,
    accepts: AtomicU64,
    bytes: AtomicU64,
    copied: AtomicU64,
    kicks: AtomicU64,
}

/// The process-ahead state of an attachment.
pub(crate) struct AheadState {
    socks: SockTable<RecvState>,
    counters: Counters,
}

/// Counters for [`crate::HostStats`].
#[derive(Clone, Copy, Default)]
pub(crate) struct AheadStats {
    pub ring_recvs: u64,
    pub ring_accepts: u64,
    pub recv_kicks: u64,
    pub bytes_received: u64,
    pub bytes_copied: u64,
}

impl AheadState {
    pub fn new() -> AheadState {
        AheadState {
            socks: SockTable::new(),
            counters: Counters::default(),
        }
    }

    pub fn stats(&self) -> AheadStats {
        let c = &self.counters;
        let mut s = AheadStats {
            ring_recvs: c.recvs.load(Ordering::Relaxed),
            ring_accepts: c.accepts.load(Ordering::Relaxed),
            recv_kicks: c.kicks.load(Ordering::Relaxed),
            bytes_received: c.bytes.load(Ordering::Relaxed),
            bytes_copied: c.copied.load(Ordering::Relaxed),
        };
        self.socks.any(|g| {
            s.ring_recvs += g.recvs;
            s.ring_accepts += g.accepts;
            s.bytes_received += g.bytes;
            s.bytes_copied += g.copied;
            false
        });
        s
    }

    /// Resets an entry to `fresh`, keeping its counts.
    fn reset(&self, g: &mut RecvState, fresh: RecvState) {
        let c = &self.counters;
        c.recvs.fetch_add(g.recvs, Ordering::Relaxed);
        c.accepts.fetch_add(g.accepts, Ordering::Relaxed);
        c.bytes.fetch_add(g.bytes, Ordering::Relaxed);
        c.copied.fetch_add(g.copied, Ordering::Relaxed);
        *g = fresh;
    }

    /// Whether `s` was closed without waiting and not handed out since
    /// (see `RecvState::closed_unanswered`).
    pub(crate) fn closed_unanswered(&self, s: u32) -> bool {
        self.socks
            .get(s)
            .is_some_and(|lock| lock.lock().closed_unanswered)
    }

    /// A call on `s` failed with `e`: remember a sign of a reset or closed
    /// connection (see `RecvState::broken`).
    pub(crate) fn note_error(&self, s: u32, e: i32) {
        if matches!(
            e,
            libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN | libc::ETIMEDOUT | libc::ECONNABORTED
        ) {
            if let Some(lock) = self.socks.get(s) {
                lock.lock().broken = true;
            }
        }
    }
}

impl Client {
    fn ahead(&self) -> &AheadState {
        &self.conn.ahead
    }

    /// The entry of socket `s`, locked (created on first use).
    fn recv_state(&self, s: u32) -> io::Result<SpinGuard<'_, RecvState>> {
        let lock = self
            .ahead()
            .socks
            .get_or_insert(s)
            .ok_or(errno(libc::EBADF))?;
        Ok(lock.lock())
    }

    /// The server handed out socket id `s` (`Socket`, `Accept` or an accept
    /// ring record; `setup`: `SETUP_*`): whatever was kept of an earlier
    /// socket `s` is forgotten, on both the receive and the send side.
    pub(crate) fn ahead_new_socket(
        &self,
        s: u32,
        nonblocking: bool,
        setup: u32,
        rcvtimeo: Option<Duration>,
        accepted: bool,
    ) {
        self.conn.kfds.forget(s);
        self.async_new_socket(s, setup & SETUP_SENDQ != 0, nonblocking);
        let Ok(mut g) = self.recv_state(s) else {
            return;
        };
        let fresh = RecvState {
            nonblocking: Some(nonblocking),
            rcvtimeo,
            accepted_open: accepted,
            ..RecvState::default()
        };
        self.ahead().reset(&mut g, fresh);
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
    pub(crate) fn ahead_prefer_plain(&self, s: u32) {
        if let Ok(mut g) = self.recv_state(s) {
            if g.mode == Mode::Unknown {
                g.mode = Mode::Plain;
            }
        }
    }

    /// `listen` succeeded; `aux == RECV_MODE_RING`: the accept ring is bound.
    pub(crate) fn ahead_listened(&self, s: u32, aux: u64) {
        let Ok(mut g) = self.recv_state(s) else {
            return;
        };
        match self.conn.recv_ring(s) {
            // listen again on a listener with its ring: nothing changes.
            Some(_) if aux == RECV_MODE_RING && g.mode == Mode::Accept => {}
            Some(ring) if aux == RECV_MODE_RING => g.bind(Mode::Accept, &ring),
            _ => g.mode = Mode::Plain,
        }
    }

    /// `s` is being closed (the server unbinds its ring): forgets its state.
    /// Returns whether it was a connection this library accepted and had
    /// not closed yet (of two racing closes, one sees true).
    pub(crate) fn ahead_close(&self, s: u32) -> bool {
        let Some(lock) = self.ahead().socks.get(s) else {
            return false;
        };
        let mut g = lock.lock();
        let accepted_open = g.accepted_open;
        let after = RecvState {
            closed_unanswered: accepted_open,
            ..RecvState::default()
        };
        self.ahead().reset(&mut g, after);
        accepted_open
    }

    /// Whether `shutdown(s, how)` may go unanswered, noting it if so: the
    /// first SHUT_WR of a connection this library accepted, whose byte ring
    /// shows no error and on which no call failed as a reset connection
    /// does. Such a shutdown cannot fail (ENOTCONN needs a reset or closed
    /// connection, and none has been seen here), so it may take effect
    /// after the call returns. A second one, or any other, waits.
    pub(crate) fn ahead_shutdown_unanswered(&self, s: u32, how: i32) -> bool {
        if how != libc::SHUT_WR {
            return false;
        }
        let Some(lock) = self.ahead().socks.get(s) else {
            return false;
        };
        let mut g = lock.lock();
        if !g.accepted_open || g.write_shut || g.broken || g.mode != Mode::Bytes {
            return false;
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return false;
        };
        if matches!(
            ring.ctl().end.load(Ordering::Acquire),
            END_ERROR | END_STOPPED
        ) {
            return false;
        }
        g.write_shut = true;
        true
    }

    /// O_NONBLOCK of `s` as this library tracks it.
    pub(crate) fn local_nonblocking(&self, s: u32) -> Option<bool> {
        self.ahead().socks.get(s)?.lock().nonblocking
    }

    /// `fcntl(F_SETFL)` succeeded.
    pub(crate) fn ahead_set_nonblocking(&self, s: u32, on: bool) {
        if let Ok(mut g) = self.recv_state(s) {
            g.nonblocking = Some(on);
        }
    }

    /// `flags` of a request on `s`, with `MSG_DONTWAIT` if the socket is
    /// non-blocking here (the server may think it blocking: see the module
    /// docs).
    pub(crate) fn local_flags(&self, s: u32, flags: i32) -> i32 {
        if self.local_nonblocking(s) == Some(true) {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        }
    }

    /// SO_RCVTIMEO of `s` as set through this library.
    pub(crate) fn local_rcvtimeo(&self, s: u32) -> Option<Duration> {
        self.ahead().socks.get(s)?.lock().rcvtimeo
    }

    /// `setsockopt` succeeded at the server: note what the host tracks.
    pub(crate) fn ahead_setsockopt(&self, s: u32, level: i32, name: i32, value: &[u8]) {
        let Ok(mut g) = self.recv_state(s) else {
            return;
        };
        if level == libc::SOL_SOCKET && name == libc::SO_RCVTIMEO {
            g.rcvtimeo = timeval(value);
        } else if level == SOL_TCPS && name == TCPS_EAGER_RECV && g.mode == Mode::Plain {
            // A new policy: ask the server again at the next recv.
            g.mode = Mode::Unknown;
        }
    }

    /// The socket's mode, asking the server once (`RecvBind`, one round
    /// trip) if it is not known.
    fn recv_mode(&self, s: u32) -> io::Result<Mode> {
        let lock = self
            .ahead()
            .socks
            .get_or_insert(s)
            .ok_or(errno(libc::EBADF))?;
        let mode = lock.lock().mode;
        if mode != Mode::Unknown {
            return Ok(mode);
        }
        let r = self.simple_call(Request {
            op: Op::RecvBind as u16,
            sock: s,
            ..Default::default()
        });
        let ring = self.conn.recv_ring(s);
        let mode = match r {
            Ok(c) if c.result as u64 == RECV_MODE_RING => {
                match ring.map(|r| r.ctl().kind.load(Ordering::Acquire)) {
                    Some(KIND_BYTES) => Mode::Bytes,
                    Some(KIND_ACCEPT) => Mode::Accept,
                    _ => Mode::Plain,
                }
            }
            Ok(_) => Mode::Plain,
            // The server cannot set this socket up: remember.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                Mode::Plain
            }
            // Not now (e.g. not connected yet): a plain request this time,
            // and ask again next time.
            Err(_) => return Ok(Mode::Plain),
        };
        let mut g = lock.lock();
        if g.mode == Mode::Unknown {
            match (mode, ring) {
                (Mode::Bytes | Mode::Accept, Some(ring)) => g.bind(mode, &ring),
                _ => g.mode = mode,
            }
        }
        Ok(g.mode)
    }

    /// Whether `s` is non-blocking; asks the server once if the host does
    /// not know (`F_GETFL`).
    fn nonblocking_of(&self, g: SpinGuard<'_, RecvState>, s: u32) -> io::Result<bool> {
        if let Some(nb) = g.nonblocking {
            return Ok(nb);
        }
        drop(g);
        let mut r = Request {
            op: Op::Fcntl as u16,
            sock: s,
            ..Default::default()
        };
        r.args[0] = libc::F_GETFL as u64;
        let fl = self.simple_call(r)?.result;
        let nb = fl & i64::from(libc::O_NONBLOCK) != 0;
        let mut g = self.recv_state(s)?;
        Ok(*g.nonblocking.get_or_insert(nb))
    }

    fn post_kick(&self, s: u32) -> io::Result<()> {
        self.ahead().counters.kicks.fetch_add(1, Ordering::Relaxed);
        self.conn.post(Request {
            op: Op::RecvKick as u16,
            sock: s,
            ..Default::default()
        })
    }

    /// Sleeps until the ring's `tail` moves from `seen` or `end` is set, at
    /// most one slice and not past `deadline`. `Ok(false)`: the deadline
    /// passed. ECONNRESET if the server died.
    fn wait_ring(
        &self,
        ring: &RecvRingRef<'_>,
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
        let ctl = ring.ctl();
        let quiet = || {
            ctl.tail.load(Ordering::Acquire) == seen && ctl.end.load(Ordering::Acquire) == END_NONE
        };
        // A counter, not a flag: several threads may wait on one ring.
        ctl.host_waiting.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        if quiet() {
            futex::wait(&ctl.tail, seen, slice);
        }
        ctl.host_waiting.fetch_sub(1, Ordering::AcqRel);
        // Nothing moved (a timeout, or a spurious wake): is the server there?
        if quiet() && !self.conn.server_alive() {
            return Err(errno(libc::ECONNRESET));
        }
        Ok(true)
    }

    /// recv(2) from the socket's byte ring: `Ok(None)` if it has none (the
    /// caller sends a plain request).
    pub(crate) fn ring_recv(
        &self,
        s: u32,
        buf: &mut [u8],
        flags: i32,
    ) -> io::Result<Option<usize>> {
        if self.recv_mode(s)? != Mode::Bytes {
            return Ok(None);
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return Ok(None);
        };
        if flags & !RING_RECV_FLAGS != 0 {
            return Err(errno(libc::EINVAL));
        }
        self.conn.check_open(libc::ENOTCONN)?;
        let peek = flags & libc::MSG_PEEK != 0;
        let trunc = flags & libc::MSG_TRUNC != 0;
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
        let ctl = ring.ctl();
        let mut got = 0usize;
        let mut deadline = None;
        loop {
            let mut g = self.recv_state(s)?;
            if g.mode != Mode::Bytes {
                // Closed (and maybe reused) meanwhile.
                return if got > 0 {
                    Ok(Some(got))
                } else {
                    Err(errno(libc::EBADF))
                };
            }
            let tail = ctl.tail.load(Ordering::Acquire);
            let want = buf.len() - got;
            let avail = available(tail, g.consumed, ring.size()) as usize;
            if want == 0 || avail > 0 {
                let n = if trunc {
                    avail.min(want)
                } else {
                    let n = copy_out(&ring, g.consumed, tail, &mut buf[got..]);
                    g.copied += n as u64;
                    n
                };
                got += n;
                let mut kick = false;
                if !peek && n > 0 {
                    g.bytes += n as u64;
                    kick = g.consume(&ring, n as u32);
                }
                let finished = !waitall || got == buf.len();
                if finished {
                    g.recvs += 1;
                }
                drop(g);
                if kick {
                    self.post_kick(s)?;
                }
                if finished {
                    return Ok(Some(got));
                }
                continue;
            }
            // Empty.
            let end = ctl.end.load(Ordering::Acquire);
            if end != END_NONE {
                // `end` is stored after the last `tail`: look once more.
                if ctl.tail.load(Ordering::Acquire) != tail {
                    continue;
                }
                if end == END_STOPPED {
                    // The server stopped receiving ahead: from now on
                    // plain requests (after the bytes returned here).
                    g.mode = Mode::Plain;
                    return Ok(if got > 0 { Some(got) } else { None });
                }
                g.recvs += 1;
                if got > 0 {
                    return Ok(Some(got));
                }
                if end == END_ERROR && !g.end_reported {
                    // Reported once, also by MSG_PEEK (the kernel's
                    // sock_error clears the error either way).
                    g.end_reported = true;
                    let e = ctl.end_errno.load(Ordering::Acquire);
                    return Err(errno(if e > 0 { e } else { libc::EIO }));
                }
                return Ok(Some(0));
            }
            let timeo = g.rcvtimeo;
            if flags & libc::MSG_DONTWAIT != 0 || self.nonblocking_of(g, s)? {
                return if got > 0 {
                    self.recv_state(s)?.recvs += 1;
                    Ok(Some(got))
                } else {
                    Err(errno(libc::EAGAIN))
                };
            }
            let deadline = *deadline.get_or_insert_with(|| timeo.map(|t| Instant::now() + t));
            match self.wait_ring(&ring, tail, deadline) {
                Ok(true) => {}
                Ok(false) if got > 0 => return Ok(Some(got)),
                Ok(false) => return Err(errno(libc::EAGAIN)),
                Err(_) if got > 0 => return Ok(Some(got)),
                Err(e) => return Err(e),
            }
        }
    }

    /// A zero-copy view of the bytes at the front of the socket's byte
    /// ring: a pointer and a length (at most `max`, contiguous, so possibly
    /// less than what is pending at the ring's wrap). Waits like `recv`
    /// (O_NONBLOCK / `MSG_DONTWAIT`: EAGAIN, SO_RCVTIMEO); `(null, 0)` at
    /// end of stream; an error of the connection once. The bytes stay
    /// valid and unchanged until [`recv_consume`](Self::recv_consume)
    /// releases them. EOPNOTSUPP if the socket has no byte ring.
    pub fn recv_view(&self, s: u32, max: usize, flags: i32) -> io::Result<(*const u8, usize)> {
        self.take_async_error(s)?;
        if flags & !libc::MSG_DONTWAIT != 0 {
            return Err(errno(libc::EINVAL));
        }
        // Waits, and reports the end, exactly as a recv that neither copies
        // nor consumes.
        let mut probe = [0u8; 1];
        let flags = flags | libc::MSG_PEEK | libc::MSG_TRUNC;
        match self.ring_recv(s, &mut probe, flags)? {
            None => return Err(errno(libc::EOPNOTSUPP)),
            Some(0) => return Ok((std::ptr::null(), 0)),
            Some(_) => {}
        }
        let ring = self.conn.recv_ring(s).ok_or(errno(libc::EOPNOTSUPP))?;
        let g = self.recv_state(s)?;
        if g.mode != Mode::Bytes {
            return Err(errno(libc::EBADF));
        }
        let tail = ring.ctl().tail.load(Ordering::Acquire);
        let n =
            available(tail, g.consumed, ring.size()).min(u32::try_from(max).unwrap_or(u32::MAX));
        let (p, n) = ring.span_ptr(g.consumed, n);
        Ok((p as *const u8, n))
    }

    /// Releases the first `n` bytes of the socket's byte ring (after
    /// [`recv_view`](Self::recv_view)): EINVAL if fewer are pending.
    pub fn recv_consume(&self, s: u32, n: usize) -> io::Result<()> {
        let ring = self.conn.recv_ring(s).ok_or(errno(libc::EOPNOTSUPP))?;
        let mut g = self.recv_state(s)?;
        if g.mode != Mode::Bytes {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let tail = ring.ctl().tail.load(Ordering::Acquire);
        let n = u32::try_from(n).map_err(|_| errno(libc::EINVAL))?;
        if n > available(tail, g.consumed, ring.size()) {
            return Err(errno(libc::EINVAL));
        }
        if n == 0 {
            return Ok(());
        }
        // Received, and copied by nobody.
        g.bytes += u64::from(n);
        let kick = g.consume(&ring, n);
        drop(g);
        if kick {
            self.post_kick(s)?;
        }
        Ok(())
    }

    /// accept4(2) from the listener's accept ring: `Ok(None)` if it has
    /// none (the caller sends a plain request).
    pub(crate) fn ring_accept(
        &self,
        s: u32,
        flags: i32,
        addr_out: &mut [u8],
    ) -> io::Result<Option<(u32, usize)>> {
        if self.recv_mode(s)? != Mode::Accept {
            return Ok(None);
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return Ok(None);
        };
        self.conn.check_open(libc::ENOTCONN)?;
        let ctl = ring.ctl();
        let mut deadline = None;
        loop {
            let mut g = self.recv_state(s)?;
            if g.mode != Mode::Accept {
                return Ok(None); // closed meanwhile: the server will say so
            }
            let tail = ctl.tail.load(Ordering::Acquire);
            if available(tail, g.consumed, ring.size()) >= ACCEPT_RECORD_SIZE {
                let rec = ring.read_record(g.consumed);
                let kick = g.consume(&ring, ACCEPT_RECORD_SIZE);
                if rec.flags & ACCEPT_ERROR != 0 {
                    // The server stopped accepting ahead at this error; the
                    // next accept that finds the ring empty asks again.
                    g.demand = false;
                    drop(g);
                    if kick {
                        let _ = self.post_kick(s);
                    }
                    let e = i32::try_from(rec.reserved).unwrap_or(libc::EIO);
                    return Err(errno(if e > 0 { e } else { libc::EIO }));
                }
                g.accepts += 1;
                let rcvtimeo = g.rcvtimeo;
                drop(g);
                if kick {
                    // The connection is ours already: a dead server shows
                    // on the next call.
                    let _ = self.post_kick(s);
                }
                return self.adopt_record(&rec, flags, rcvtimeo, addr_out).map(Some);
            }
            if ctl.end.load(Ordering::Acquire) != END_NONE {
                // The server stopped accepting ahead: ask it directly.
                return Ok(None);
            }
            // Empty: tell the server we want connections (first time), or
            // that it may go on (paused).
            let paused = ctl.paused.load(Ordering::Acquire) != 0;
            let first = !g.demand;
            let timeo = g.rcvtimeo;
            let nonblocking = match g.nonblocking {
                Some(nb) => nb,
                None => {
                    // Learn it from the server once, then look again.
                    self.nonblocking_of(g, s)?;
                    continue;
                }
            };
            if first && nonblocking {
                // A non-blocking accept must see connections already in the
                // kernel's backlog: the server accepts ahead before it
                // answers this (one round trip, once per listener).
                g.demand = true;
                drop(g);
                self.simple_call(Request {
                    op: Op::RecvBind as u16,
                    sock: s,
                    ..Default::default()
                })?;
                continue;
            }
            let kick = (first || paused) && g.take_kick(&ring);
            g.demand |= kick;
            drop(g);
            if kick {
                self.post_kick(s)?;
            }
            if nonblocking {
                return Err(errno(libc::EAGAIN));
            }
            let deadline = *deadline.get_or_insert_with(|| timeo.map(|t| Instant::now() + t));
            if !self.wait_ring(&ring, tail, deadline)? {
                return Err(errno(libc::EAGAIN));
            }
        }
    }

    /// A connection from an accept ring: the new socket's state, the
    /// peer's address (up to `addr_out.len()` bytes). Returns the socket id
    /// and the address's full length.
    fn adopt_record(
        &self,
        rec: &AcceptRecord,
        flags: i32,
        rcvtimeo: Option<Duration>,
        addr_out: &mut [u8],
    ) -> io::Result<(u32, usize)> {
        let len = (rec.addr_len as usize).min(rec.addr.len());
        let n = len.min(addr_out.len());
        addr_out[..n].copy_from_slice(&rec.addr[..n]);
        // Like the kernel, an accepted socket inherits the listener's
        // SO_RCVTIMEO; O_NONBLOCK comes from accept4's flags.
        self.ahead_new_socket(
            rec.sock,
            flags & libc::SOCK_NONBLOCK != 0,
            rec.flags,
            rcvtimeo,
            true,
        );
        Ok((rec.sock, len))
    }

    /// poll(2) answered from the rings, with no request, when every entry
    /// asks only for readability of a socket with a ring and something is
    /// ready (or `timeout_ms == 0`). `Ok(None)`: ask the server. Either
    /// way, polled listeners whose empty accept ring never got a kick get
    /// one (the server accepts ahead only once connections are wanted).
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
            let Some(lock) = self.ahead().socks.get(f.sock) else {
                answerable = false;
                continue;
            };
            let mut g = lock.lock();
            let ring = match (g.mode, self.conn.recv_ring(f.sock)) {
                (Mode::Bytes | Mode::Accept, Some(ring)) => ring,
                _ => {
                    answerable = false;
                    continue;
                }
            };
            let ctl = ring.ctl();
            let avail = available(ctl.tail.load(Ordering::Acquire), g.consumed, ring.size());
            let end = ctl.end.load(Ordering::Acquire);
            if end == END_STOPPED && avail == 0 {
                // The kernel has the rest: the server answers.
                answerable = false;
            }
            f.revents = ring_revents(g.mode, f.events, avail, end, g.end_reported);
            if f.revents != 0 {
                ready += 1;
            }
            let empty_listener = g.mode == Mode::Accept && avail < ACCEPT_RECORD_SIZE;
            if empty_listener && f.events & READABLE != 0 && !g.demand && g.take_kick(&ring) {
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
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    use tcps_proto::{Layout, Region};

    fn region() -> Region {
        let layout = Layout {
            n_channels: 1,
            ring_entries: 2,
            arena_size: 4096,
            send_queues: 0,
            recv_rings: 2,
            rq_bytes: 4096,
            ..Layout::default()
        };
        // SAFETY: memfd_create with a valid C string; checked.
        let fd = unsafe { libc::memfd_create(c"tcps-ahead-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: valid descriptor and size.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), layout.region_size() as i64) },
            0
        );
        Region::map(fd.as_fd(), layout).unwrap()
    }

    #[test]
    fn copy_out_wraps_and_stops_at_tail() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let size = ring.size();
        let start = size - 10; // 10 bytes before the wrap
        let data: Vec<u8> = (0..100u8).collect();
        ring.write_at(start, &data);
        let tail = start.wrapping_add(100);
        let mut out = [0u8; 64];
        assert_eq!(copy_out(&ring, start, tail, &mut out), 64);
        assert_eq!(&out[..], &data[..64]);
        let mut out = [0u8; 64];
        assert_eq!(copy_out(&ring, start + 64, tail, &mut out), 36);
        assert_eq!(&out[..36], &data[64..]);
        // Nothing published.
        assert_eq!(copy_out(&ring, tail, tail, &mut out), 0);
        // Free-running positions across the u32 wrap.
        let p = u32::MAX - 5;
        ring.write_at(p, &data[..20]);
        let mut out = [0u8; 20];
        assert_eq!(copy_out(&ring, p, p.wrapping_add(20), &mut out), 20);
        assert_eq!(&out[..], &data[..20]);
    }

    #[test]
    fn forged_tail_reads_at_most_a_ring() {
        assert_eq!(available(10, 20, 4096), 4096);
        assert_eq!(available(5000, 0, 4096), 4096);
        assert_eq!(available(100, 40, 4096), 60);
    }

    #[test]
    fn consume_stores_head_and_kicks_once_while_paused() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let ctl = ring.ctl();
        let mut g = RecvState::default();
        g.bind(Mode::Bytes, &ring);
        assert!(!g.consume(&ring, 100));
        assert_eq!(ctl.head.load(Ordering::Relaxed), 100);
        ctl.paused.store(1, Ordering::Relaxed);
        assert!(g.consume(&ring, 1)); // a kick
        assert!(!g.consume(&ring, 1)); // ours is still unseen
        ctl.kicks_seen.store(1, Ordering::Relaxed);
        assert!(g.consume(&ring, 1)); // seen: kick again
        ctl.paused.store(0, Ordering::Relaxed);
        assert!(!g.consume(&ring, 1));
        assert_eq!(ctl.head.load(Ordering::Relaxed), 104);
    }

    #[test]
    fn kicks_of_an_earlier_binding_do_not_block_ours() {
        assert!(!kick_pending(5, 5));
        assert!(kick_pending(4, 5));
        assert!(!kick_pending(7, 5)); // stale kicks counted: nothing pending
        assert!(kick_pending(u32::MAX, 0)); // across the wrap
    }

    #[test]
    fn bind_starts_at_the_servers_head() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        ring.ctl().head.store(640, Ordering::Relaxed);
        ring.ctl().kicks_seen.store(3, Ordering::Relaxed);
        let mut g = RecvState {
            end_reported: true,
            demand: true,
            ..RecvState::default()
        };
        g.bind(Mode::Accept, &ring);
        assert_eq!((g.mode, g.consumed, g.kicks_sent), (Mode::Accept, 640, 3));
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
