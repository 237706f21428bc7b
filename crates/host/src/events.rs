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
//! socket is reported on every call while its condition holds.
//!
//! O(ready), not O(interest): the queue keeps a ready list, fed by the
//! host's ready log (the server appends every ring it publishes into,
//! `tcps_proto::ready_log`). A call looks at the listed sockets only: those
//! the log names since the last call, those reported last time (level
//! triggered: they are looked at again until their condition ends), and
//! the *sticky* ones the log cannot announce (EV_ROOM wanted, no ring).

use crate::client::{Client, PollFd};
use crate::ring_wait::EdgeWatch;
use crate::socket::Mode;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
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
    state: Mutex<QueueState>,
    /// Looks at the ready list, and the sockets they examined (see
    /// [`EventQueue::looked`]).
    passes: AtomicU64,
    looks: AtomicU64,
}

#[derive(Default)]
struct QueueState {
    /// Socket → (`EV_*` wanted, user word).
    watch: BTreeMap<u32, (u32, u64)>,
    /// The ready list: sockets the next call looks at.
    ready: BTreeSet<u32>,
    /// How far the queue has read the host's ready log (None: not yet).
    cursor: Option<u32>,
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
        let mut st = self.lock();
        st.watch.insert(sock, (events, user));
        st.ready.insert(sock); // looked at once
        Ok(())
    }

    /// Stops watching `sock` (ENOENT if it was not watched).
    pub fn remove(&self, sock: u32) -> io::Result<()> {
        let mut st = self.lock();
        st.ready.remove(&sock);
        match st.watch.remove(&sock) {
            Some(_) => Ok(()),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// Sockets watched.
    pub fn len(&self) -> usize {
        self.lock().watch.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many looks at its ready list the waits made, and how many
    /// sockets those looks examined: their ratio is what a wait costs
    /// (O(ready), not O(interest)).
    pub fn looked(&self) -> (u64, u64) {
        (
            self.passes.load(Ordering::Relaxed),
            self.looks.load(Ordering::Relaxed),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl QueueState {
    /// Lists the watched sockets the ready log names since the last look
    /// (all of them the first time, or when the log overflowed).
    fn refill(&mut self, c: &Client) {
        let mut ids = Vec::new();
        let whole = match self.cursor.as_mut() {
            None => {
                self.cursor = Some(c.ready_log_tail());
                false
            }
            Some(cur) => c.ready_log_since(cur, &mut ids),
        };
        if !whole {
            self.ready.extend(self.watch.keys().copied());
            return;
        }
        for id in ids {
            if self.watch.contains_key(&id) {
                self.ready.insert(id);
            }
        }
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
            if q.is_empty() {
                return Ok(0);
            }
            let (mut fds, meta) = self.events_snapshot(q, true);
            let ready = if fds.is_empty() {
                0
            } else {
                self.poll(&mut fds, 0)?
            };
            if ready > 0 || meta.iter().any(|m| m.room) {
                return Ok(self.fill(q, &fds, &meta, out));
            }
            self.relist(q, &fds, &meta, &[]);
            let left = match deadline {
                None if timeout_ms < 0 => -1,
                None => return Ok(0),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => l.as_millis().clamp(1, i32::MAX as u128) as i32,
                    _ => return Ok(0),
                },
            };
            if !self.sleep_on_list(q, left)? {
                // Some socket needs the server: it parks the wait, on
                // every watched socket (an arrival on any ends it).
                let (mut fds, meta) = self.events_snapshot(q, false);
                if self.poll(&mut fds, left)? > 0 {
                    return Ok(self.fill(q, &fds, &meta, out));
                }
            }
        }
    }

    /// Sleeps on the host doorbell until the ready log moves or a sticky
    /// socket's send queue gets room (see `ring_wait`). `Ok(false)`: a
    /// listed socket cannot be watched that way (it has no ring).
    fn sleep_on_list(&self, q: &EventQueue, left: i32) -> io::Result<bool> {
        let (fds, _) = self.events_snapshot(q, true);
        let mut watch: Vec<EdgeWatch> = fds
            .iter()
            .map(|f| EdgeWatch {
                sock: f.sock,
                read: f.events & libc::POLLIN != 0 && self.read_edge(f.sock).is_none(),
                write: f.events & libc::POLLOUT != 0,
            })
            .filter(|w| w.read || w.write)
            .collect();
        watch.push(EdgeWatch::READY_LOG);
        self.sleep_on_edges(&watch, &mut [], left, &mut || {
            let (mut fds, meta) = self.events_snapshot(q, true);
            let n = if fds.is_empty() {
                0
            } else {
                self.poll(&mut fds, 0)?
            };
            Ok(n > 0 || meta.iter().any(|m| m.room))
        })
    }

    /// The poll entries of `q`'s ready list after refilling it from the
    /// ready log (`listed`), or of every watched socket; and what else is
    /// known of each socket. Room in a socket's send queue is known here:
    /// such an entry is asked without POLLOUT.
    fn events_snapshot(&self, q: &EventQueue, listed: bool) -> (Vec<PollFd>, Vec<Watched>) {
        let mut st = q.lock();
        let socks: Vec<u32> = if listed {
            st.refill(self);
            q.passes.fetch_add(1, Ordering::Relaxed);
            q.looks.fetch_add(st.ready.len() as u64, Ordering::Relaxed);
            st.ready.iter().copied().collect()
        } else {
            st.watch.keys().copied().collect()
        };
        let mut fds = Vec::with_capacity(socks.len());
        let mut meta = Vec::with_capacity(socks.len());
        for sock in socks {
            let Some(&(wanted, user)) = st.watch.get(&sock) else {
                continue;
            };
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

impl Client {
    /// Events of a poll pass into `out`; sockets found closed (POLLNVAL)
    /// leave the queue. Then the ready list keeps what was reported or
    /// found ready (level-triggered) and the sticky sockets.
    fn fill(
        &self,
        q: &EventQueue,
        fds: &[PollFd],
        meta: &[Watched],
        out: &mut [ConnEvent],
    ) -> usize {
        let mut n = 0;
        let mut held = Vec::new();
        for (f, m) in fds.iter().zip(meta) {
            let events = fd_events(f, m);
            if events == 0 {
                continue;
            }
            held.push(f.sock); // reported now, or ready with no room left in `out`
            if n == out.len() {
                continue;
            }
            if f.revents & libc::POLLNVAL != 0 {
                q.lock().watch.remove(&f.sock);
            }
            out[n] = ConnEvent {
                sock: f.sock,
                events,
                user: m.user,
            };
            n += 1;
        }
        self.relist(q, fds, meta, &held);
        n
    }

    /// After a look at `fds`: each stays listed if it is in `held` (ready)
    /// or sticky, and leaves the list otherwise.
    fn relist(&self, q: &EventQueue, fds: &[PollFd], meta: &[Watched], held: &[u32]) {
        let mut st = q.lock();
        for (f, m) in fds.iter().zip(meta) {
            let sticky = m.wanted & EV_ROOM != 0 || self.read_edge(f.sock).is_none();
            if !(held.contains(&f.sock) || sticky) || !st.watch.contains_key(&f.sock) {
                st.ready.remove(&f.sock);
            }
        }
    }
}

/// The `EV_*` bits a looked-at socket reports.
fn fd_events(f: &PollFd, m: &Watched) -> u32 {
    let mut events = conn_events(f.revents, m.listener, m.wanted);
    if m.room {
        events |= EV_ROOM;
    }
    events
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
