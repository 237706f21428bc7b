//! Sleeping on many rings at once, and on kernel fds beside them.
//!
//! A thread that waits for readability of several sockets whose receive or
//! accept rings answer for them needs nothing from the server but to be
//! woken when one of those rings moves. It registers as a sleeper on every
//! ring (the rings' own lost-wake-up handshake: `host_waiting`, then a
//! fence, then a re-check), and sleeps in poll(2) on the attachment's *host
//! doorbell*, a pipe the server rings at the end of a pass in which it
//! woke a sleeper of this host (`ControlMsg::HostDoorbell`). A thread
//! waiting for room to send (POLLOUT) registers the same way on the
//! socket's send queue, whose `done` moving is the room appearing. Kernel fds can
//! be in the same poll(2), so a mixed set needs no helper thread, and no
//! call is parked at the server: blocking costs no round trip.
//!
//! One doorbell per sleeping thread: a sleeper empties its doorbell before
//! its last look at the rings (a ring rung after that look stays readable
//! until it polls), so two threads on one pipe could swallow each other's
//! rings. A thread takes a free doorbell *slot* (`DOORBELL_SLOTS` per
//! attachment, each pipe asked for once: `ControlMsg::HostDoorbell` with
//! the slot as handle) and registers on each ring and queue with it; the
//! server rings only the doorbells of the sleepers whose rings moved. With
//! every slot taken, a thread waits the old way (a call parked at the
//! server).

use crate::client::Client;
use crate::socket::Mode;
use crate::sys::move_high;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use tcps_proto::eager::END_STOPPED;
use tcps_proto::handshake::ControlMsg;
use tcps_proto::msg::PollEntry;

/// Poll events a ring can wait for alone (errors and hang-ups are always
/// reported, so asking for them changes nothing).
const RING_EVENTS: i16 =
    libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP;
/// Read-side events: the ones that need a ring.
const READ_EVENTS: i16 = libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP;

/// What a doorbell sleeper watches on one socket: its receive or accept
/// ring (`read`), its send queue (`write`). [`EdgeWatch::READY_LOG`]
/// watches the host's ready log instead: every receive and accept ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeWatch {
    pub sock: u32,
    pub read: bool,
    pub write: bool,
}

impl EdgeWatch {
    /// Watches every receive and accept ring of the host at once, through
    /// its ready log (`tcps_proto::ready_log`): what a sleeper with a ready
    /// list of its own registers on (see `Client::ready_log_since`).
    pub const READY_LOG: EdgeWatch = EdgeWatch {
        sock: u32::MAX,
        read: true,
        write: false,
    };
}

/// What a doorbell sleeper registered on.
#[derive(Clone, Copy)]
enum Watch {
    /// The receive or accept ring of a socket (the ring index is its id).
    Ring(u32),
    /// A send queue (its index), for POLLOUT.
    Queue(u32),
    /// The ready log: any receive or accept ring.
    Log,
}

/// Registered as a doorbell sleeper (on doorbell `slot`) on the rings and
/// send queues of a poll set; unregisters when dropped, then marks the
/// slot awake. Made by `Client::register`.
struct Registered<'a> {
    client: &'a Client,
    watches: Vec<Watch>,
    slot: u32,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let slot = self.slot;
        for &w in &self.watches {
            match w {
                Watch::Ring(s) => {
                    if let Some(ring) = self.client.conn.recv_ring(s) {
                        ring.bell_wait_done(slot);
                    }
                }
                Watch::Queue(q) => self.client.conn.send_queue(q).bell_wait_done(slot),
                Watch::Log => self.client.conn.ready_log().bell_wait_done(slot),
            }
        }
    }
}

/// A doorbell slot held by a sleeping thread; freed when dropped.
struct Slot<'a> {
    held: &'a AtomicU64,
    slot: u32,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.held.fetch_and(!(1u64 << self.slot), Ordering::Release);
    }
}

/// Takes a free doorbell slot, this thread's last one if it is free (its
/// pipe is made already). None: every slot is held.
fn take_slot(held: &AtomicU64) -> Option<Slot<'_>> {
    thread_local! {
        static LAST: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let mut cur = held.load(Ordering::Relaxed);
    loop {
        let last = LAST.with(|l| l.get());
        let slot = if cur & (1 << last) == 0 {
            last
        } else if cur == u64::MAX {
            return None;
        } else {
            (!cur).trailing_zeros()
        };
        match held.compare_exchange_weak(cur, cur | 1 << slot, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => {
                LAST.with(|l| l.set(slot));
                return Some(Slot { held, slot });
            }
            Err(now) => cur = now,
        }
    }
}

impl Client {
    /// Sleeps until a ring of `fds` moves, room appears in the send queue
    /// of a POLLOUT entry, a kernel fd of `kernel` is ready (its `revents`
    /// set), or `timeout_ms` (<0: forever) passes, without asking the
    /// server; or returns at once if an entry of `fds` is ready already.
    /// `room(sock)` says whether a send on `sock` would not block now (the
    /// caller's rule: the preload bounds queues by SO_SNDBUF). Readiness of
    /// `fds` is the caller's to collect afterwards (`Client::poll` with
    /// timeout 0 answers readability from the rings). `Ok(false)`: this
    /// wait cannot be done that way (an entry needs the server, another
    /// thread of this attachment sleeps here, or the server gave no
    /// doorbell); nothing was waited for.
    pub fn sleep_on_rings(
        &self,
        fds: &mut [PollEntry],
        kernel: &mut [libc::pollfd],
        timeout_ms: i32,
        room: &dyn Fn(u32) -> bool,
    ) -> io::Result<bool> {
        sleep_on_rings_many(&mut [(self, fds)], kernel, timeout_ms, &|_, s| room(s))
    }

    /// The doorbell sleep itself: watches the receive or accept ring
    /// (`read`) and the send queue (`write`) of each socket of `watch`, and
    /// sleeps until one of them moves, a kernel fd of `kernel` is ready, or
    /// `timeout_ms` passes; `ready()` is the caller's own look (true:
    /// something is ready, do not sleep), made while spinning and once more
    /// after registering. `Ok(false)`: not possible (a socket has no such
    /// ring or queue, another thread of this attachment sleeps here, no
    /// doorbell); nothing was waited for.
    pub fn sleep_on_edges(
        &self,
        watch: &[EdgeWatch],
        kernel: &mut [libc::pollfd],
        timeout_ms: i32,
        ready: &mut dyn FnMut() -> io::Result<bool>,
    ) -> io::Result<bool> {
        sleep_on_many(&[(self, watch)], kernel, timeout_ms, ready)
    }

    /// An edge counter of socket `s`'s read side: it changes whenever the
    /// server publishes bytes, a connection or an end into the socket's
    /// receive or accept ring (epoll's edge-triggered entries fire on it,
    /// as the kernel's fire on every arrival). `None`: the socket has no
    /// such ring, or it handed the rest back to the kernel.
    pub fn read_edge(&self, s: u32) -> Option<u64> {
        let sock = self.conn.socks.get(s)?;
        if !matches!(sock.recv.lock().mode, Mode::Bytes | Mode::Accept) {
            return None;
        }
        let ring = self.conn.recv_ring(s)?;
        let end = ring.end();
        (end != END_STOPPED).then(|| u64::from(end) << 32 | u64::from(ring.tail()))
    }

    /// An edge counter of socket `s`'s write side: the sends of its send
    /// queue the server finished (room appears when it moves). `None`: no
    /// send queue.
    pub fn write_edge(&self, s: u32) -> Option<u32> {
        let sock = self.conn.socks.get(s)?;
        let q = sock.send.lock().queue?;
        Some(self.conn.send_queue(q).done())
    }

    /// Where the host's ready log ends now: the cursor of a reader that
    /// starts looking from here (see [`ready_log_since`](Self::ready_log_since)).
    pub fn ready_log_tail(&self) -> u32 {
        self.conn.ready_log().tail()
    }

    /// The ids of the sockets whose receive or accept ring the server
    /// published into (bytes, a connection, an end) since `*cursor`, in
    /// publish order, pushed onto `out`; the cursor moves to the end. A
    /// ready list fed by this looks only at sockets that moved. `false`:
    /// the reader fell a whole log behind and `out` may miss some: look
    /// at every socket once.
    pub fn ready_log_since(&self, cursor: &mut u32, out: &mut Vec<u32>) -> bool {
        self.conn.ready_log().read(cursor, out)
    }

    /// Host doorbell `slot` (the read end of a pipe, non-blocking,
    /// readable when the server woke one of this host's ring or queue
    /// sleepers while the slot was marked asleep), asked from the server
    /// once. Read it empty after waking.
    fn host_doorbell(&self, slot: u32) -> io::Result<RawFd> {
        let cell = &self.conn.host_doorbells[slot as usize];
        if let Some(fd) = cell.get() {
            return Ok(fd.as_raw_fd());
        }
        let mut got = self
            .conn
            .control()
            .call(&ControlMsg::HostDoorbell { handle: slot }, &[])?;
        if got.len() != 1 {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        // SAFETY: `move_high` returns a descriptor we own (the received one,
        // or a close-on-exec duplicate of it that replaced it).
        let fd = unsafe { OwnedFd::from_raw_fd(move_high(got.remove(0).into_raw_fd())) };
        // The read end is this process's own open file: non-blocking, so
        // emptying it never waits (the server made it so; say it again).
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        // Two threads asking at once: the loser's copy is closed here.
        Ok(cell.get_or_init(|| fd).as_raw_fd())
    }

    /// Before sleeping: looks (`ready`) again and again for a while (see
    /// `Conn::spin_until`; the doorbell sleeper's own budget), so a reply
    /// that is microseconds away costs neither a doorbell write at the
    /// server nor a sleep and wake-up here. Kernel fds are not looked at
    /// meanwhile (they wait at most the spin). Returns whether something
    /// became ready.
    fn spin(&self, ready: &mut dyn FnMut() -> io::Result<bool>) -> io::Result<bool> {
        const MIN_BELL_SPIN_NS: u64 = 1_000;
        self.conn
            .spin_until(&self.conn.bell_spin_ns, MIN_BELL_SPIN_NS, ready)
    }

    /// What a doorbell sleeper registers on for `watch`: receive or accept
    /// rings (bound, not handed back to the kernel), send queues (bound, no
    /// failed send). `None`: some socket has no such ring or queue (the
    /// server must be asked). After registering, look once more, and only
    /// if nothing is ready sleep on the host doorbell: a ring or queue that
    /// moves after the registration rings it.
    fn watch_targets(&self, watch: &[EdgeWatch]) -> Option<Vec<Watch>> {
        let mut watches = Vec::with_capacity(watch.len());
        for w in watch {
            if *w == EdgeWatch::READY_LOG {
                watches.push(Watch::Log);
                continue;
            }
            let sock = self.conn.socks.get(w.sock)?;
            if w.read {
                let g = sock.recv.lock();
                if !matches!(g.mode, Mode::Bytes | Mode::Accept) {
                    return None;
                }
                if self.conn.recv_ring(w.sock)?.end() == END_STOPPED {
                    return None;
                }
                watches.push(Watch::Ring(w.sock));
            }
            if w.write {
                let g = sock.send.lock();
                match g.queue {
                    Some(q) if g.error == 0 => watches.push(Watch::Queue(q)),
                    _ => return None,
                }
            }
        }
        Some(watches)
    }

    /// Registers as a sleeper on doorbell `slot` on `targets` (from
    /// `watch_targets`).
    fn register(&self, watches: Vec<Watch>, slot: u32) -> Registered<'_> {
        for &w in &watches {
            match w {
                Watch::Ring(s) => {
                    if let Some(ring) = self.conn.recv_ring(s) {
                        ring.bell_wait_prepare(slot);
                    }
                }
                Watch::Queue(q) => self.conn.send_queue(q).bell_wait_prepare(slot),
                Watch::Log => self.conn.ready_log().bell_wait_prepare(slot),
            }
        }
        Registered {
            client: self,
            watches,
            slot,
        }
    }

    /// Whether an entry of `fds` is ready, from host memory alone: the
    /// rings for readability (`Client::poll` with timeout 0 answers from
    /// them for such entries), `room` for POLLOUT.
    fn ready_here(&self, fds: &mut [PollEntry], room: &dyn Fn(u32) -> bool) -> io::Result<bool> {
        let mut read: Vec<PollEntry> = fds
            .iter()
            .filter(|f| f.events & READ_EVENTS != 0)
            .map(|f| PollEntry {
                events: f.events & !libc::POLLOUT,
                revents: 0,
                ..*f
            })
            .collect();
        if !read.is_empty() && self.poll(&mut read, 0)? > 0 {
            return Ok(true);
        }
        Ok(fds
            .iter()
            .any(|f| f.events & libc::POLLOUT != 0 && room(f.sock)))
    }
}

/// [`Client::sleep_on_edges`] over several attachments at once (a host
/// that uses several servers, `TCPS_REMOTE=a,b`): registers on the watches
/// of every part, each on a doorbell slot of its own attachment, and
/// sleeps in one poll(2) on all their doorbells and `kernel`. `Ok(false)`:
/// some part cannot be watched that way; nothing was waited for.
pub fn sleep_on_many(
    parts: &[(&Client, &[EdgeWatch])],
    kernel: &mut [libc::pollfd],
    timeout_ms: i32,
    ready: &mut dyn FnMut() -> io::Result<bool>,
) -> io::Result<bool> {
    let mark = crate::interrupt::Mark::new();
    let mut slots = Vec::with_capacity(parts.len());
    let mut bells = Vec::with_capacity(parts.len());
    let mut targets = Vec::with_capacity(parts.len());
    for &(c, watch) in parts {
        let Some(slot) = take_slot(&c.conn.bells_held) else {
            return Ok(false);
        };
        let Ok(bell) = c.host_doorbell(slot.slot) else {
            return Ok(false);
        };
        let Some(t) = c.watch_targets(watch) else {
            return Ok(false);
        };
        slots.push(slot);
        bells.push(bell);
        targets.push(t);
    }
    // Spin unregistered: a publish meanwhile costs the server no
    // doorbell write.
    if let Some(&(c, _)) = parts.first() {
        if c.spin(ready)? {
            return Ok(true);
        }
    }
    let _registered: Vec<Registered<'_>> = parts
        .iter()
        .zip(targets)
        .zip(&slots)
        .map(|((&(c, _), t), slot)| c.register(t, slot.slot))
        .collect();
    bells.iter().for_each(|&b| drain(b));
    // The last look, after registering and emptying the bells: a ring or
    // queue that moves from here on rings its bell.
    if ready()? {
        return Ok(true);
    }
    if mark.seen() {
        // A handler ran before the poll(2), which would have said EINTR.
        return Err(crate::interrupt::eintr());
    }
    let mut all: Vec<libc::pollfd> = kernel
        .iter()
        .map(|p| libc::pollfd { revents: 0, ..*p })
        .chain(bells.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }))
        .collect();
    // SAFETY: `all` is a valid array of pollfds for its length.
    let n = unsafe { libc::poll(all.as_mut_ptr(), all.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    for (&(c, _), b) in parts.iter().zip(&all[kernel.len()..]) {
        if b.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // The server's end of the doorbell closed: it died. Say so
            // (the attachment is marked dead), or every sleep ends at once.
            c.conn.server_alive();
        }
    }
    for (k, a) in kernel.iter_mut().zip(&all) {
        k.revents = a.revents;
    }
    Ok(true)
}

/// [`Client::sleep_on_rings`] over several attachments at once (see
/// [`sleep_on_many`]): each part's entries are sockets of its attachment;
/// `room(c, sock)` is the caller's rule for POLLOUT. `Ok(false)`: some
/// entry cannot be watched that way; nothing was waited for.
pub fn sleep_on_rings_many(
    parts: &mut [(&Client, &mut [PollEntry])],
    kernel: &mut [libc::pollfd],
    timeout_ms: i32,
    room: &dyn Fn(&Client, u32) -> bool,
) -> io::Result<bool> {
    let mut watches = Vec::with_capacity(parts.len());
    for (_, fds) in parts.iter() {
        let mut w = Vec::with_capacity(fds.len());
        for f in fds.iter() {
            if f.events & !(RING_EVENTS | libc::POLLOUT) != 0 {
                return Ok(false);
            }
            w.push(EdgeWatch {
                sock: f.sock,
                read: f.events & READ_EVENTS != 0,
                write: f.events & libc::POLLOUT != 0,
            });
        }
        watches.push(w);
    }
    let clients: Vec<&Client> = parts.iter().map(|(c, _)| *c).collect();
    let refs: Vec<(&Client, &[EdgeWatch])> = clients
        .iter()
        .zip(&watches)
        .map(|(c, w)| (*c, &w[..]))
        .collect();
    sleep_on_many(&refs, kernel, timeout_ms, &mut || {
        for (c, fds) in parts.iter_mut() {
            fds.iter_mut().for_each(|f| f.revents = 0);
            let c: &Client = c;
            if c.ready_here(fds, &|s| room(c, s))? {
                return Ok(true);
            }
        }
        Ok(false)
    })
}

/// Empties the doorbell, a pipe the server writes a byte to per ring
/// (non-blocking: nothing to read is fine).
fn drain(bell: RawFd) {
    let mut b = [0u8; 256];
    loop {
        // SAFETY: reads at most 256 bytes into a local buffer from our pipe.
        let n = unsafe { libc::read(bell, b.as_mut_ptr().cast(), b.len()) };
        if n < b.len() as isize {
            return;
        }
    }
}
