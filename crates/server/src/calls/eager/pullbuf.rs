//! Pull buffers: what a pull socket received ahead at the server, and the
//! host's budget for them (`--max-pull-bytes-per-host`). Knows nothing of
//! hosts or sockets: `pull` drives it.

use crate::sys;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A pull buffer's first allocation; it doubles as bytes arrive, up to the
/// socket's `recv_size` and within the host's budget ([`PullAccount`]).
pub(crate) const PULL_FIRST: usize = 16 << 10;

/// While a pull buffer has nothing allocated the server reads into a stack
/// buffer of this size first: memory is allocated only for bytes that
/// arrived (an idle pull socket holds none).
pub(crate) const PULL_PROBE: usize = 4096;

/// End of a pull socket's stream, delivered after the buffered data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullEnd {
    Eof,
    Error(i32),
}

/// The bytes a host's pull buffers hold allocated, against its budget
/// (`--max-pull-bytes-per-host`). Shared by the host's buffers: each one
/// adds what it allocates and gives it back when it shrinks or goes away
/// (whichever way its socket leaves: close, export, detach).
#[derive(Clone, Debug)]
pub struct PullAccount {
    pub(crate) held: Arc<AtomicUsize>,
    pub(crate) limit: usize,
}

impl PullAccount {
    pub fn new(limit: usize) -> PullAccount {
        PullAccount {
            held: Arc::default(),
            limit,
        }
    }

    /// Bytes allocated by the host's pull buffers.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Bytes the host may still allocate.
    pub(crate) fn room(&self) -> usize {
        self.limit.saturating_sub(self.held())
    }
}

/// A pull socket's read-ahead buffer: bytes `lo..hi` of `buf`. `buf` grows
/// as bytes arrive and is freed when drained; its allocation is counted in
/// the host's [`PullAccount`].
#[derive(Debug)]
pub struct PullBuf {
    pub(crate) buf: Vec<u8>,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    /// Most bytes held (the socket's `recv_size`).
    pub(crate) cap: usize,
    pub(crate) end: Option<PullEnd>,
    /// The host's budget stopped this buffer growing: the socket reads
    /// ahead no more (bytes stay in the kernel, TCP's window holds the
    /// peer) until the sweep finds room again.
    pub(crate) throttled: bool,
    pub(crate) account: PullAccount,
    /// What this buffer added to `account` (its allocation).
    pub(crate) counted: usize,
    /// When the buffer last became non-empty (as the server saw it).
    pub(crate) since: crate::arrival::Arrival,
}

impl PullBuf {
    pub(crate) fn new(cap: usize, account: PullAccount) -> PullBuf {
        PullBuf {
            buf: Vec::new(),
            lo: 0,
            hi: 0,
            cap,
            end: None,
            throttled: false,
            account,
            counted: 0,
            since: Default::default(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.hi - self.lo
    }

    pub(crate) fn full(&self) -> bool {
        self.len() >= self.cap
    }

    /// Empty, open, and not allowed to read ahead: the kernel serves the
    /// socket meanwhile (recv requests and readiness go to it).
    pub(crate) fn deferring(&self) -> bool {
        self.throttled && self.len() == 0 && self.end.is_none()
    }

    /// Brings the account in line with the allocation.
    pub(crate) fn recount(&mut self) {
        let now = self.buf.capacity();
        if now >= self.counted {
            self.account
                .held
                .fetch_add(now - self.counted, Ordering::Relaxed);
        } else {
            self.account
                .held
                .fetch_sub(self.counted - now, Ordering::Relaxed);
        }
        self.counted = now;
    }

    /// Grows the allocation (doubling, from [`PULL_FIRST`]) by at least
    /// `need` bytes, within `cap` and the host's budget. False if the
    /// budget has no room for `need`.
    pub(crate) fn grow(&mut self, need: usize) -> bool {
        let len = self.buf.len();
        let target = (len * 2)
            .max(PULL_FIRST)
            .min(self.cap.max(self.hi + need))
            .max(len + need);
        let room = self.account.room();
        if room < need {
            return false;
        }
        let new_len = target.min(len + room);
        self.buf.reserve_exact(new_len - len);
        self.buf.resize(new_len, 0);
        self.recount();
        true
    }

    /// Drained: the allocation goes back to the host's budget.
    pub(crate) fn free_if_drained(&mut self) {
        if self.lo == self.hi {
            self.lo = 0;
            self.hi = 0;
            if self.counted > 0 {
                self.buf = Vec::new();
                self.recount();
            }
        }
    }

    /// One `recv` into the free room of a pull buffer: (bytes, bytes asked),
    /// or `Err(None)` for nothing to read now, `Err(Some(end))` at the end.
    pub(crate) fn recv_into(
        &mut self,
        fd: i32,
        want: usize,
    ) -> Result<(usize, usize), Option<PullEnd>> {
        let room = want.min(self.buf.len() - self.hi);
        let dst = &mut self.buf[self.hi..self.hi + room];
        loop {
            // SAFETY: dst is private memory of `room` bytes.
            return match unsafe { sys::recv(fd, dst.as_mut_ptr(), dst.len(), 0) } {
                Ok(0) => Err(Some(PullEnd::Eof)),
                Ok(k) => {
                    self.hi += k;
                    Ok((k, room))
                }
                Err(libc::EINTR) => continue,
                Err(libc::EAGAIN) => Err(None),
                Err(e) => Err(Some(PullEnd::Error(e))),
            };
        }
    }

    /// A pull buffer with no room allocated: `recv` into a stack buffer, then
    /// grow the buffer for the bytes that arrived (never before they do).
    pub(crate) fn probe_into(
        &mut self,
        fd: i32,
        want: usize,
    ) -> Result<(usize, usize), Option<PullEnd>> {
        let mut probe = [0u8; PULL_PROBE];
        let asked = want.min(PULL_PROBE);
        loop {
            // SAFETY: probe is a private stack buffer of at least `asked` bytes.
            return match unsafe { sys::recv(fd, probe.as_mut_ptr(), asked, 0) } {
                Ok(0) => Err(Some(PullEnd::Eof)),
                Ok(k) => {
                    // The budget had room for `asked` bytes (checked by the
                    // caller), so this cannot fail; bytes read are never lost.
                    if !self.grow(k) {
                        self.buf.resize(self.hi + k, 0);
                        self.recount();
                    }
                    self.buf[self.hi..self.hi + k].copy_from_slice(&probe[..k]);
                    self.hi += k;
                    Ok((k, asked))
                }
                Err(libc::EINTR) => continue,
                Err(libc::EAGAIN) => Err(None),
                Err(e) => Err(Some(PullEnd::Error(e))),
            };
        }
    }
}

impl Drop for PullBuf {
    fn drop(&mut self) {
        self.account.held.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

/// What a `Recv` on a pull socket got from its buffer.
pub(crate) enum PullTake {
    /// Not a pull socket, or its buffer is empty and the stream open: go
    /// to the kernel.
    Empty,
    /// Bytes copied (PEEK: copied and left).
    Data(usize),
    /// End of stream, after the data.
    End(PullEnd),
}
