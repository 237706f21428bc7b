//! The producer side of a send queue: one asynchronous send is one
//! descriptor (credits, its bytes, publishing, the kick). See the module
//! above for the steps.

use super::credits::WAIT_SLICE;
use super::pool::MAX_PIECE;
use super::shared::IoHandle;
use crate::client::Client;
use crate::socket::{Pending, SendSide, Socket};
use crate::sys::errno;
use crate::table::SpinGuard;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tcps_proto::sendq::{
    self, SendDesc, SendQueueProducer, DESC_CHECKSUM, DESC_FILE, DESC_MORE, MAX_FILE_LEN,
};
use tcps_proto::Call;

/// Flags an asynchronous send accepts.
const ASYNC_FLAGS: i32 = libc::MSG_DONTWAIT | libc::MSG_MORE | libc::MSG_NOSIGNAL;

/// Where an asynchronous send's bytes are.
enum Source<'a> {
    Registered {
        mem: u32,
        ptr: *const u8,
        len: usize,
    },
    Copy(&'a [u8]),
    /// A file range (`DESC_FILE`): `len` bytes at `off` of file handle `file`.
    File {
        file: u32,
        off: u64,
        len: u32,
    },
}

/// One send being queued on socket `s`'s queue `q`.
struct Submit<'a> {
    s: u32,
    sock: &'a Socket,
    q: u32,
    sq: SendQueueProducer<'a>,
    nonblocking: bool,
}

/// Where a descriptor's bytes are: registration, offset, staged range,
/// debug-mode checksum, file handle (a file range).
type Placed = (u32, u64, Option<(u32, u32)>, Option<u64>, Option<u32>);

impl Client {
    /// Switches the debug mode of registered asynchronous sends on or off
    /// for sends submitted from now on (the default is
    /// `TCPS_DEBUG_REGISTERED` at attach): each send carries a checksum of
    /// its bytes, and the server counts a buffer written while in flight
    /// (`HostStats::registered_misuse`).
    pub fn set_registered_debug(&self, on: bool) {
        self.conn.sendq.debug.store(on, Ordering::Relaxed);
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
        for piece in buf.chunks(MAX_PIECE) {
            match self.submit(s, Source::Copy(piece), flags) {
                Ok((_, n)) => {
                    sent += n;
                    // A synchronous send took less: the rest is not sent.
                    if n < piece.len() {
                        break;
                    }
                }
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
            .map(|(io, _)| io)
    }

    /// Queues `len` bytes at `offset` of file `file` (handed over with
    /// `ControlMsg::FileOpen`) on `s`'s send queue: the server sends them
    /// from its copy of the file, in order with the sends around them, and
    /// the call returns at once (an asynchronous sendfile; errors as for
    /// [`send_async`](Self::send_async)). At most 2^30 bytes, which the
    /// file must hold (the server fails the send with EIO where it does
    /// not). A socket without a send queue: `EOPNOTSUPP` (use
    /// [`sendfile`](Self::sendfile)). Credits as for any send; `flags`:
    /// `MSG_DONTWAIT`, `MSG_MORE`.
    pub fn sendfile_async(
        &self,
        s: u32,
        file: u32,
        offset: u64,
        len: u32,
        flags: i32,
    ) -> io::Result<IoHandle> {
        let end = offset.checked_add(u64::from(len));
        if len > MAX_FILE_LEN || end.is_none_or(|e| e > i64::MAX as u64) {
            return Err(errno(libc::EINVAL));
        }
        let src = Source::File {
            file,
            off: offset,
            len,
        };
        self.submit(s, src, flags).map(|(io, _)| io)
    }

    /// One descriptor (see the module docs for the steps), and the bytes
    /// taken: all of them, unless the send ran synchronously and the
    /// kernel took less.
    fn submit(&self, s: u32, src: Source<'_>, flags: i32) -> io::Result<(IoHandle, usize)> {
        let conn = &self.conn;
        conn.check_open(libc::EPIPE)?;
        if flags & !ASYNC_FLAGS != 0 {
            return Err(errno(libc::EINVAL));
        }
        let len = match &src {
            Source::Registered { len, .. } => *len,
            Source::Copy(b) => b.len(),
            Source::File { len, .. } => *len as usize,
        };
        let len32 = u32::try_from(len).map_err(|_| errno(libc::EINVAL))?;
        if len == 0 {
            return Ok((IoHandle::DONE, 0));
        }
        // Check the registration before anything else: unregistered memory
        // is EINVAL, whatever the socket's state.
        let registered = match src {
            Source::Registered { mem, ptr, len } => {
                Some((mem, conn.memory.offset_of(mem, ptr, len)?, ptr))
            }
            Source::Copy(_) | Source::File { .. } => None,
        };
        let sock = conn.socks.get_or_insert(s)?;
        let g = self.send_side(s, sock)?;
        // (A host on another node too: its helper ships the staged bytes
        // before the descriptor, `crate::remote::pump`.)
        let Some(q) = g.queue.filter(|_| !g.write_shut) else {
            drop(g);
            return self.fallback(s, &src, len, flags);
        };
        let sub = Submit {
            s,
            sock,
            q,
            sq: conn.send_queue(q),
            nonblocking: sock.nonblocking() == Some(true) || flags & libc::MSG_DONTWAIT != 0,
        };
        let mut g = self.take_credit(&sub, g)?;
        let placed = match (registered, &src) {
            (Some((mem, off, ptr)), _) => {
                let sum = self.conn.sendq.debug.load(Ordering::Relaxed).then(|| {
                    // SAFETY: `ptr..ptr+len` lies inside a registration (checked).
                    sendq::checksum(unsafe { std::slice::from_raw_parts(ptr, len) })
                });
                (mem, off, None, sum, None)
            }
            (None, &Source::File { file, off, .. }) => (0, off, None, None, Some(file)),
            (None, Source::Copy(bytes)) => {
                let (placed, g2) = self.stage(&sub, g, bytes)?;
                g = g2;
                placed
            }
            (None, Source::Registered { .. }) => return Err(errno(libc::EINVAL)),
        };
        self.publish(&sub, g, placed, len32, flags)
            .map(|io| (io, len))
    }

    /// Waits for a credit (a free descriptor): refreshes `done`, then sleeps
    /// on it (blocking) or fails with EAGAIN (non-blocking). Reports an
    /// earlier send's error first.
    fn take_credit<'a>(
        &'a self,
        sub: &Submit<'a>,
        mut g: SpinGuard<'a, SendSide>,
    ) -> io::Result<SpinGuard<'a, SendSide>> {
        loop {
            if g.error != 0 {
                return Err(g.report());
            }
            if sub.sq.has_credit(g.head, g.done) {
                return Ok(g);
            }
            self.refresh(&mut g, &sub.sq);
            if g.error != 0 || sub.sq.has_credit(g.head, g.done) {
                continue;
            }
            if sub.nonblocking {
                return Err(errno(libc::EAGAIN));
            }
            let seen = g.done;
            drop(g);
            self.wait_queue(&sub.sq, seen, WAIT_SLICE)?;
            g = self.send_side(sub.s, sub.sock)?;
            if g.queue != Some(sub.q) {
                return Err(errno(libc::EBADF)); // closed meanwhile
            }
        }
    }

    /// Copies a copying send's bytes into the staging pool, waiting a
    /// little for room (freeing what finished, everywhere) unless
    /// non-blocking.
    fn stage<'a>(
        &'a self,
        sub: &Submit<'a>,
        mut g: SpinGuard<'a, SendSide>,
        bytes: &[u8],
    ) -> io::Result<(Placed, SpinGuard<'a, SendSide>)> {
        let len = bytes.len();
        let pool = self.pool()?;
        let (off, n) = loop {
            if let Some(r) = pool.alloc(len) {
                break r;
            }
            // Free what finished, everywhere, then wait a little.
            self.refresh(&mut g, &sub.sq);
            self.reap_orphans();
            if let Some(r) = pool.alloc(len) {
                break r;
            }
            if sub.nonblocking {
                return Err(errno(libc::EAGAIN));
            }
            drop(g);
            std::thread::sleep(Duration::from_micros(50));
            self.conn.check_open(libc::EPIPE)?;
            g = self.send_side(sub.s, sub.sock)?;
            if g.queue != Some(sub.q) {
                return Err(errno(libc::EBADF));
            }
        };
        // SAFETY: the staged range is ours until its descriptor is done; it
        // lies inside the pool mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), pool.base.add(off as usize), len) };
        let copied = &self.conn.sendq.counters.bytes_copied;
        copied.fetch_add(len as u64, Ordering::Relaxed);
        Ok(((pool.handle, u64::from(off), Some((off, n)), None, None), g))
    }

    /// Writes and publishes the descriptor, remembers it, and kicks the
    /// server if it is not watching the queue.
    fn publish(
        &self,
        sub: &Submit<'_>,
        mut g: SpinGuard<'_, SendSide>,
        (mem, off, staged, checksum, file): Placed,
        len: u32,
        flags: i32,
    ) -> io::Result<IoHandle> {
        let mut dflags = 0;
        if flags & libc::MSG_MORE != 0 {
            dflags |= DESC_MORE;
        }
        if checksum.is_some() {
            dflags |= DESC_CHECKSUM;
        }
        if file.is_some() {
            dflags |= DESC_FILE;
        }
        let desc = SendDesc {
            off,
            len,
            mem: mem as u16,
            flags: dflags,
            checksum: checksum.unwrap_or(0),
            file: file.unwrap_or(0),
            reserved: 0,
        };
        let seq = sub.sq.push(&mut g.head, &desc);
        g.pending.push_back(Pending {
            seq,
            mem: mem as u16,
            pool: staged,
            len,
        });
        g.queued += u64::from(len);
        g.sends += 1;
        g.bytes += u64::from(len);
        // Over a fabric this copy's `active` and `kicks_seen` are the
        // server's a round trip ago (the Dekker with the worker cannot
        // hold): every publish kicks, and the helper ships the kick after
        // the descriptor and `head`, in one batch (`crate::remote::pump`).
        let kick = self.conn.remote || sub.sq.needs_kick(&mut g.kicks_sent);
        let io = IoHandle::new(sub.q, g.gen, seq);
        drop(g);
        if kick {
            let kicks = &self.conn.sendq.counters.kicks;
            kicks.fetch_add(1, Ordering::Relaxed);
            self.conn.post(Call::AsyncKick { sock: sub.s })?;
        }
        Ok(io)
    }

    /// No send queue: the send runs synchronously (and may take less).
    fn fallback(
        &self,
        s: u32,
        src: &Source<'_>,
        len: usize,
        flags: i32,
    ) -> io::Result<(IoHandle, usize)> {
        let fallbacks = &self.conn.sendq.counters.fallbacks;
        fallbacks.fetch_add(1, Ordering::Relaxed);
        let flags = flags & !libc::MSG_NOSIGNAL;
        match *src {
            Source::Copy(b) => self.send(s, b, flags).map(|n| (IoHandle::DONE, n)),
            Source::Registered { mem, ptr, .. } => self
                .send_registered(s, ptr, len, flags, mem)
                .map(|n| (IoHandle::DONE, n)),
            // A synchronous sendfile may send less: the caller decides.
            Source::File { .. } => Err(errno(libc::EOPNOTSUPP)),
        }
    }
}
