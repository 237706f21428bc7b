//! The channel over a fabric (`docs/ARCHITECTURE.md`, "The channel over a
//! fabric"): each side holds its own copy of a host's region and a pump
//! ships what its side wrote to the peer as spans `(offset, bytes)`. This
//! module is the protocol half of that: which side writes which bytes of a
//! region (`zone`), and applying a peer's span to this side's copy so that
//! the code reading it sees an ordinary publish — index fields stored as
//! atomics with release, ring slots with their stamp stored last (release),
//! so an index or a stamp never becomes visible before what it publishes.
//!
//! A span is accepted only if it lies inside one zone its sender writes:
//! a host can write only what a local host could (the server copy stays
//! host-written memory the server copies out once and bound-checks, §6).

use crate::layout::{Layout, CTL_SIZE, HEADER_SIZE};
use crate::ready_log::{READY_LOG_OFFSET, READY_LOG_SIZE};
use crate::region::Region;
use crate::wake::Woke;
use std::sync::atomic::{fence, AtomicU16, AtomicU32, Ordering};

/// Who writes a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Host,
    Server,
    /// The arena: the host writes a call's arguments, the server its results.
    Both,
}

/// How a zone's bytes are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Index and flag words: stored as u32 atomics with release.
    Words,
    /// Ring slots of this size, each with its u16 stamp at byte 10
    /// (`Request`, `Completion`): the stamp is stored last, with release.
    Slots(usize),
    /// Data published by an index or a stamp shipped after it.
    Bytes,
}

/// A run of bytes with one writer and one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    pub start: usize,
    pub end: usize,
    pub writer: Writer,
    pub kind: Kind,
}

const LINE: usize = 64;
/// Byte offset of the stamp in a request and a completion.
const STAMP_AT: usize = 10;

fn z(start: usize, len: usize, writer: Writer, kind: Kind) -> Zone {
    Zone {
        start,
        end: start + len,
        writer,
        kind,
    }
}

/// The zone holding byte `off` of a region of this geometry, or `None`
/// (padding, or outside the region).
pub fn zone(l: &Layout, off: usize) -> Option<Zone> {
    use Kind::*;
    use Writer::*;
    let candidates: [Zone; 6];
    if off < HEADER_SIZE {
        let rl = READY_LOG_OFFSET;
        candidates = [
            z(0, LINE, Server, Bytes),       // geometry, written once
            z(LINE, LINE, Server, Words),    // server_sleeping, alive, flags
            z(2 * LINE, 4, Host, Words),     // channels_used
            z(rl, LINE, Server, Words),      // ready log tail
            z(rl + LINE, LINE, Host, Words), // its host_waiting, bell_slots
            z(rl + 2 * LINE, READY_LOG_SIZE - 2 * LINE, Server, Bytes),
        ];
    } else if off < l.send_queues_offset() {
        let c = (off - HEADER_SIZE) / l.channel_stride();
        let b = l.channel_offset(c as u32);
        let e = l.ring_entries as usize;
        candidates = [
            z(b, 2 * LINE, Host, Words), // req_tail, cq_head; host_waiting, room_waiters
            z(b + 2 * LINE, LINE, Server, Words), // req_head, cq_tail, parked_tag
            z(b + l.requests_offset(), 64 * e, Host, Slots(64)),
            z(b + l.completions_offset(), 32 * e, Server, Slots(32)),
            z(b + l.arena_offset(), l.arena_size as usize, Both, Bytes),
            z(b, 0, Host, Words),
        ];
    } else if off < l.recv_rings_offset() {
        let q = (off - l.send_queues_offset()) / l.sq_stride();
        if q >= l.send_queues as usize {
            return None;
        }
        let b = l.send_queue_offset(q as u32);
        candidates = [
            z(b, LINE, Host, Words),              // head, host_waiting, bell_slots
            z(b + LINE, 2 * LINE, Server, Words), // done, error…; active, kicks_seen, owner
            z(b + CTL_SIZE, 32 * l.sq_entries as usize, Host, Bytes),
            z(b, 0, Host, Words),
            z(b, 0, Host, Words),
            z(b, 0, Host, Words),
        ];
    } else {
        let r = (off - l.recv_rings_offset()) / l.rq_stride();
        if r >= l.recv_rings as usize {
            return None;
        }
        let b = l.recv_ring_offset(r as u32);
        candidates = [
            z(b, LINE, Host, Words),              // head, host_waiting, bell_slots
            z(b + LINE, 2 * LINE, Server, Words), // tail, end…; owner, kind, kicks_seen
            z(b + CTL_SIZE, l.rq_bytes as usize, Server, Bytes),
            z(b, 0, Host, Words),
            z(b, 0, Host, Words),
            z(b, 0, Host, Words),
        ];
    }
    candidates
        .into_iter()
        .find(|z| z.start <= off && off < z.end)
}

/// Why a span was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanRefused {
    /// Not inside one zone (padding, two zones, outside the region).
    Outside,
    /// Inside a zone the sender does not write.
    NotWriter,
    /// Words or slots not whole (misaligned or a partial slot).
    Misaligned,
}

/// Which of its zones a side ships, for the checks of `apply`.
pub fn may_write(sender: Writer, zone: &Zone) -> bool {
    zone.writer == sender || zone.writer == Writer::Both
}

impl Region {
    /// Applies a span `sender` wrote to this copy of the region: checked
    /// (one zone, one the sender writes, whole words or slots), then
    /// stored so that readers see an ordinary publish (see the module).
    pub fn apply_span(&self, sender: Writer, off: usize, bytes: &[u8]) -> Result<(), SpanRefused> {
        let zone = zone(self.layout(), off).ok_or(SpanRefused::Outside)?;
        let end = off.checked_add(bytes.len()).ok_or(SpanRefused::Outside)?;
        if bytes.is_empty() || end > zone.end {
            return Err(SpanRefused::Outside);
        }
        if !may_write(sender, &zone) {
            return Err(SpanRefused::NotWriter);
        }
        let base = self.base_ptr();
        match zone.kind {
            Kind::Bytes => {
                // SAFETY: off..end lies inside the mapping (inside a zone of
                // this layout); readers of these bytes read them only after
                // an index or stamp stored later with release.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(off), bytes.len())
                };
            }
            Kind::Words => {
                if !off.is_multiple_of(4) || !bytes.len().is_multiple_of(4) {
                    return Err(SpanRefused::Misaligned);
                }
                for (i, w) in bytes.chunks_exact(4).enumerate() {
                    let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    // SAFETY: an aligned u32 inside the mapping; these
                    // fields are only ever accessed atomically.
                    unsafe { AtomicU32::from_ptr(base.add(off + 4 * i) as *mut u32) }
                        .store(v, Ordering::Release);
                }
            }
            Kind::Slots(size) => {
                if !(off - zone.start).is_multiple_of(size) || !bytes.len().is_multiple_of(size) {
                    return Err(SpanRefused::Misaligned);
                }
                for (i, slot) in bytes.chunks_exact(size).enumerate() {
                    // SAFETY: a whole slot inside the mapping.
                    let p = unsafe { base.add(off + i * size) };
                    // SAFETY: everything but the stamp, then the stamp
                    // (an aligned u16, only accessed atomically) with
                    // release: a reader that sees it sees the slot.
                    unsafe {
                        std::ptr::copy_nonoverlapping(slot.as_ptr(), p, STAMP_AT);
                        std::ptr::copy_nonoverlapping(
                            slot.as_ptr().add(STAMP_AT + 2),
                            p.add(STAMP_AT + 2),
                            size - STAMP_AT - 2,
                        );
                        AtomicU16::from_ptr(p.add(STAMP_AT) as *mut u16).store(
                            u16::from_le_bytes([slot[STAMP_AT], slot[STAMP_AT + 1]]),
                            Ordering::Release,
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies bytes of this copy out, for the pump shipping them: index
    /// words (a range inside a `Words` zone, whole words) by acquire
    /// loads, so what they publish is seen by the reads that follow; any
    /// other range by a byte copy (fields written meanwhile are shipped
    /// again when their index moves).
    pub fn read_span(&self, off: usize, out: &mut [u8]) -> Result<(), SpanRefused> {
        let end = off.checked_add(out.len()).ok_or(SpanRefused::Outside)?;
        if end > self.layout().region_size() {
            return Err(SpanRefused::Outside);
        }
        let base = self.base_ptr();
        let words = zone(self.layout(), off).filter(|z| z.kind == Kind::Words && end <= z.end);
        if words.is_some() && off.is_multiple_of(4) && out.len().is_multiple_of(4) {
            for (i, w) in out.chunks_exact_mut(4).enumerate() {
                // SAFETY: an aligned u32 inside the mapping, only ever
                // accessed atomically.
                let v = unsafe { AtomicU32::from_ptr(base.add(off + 4 * i) as *mut u32) }
                    .load(Ordering::Acquire);
                w.copy_from_slice(&v.to_le_bytes());
            }
            return Ok(());
        }
        fence(Ordering::Acquire);
        // SAFETY: off..end is inside the mapping; a byte copy.
        unsafe { std::ptr::copy_nonoverlapping(base.add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

/// The producer's half of the wake-up handshake, for a pump that applied
/// a peer's publish to this copy (`apply_span`): a fence, then whom the
/// consumer side's `host_waiting` names, as the server does after its own
/// publish. Futex sleepers are woken here; doorbell sleepers are reported
/// ([`Woke::bell`], [`Woke::bells`]) for the caller to ring.
impl Region {
    /// After receive/accept ring `r`'s line 1 (`tail`, `end`) or line 2
    /// (an unbind) was applied.
    pub fn wake_recv_ring(&self, r: u32) -> Woke {
        match self.recv_ring(r) {
            Some(ring) => crate::eager::recv::wake_if_waiting(ring.ctl(), None),
            None => Woke::default(),
        }
    }

    /// After send queue `q`'s server lines (`done`, an error) were applied.
    pub fn wake_send_queue(&self, q: u32) -> Woke {
        match self.send_queue(q) {
            Some(sq) => crate::sendq::queue::wake_if_waiting(sq.ctl()),
            None => Woke::default(),
        }
    }

    /// After the ready log's `tail` was applied: its doorbell sleepers.
    pub fn wake_ready_log(&self) -> Woke {
        fence(Ordering::SeqCst);
        crate::ready_log::sleepers(self.ready_log())
    }
}

/// One side's copy of a memory registration over a fabric (a mapping of a
/// memfd: at the host's helper the library's own, at the server one it
/// made of the announced length). A peer's registration span is applied
/// only inside it, as a region span only inside its zone: the bytes a
/// send-queue descriptor or `SendReg` names cross before the descriptor
/// or request, so the sender of a registration's bytes is always the
/// registration's owner (the host) and the server sends from its copy.
pub struct RegCopy {
    base: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a shared mapping owned by this value; readers of the bytes (the
// server's worker, through its own mapping) read them only after an index
// shipped after them (a descriptor's `head`, a request's stamp).
unsafe impl Send for RegCopy {}

impl RegCopy {
    /// Maps `len` bytes of `fd` from offset 0, read-write and shared.
    pub fn map(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> std::io::Result<RegCopy> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a fresh shared mapping of a file we were given; the kernel
        // picks the address. Failure is reported as MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = std::ptr::NonNull::new(p as *mut u8)
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(RegCopy { base, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `off..off + n` if it lies inside the registration.
    fn range(&self, off: u64, n: usize) -> Result<usize, SpanRefused> {
        let off = usize::try_from(off).map_err(|_| SpanRefused::Outside)?;
        match off.checked_add(n) {
            Some(end) if n > 0 && end <= self.len => Ok(off),
            _ => Err(SpanRefused::Outside),
        }
    }

    /// Applies a registration span: `bytes` at `off`, refused outside.
    pub fn apply(&self, off: u64, bytes: &[u8]) -> Result<(), SpanRefused> {
        let at = self.range(off, bytes.len())?;
        // SAFETY: at..at+len lies inside the mapping (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.as_ptr().add(at), bytes.len())
        };
        Ok(())
    }

    /// Copies `out.len()` bytes at `off` out, refused outside.
    pub fn read(&self, off: u64, out: &mut [u8]) -> Result<(), SpanRefused> {
        let at = self.range(off, out.len())?;
        fence(Ordering::Acquire);
        // SAFETY: at..at+len lies inside the mapping (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(at), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }
}

impl Drop for RegCopy {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no pointer into it
        // outlives this value.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Op, Request};
    use crate::ring::{HostCursor, ServerCursor};

    fn layout() -> Layout {
        Layout {
            n_channels: 4,
            ring_entries: 8,
            arena_size: 4096,
            send_queues: 4,
            sq_entries: 8,
            recv_rings: 4,
            rq_bytes: 4096,
        }
    }

    fn region(l: Layout) -> ((), Region) {
        ((), crate::region::test_region(l))
    }

    #[test]
    fn every_byte_has_one_writer_or_is_padding() {
        let l = layout();
        let mut host = 0;
        for off in 0..l.region_size() {
            if let Some(z) = zone(&l, off) {
                assert!(
                    z.start <= off && off < z.end && z.end <= l.region_size(),
                    "{z:?} at {off}"
                );
                host += (z.writer != Writer::Server) as usize;
            }
        }
        assert!(host > 0);
        let ch = l.channel_offset(1);
        assert_eq!(zone(&l, ch).map(|z| z.writer), Some(Writer::Host));
        assert_eq!(zone(&l, ch + 128).map(|z| z.writer), Some(Writer::Server));
        assert_eq!(
            zone(&l, ch + l.arena_offset()).map(|z| z.writer),
            Some(Writer::Both)
        );
        assert_eq!(
            zone(&l, 64).map(|z| z.writer),
            Some(Writer::Server),
            "server_sleeping"
        );
        assert_eq!(
            zone(&l, 128).map(|z| z.writer),
            Some(Writer::Host),
            "channels_used"
        );
    }

    #[test]
    fn a_host_cannot_write_server_fields() {
        let l = layout();
        let (_f, r) = region(l);
        let ch = l.channel_offset(0);
        let refused = |off: usize, len: usize| r.apply_span(Writer::Host, off, &vec![0xff; len]);
        assert_eq!(
            refused(64, 4),
            Err(SpanRefused::NotWriter),
            "server_sleeping"
        );
        assert_eq!(refused(ch + 128, 4), Err(SpanRefused::NotWriter), "cq_tail");
        assert_eq!(
            refused(ch + l.completions_offset(), 32),
            Err(SpanRefused::NotWriter)
        );
        assert_eq!(
            refused(l.recv_ring_offset(0) + CTL_SIZE, 8),
            Err(SpanRefused::NotWriter)
        );
        assert_eq!(
            refused(ch + 120, 16),
            Err(SpanRefused::Outside),
            "across two zones"
        );
        assert_eq!(refused(l.region_size() - 1, 2), Err(SpanRefused::Outside));
        assert_eq!(refused(ch + 2, 4), Err(SpanRefused::Misaligned));
        assert_eq!(
            refused(ch + l.requests_offset() + 8, 64),
            Err(SpanRefused::Misaligned)
        );
        assert_eq!(r.header().server_sleeping.load(Ordering::Relaxed), 0);
        assert!(r
            .apply_span(Writer::Server, 64, &1u32.to_le_bytes())
            .is_ok());
    }

    /// A request posted into the host's copy, shipped as spans (arena
    /// range, slot, line 0) and applied to the server's copy, is taken
    /// by the server's cursor as if the host had written it there.
    #[test]
    fn shipped_request_reaches_the_server_cursor() {
        let l = layout();
        let (_fh, host) = region(l);
        let (_fs, server) = region(l);
        let ch_h = host.channel(0).unwrap();
        let mut hc = HostCursor::default();
        let arena_at = l.channel_offset(0) + l.arena_offset();
        host.apply_span(Writer::Host, arena_at, b"payload").unwrap();
        let req = Request {
            user_data: 7,
            op: Op::Send as u16,
            sock: 3,
            buf_off: 0,
            buf_len: 7,
            ..Default::default()
        };
        hc.submit(&ch_h, &req).unwrap();
        let mut spans = Vec::new();
        for (off, len) in [
            (arena_at, 7),
            (l.channel_offset(0) + l.requests_offset(), 64),
            (l.channel_offset(0), 128),
        ] {
            let mut b = vec![0u8; len];
            host.read_span(off, &mut b).unwrap();
            spans.push((off, b));
        }
        for (off, b) in &spans {
            server.apply_span(Writer::Host, *off, b).unwrap();
        }
        let ch_s = server.channel(0).unwrap();
        let mut sc = ServerCursor::default();
        let got: Request = sc.pop(&ch_s).unwrap().expect("the server sees the request");
        assert_eq!(
            (got.user_data, got.sock, got.buf_len),
            (req.user_data, req.sock, req.buf_len)
        );
        let mut data = [0u8; 7];
        server.read_span(arena_at, &mut data).unwrap();
        assert_eq!(&data, b"payload");
    }

    #[test]
    fn a_registration_copy_takes_spans_only_inside() {
        use std::os::fd::{AsFd, FromRawFd, OwnedFd};
        // SAFETY: memfd_create with a valid name; checked.
        let fd = unsafe { libc::memfd_create(c"reg-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor, owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        std::fs::File::from(fd.try_clone().unwrap())
            .set_len(8192)
            .unwrap();
        let a = RegCopy::map(fd.as_fd(), 8192).unwrap();
        let b = RegCopy::map(fd.as_fd(), 8192).unwrap();
        a.apply(8190, b"xy").unwrap();
        let mut got = [0u8; 2];
        b.read(8190, &mut got).unwrap();
        assert_eq!(&got, b"xy", "one memfd, two mappings");
        assert_eq!(a.apply(8191, b"xy"), Err(SpanRefused::Outside));
        assert_eq!(a.apply(u64::MAX, b"x"), Err(SpanRefused::Outside));
        assert_eq!(a.apply(0, b""), Err(SpanRefused::Outside));
        assert_eq!(a.read(8192, &mut got), Err(SpanRefused::Outside));
        assert!(RegCopy::map(fd.as_fd(), 0).is_err());
    }
}
