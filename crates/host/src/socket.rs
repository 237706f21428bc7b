//! The host's record of one socket (TAS's `struct socket`): everything this
//! library knows about a socket id, in one entry of one table, found with
//! one lookup ([`Sockets::get`]).
//!
//! * **Facts of the socket**: O_NONBLOCK as this library tracks it (a
//!   socket accepted eagerly is blocking at the server whatever `accept4`'s
//!   flags say, so non-blocking-ness is a host matter, and requests of a
//!   socket that is non-blocking here carry `MSG_DONTWAIT`), and this
//!   process's own kernel descriptor (`crate::kernelfd`). Both are atomics
//!   of their own: any call may read them, whichever side's lock it holds.
//! * **The receive side** ([`RecvSide`], `crate::eager`): how the socket
//!   receives, its receive or accept ring cursor, SO_RCVTIMEO, and what the
//!   library must remember between calls (accepted and open, shut for
//!   writing, broken, closed without an answer).
//! * **The send side** ([`SendSide`], `crate::sendq`): the send queue
//!   binding, its cursor and the descriptors in flight.
//!
//! The two sides have spin locks of their own, so a receiving thread and a
//! sending thread of one connection do not contend. Each lock is held for
//! a few dozen instructions (or one bounded copy out of a receive ring),
//! never across a wait.

use crate::sys;
use crate::table::{SockTable, SpinGuard, SpinLock};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;
use tcps_proto::eager::RecvCursor;

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
    /// The socket's receive ring is bound.
    Bytes,
    /// The listener's accept ring is bound.
    Accept,
}

/// The receive side of a socket (behind its spin lock; see `crate::eager`).
#[derive(Default)]
pub(crate) struct RecvSide {
    pub mode: Mode,
    /// The ring position consumed (`head` in shared memory is its public
    /// copy) and the kicks posted for this binding.
    pub cur: RecvCursor,
    /// Accept ring: a kick told the server connections are wanted.
    pub demand: bool,
    /// The ring's `END_ERROR` was returned (once; later recvs get 0).
    pub end_reported: bool,
    /// SO_RCVTIMEO as set through this library (`None`: no limit).
    pub rcvtimeo: Option<Duration>,
    /// SO_RCVLOWAT as set through this library (0: never set, i.e. 1).
    pub rcvlowat: usize,
    /// A connection this library accepted and has not closed: closing it
    /// cannot fail and frees nothing another call could be waiting for
    /// (its port is the listener's), so `close` need not wait for the
    /// answer. Sockets from `socket` (listeners, bound ports that a next
    /// `bind` may want again) are closed with a round trip.
    pub accepted_open: bool,
    /// A first `shutdown(SHUT_WR)` went unanswered (the next waits).
    pub write_shut: bool,
    /// A call on the socket failed as a reset or closed connection would
    /// (ECONNRESET, EPIPE, ...): a shutdown must ask the server.
    pub broken: bool,
    /// Closed without waiting for the answer: until the id is handed out
    /// again, calls on it fail with EBADF here, since a call on another
    /// channel could overtake the close at the server.
    pub closed_unanswered: bool,
    /// Counters, summed by `stats` and folded into [`RecvCounters`] when
    /// the side is reset (no shared atomic on the receive path).
    pub recvs: u64,
    pub accepts: u64,
    pub bytes: u64,
    pub copied: u64,
}

/// A descriptor in flight, as the host remembers it.
pub(crate) struct Pending {
    pub seq: u32,
    pub mem: u16,
    /// Staged bytes to free (copying sends).
    pub pool: Option<(u32, u32)>,
    /// The descriptor's length (the socket's `queued` bytes).
    pub len: u32,
}

/// The send side of a socket (behind its spin lock; see `crate::sendq`).
#[derive(Default)]
pub(crate) struct SendSide {
    /// The bound send queue (its index is the socket id).
    pub queue: Option<u32>,
    pub gen: u32,
    pub head: u32,
    /// `done` as last read.
    pub done: u32,
    pub kicks_sent: u32,
    /// The server refused to bind the socket's queue (`AsyncBind` failed
    /// with EBUSY or EINVAL): its asynchronous sends run synchronously.
    pub no_queue: bool,
    /// Shut down for writing (`shutdown`): sends run synchronously, and
    /// the kernel refuses them at the call (EPIPE) as it would.
    pub write_shut: bool,
    /// errno of a failed send, once seen in the queue; `reported` once a
    /// later call returned it.
    pub error: i32,
    pub reported: bool,
    pub misuse_seen: u32,
    pub pending: VecDeque<Pending>,
    /// Bytes of `pending` (queued, not yet finished by the server): the
    /// preload bounds it by SO_SNDBUF like a kernel socket buffer.
    pub queued: u64,
    /// Sends queued and bytes handed to the server, counted here (under the
    /// side's lock, no shared atomic on the send path) and summed by
    /// `stats`; folded into the attachment's counters when the socket closes.
    pub sends: u64,
    pub bytes: u64,
}

impl SendSide {
    /// The error to return now (once); later asynchronous sends get EPIPE.
    pub fn report(&mut self) -> io::Error {
        if self.reported {
            return errno(libc::EPIPE);
        }
        self.reported = true;
        errno(self.error)
    }
}

/// Option values read from the server and kept (`crate::optcache`).
#[derive(Default)]
pub(crate) struct OptCache {
    /// The socket is shared with another process (fork): its options may
    /// change behind this library's back, so nothing is kept.
    pub shared: bool,
    /// Per cached option (`optcache::slot`): the value and its length.
    pub vals: [Option<([u8; 16], u8)>; 3],
    /// Counts forgets: an answer asked for before a set must not be kept.
    pub gen: u32,
}

const NB_UNKNOWN: u8 = 0;
const NB_OFF: u8 = 1;
const NB_ON: u8 = 2;

/// One socket id's record.
#[derive(Default)]
pub(crate) struct Socket {
    /// `NB_*`: unknown (e.g. a socket inherited over fork; the server's
    /// flag is then asked once), off or on. Relaxed: a flag on its own,
    /// ordered with nothing else (it used to be a field under each side's
    /// lock, set by `fcntl` with no ordering against other threads' calls).
    nonblocking: AtomicU8,
    /// `fd + 1` of this process's own descriptor of the socket (0: none).
    kfd: AtomicI32,
    pub opts: SpinLock<OptCache>,
    pub recv: SpinLock<RecvSide>,
    pub send: SpinLock<SendSide>,
}

impl Socket {
    /// O_NONBLOCK as this library tracks it (`None`: not known here).
    pub fn nonblocking(&self) -> Option<bool> {
        match self.nonblocking.load(Ordering::Relaxed) {
            NB_OFF => Some(false),
            NB_ON => Some(true),
            _ => None,
        }
    }

    /// O_NONBLOCK changed (`fcntl`), or the socket was handed out.
    pub fn set_nonblocking(&self, on: bool) {
        let v = if on { NB_ON } else { NB_OFF };
        self.nonblocking.store(v, Ordering::Relaxed);
    }

    /// The server's O_NONBLOCK, learnt by a request: kept unless this
    /// library knew better meanwhile. Returns the flag as tracked now.
    pub fn learn_nonblocking(&self, on: bool) -> bool {
        let v = if on { NB_ON } else { NB_OFF };
        let _ =
            self.nonblocking
                .compare_exchange(NB_UNKNOWN, v, Ordering::Relaxed, Ordering::Relaxed);
        self.nonblocking() == Some(true)
    }

    /// The socket was closed: nothing is known of the id any more.
    fn forget_nonblocking(&self) {
        self.nonblocking.store(NB_UNKNOWN, Ordering::Relaxed);
    }

    /// `flags` of a request on the socket, with `MSG_DONTWAIT` if it is
    /// non-blocking here (the server may think it blocking).
    pub fn request_flags(&self, flags: i32) -> i32 {
        if self.nonblocking() == Some(true) {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        }
    }

    /// This process's descriptor of the socket, if it has one.
    pub fn kfd(&self) -> Option<RawFd> {
        let v = self.kfd.load(Ordering::Acquire);
        (v > 0).then_some(v - 1)
    }

    /// Records `fd` as the socket's (closing one recorded before).
    pub fn set_kfd(&self, fd: RawFd) {
        let old = self.kfd.swap(fd + 1, Ordering::AcqRel);
        if old > 0 {
            sys::close(old - 1);
        }
    }

    /// Takes the socket's descriptor out (the caller closes it).
    pub fn take_kfd(&self) -> Option<RawFd> {
        let v = self.kfd.swap(0, Ordering::AcqRel);
        (v > 0).then_some(v - 1)
    }
}

/// Counters of receive sides that were reset, and the kicks.
#[derive(Default)]
pub(crate) struct RecvCounters {
    pub recvs: AtomicU64,
    pub accepts: AtomicU64,
    pub bytes: AtomicU64,
    pub copied: AtomicU64,
    pub kicks: AtomicU64,
}

/// Receive counters for [`crate::channel::HostStats`].
#[derive(Clone, Copy, Default)]
pub(crate) struct RecvStats {
    pub ring_recvs: u64,
    pub ring_accepts: u64,
    pub recv_kicks: u64,
    pub bytes_received: u64,
    pub bytes_copied: u64,
}

/// The records of an attachment's sockets.
pub(crate) struct Sockets {
    table: SockTable<Socket>,
    pub recv_counters: RecvCounters,
}

impl Sockets {
    pub fn new() -> Sockets {
        Sockets {
            table: SockTable::new(),
            recv_counters: RecvCounters::default(),
        }
    }

    /// The record of socket `s`, if it was ever created.
    #[inline]
    pub fn get(&self, s: u32) -> Option<&Socket> {
        self.table.get(s)
    }

    /// The record of socket `s`, created on first use; EBADF for an id
    /// beyond any the server hands out.
    #[inline]
    pub fn get_or_insert(&self, s: u32) -> io::Result<&Socket> {
        self.table.get_or_insert(s).ok_or(errno(libc::EBADF))
    }

    /// Every record with its socket id.
    pub fn for_each(&self, f: impl FnMut(u32, &Socket)) {
        self.table.for_each(f)
    }

    /// Whether `f` holds for any record.
    pub fn any(&self, f: impl FnMut(&Socket) -> bool) -> bool {
        self.table.any(f)
    }

    /// Resets a receive side to `fresh`, keeping its counts.
    pub fn reset_recv(&self, g: &mut SpinGuard<'_, RecvSide>, fresh: RecvSide) {
        let c = &self.recv_counters;
        c.recvs.fetch_add(g.recvs, Ordering::Relaxed);
        c.accepts.fetch_add(g.accepts, Ordering::Relaxed);
        c.bytes.fetch_add(g.bytes, Ordering::Relaxed);
        c.copied.fetch_add(g.copied, Ordering::Relaxed);
        **g = fresh;
    }

    /// `s` is being closed: forgets its receive side, its O_NONBLOCK and
    /// its kept options.
    /// Returns whether it was a connection this library accepted and had
    /// not closed yet (of two racing closes, one sees true).
    pub fn close_recv(&self, s: u32) -> bool {
        let Some(sock) = self.get(s) else {
            return false;
        };
        let mut g = sock.recv.lock();
        let accepted_open = g.accepted_open;
        let after = RecvSide {
            closed_unanswered: accepted_open,
            ..RecvSide::default()
        };
        self.reset_recv(&mut g, after);
        sock.forget_nonblocking();
        let mut opts = sock.opts.lock();
        *opts = OptCache {
            gen: opts.gen.wrapping_add(1),
            ..OptCache::default()
        };
        accepted_open
    }

    /// Whether `s` was closed without waiting and not handed out since
    /// (see [`RecvSide::closed_unanswered`]).
    pub fn closed_unanswered(&self, s: u32) -> bool {
        self.get(s).is_some_and(|k| k.recv.lock().closed_unanswered)
    }

    /// A call on `s` failed with `e`: remember a sign of a reset or closed
    /// connection (see [`RecvSide::broken`]).
    pub fn note_error(&self, s: u32, e: i32) {
        if matches!(
            e,
            libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN | libc::ETIMEDOUT | libc::ECONNABORTED
        ) {
            if let Some(k) = self.get(s) {
                k.recv.lock().broken = true;
            }
        }
    }

    /// The receive counters: those of reset sides and the live ones.
    pub fn recv_stats(&self) -> RecvStats {
        let c = &self.recv_counters;
        let mut s = RecvStats {
            ring_recvs: c.recvs.load(Ordering::Relaxed),
            ring_accepts: c.accepts.load(Ordering::Relaxed),
            recv_kicks: c.kicks.load(Ordering::Relaxed),
            bytes_received: c.bytes.load(Ordering::Relaxed),
            bytes_copied: c.copied.load(Ordering::Relaxed),
        };
        self.table.for_each(|_, k| {
            let g = k.recv.lock();
            s.ring_recvs += g.recvs;
            s.ring_accepts += g.accepts;
            s.bytes_received += g.bytes;
            s.bytes_copied += g.copied;
        });
        s
    }

    /// Every (socket, descriptor) pair of this process (fork: the child
    /// keeps them).
    pub fn kernel_fds(&self) -> Vec<(u32, RawFd)> {
        let mut out = Vec::new();
        self.table.for_each(|id, k| {
            if let Some(fd) = k.kfd() {
                out.push((id, fd));
            }
        });
        out
    }
}

impl Drop for Sockets {
    fn drop(&mut self) {
        self.table.for_each(|_, k| {
            if let Some(fd) = k.take_kfd() {
                sys::close(fd);
            }
        });
    }
}
