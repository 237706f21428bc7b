//! Asynchronous sends and registered memory on the host (the protocol is in
//! `tcps_proto::sendq`).
//!
//! A socket's first asynchronous send binds it to its send queue (one
//! round trip; queue `s` belongs to socket id `s`, PROTOCOL §10, so sockets
//! with ids beyond the region's queues send synchronously). A connection
//! the server set up at accept (`SETUP_SENDQ`) is bound already. After that a send is: lock the socket's state (a spin lock
//! in host memory), check credits against the cached `done`, write one
//! 32-byte descriptor, store `head`, and kick the server only if it is not
//! watching the queue. No system call, no fence, no wait: the call returns
//! the full length as sent (thesis §5.5.1).
//!
//! * **Credits**: a queue holds `sq_entries` descriptors; a sender out of
//!   credits refreshes `done` and, if still out, waits on the futex `done`
//!   (blocking socket) or gets EAGAIN (non-blocking socket or MSG_DONTWAIT).
//! * **Completion tracking**: `done` and the first failure (`error`,
//!   `error_seq`) are in shared memory; an [`IoHandle`] names one
//!   descriptor, and [`Client::io_done`]/[`Client::io_wait`] read them.
//! * **Errors**: a failed asynchronous send is reported once on a later call
//!   on the socket (thesis semantics), and every later asynchronous send of
//!   the socket fails (the stream has a hole).
//! * **Copying sends** stage the bytes in a registered pool, freed as
//!   descriptors finish.
//! * **Closing** a socket with sends in flight hands its queue to the
//!   orphans: the server sends the rest and then closes; the staged bytes
//!   are freed once the server released the queue, or at the latest when
//!   the socket id is handed out again (the server frees an id only after
//!   its queue is unbound).
//! * **Debug mode** (`TCPS_DEBUG_REGISTERED=1`): each registered send
//!   carries a checksum of its bytes; the server counts a mismatch (the
//!   buffer was written while in flight), which the library reports.

mod pool;

use crate::client::Client;
use crate::table::{SockTable, SpinGuard};
use pool::Pool;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use tcps_proto::region::SendQueueRef;
use tcps_proto::sendq::{self, SendDesc, DESC_CHECKSUM, DESC_MORE};
use tcps_proto::{futex, Op, Request};

/// Default size of the staging pool of copying asynchronous sends.
const DEFAULT_POOL_KIB: usize = 16 * 1024;
/// The longest single futex sleep while waiting for a queue.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Flags an asynchronous send accepts.
const ASYNC_FLAGS: i32 = libc::MSG_DONTWAIT | libc::MSG_MORE | libc::MSG_NOSIGNAL;

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// One asynchronous send: which queue (and which binding of it) and which
/// descriptor. [`IoHandle::DONE`] is a send that completed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoHandle(pub u64);

impl IoHandle {
    /// A send that was executed synchronously (the socket has no queue).
    pub const DONE: IoHandle = IoHandle(u64::MAX);

    fn new(queue: u32, gen: u32, seq: u32) -> IoHandle {
        IoHandle((u64::from(queue) << 40) | (u64::from(gen & 0xff) << 32) | u64::from(seq))
    }

    fn parts(self) -> (u32, u32, u32) {
        (
            (self.0 >> 40) as u32,
            ((self.0 >> 32) & 0xff) as u32,
            self.0 as u32,
        )
    }
}

/// A descriptor in flight, as the host remembers it.
struct Pending {
    seq: u32,
    mem: u16,
    /// Staged bytes to free (copying sends).
    pool: Option<(u32, u32)>,
}

/// A socket's asynchronous-send state (behind its spin lock).
#[derive(Default)]
pub(crate) struct SockState {
    queue: Option<u32>,
    gen: u32,
    head: u32,
    /// `done` as last read.
    done: u32,
    kicks_sent: u32,
    nonblocking: bool,
    /// The server refused to bind the socket's queue (`AsyncBind` failed
    /// with EBUSY or EINVAL): its asynchronous sends run synchronously.
    no_queue: bool,
    /// errno of a failed send, once seen in the queue; `reported` once a
    /// later call returned it.
    error: i32,
    reported: bool,
    misuse_seen: u32,
    pending: VecDeque<Pending>,
    /// Sends queued and bytes handed to the server, counted here (under the
    /// socket's lock, no shared atomic on the send path) and summed by
    /// `stats`; folded into the attachment's counters when the socket closes.
    sends: u64,
    bytes: u64,
}

/// A closed socket's queue whose sends are still going out.
struct Orphan {
    queue: u32,
    pending: VecDeque<Pending>,
}

#[derive(Default)]
struct Counters {
    sends: AtomicU64,
    fallbacks: AtomicU64,
    kicks: AtomicU64,
    misuse: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_copied: AtomicU64,
}

/// The asynchronous-send state of an attachment.
pub(crate) struct AsyncState {
    socks: SockTable<SockState>,
    orphans: Mutex<Vec<Orphan>>,
    /// Host-side binding generation of each queue (names stale io handles).
    gens: Box<[AtomicU32]>,
    pool: OnceLock<Result<Pool, i32>>,
    /// Debug mode: `TCPS_DEBUG_REGISTERED` at attach, or
    /// [`Client::set_registered_debug`].
    debug: AtomicBool,
    counters: Counters,
}

/// Counters for [`crate::HostStats`].
#[derive(Clone, Copy, Default)]
pub(crate) struct AsyncStats {
    pub sends: u64,
    pub fallbacks: u64,
    pub kicks: u64,
    pub misuse: u64,
    pub bytes_sent: u64,
    pub bytes_copied: u64,
}

impl AsyncState {
    pub fn new(send_queues: u32) -> AsyncState {
        AsyncState {
            socks: SockTable::new(),
            orphans: Mutex::new(Vec::new()),
            gens: (0..send_queues).map(|_| AtomicU32::new(0)).collect(),
            pool: OnceLock::new(),
            debug: AtomicBool::new(
                std::env::var("TCPS_DEBUG_REGISTERED").is_ok_and(|v| v != "0" && !v.is_empty()),
            ),
            counters: Counters::default(),
        }
    }

    /// Adds a socket's own counters to the attachment's (before its state
    /// is reset).
    fn fold_counts(&self, g: &SockState) {
        self.counters.sends.fetch_add(g.sends, Ordering::Relaxed);
        self.counters
            .bytes_sent
            .fetch_add(g.bytes, Ordering::Relaxed);
    }

    pub fn stats(&self) -> AsyncStats {
        let c = &self.counters;
        let (mut sends, mut bytes) = (0, 0);
        self.socks.any(|g| {
            sends += g.sends;
            bytes += g.bytes;
            false
        });
        AsyncStats {
            sends: c.sends.load(Ordering::Relaxed) + sends,
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            kicks: c.kicks.load(Ordering::Relaxed),
            misuse: c.misuse.load(Ordering::Relaxed),
            bytes_sent: c.bytes_sent.load(Ordering::Relaxed) + bytes,
            bytes_copied: c.bytes_copied.load(Ordering::Relaxed),
        }
    }
}

/// Where an asynchronous send's bytes are.
enum Source<'a> {
    Registered {
        mem: u32,
        ptr: *const u8,
        len: usize,
    },
    Copy(&'a [u8]),
}

impl Client {
    fn asyncs(&self) -> &AsyncState {
        &self.conn.asyncs
    }

    /// Switches the debug mode of registered asynchronous sends on or off
    /// for sends submitted from now on (the default is
    /// `TCPS_DEBUG_REGISTERED` at attach): each send carries a checksum of
    /// its bytes, and the server counts a buffer written while in flight
    /// (`HostStats::registered_misuse`).
    pub fn set_registered_debug(&self, on: bool) {
        self.asyncs().debug.store(on, Ordering::Relaxed);
    }

    /// Sends `buf` asynchronously: copies it into registered staging memory
    /// and returns at once with its full length (the thesis' `AsyncSend`).
    /// Completion and errors: see the module docs. Falls back to a
    /// synchronous send if the socket has no send queue.
    pub fn send_async(&self, s: u32, buf: &[u8], flags: i32) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut sent = 0;
        for piece in buf.chunks(pool::MAX_PIECE) {
            match self.submit(s, Source::Copy(piece), flags) {
                Ok(_) => sent += piece.len(),
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(sent)
    }

    /// Sends `len` bytes at `ptr`, inside registration `mem`, asynchronously
    /// and with no copy. The bytes must stay untouched until the returned
    /// handle is done ([`io_done`](Self::io_done)).
    pub fn send_async_registered(
        &self,
        s: u32,
        ptr: *const u8,
        len: usize,
        flags: i32,
        mem: u32,
    ) -> io::Result<IoHandle> {
        self.submit(s, Source::Registered { mem, ptr, len }, flags)
    }

    /// One descriptor (see the module docs for the steps).
    fn submit(&self, s: u32, src: Source<'_>, flags: i32) -> io::Result<IoHandle> {
        let conn = &self.conn;
        conn.check_open(libc::EPIPE)?;
        if flags & !ASYNC_FLAGS != 0 {
            return Err(errno(libc::EINVAL));
        }
        let len = match &src {
            Source::Registered { len, .. } => *len,
            Source::Copy(b) => b.len(),
        };
        let len32 = u32::try_from(len).map_err(|_| errno(libc::EINVAL))?;
        if len == 0 {
            return Ok(IoHandle::DONE);
        }
        // Check the registration before anything else: unregistered memory
        // is EINVAL, whatever the socket's state.
        let registered = match src {
            Source::Registered { mem, ptr, len } => {
                Some((mem, conn.memory.offset_of(mem, ptr, len)?, ptr))
            }
            Source::Copy(_) => None,
        };
        let st = self.asyncs();
        let mut g = self.sock_state(s)?;
        let Some(q) = g.queue else {
            drop(g);
            return self.fallback(s, &src, len, flags);
        };
        let sq = conn.send_queue(q);
        let nonblocking = g.nonblocking || flags & libc::MSG_DONTWAIT != 0;
        let entries = sq.entries();
        // Credits.
        loop {
            if g.error != 0 {
                return Err(g.report());
            }
            if g.head.wrapping_sub(g.done) < entries {
                break;
            }
            self.refresh(&mut g, &sq);
            if g.error != 0 || g.head.wrapping_sub(g.done) < entries {
                continue;
            }
            if nonblocking {
                return Err(errno(libc::EAGAIN));
            }
            let seen = g.done;
            drop(g);
            self.wait_queue(&sq, seen, WAIT_SLICE)?;
            g = self.sock_state(s)?;
            if g.queue != Some(q) {
                return Err(errno(libc::EBADF)); // closed meanwhile
            }
        }
        // The bytes.
        let (mem, off, staged, checksum) = match (registered, &src) {
            (Some((mem, off, ptr)), _) => {
                let sum = st.debug.load(Ordering::Relaxed).then(|| {
                    // SAFETY: `ptr..ptr+len` lies inside a registration (checked).
                    sendq::checksum(unsafe { std::slice::from_raw_parts(ptr, len) })
                });
                (mem, off, None, sum)
            }
            (None, Source::Copy(bytes)) => {
                let pool = self.pool()?;
                let (off, n) = loop {
                    if let Some(r) = pool.alloc(len) {
                        break r;
                    }
                    // Free what finished, everywhere, then wait a little.
                    self.refresh(&mut g, &sq);
                    self.reap_orphans();
                    if let Some(r) = pool.alloc(len) {
                        break r;
                    }
                    if nonblocking {
                        return Err(errno(libc::EAGAIN));
                    }
                    drop(g);
                    std::thread::sleep(Duration::from_micros(50));
                    conn.check_open(libc::EPIPE)?;
                    g = self.sock_state(s)?;
                    if g.queue != Some(q) {
                        return Err(errno(libc::EBADF));
                    }
                };
                // SAFETY: the staged range is ours until its descriptor is
                // done; it lies inside the pool mapping.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), pool.base.add(off as usize), len)
                };
                st.counters
                    .bytes_copied
                    .fetch_add(len as u64, Ordering::Relaxed);
                (pool.handle, u64::from(off), Some((off, n)), None)
            }
            (None, Source::Registered { .. }) => return Err(errno(libc::EINVAL)),
        };
        let mut dflags = 0;
        if flags & libc::MSG_MORE != 0 {
            dflags |= DESC_MORE;
        }
        if checksum.is_some() {
            dflags |= DESC_CHECKSUM;
        }
        let seq = g.head;
        sq.write_desc(
            seq,
            &SendDesc {
                off,
                len: len32,
                mem: mem as u16,
                flags: dflags,
                checksum: checksum.unwrap_or(0),
                reserved: 0,
            },
        );
        g.head = seq.wrapping_add(1);
        let ctl = sq.ctl();
        ctl.head.store(g.head, Ordering::Release);
        g.pending.push_back(Pending {
            seq,
            mem: mem as u16,
            pool: staged,
        });
        g.sends += 1;
        g.bytes += u64::from(len32);
        // Kick only if the server is not watching and no kick of ours is
        // still on its way (it would make the server watch).
        let kick = ctl.active.load(Ordering::Relaxed) == 0
            && ctl.kicks_seen.load(Ordering::Relaxed) == g.kicks_sent;
        if kick {
            g.kicks_sent = g.kicks_sent.wrapping_add(1);
        }
        let io = IoHandle::new(q, g.gen, seq);
        drop(g);
        if kick {
            st.counters.kicks.fetch_add(1, Ordering::Relaxed);
            conn.post(Request {
                op: Op::AsyncKick as u16,
                sock: s,
                ..Default::default()
            })?;
        }
        Ok(io)
    }

    /// No send queue: the send runs synchronously.
    fn fallback(&self, s: u32, src: &Source<'_>, len: usize, flags: i32) -> io::Result<IoHandle> {
        self.asyncs()
            .counters
            .fallbacks
            .fetch_add(1, Ordering::Relaxed);
        let flags = flags & !libc::MSG_NOSIGNAL;
        match *src {
            Source::Copy(b) => self.send(s, b, flags).map(|_| IoHandle::DONE),
            Source::Registered { mem, ptr, .. } => self
                .send_registered(s, ptr, len, flags, mem)
                .map(|_| IoHandle::DONE),
        }
    }

    /// The socket's state, locked; binds its send queue (`queue == s`) on
    /// first use (one round trip). A socket that cannot have one (an id
    /// beyond the region's queues, or the server refused) has `queue == None`.
    fn sock_state(&self, s: u32) -> io::Result<SpinGuard<'_, SockState>> {
        let st = self.asyncs();
        let lock = st.socks.get_or_insert(s).ok_or(errno(libc::EBADF))?;
        let mut g = lock.lock();
        if g.queue.is_some() || g.no_queue {
            return Ok(g);
        }
        let Some(sq) = self.conn.region_send_queue(s) else {
            return Ok(g);
        };
        sq.ctl().head.store(0, Ordering::Relaxed);
        let mut r = Request {
            op: Op::AsyncBind as u16,
            sock: s,
            ..Default::default()
        };
        r.args[0] = u64::from(s);
        match self.simple_call(r) {
            Ok(c) => {
                // O_NONBLOCK as this library tracks it (an eagerly accepted
                // socket made non-blocking by accept4 is blocking at the
                // server), else as the server reports it.
                let nonblocking = self.local_nonblocking(s).unwrap_or(c.aux != 0);
                self.bound(&mut g, s, &sq, nonblocking);
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EINVAL)) => {
                g.no_queue = true;
            }
            Err(e) => return Err(e),
        }
        Ok(g)
    }

    /// The socket's state after its queue `s` was bound (`head == done == 0`).
    fn bound(&self, g: &mut SockState, s: u32, sq: &SendQueueRef<'_>, nonblocking: bool) {
        let gen = self.asyncs().gens[s as usize].fetch_add(1, Ordering::AcqRel) + 1;
        *g = SockState {
            queue: Some(s),
            gen,
            kicks_sent: sq.ctl().kicks_seen.load(Ordering::Acquire),
            nonblocking,
            ..SockState::default()
        };
    }

    /// The server handed out socket id `s` (`Socket`, `Accept`, an accept
    /// ring): whatever was kept of an earlier socket `s` is stale, since
    /// the server frees an id only after unbinding its queue. With
    /// `setup_sendq` (`SETUP_SENDQ`) the queue is bound already, with
    /// `head == done == 0`.
    pub(crate) fn async_new_socket(&self, s: u32, setup_sendq: bool, nonblocking: bool) {
        self.forget_orphan(s);
        let st = self.asyncs();
        let Some(lock) = st.socks.get_or_insert(s) else {
            return;
        };
        let mut g = lock.lock();
        st.fold_counts(&g);
        // Descriptors of an earlier binding finished when the server freed it.
        let all = g.head.wrapping_add(1 << 30);
        self.forget_done(&mut g.pending, all);
        *g = SockState {
            nonblocking,
            ..SockState::default()
        };
        if setup_sendq {
            if let Some(sq) = self.conn.region_send_queue(s) {
                self.bound(&mut g, s, &sq, nonblocking);
            }
        }
    }

    /// Frees the staging of the orphaned queue `q`: its socket id is in use
    /// again, so the server released it.
    fn forget_orphan(&self, q: u32) {
        let mut orphans = self
            .asyncs()
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        orphans.retain_mut(|o| {
            if o.queue != q {
                return true;
            }
            let done = self.conn.send_queue(q).ctl().done.load(Ordering::Acquire);
            self.forget_done(&mut o.pending, done.wrapping_add(1 << 30));
            false
        });
    }

    fn pool(&self) -> io::Result<&Pool> {
        let r = self.asyncs().pool.get_or_init(|| {
            let kib = std::env::var("TCPS_ASYNC_POOL_KIB")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(DEFAULT_POOL_KIB)
                .clamp(pool::MAX_PIECE / 1024, 1 << 22);
            let len = kib * 1024;
            self.conn
                .memory
                .alloc(self.conn.control(), len, true)
                .map(|(p, h)| Pool::new(p, h, len))
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        });
        r.as_ref().map_err(|&e| errno(e))
    }

    /// Reads `done`, the error and the misuse count of the socket's queue,
    /// and forgets (frees) the descriptors that finished.
    fn refresh(&self, g: &mut SockState, sq: &SendQueueRef<'_>) {
        let ctl = sq.ctl();
        let done = ctl.done.load(Ordering::Acquire);
        g.done = done;
        if g.error == 0 {
            let e = ctl.error.load(Ordering::Acquire);
            if e != 0 {
                g.error = e;
            }
        }
        let st = self.asyncs();
        if st.debug.load(Ordering::Relaxed) {
            let m = ctl.misuse.load(Ordering::Acquire);
            if m != g.misuse_seen {
                let n = m.wrapping_sub(g.misuse_seen);
                g.misuse_seen = m;
                st.counters
                    .misuse
                    .fetch_add(u64::from(n), Ordering::Relaxed);
                eprintln!(
                    "tcps: {n} registered buffer(s) were written while their asynchronous send was in flight (TCPS_DEBUG_REGISTERED)"
                );
            }
        }
        self.forget_done(&mut g.pending, done);
    }

    /// [`refresh`](Self::refresh) for a socket bound to a queue (else nothing).
    fn refresh_bound(&self, g: &mut SockState) {
        if let Some(q) = g.queue {
            let sq = self.conn.send_queue(q);
            self.refresh(g, &sq);
        }
    }

    /// Drops the finished descriptors of `pending`, freeing staged bytes.
    fn forget_done(&self, pending: &mut VecDeque<Pending>, done: u32) {
        while let Some(p) = pending.front() {
            if !sendq::is_done(p.seq, done) {
                break;
            }
            if let (Some((off, n)), Ok(pool)) = (p.pool, self.pool()) {
                pool.free(off, n);
            }
            pending.pop_front();
        }
    }

    /// Frees what the orphaned queues finished, and forgets the queues the
    /// server released.
    fn reap_orphans(&self) {
        let st = self.asyncs();
        let mut orphans = st.orphans.lock().unwrap_or_else(PoisonError::into_inner);
        orphans.retain_mut(|o| {
            let sq = self.conn.send_queue(o.queue);
            let ctl = sq.ctl();
            let released = ctl.owner.load(Ordering::Acquire) == 0;
            let done = ctl.done.load(Ordering::Acquire);
            if released {
                // The server is finished with the queue: everything is done.
                self.forget_done(&mut o.pending, done.wrapping_add(1 << 30));
                return false;
            }
            self.forget_done(&mut o.pending, done);
            true
        });
    }

    /// Sleeps until the queue's `done` moves from `seen` (or `max` passes).
    /// ECONNRESET if the server died.
    fn wait_queue(&self, sq: &SendQueueRef<'_>, seen: u32, max: Duration) -> io::Result<()> {
        let ctl = sq.ctl();
        // A counter, not a flag: several threads may wait on one queue.
        ctl.host_waiting.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        if ctl.done.load(Ordering::Acquire) == seen {
            futex::wait(&ctl.done, seen, max.min(WAIT_SLICE));
        }
        ctl.host_waiting.fetch_sub(1, Ordering::AcqRel);
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
        let st = self.asyncs();
        let cur = st.gens.get(q as usize).ok_or(errno(libc::EINVAL))?;
        if cur.load(Ordering::Acquire) & 0xff != gen {
            // The queue was bound anew, which happens only after every send
            // of its old socket finished.
            return Ok(true);
        }
        let ctl = self.conn.send_queue(q).ctl();
        if !sendq::is_done(seq, ctl.done.load(Ordering::Acquire)) {
            self.conn.check_open(libc::ECONNRESET)?;
            return Ok(false);
        }
        let e = ctl.error.load(Ordering::Acquire);
        if e != 0 && !sendq::is_done(seq, ctl.error_seq.load(Ordering::Relaxed)) {
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
            let seen = sq.ctl().done.load(Ordering::Acquire);
            if !self.io_done(io)? {
                self.wait_queue(&sq, seen, left)?;
            }
        }
    }

    /// Waits until every asynchronous send of socket `s` finished (Ok), or
    /// returns the first failure.
    pub fn flush_async(&self, s: u32, timeout: Option<Duration>) -> io::Result<()> {
        let last = {
            let Some(lock) = self.asyncs().socks.get(s) else {
                return Ok(());
            };
            let g = lock.lock();
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
        if let Some(lock) = self.asyncs().socks.get(s) {
            self.refresh_bound(&mut lock.lock());
        }
        Ok(())
    }

    /// Whether an asynchronous send on `s` failed (reported or not): the
    /// connection is broken.
    pub(crate) fn async_failed(&self, s: u32) -> bool {
        self.asyncs()
            .socks
            .get(s)
            .is_some_and(|lock| lock.lock().error != 0)
    }

    /// The error of an earlier asynchronous send on `s` not yet reported
    /// (each is reported once, by the next call on the socket).
    pub(crate) fn take_async_error(&self, s: u32) -> io::Result<()> {
        let Some(lock) = self.asyncs().socks.get(s) else {
            return Ok(());
        };
        let mut g = lock.lock();
        if g.error == 0 {
            self.refresh_bound(&mut g);
        }
        if g.error != 0 && !g.reported {
            return Err(g.report());
        }
        Ok(())
    }

    /// The socket is being closed: its queue (with sends in flight) goes to
    /// the orphans until the server releases it.
    pub(crate) fn async_close(&self, s: u32) {
        let st = self.asyncs();
        let Some(lock) = st.socks.get(s) else {
            return;
        };
        let mut g = lock.lock();
        st.fold_counts(&g);
        if let Some(q) = g.queue {
            let pending = std::mem::take(&mut g.pending);
            st.orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Orphan { queue: q, pending });
        }
        *g = SockState::default();
    }

    /// O_NONBLOCK changed on `s` (the asynchronous path decides EAGAIN itself).
    pub(crate) fn async_set_nonblocking(&self, s: u32, on: bool) {
        if let Some(lock) = self.asyncs().socks.get(s) {
            lock.lock().nonblocking = on;
        }
    }

    /// Whether registration `mem` is used by a send still in flight.
    fn registration_busy(&self, mem: u32) -> bool {
        self.reap_orphans();
        let st = self.asyncs();
        let in_orphans = st
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|o| o.pending.iter().any(|p| u32::from(p.mem) == mem));
        in_orphans
            || st.socks.any(|g| {
                self.refresh_bound(g);
                g.pending.iter().any(|p| u32::from(p.mem) == mem)
            })
    }

    /// Allocates `len` bytes of registered memory (page rounded): sends from
    /// it and receives into it are never copied. Returns the memory and its
    /// handle; free it with [`deregister_memory`](Self::deregister_memory).
    pub fn alloc_registered(&self, len: usize) -> io::Result<(*mut u8, u32)> {
        self.conn.check_open(libc::ENOTCONN)?;
        self.conn.memory.alloc(self.conn.control(), len, false)
    }

    /// Registers existing page-aligned memory in place (see `memory`).
    /// Returns its handle.
    pub fn register_memory(&self, ptr: *mut u8, len: usize) -> io::Result<u32> {
        self.conn.check_open(libc::ENOTCONN)?;
        self.conn.memory.register(self.conn.control(), ptr, len)
    }

    /// Ends registration `mem`: EBUSY while a send from it is in flight.
    /// Memory from [`alloc_registered`](Self::alloc_registered) is unmapped.
    pub fn deregister_memory(&self, mem: u32) -> io::Result<()> {
        if self.registration_busy(mem) {
            return Err(errno(libc::EBUSY));
        }
        self.conn.memory.deregister(self.conn.control(), mem)
    }

    /// The registration holding `[ptr, ptr+len)`: (handle, offset).
    pub fn find_registration(&self, ptr: *const u8, len: usize) -> Option<(u32, u64)> {
        self.conn.memory.find(ptr, len)
    }

    /// send(2) straight from registered memory (no copy, synchronous).
    pub fn send_registered(
        &self,
        s: u32,
        ptr: *const u8,
        len: usize,
        flags: i32,
        mem: u32,
    ) -> io::Result<usize> {
        self.registered_call(Op::SendReg, s, ptr, len, flags, mem)
    }

    /// recv(2) straight into registered memory (no copy, synchronous).
    pub fn recv_registered(
        &self,
        s: u32,
        ptr: *mut u8,
        len: usize,
        flags: i32,
        mem: u32,
    ) -> io::Result<usize> {
        self.registered_call(Op::RecvReg, s, ptr, len, flags, mem)
    }

    fn registered_call(
        &self,
        op: Op,
        s: u32,
        ptr: *const u8,
        len: usize,
        flags: i32,
        mem: u32,
    ) -> io::Result<usize> {
        let len32 = u32::try_from(len).map_err(|_| errno(libc::EINVAL))?;
        let off = self.conn.memory.offset_of(mem, ptr, len)?;
        self.take_async_error(s)?;
        if op == Op::RecvReg {
            // A socket whose first receive is into registered memory keeps
            // receiving on demand, straight into it (no copy): it gets no
            // ring unless the server set one up at accept.
            self.ahead_prefer_plain(s);
            // A socket with a receive ring: copy from it (one copy, counted).
            // SAFETY: `ptr..ptr+len` lies inside a registration (checked
            // above), memory this process owns and lets the server write;
            // nothing else reads it during the call.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            if let Some(n) = self.ring_recv(s, buf, flags)? {
                return Ok(n);
            }
        }
        let flags = self.local_flags(s, flags);
        let mut r = Request {
            op: op as u16,
            sock: s,
            ..Default::default()
        };
        r.args = [
            u64::from(mem),
            off,
            u64::from(len32),
            flags as i64 as u64,
            0,
        ];
        let c = self.simple_call(r)?;
        let n = usize::try_from(c.result)
            .ok()
            .filter(|&n| n <= len)
            .ok_or(errno(libc::EIO))?;
        if op == Op::SendReg {
            self.conn.count_registered(n, 0);
        } else {
            self.conn.count_registered(0, n);
        }
        Ok(n)
    }
}

impl SockState {
    /// The error to return now (once); later asynchronous sends get EPIPE.
    fn report(&mut self) -> io::Error {
        if self.reported {
            return errno(libc::EPIPE);
        }
        self.reported = true;
        errno(self.error)
    }
}
