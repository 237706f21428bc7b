//! Connection events for native programs: a batched event queue over tcps
//! sockets (seed 002 §3's host/adapter interface: nothing below the
//! connection level). A program adds sockets with the events it wants
//! ([`EV_ACCEPT`], [`EV_DATA`], [`EV_ROOM`], [`EV_CLOSED`], [`EV_ERROR`])
//! and a user word, then [`Client::events_wait`] returns many events per
//! call.
//!
//! Readiness comes from host memory where it lives there (receive and
//! accept rings, send-queue room) with no request; a wait with nothing
//! ready sleeps on the host doorbell (`ring_wait`), so a busy or idle event
//! loop over sockets with rings makes no round trip. Sockets without rings
//! (eager receive off, a connect in progress) are asked of the server, as
//! `Client::poll` does. Level-triggered, like `epoll` without `EPOLLET`: a
//! socket is reported on every call while its condition holds. The scan is
//! over the queue's sockets (O(interest) in host memory, no system call);
//! a ready list fed by the server would make it O(ready).

use crate::client::{Client, PollFd};
use crate::socket::Mode;
use std::collections::BTreeMap;
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A listener has a connection to accept.
pub const EV_ACCEPT: u32 = 1;
/// A connection has bytes to read.
pub const EV_DATA: u32 = 2;
/// A connection has room to send.
pub const EV_ROOM: u32 = 4;
/// The peer closed its side (EOF).
pub const EV_CLOSED: u32 = 8;
/// The connection failed (reset, refused): the next call reports it.
pub const EV_ERROR: u32 = 16;
/// Every event.
pub const EV_ALL: u32 = EV_ACCEPT | EV_DATA | EV_ROOM | EV_CLOSED | EV_ERROR;

/// One event of [`Client::events_wait`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnEvent {
    pub sock: u32,
    /// `EV_*` bits that hold (only those asked for, plus `EV_ERROR` and
    /// `EV_CLOSED`, which are always reported).
    pub events: u32,
    /// The word given to [`EventQueue::add`].
    pub user: u64,
}

/// The sockets a program watches and what for.
#[derive(Default)]
pub struct EventQueue {
    watch: Mutex<BTreeMap<u32, (u32, u64)>>,
}

impl EventQueue {
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    /// Watches `sock` for `events` (`EV_*`), reported with `user`; adding
    /// a watched socket again replaces its events and word.
    pub fn add(&self, sock: u32, events: u32, user: u64) -> io::Result<()> {
        if events & !EV_ALL != 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.lock().insert(sock, (events, user));
        Ok(())
    }

    /// Stops watching `sock` (ENOENT if it was not watched).
    pub fn remove(&self, sock: u32) -> io::Result<()> {
        match self.lock().remove(&sock) {
            Some(_) => Ok(()),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// Sockets watched.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, (u32, u64)>> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// poll(2) events for `EV_*` bits.
fn poll_events(ev: u32) -> i16 {
    let mut p = 0;
    if ev & (EV_ACCEPT | EV_DATA) != 0 {
        p |= libc::POLLIN;
    }
    if ev & EV_ROOM != 0 {
        p |= libc::POLLOUT;
    }
    p | libc::POLLRDHUP
}

/// `EV_*` bits for poll(2) `revents` of a socket (`listener`: readable
/// means a connection to accept), restricted to `wanted` plus the bits
/// always reported.
fn conn_events(revents: i16, listener: bool, wanted: u32) -> u32 {
    let mut ev = 0;
    if revents & libc::POLLIN != 0 {
        ev |= if listener { EV_ACCEPT } else { EV_DATA };
    }
    if revents & libc::POLLOUT != 0 {
        ev |= EV_ROOM;
    }
    if revents & (libc::POLLRDHUP | libc::POLLHUP) != 0 {
        ev |= EV_CLOSED;
    }
    if revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
        ev |= EV_ERROR;
    }
    ev & (wanted | EV_CLOSED | EV_ERROR)
}

impl Client {
    /// Waits up to `timeout_ms` (<0: forever, 0: just look) for events of
    /// the sockets in `q`, and fills `out` with up to `out.len()` of them;
    /// returns how many. A socket closed meanwhile is reported with
    /// `EV_ERROR` once and then forgotten.
    pub fn events_wait(
        &self,
        q: &EventQueue,
        out: &mut [ConnEvent],
        timeout_ms: i32,
    ) -> io::Result<usize> {
        if out.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let deadline =
            (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        loop {
            let (mut fds, meta) = self.events_snapshot(q);
            if fds.is_empty() {
                return Ok(0);
            }
            let ready = self.poll(&mut fds, 0)?;
            if ready > 0 || meta.iter().any(|m| m.room) {
                return Ok(fill(q, &fds, &meta, out));
            }
            let left = match deadline {
                None if timeout_ms < 0 => -1,
                None => return Ok(0),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => l.as_millis().clamp(1, i32::MAX as u128) as i32,
                    _ => return Ok(0),
                },
            };
            let room = |s: u32| {
                let b = self.send_backlog(s);
                b.failed || (b.bound && b.credit)
            };
            if !self.sleep_on_rings(&mut fds, &mut [], left, &room)? {
                // Some socket needs the server: it parks the wait.
                if self.poll(&mut fds, left)? > 0 {
                    return Ok(fill(q, &fds, &meta, out));
                }
            }
        }
    }

    /// The poll entries of `q` now, and what else is known of each socket.
    /// Room in a socket's send queue is known here: such an entry is asked
    /// without POLLOUT.
    fn events_snapshot(&self, q: &EventQueue) -> (Vec<PollFd>, Vec<Watched>) {
        let w = q.lock();
        let mut fds = Vec::with_capacity(w.len());
        let mut meta = Vec::with_capacity(w.len());
        for (&sock, &(wanted, user)) in w.iter() {
            let listener = self
                .conn
                .socks
                .get(sock)
                .is_some_and(|s| s.recv.lock().mode == Mode::Accept);
            let room = wanted & EV_ROOM != 0 && {
                let b = self.send_backlog(sock);
                b.bound && b.credit && !b.failed
            };
            let mut events = poll_events(wanted);
            if room {
                events &= !libc::POLLOUT;
            }
            fds.push(PollFd {
                sock,
                events,
                revents: 0,
            });
            meta.push(Watched {
                wanted,
                user,
                listener,
                room,
            });
        }
        (fds, meta)
    }
}

/// What [`Client::events_wait`] knows of a watched socket beside its poll
/// entry.
struct Watched {
    wanted: u32,
    user: u64,
    listener: bool,
    /// Its send queue has room (known in host memory).
    room: bool,
}

/// Events of a poll pass into `out`; sockets found closed (POLLNVAL) leave
/// the queue.
fn fill(q: &EventQueue, fds: &[PollFd], meta: &[Watched], out: &mut [ConnEvent]) -> usize {
    let mut n = 0;
    for (f, m) in fds.iter().zip(meta) {
        if n == out.len() {
            break;
        }
        let (wanted, user) = (m.wanted, m.user);
        let mut events = conn_events(f.revents, m.listener, wanted);
        if m.room {
            events |= EV_ROOM;
        }
        if events == 0 {
            continue;
        }
        if f.revents & libc::POLLNVAL != 0 {
            q.lock().remove(&f.sock);
        }
        out[n] = ConnEvent {
            sock: f.sock,
            events,
            user,
        };
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_bits_map_to_connection_events() {
        assert_eq!(conn_events(libc::POLLIN, true, EV_ALL), EV_ACCEPT);
        assert_eq!(conn_events(libc::POLLIN, false, EV_ALL), EV_DATA);
        assert_eq!(conn_events(libc::POLLOUT, false, EV_ROOM), EV_ROOM);
        assert_eq!(conn_events(libc::POLLOUT, false, EV_DATA), 0);
        assert_eq!(
            conn_events(libc::POLLIN | libc::POLLRDHUP, false, EV_DATA),
            EV_DATA | EV_CLOSED
        );
        assert_eq!(conn_events(libc::POLLERR, false, 0), EV_ERROR);
        assert_eq!(poll_events(EV_ACCEPT), libc::POLLIN | libc::POLLRDHUP);
        assert_eq!(
            poll_events(EV_DATA | EV_ROOM),
            libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP
        );
    }

    #[test]
    fn queue_rejects_unknown_events_and_unknown_removals() {
        let q = EventQueue::new();
        assert_eq!(
            q.add(3, 1 << 10, 0).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        q.add(3, EV_DATA, 7).unwrap();
        q.add(3, EV_DATA | EV_ROOM, 8).unwrap();
        assert_eq!(q.len(), 1);
        q.remove(3).unwrap();
        assert_eq!(q.remove(3).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    }
}
