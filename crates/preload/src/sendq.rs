//! Asynchronous sends for the data calls (`write`, `send`, `sendto`,
//! `sendmsg`, `writev`): the bytes are copied into the host library's
//! staging pool and queued on the socket's send queue
//! (`tcps::Client::send_async`), and the call returns at once, with no
//! round trip (`docs/PRELOAD.md`, "Sends").
//!
//! The room is bounded like a kernel socket buffer: at most SO_SNDBUF bytes
//! queued and not yet finished by the server, and a free descriptor. A full
//! queue gives a non-blocking socket EAGAIN (or a short write, as the
//! kernel), and `poll`/`epoll` report POLLOUT only when there is room
//! ([`poll`]). `TCPS_ASYNC_SEND=0` keeps every send synchronous.

use crate::fdtable;
use crate::real;
use libc::c_int;
use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};

/// Flags an asynchronous send takes; any other goes the synchronous way.
const ASYNC_FLAGS: c_int = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | libc::MSG_MORE;

/// Below the smallest SO_SNDBUF the kernel grants a TCP socket (about
/// 4.5 KiB): a backlog this small never needs the option read, so a short
/// connection pays no getsockopt round trip.
const SURE_ROOM: u64 = 4096;

static ASYNC: tcps::Switch = tcps::Switch::new("TCPS_ASYNC_SEND");

/// Whether sends are asynchronous (`TCPS_ASYNC_SEND`, default on; `0`,
/// `off`, `no` or `false` switch it off). Read once (the load-time hook
/// reads it first, before the program can change its environment).
pub fn enabled() -> bool {
    ASYNC.on()
}

/// The socket's SO_SNDBUF, read once (a round trip) and cached per id.
/// The first connection a listener accepted reads it for all that follow
/// ([`accepted`]): the kernel gives a listener's connections the same
/// start (the listener's SO_SNDBUF if the program set one, else what the
/// route autotunes to), and a per-connection round trip would cost a
/// short-lived connection (an HTTP/1.0 request) more than its send.
fn sndbuf(c: &Client, id: u32) -> u64 {
    let st = fdtable::id_state(c, id);
    let v = st.sndbuf.load(Ordering::Relaxed);
    if v != 0 {
        return u64::from(v);
    }
    let v = c
        .getsockopt_int(id, libc::SOL_SOCKET, libc::SO_SNDBUF)
        .ok()
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .unwrap_or(SURE_ROOM as u32);
    st.sndbuf.store(v, Ordering::Relaxed);
    if let Some(listener) = st.parent.swap(0, Ordering::Relaxed).checked_sub(1) {
        let l = fdtable::id_state(c, listener);
        let _ = l
            .child_sndbuf
            .compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed);
    }
    u64::from(v)
}

/// Connection `id` was accepted from `listener`: it starts with the
/// SO_SNDBUF the listener's first connection read, or reads it for the
/// ones after it.
pub fn accepted(c: &Client, listener: u32, id: u32) {
    let st = fdtable::id_state(c, id);
    match fdtable::id_state(c, listener)
        .child_sndbuf
        .load(Ordering::Relaxed)
    {
        0 => st.parent.store(listener + 1, Ordering::Relaxed),
        v => st.sndbuf.store(v, Ordering::Relaxed),
    }
}

/// The program set SO_SNDBUF: read it again at the next send (and, on a
/// listener, on its next connection).
pub fn sndbuf_changed(c: &Client, id: u32) {
    let st = fdtable::id_state(c, id);
    st.sndbuf.store(0, Ordering::Relaxed);
    st.child_sndbuf.store(0, Ordering::Relaxed);
}

/// Bytes that fit into `id`'s send queue now, capped at `want`
/// (`u64::MAX`: a failed socket, whose next send reports the error).
fn room(c: &Client, id: u32, want: u64) -> u64 {
    let b = c.send_backlog(id);
    if b.failed {
        return u64::MAX;
    }
    if !b.credit {
        return 0;
    }
    if b.queued + want <= SURE_ROOM {
        return want;
    }
    sndbuf(c, id).saturating_sub(b.queued).min(want)
}

/// Whether the placeholder `fd` (which carries O_NONBLOCK) is non-blocking.
fn fd_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on an fd; a bad fd answers -1.
    let fl = unsafe { real::fcntl()(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Sends `data` on `id` asynchronously if it can: `Some(result)`, or `None`
/// when the caller must send synchronously.
///
/// A blocking socket without room sends synchronously rather than waiting
/// for room here: the server runs that send after every queued descriptor
/// (so the stream stays in order) and parks it until the kernel socket
/// takes the bytes, which is exactly a blocking write, with SO_SNDTIMEO,
/// signals (EINTR) and errors handled where they already are. Waiting here
/// instead would need a wake-up per freed byte range, which the queue does
/// not give (its `done` counts descriptors), and a second copy of the
/// timeout and signal handling.
pub fn try_send(
    c: &Client,
    fd: c_int,
    id: u32,
    data: &[u8],
    flags: c_int,
) -> Option<io::Result<usize>> {
    if data.is_empty() || flags & !ASYNC_FLAGS != 0 || !enabled() || fdtable::is_broken(c, id) {
        return None;
    }
    let len = data.len() as u64;
    let fits = room(c, id, len);
    // Never wait inside the host library: MSG_DONTWAIT makes a full queue or
    // pool EAGAIN, handled below.
    let quick = flags | libc::MSG_DONTWAIT;
    if fits >= len {
        match c.send_async(id, data, quick) {
            Ok(n) if n == data.len() => return Some(Ok(n)),
            Ok(n) => return Some(rest(c, fd, id, data, n, flags)),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(e) => return Some(Err(e)),
        }
    }
    if flags & libc::MSG_DONTWAIT == 0 && !fd_nonblocking(fd) {
        return None;
    }
    // Non-blocking, no room for all of it: a short write, as the kernel.
    let fits = room(c, id, len).min(len);
    if fits == 0 {
        return Some(Err(io::Error::from_raw_os_error(libc::EAGAIN)));
    }
    Some(c.send_async(id, &data[..fits as usize], quick))
}

/// How far a queued file range may take the backlog past SO_SNDBUF (the
/// kernel's largest segment: see [`try_sendfile`]).
const FILE_OVERSHOOT: u64 = 64 << 10;

/// Queues `count` bytes at `off` of file handle `file` on `id` (an
/// asynchronous sendfile; `nonblocking`: the socket's O_NONBLOCK): `Some(bytes queued)`, or `None` when the caller
/// must send synchronously.
///
/// Bounded like a kernel socket buffer: the file bytes count against the
/// SO_SNDBUF budget of the queue until the server sent them. The rule is
/// the kernel's: a send is taken while the backlog is below SO_SNDBUF, and
/// may overshoot it by one segment of at most [`FILE_OVERSHOOT`] (the
/// kernel copies into a fresh skb of up to 64 KiB once memory is free), so
/// an nginx response (headers written, then a 16 KiB file) is taken whole
/// as the kernel takes it. Beyond that a non-blocking socket queues what
/// fits and returns the short count (as the kernel's non-blocking sendfile
/// returns what fitted into its socket buffer), or EAGAIN with no room at
/// all; a blocking one queues what fits and the caller sends the rest
/// synchronously (which waits), for the reasons given at [`try_send`].
pub fn try_sendfile(
    c: &Client,
    id: u32,
    nonblocking: bool,
    (file, off, count): (u32, u64, u64),
) -> Option<io::Result<usize>> {
    if count == 0 || !enabled() || fdtable::is_broken(c, id) {
        return None;
    }
    // `u64::MAX`: a failed socket, whose error the submit reports.
    let free = room(c, id, count);
    let fits = match free {
        0 => 0,
        f => f.saturating_add(FILE_OVERSHOOT).min(count),
    };
    let fits = fits.min(u64::from(tcps_proto::sendq::MAX_FILE_LEN));
    let eagain = || Some(Err(io::Error::from_raw_os_error(libc::EAGAIN)));
    if fits == 0 {
        return if nonblocking { eagain() } else { None };
    }
    match c.sendfile_async(id, file, off, fits as u32, libc::MSG_DONTWAIT) {
        Ok(_) => Some(Ok(fits as usize)),
        Err(e) => match e.raw_os_error() {
            Some(libc::EAGAIN) if nonblocking => eagain(),
            // No credit for a blocking socket, or no send queue.
            Some(libc::EAGAIN | libc::EOPNOTSUPP) => None,
            _ => Some(Err(e)),
        },
    }
}

/// After a short asynchronous send of `n` bytes: a non-blocking socket
/// returns the short count, a blocking one sends the rest synchronously.
fn rest(c: &Client, fd: c_int, id: u32, data: &[u8], n: usize, flags: c_int) -> io::Result<usize> {
    if flags & libc::MSG_DONTWAIT != 0 || fd_nonblocking(fd) {
        return Ok(n);
    }
    match c.send(id, &data[n..], flags & !libc::MSG_NOSIGNAL) {
        Ok(m) => Ok(n + m),
        Err(_) => Ok(n),
    }
}

/// Whether a write on `id` would not get EAGAIN from the send queue.
pub fn writable(c: &Client, id: u32) -> bool {
    room(c, id, 1) > 0
}

/// POLLOUT answered here, with no round trip, when an entry's socket has a
/// send queue with room (and no failed send: the error bits of a broken
/// connection are the server's to report): the call then waits for
/// nothing, and the other entries' readiness is only looked at (`poll` with
/// timeout 0, answered from the rings where they have them). An entry
/// that asked for nothing but POLLOUT is not asked at all. `None`: no
/// entry is writable that way.
fn poll_with_room(c: &Client, fds: &mut [PollFd], ranks: &mut [u16]) -> io::Result<Option<usize>> {
    let has_room = |f: &PollFd| {
        f.events & libc::POLLOUT != 0 && {
            let b = c.send_backlog(f.sock);
            b.bound && !b.failed && b.credit && room(c, f.sock, 1) > 0
        }
    };
    let local: Vec<bool> = fds.iter().map(has_room).collect();
    if !local.contains(&true) {
        return Ok(None);
    }
    let mut ask = Vec::with_capacity(fds.len());
    let mut at = Vec::with_capacity(fds.len());
    for (i, (f, &l)) in fds.iter().zip(&local).enumerate() {
        let events = if l {
            f.events & !libc::POLLOUT
        } else {
            f.events
        };
        if events != 0 {
            ask.push(PollFd {
                events,
                revents: 0,
                ..*f
            });
            at.push(i);
        }
    }
    let mut ask_ranks = vec![0u16; ask.len()];
    if !ask.is_empty() {
        c.poll_ranked(&mut ask, &mut ask_ranks, 0)?;
    }
    // Writable only: after everything that became readable.
    for ((f, r), &l) in fds.iter_mut().zip(ranks.iter_mut()).zip(&local) {
        f.revents = if l { libc::POLLOUT } else { 0 };
        *r = u16::MAX;
    }
    for ((a, &i), &r) in ask.iter().zip(&at).zip(&ask_ranks) {
        fds[i].revents |= a.revents;
        if a.revents != 0 {
            ranks[i] = r;
        }
    }
    Ok(Some(fds.iter().filter(|f| f.revents != 0).count()))
}

/// The longest single server poll while a POLLOUT entry waits for room in
/// its send queue: the queue's `done` moves without telling the server's
/// poll, so the wait is sliced.
const ROOM_SLICE_MAX: Duration = Duration::from_millis(8);

/// `Client::poll` where POLLOUT means "a write would not get EAGAIN": the
/// kernel socket at the server may be writable while this host's send
/// queue is full. Entries without room are asked without POLLOUT (so the
/// server does not answer at once for them) and get POLLOUT when room
/// appears; while some wait for room, the wait is sliced (1 ms, doubling to
/// 8 ms), so a program waiting for POLLOUT sleeps, never spins.
pub fn poll(c: &Client, fds: &mut [PollFd], timeout: c_int) -> io::Result<usize> {
    let mut ranks = vec![0u16; fds.len()];
    poll_ranked(c, fds, &mut ranks, timeout)
}

/// [`poll`] with the arrival ranks of the ready entries
/// (`Client::poll_ranked`; entries made writable here rank as the server
/// left them).
pub fn poll_ranked(
    c: &Client,
    fds: &mut [PollFd],
    ranks: &mut [u16],
    timeout: c_int,
) -> io::Result<usize> {
    let r = poll_ranked_here(c, fds, ranks, timeout);
    for f in fds.iter_mut() {
        // An error kept here for the program (`IdState::pending_err`); one
        // that ended the receive ring and a call already reported is
        // cleared, as the kernel's is.
        if fdtable::has_error(c, f.sock) {
            f.revents |= libc::POLLERR;
        } else if f.revents & libc::POLLERR != 0 && c.ring_error_reported(f.sock) {
            f.revents &= !libc::POLLERR;
        }
        // A broken connection the program was told of: its next send must
        // fail at the call as the kernel's does (`IdState::broken`).
        if f.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            fdtable::note_broken(c, f.sock);
        }
    }
    r.map(|n| n.max(fds.iter().filter(|f| f.revents != 0).count()))
}

fn poll_ranked_here(
    c: &Client,
    fds: &mut [PollFd],
    ranks: &mut [u16],
    timeout: c_int,
) -> io::Result<usize> {
    let wants_out = |f: &PollFd| f.events & libc::POLLOUT != 0;
    if !enabled() || !fds.iter().any(wants_out) {
        return c.poll_ranked(fds, ranks, timeout);
    }
    if let Some(n) = poll_with_room(c, fds, ranks)? {
        return Ok(n);
    }
    let deadline = (timeout > 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let mut slice = Duration::from_millis(1);
    loop {
        let full: Vec<bool> = fds
            .iter()
            .map(|f| wants_out(f) && !writable(c, f.sock))
            .collect();
        if !full.contains(&true) {
            return c.poll_ranked(fds, ranks, timeout);
        }
        let mut ask: Vec<PollFd> = fds.to_vec();
        for (a, &f) in ask.iter_mut().zip(&full) {
            if f {
                a.events &= !libc::POLLOUT;
            }
        }
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None if timeout < 0 => slice,
            None => Duration::ZERO,
        };
        let t = left.min(slice);
        if ask.iter().any(|a| a.events != 0) {
            c.poll_ranked(&mut ask, ranks, t.as_millis() as c_int)?;
        } else {
            // Only full queues to wait for: nothing to ask the server.
            std::thread::sleep(t);
        }
        let mut n = 0;
        for ((f, a), &was_full) in fds.iter_mut().zip(&ask).zip(&full) {
            f.revents = a.revents;
            if was_full && writable(c, f.sock) {
                f.revents |= libc::POLLOUT;
            }
            n += usize::from(f.revents != 0);
        }
        if n > 0 || (timeout >= 0 && left <= t) {
            return Ok(n);
        }
        slice = (slice * 2).min(ROOM_SLICE_MAX);
    }
}

/// How long a fork or exec waits, in all, for queued sends to go out.
const FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// Before fork and exec: lets every socket's queued sends go out first, so
/// that what the program wrote before is in the kernel socket (as with
/// kernel sockets) before a child's or a new image's writes can follow.
/// Bounded (a peer that does not read must not hang the fork).
pub fn flush_all(c: &Client) {
    if !enabled() {
        return;
    }
    let end = Instant::now() + FLUSH_LIMIT;
    for (_, id) in fdtable::all_in(crate::state::epoch_of(c)) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        // A signal ends a wait (EINTR); this one goes on to its bound.
        while let Err(e) = c.flush_async(id, Some(end.saturating_duration_since(Instant::now()))) {
            if e.raw_os_error() != Some(libc::EINTR) || Instant::now() >= end {
                break;
            }
        }
    }
}

/// How long a non-blocking call waits in [`drain`] before EAGAIN.
const NONBLOCKING_DRAIN: Duration = Duration::from_millis(100);

/// Before a call the server does not order behind the send queue
/// (sendfile): waits until `id`'s queued sends went out, or returns the
/// error of one that failed. A non-blocking socket waits a little (a peer
/// that reads takes a backlog of at most SO_SNDBUF in far less) and then
/// gets EAGAIN.
pub fn drain(c: &Client, id: u32, nonblocking: bool) -> Result<(), i32> {
    let b = c.send_backlog(id);
    if b.queued == 0 && !b.failed {
        return Ok(());
    }
    let limit = nonblocking.then_some(NONBLOCKING_DRAIN);
    match c.flush_async(id, limit) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => Err(libc::EAGAIN),
        Err(e) => Err(crate::errno::errno_of(&e)),
    }
}
