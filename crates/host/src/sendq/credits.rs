//! What the server finished: refreshing a socket's books from its queue
//! (`done`, the first error, the debug-mode misuse count), freeing what
//! finished, waiting for credits or for one send, and reporting a failed
//! send once.

use super::shared::IoHandle;
use crate::client::Client;
use crate::interrupt::{self, Mark};
use crate::socket::{Pending, SendSide, Socket};
use crate::sys::errno;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};
use tcps_proto::sendq::{self, SendQueueProducer};

/// A socket's send queue as [`Client::send_backlog`] finds it.
#[derive(Clone, Copy, Debug)]
pub struct SendBacklog {
    /// Bytes queued and not yet finished by the server.
    pub queued: u64,
    /// A descriptor is free.
    pub credit: bool,
    /// An earlier asynchronous send failed: the next send reports it.
    pub failed: bool,
    /// The socket has a send queue (it sent asynchronously before): room
    /// in it is what a write needs, so POLLOUT can be answered from it.
    pub bound: bool,
}

/// The longest single futex sleep while waiting for a queue.
pub(super) const WAIT_SLICE: Duration = Duration::from_millis(100);

impl Client {
    /// Reads `done`, the error and the misuse count of the socket's queue,
    /// and forgets (frees) the descriptors that finished.
    pub(super) fn refresh(&self, g: &mut SendSide, sq: &SendQueueProducer<'_>) {
        let done = sq.done();
        g.done = done;
        if g.error == 0 {
            let e = sq.error();
            if e != 0 {
                g.error = e;
            }
        }
        let st = &self.conn.sendq;
        if st.debug.load(Ordering::Relaxed) {
            let m = sq.misuse();
            if m != g.misuse_seen {
                let n = m.wrapping_sub(g.misuse_seen);
                g.misuse_seen = m;
                st.counters
                    .misused
                    .fetch_add(u64::from(n), Ordering::Relaxed);
                eprintln!(
                    "tcps: {n} registered buffer(s) were written while their asynchronous send was in flight (TCPS_DEBUG_REGISTERED)"
                );
            }
        }
        let freed = self.forget_done(&mut g.pending, done);
        g.queued = g.queued.saturating_sub(freed);
    }

    /// [`refresh`](Self::refresh) for a socket bound to a queue (else nothing).
    pub(super) fn refresh_bound(&self, g: &mut SendSide) {
        if let Some(q) = g.queue {
            let sq = self.conn.send_queue(q);
            self.refresh(g, &sq);
        }
    }

    /// Drops the finished descriptors of `pending`, freeing staged bytes;
    /// returns how many bytes they carried.
    pub(super) fn forget_done(&self, pending: &mut VecDeque<Pending>, done: u32) -> u64 {
        let mut freed = 0;
        while let Some(p) = pending.front() {
            if !sendq::is_done(p.seq, done) {
                break;
            }
            if let (Some((off, n)), Ok(pool)) = (p.pool, self.pool()) {
                pool.free(off, n);
            }
            freed += u64::from(p.len);
            pending.pop_front();
        }
        freed
    }

    /// Frees what the orphaned queues finished, and forgets the queues the
    /// server released.
    pub(super) fn reap_orphans(&self) {
        let st = &self.conn.sendq;
        let mut orphans = st.orphans.lock().unwrap_or_else(PoisonError::into_inner);
        orphans.retain_mut(|o| {
            let sq = self.conn.send_queue(o.queue);
            let released = sq.released();
            let done = sq.done();
            if released {
                // The server is finished with the queue: everything is done.
                self.forget_done(&mut o.pending, done.wrapping_add(1 << 30));
                return false;
            }
            self.forget_done(&mut o.pending, done);
            true
        });
    }

    /// Sleeps until the queue's `done` moves from `seen` (or `max` passes,
    /// at most a slice). ECONNRESET if the server died; EINTR if a signal
    /// handler ran meanwhile and nothing moved (`crate::interrupt`).
    pub(super) fn wait_queue(
        &self,
        sq: &SendQueueProducer<'_>,
        seen: u32,
        max: Duration,
    ) -> io::Result<()> {
        let mark = Mark::new();
        let hit = interrupt::futex_interrupted(|| sq.wait(seen, max.min(WAIT_SLICE)));
        if (hit || mark.seen()) && sq.done() == seen {
            return Err(interrupt::eintr());
        }
        if !self.conn.server_alive() {
            return Err(errno(libc::ECONNRESET));
        }
        Ok(())
    }

    /// Whether the send `io` finished: `Ok(true)` sent, `Ok(false)` still in
    /// flight, an error if it (or an earlier send of its socket) failed.
    pub fn io_done(&self, io: IoHandle) -> io::Result<bool> {
        if io == IoHandle::DONE {
            return Ok(true);
        }
        let (q, gen, seq) = io.parts();
        let cur = self.conn.sendq.gens.get(q as usize);
        let cur = cur.ok_or(errno(libc::EINVAL))?;
        if cur.load(Ordering::Acquire) & 0xff != gen {
            // The queue was bound anew, which happens only after every send
            // of its old socket finished.
            return Ok(true);
        }
        let sq = self.conn.send_queue(q);
        if !sendq::is_done(seq, sq.done()) {
            self.conn.check_open(libc::ECONNRESET)?;
            return Ok(false);
        }
        if let Some(e) = sq.failed(seq) {
            return Err(errno(e));
        }
        Ok(true)
    }

    /// Waits until the send `io` finished: Ok once sent, its error if it
    /// failed, ETIMEDOUT after `timeout` (`None`: no limit).
    pub fn io_wait(&self, io: IoHandle, timeout: Option<Duration>) -> io::Result<()> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.io_done(io)? {
                return Ok(());
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => l,
                    _ => return Err(errno(libc::ETIMEDOUT)),
                },
                None => WAIT_SLICE,
            };
            let (q, _, _) = io.parts();
            let sq = self.conn.send_queue(q);
            let seen = sq.done();
            if !self.io_done(io)? {
                self.wait_queue(&sq, seen, left)?;
            }
        }
    }

    /// Waits until every asynchronous send of socket `s` finished (Ok), or
    /// returns the first failure.
    pub fn flush_async(&self, s: u32, timeout: Option<Duration>) -> io::Result<()> {
        let Some(sock) = self.conn.socks.get(s) else {
            return Ok(());
        };
        let last = {
            let g = sock.send.lock();
            match g.queue {
                Some(q) if g.head != g.done || !g.pending.is_empty() => {
                    IoHandle::new(q, g.gen, g.head.wrapping_sub(1))
                }
                _ => return Ok(()),
            }
        };
        self.io_wait(last, timeout)?;
        // Bring the socket's books up to date (frees staging, reads the
        // debug-mode misuse count).
        self.refresh_bound(&mut sock.send.lock());
        Ok(())
    }

    /// The send queue's backlog on `s`: bytes of asynchronous sends the
    /// server has not finished, and whether the queue has a free descriptor
    /// (after reading what finished). A socket with no queue yet: nothing
    /// queued, a free descriptor. The preload bounds the backlog by SO_SNDBUF, as the kernel
    /// bounds a socket buffer.
    pub fn send_backlog(&self, s: u32) -> SendBacklog {
        let idle = SendBacklog {
            queued: 0,
            credit: true,
            failed: false,
            bound: false,
        };
        let Some(sock) = self.conn.socks.get(s) else {
            return idle;
        };
        let mut g = sock.send.lock();
        let Some(q) = g.queue else {
            return idle;
        };
        let sq = self.conn.send_queue(q);
        if g.queued > 0 || !sq.has_credit(g.head, g.done) {
            self.refresh(&mut g, &sq);
        }
        SendBacklog {
            queued: g.queued,
            credit: sq.has_credit(g.head, g.done),
            failed: g.error != 0,
            bound: true,
        }
    }

    /// Whether an asynchronous send on `s` failed (reported or not): the
    /// connection is broken.
    pub(crate) fn sendq_failed(&self, s: u32) -> bool {
        let sock = self.conn.socks.get(s);
        sock.is_some_and(|k| k.send.lock().error != 0)
    }

    /// The error of an earlier asynchronous send on `s` not yet reported
    /// (each is reported once, by the next call on the socket).
    pub(crate) fn take_async_error(&self, s: u32) -> io::Result<()> {
        match self.conn.socks.get(s) {
            Some(sock) => self.async_error_of(sock),
            None => Ok(()),
        }
    }

    /// [`take_async_error`](Self::take_async_error) of a socket's record.
    pub(crate) fn async_error_of(&self, sock: &Socket) -> io::Result<()> {
        let mut g = sock.send.lock();
        if g.error == 0 {
            self.refresh_bound(&mut g);
        }
        if g.error != 0 && !g.reported {
            return Err(g.report());
        }
        Ok(())
    }
}
