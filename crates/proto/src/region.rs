//! A mapped channel region and typed views into it.
//!
//! This is where the raw pointers are. Everything above it works with
//! [`ChannelRef`], whose accessors only hand out atomics, bounds-checked arena
//! pointers and by-value copies of ring slots.

use crate::eager::ctl::{RecvRingCtl, RQ_CTL_SIZE};
use crate::layout::{ChannelCtl, Layout, RegionHeader, HEADER_SIZE};
use crate::layout::{MAGIC, VERSION};
use crate::msg::{ArenaRange, Completion, Request};
use crate::ready_log::{LogEntry, ReadyLogCtl, READY_LOG_OFFSET};
use crate::sendq::ctl::{SendDesc, SendQueueCtl, SQ_CTL_SIZE};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

/// The stamp that publishes slot `index` of a ring of `entries` slots (a
/// power of two): the lap number modulo 2^15, plus one. It never equals the
/// stamp of the same slot one lap earlier — also across the wrap of the u32
/// index, since the lap count wraps at a multiple of 2^15 — nor zeroed memory.
pub fn stamp(index: u32, entries: u32) -> u16 {
    ((index / entries) & 0x7fff) as u16 + 1
}

/// A `MAP_SHARED` mapping of a channel region; unmapped on drop.
pub struct Region {
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the region is shared memory accessed only through atomics, volatile
// slot copies and raw arena pointers whose users accept concurrent writes.
unsafe impl Send for Region {}
// SAFETY: as above; no `&mut` to shared memory is ever handed out.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `fd` (a memfd of exactly `layout.region_size()` bytes).
    pub fn map(fd: BorrowedFd<'_>, layout: Layout) -> io::Result<Region> {
        layout
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.0))?;
        // SAFETY: a fresh shared mapping of a file we were given; the kernel
        // picks the address. Failure is reported as MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.region_size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Region { base, layout })
    }

    /// Maps a region a server handed out and checks its header. The geometry
    /// comes from the header, after magic and version match.
    pub fn map_from_header(fd: BorrowedFd<'_>, region_size: u64) -> io::Result<Region> {
        if region_size < HEADER_SIZE as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "tcps: channel region too small",
            ));
        }
        let probe = Layout {
            n_channels: 1,
            ring_entries: 2,
            arena_size: 4096,
            send_queues: 0,
            sq_entries: 2,
            recv_rings: 0,
            rq_bytes: 4096,
        };
        // Map just the header first to read the geometry.
        let head = Region::map(fd, probe)?;
        let h = head.header();
        if h.magic != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "tcps: channel region has a bad magic number",
            ));
        }
        if h.version != VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "tcps: protocol version mismatch: region v{}, library v{}",
                    h.version, VERSION
                ),
            ));
        }
        let layout = Layout {
            n_channels: h.n_channels,
            ring_entries: h.ring_entries,
            arena_size: h.arena_size,
            send_queues: h.send_queues,
            sq_entries: h.sq_entries,
            recv_rings: h.recv_rings,
            rq_bytes: h.rq_bytes,
        };
        drop(head);
        if layout.region_size() as u64 != region_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "tcps: channel region size does not match its header",
            ));
        }
        Region::map(fd, layout)
    }

    /// Writes the header of a freshly created (zeroed) region.
    pub fn init_header(&self) {
        let l = self.layout;
        // SAFETY: the region is at least HEADER_SIZE bytes and page aligned;
        // the header is written before the region is shared with anyone.
        unsafe {
            let h = self.base.as_ptr() as *mut RegionHeader;
            std::ptr::addr_of_mut!((*h).magic).write(MAGIC);
            std::ptr::addr_of_mut!((*h).version).write(VERSION);
            std::ptr::addr_of_mut!((*h).header_size).write(HEADER_SIZE as u32);
            std::ptr::addr_of_mut!((*h).n_channels).write(l.n_channels);
            std::ptr::addr_of_mut!((*h).ring_entries).write(l.ring_entries);
            std::ptr::addr_of_mut!((*h).arena_size).write(l.arena_size);
            std::ptr::addr_of_mut!((*h).channel_stride).write(l.channel_stride() as u32);
            std::ptr::addr_of_mut!((*h).region_size).write(l.region_size() as u64);
            std::ptr::addr_of_mut!((*h).send_queues).write(l.send_queues);
            std::ptr::addr_of_mut!((*h).sq_entries).write(l.sq_entries);
            std::ptr::addr_of_mut!((*h).recv_rings).write(l.recv_rings);
            std::ptr::addr_of_mut!((*h).rq_bytes).write(l.rq_bytes);
        }
        self.header()
            .server_alive
            .store(1, std::sync::atomic::Ordering::Release);
    }

    /// The mapping's first byte (for `mirror`, which checks every range).
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping is at least one page, aligned, and outlives `self`.
        // Plain fields are only read; a host scribbling on them can make the
        // host's own view wrong but the server keeps its own Layout.
        unsafe { &*(self.base.as_ptr() as *const RegionHeader) }
    }

    /// The channel at `index`, or `None` if out of range.
    pub fn channel(&self, index: u32) -> Option<ChannelRef<'_>> {
        if index >= self.layout.n_channels {
            return None;
        }
        // SAFETY: index < n_channels, so the channel lies inside the mapping.
        let base = unsafe { self.base.as_ptr().add(self.layout.channel_offset(index)) };
        Some(ChannelRef {
            base,
            layout: &self.layout,
            header: self.header(),
        })
    }
}

impl Region {
    /// Send queue `q`, or `None` if out of range.
    pub fn send_queue(&self, q: u32) -> Option<SendQueueRef<'_>> {
        if q >= self.layout.send_queues {
            return None;
        }
        // SAFETY: q < send_queues, so the queue lies inside the mapping.
        let base = unsafe { self.base.as_ptr().add(self.layout.send_queue_offset(q)) };
        Some(SendQueueRef {
            base,
            entries: self.layout.sq_entries,
            _region: std::marker::PhantomData,
        })
    }
}

/// One asynchronous send queue of a mapped region (see [`crate::sendq`]).
#[derive(Clone, Copy)]
pub struct SendQueueRef<'a> {
    base: *mut u8,
    entries: u32,
    _region: std::marker::PhantomData<&'a Region>,
}

impl<'a> SendQueueRef<'a> {
    pub fn ctl(&self) -> &'a SendQueueCtl {
        // SAFETY: the control block is at the (64-aligned) start of the queue.
        unsafe { &*(self.base as *const SendQueueCtl) }
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    fn desc_ptr(&self, seq: u32) -> *mut SendDesc {
        let slot = (seq & (self.entries - 1)) as usize;
        // SAFETY: slot < entries, so the descriptor lies inside this queue.
        unsafe { (self.base.add(SQ_CTL_SIZE) as *mut SendDesc).add(slot) }
    }

    /// Copies descriptor `seq` out (the host may be writing it: the copy is
    /// what gets validated and used).
    pub fn read_desc(&self, seq: u32) -> SendDesc {
        // SAFETY: an aligned slot inside the mapping; a volatile read of plain
        // data, racing writes at worst give garbage that validation refuses.
        unsafe { std::ptr::read_volatile(self.desc_ptr(seq)) }
    }

    /// Writes descriptor `seq` (host side; published by storing `head`).
    pub fn write_desc(&self, seq: u32, d: &SendDesc) {
        // SAFETY: as for read_desc.
        unsafe { std::ptr::write_volatile(self.desc_ptr(seq), *d) }
    }
}

impl Region {
    /// Receive ring `r`, or `None` if out of range.
    pub fn recv_ring(&self, r: u32) -> Option<RecvRingRef<'_>> {
        if r >= self.layout.recv_rings {
            return None;
        }
        // SAFETY: r < recv_rings, so the ring lies inside the mapping.
        let base = unsafe { self.base.as_ptr().add(self.layout.recv_ring_offset(r)) };
        Some(RecvRingRef {
            base,
            size: self.layout.rq_bytes,
            log: self.ready_log(),
            index: r,
        })
    }

    /// The host's ready log (`crate::ready_log`), in the header page.
    pub fn ready_log(&self) -> &ReadyLogCtl {
        // SAFETY: the log lies inside the header page (asserted in
        // ready_log.rs), 64-aligned in a page-aligned mapping that outlives
        // `self`; it is atomics only.
        unsafe { &*(self.base.as_ptr().add(READY_LOG_OFFSET) as *const ReadyLogCtl) }
    }
}

/// One receive (or accept) ring of a mapped region (see [`crate::eager`]).
/// Positions are free-running byte counts; they wrap modulo the ring size.
#[derive(Clone, Copy)]
pub struct RecvRingRef<'a> {
    base: *mut u8,
    size: u32,
    /// The region's ready log, and this ring's id in it.
    log: &'a ReadyLogCtl,
    index: u32,
}

impl<'a> RecvRingRef<'a> {
    /// Where a publish into this ring is announced (the ring's index is
    /// its socket's id).
    pub(crate) fn log_entry(&self) -> Option<LogEntry<'a>> {
        Some(LogEntry {
            log: self.log,
            id: self.index,
        })
    }

    pub fn ctl(&self) -> &'a RecvRingCtl {
        // SAFETY: the control block is at the (64-aligned) start of the ring.
        unsafe { &*(self.base as *const RecvRingCtl) }
    }

    /// Bytes of ring (a power of two).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The contiguous free span starting at position `pos`, at most `max`
    /// bytes (it stops at the wrap): a pointer the server hands to
    /// `recv(2)`. Never form a Rust reference to it: the other side may
    /// read or write it at any time.
    pub fn span_ptr(&self, pos: u32, max: u32) -> (*mut u8, usize) {
        let at = pos & (self.size - 1);
        let n = max.min(self.size - at);
        // SAFETY: at < size, and at + n <= size: inside this ring's bytes.
        (
            unsafe { self.base.add(RQ_CTL_SIZE + at as usize) },
            n as usize,
        )
    }

    /// Copies `src` into the ring at position `pos`, wrapping (at most `size` bytes).
    pub fn write_at(&self, pos: u32, src: &[u8]) {
        let mut done = 0usize;
        while done < src.len().min(self.size as usize) {
            let (p, n) = self.span_ptr(pos.wrapping_add(done as u32), (src.len() - done) as u32);
            // SAFETY: p..p+n is inside the ring (span_ptr); src is private memory.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), p, n) };
            done += n;
        }
    }

    /// Copies ring bytes at position `pos` into `dst`, wrapping (at most `size` bytes).
    pub fn read_at(&self, pos: u32, dst: &mut [u8]) {
        let mut done = 0usize;
        while done < dst.len().min(self.size as usize) {
            let (p, n) = self.span_ptr(pos.wrapping_add(done as u32), (dst.len() - done) as u32);
            // SAFETY: as in write_at, with the roles swapped.
            unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr().add(done), n) };
            done += n;
        }
    }

    /// Reads the accept record at position `pos` (a multiple of 64).
    pub fn read_record(&self, pos: u32) -> crate::eager::ctl::AcceptRecord {
        let mut b = [0u8; crate::eager::ctl::ACCEPT_RECORD_SIZE as usize];
        self.read_at(pos, &mut b);
        // SAFETY: AcceptRecord is plain integers and byte arrays (any bit
        // pattern is valid) of exactly this size; read_unaligned copies it.
        unsafe { std::ptr::read_unaligned(b.as_ptr() as *const crate::eager::ctl::AcceptRecord) }
    }

    /// Writes an accept record at position `pos` (a multiple of 64).
    pub fn write_record(&self, pos: u32, r: &crate::eager::ctl::AcceptRecord) {
        // SAFETY: a plain-data struct viewed as its bytes.
        let b = unsafe {
            std::slice::from_raw_parts(
                r as *const crate::eager::ctl::AcceptRecord as *const u8,
                crate::eager::ctl::ACCEPT_RECORD_SIZE as usize,
            )
        };
        self.write_at(pos, b);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no references outlive self.
        unsafe {
            libc::munmap(
                self.base.as_ptr() as *mut libc::c_void,
                self.layout.region_size(),
            );
        }
    }
}

/// One channel of a mapped region.
#[derive(Clone, Copy)]
pub struct ChannelRef<'a> {
    base: *mut u8,
    layout: &'a Layout,
    header: &'a RegionHeader,
}

impl<'a> ChannelRef<'a> {
    pub fn ctl(&self) -> &'a ChannelCtl {
        // SAFETY: the control block is at the (64-aligned) start of the channel.
        unsafe { &*(self.base as *const ChannelCtl) }
    }

    pub fn header(&self) -> &'a RegionHeader {
        self.header
    }

    pub fn ring_entries(&self) -> u32 {
        self.layout.ring_entries
    }

    pub fn arena_size(&self) -> u32 {
        self.layout.arena_size
    }

    fn request_ptr(&self, index: u32) -> *mut Request {
        let slot = (index & (self.layout.ring_entries - 1)) as usize;
        // SAFETY: slot < entries, so the slot lies inside this channel.
        unsafe { (self.base.add(self.layout.requests_offset()) as *mut Request).add(slot) }
    }

    fn completion_ptr(&self, index: u32) -> *mut Completion {
        let slot = (index & (self.layout.ring_entries - 1)) as usize;
        // SAFETY: slot < entries, so the slot lies inside this channel.
        unsafe { (self.base.add(self.layout.completions_offset()) as *mut Completion).add(slot) }
    }

    /// The publication stamp of request slot `index` (acquire).
    pub fn request_stamp(&self, index: u32) -> u16 {
        // SAFETY: the stamp is an aligned u16 inside the slot; the producer
        // writes it only atomically, so an atomic view is sound.
        unsafe { AtomicU16::from_ptr(std::ptr::addr_of_mut!((*self.request_ptr(index)).stamp)) }
            .load(Ordering::Acquire)
    }

    /// The publication stamp of completion slot `index` (acquire).
    pub fn completion_stamp(&self, index: u32) -> u16 {
        // SAFETY: as for request_stamp.
        unsafe { AtomicU16::from_ptr(std::ptr::addr_of_mut!((*self.completion_ptr(index)).stamp)) }
            .load(Ordering::Acquire)
    }

    /// Copies the request in slot `index % entries` out of shared memory.
    pub fn read_request(&self, index: u32) -> Request {
        // SAFETY: the slot is inside the channel. A volatile read yields
        // *some* bit pattern even if the host writes concurrently, and every
        // bit pattern is a valid Request (plain integers).
        unsafe { std::ptr::read_volatile(self.request_ptr(index)) }
    }

    /// Writes a request into slot `index` and publishes it: the body first,
    /// then the slot's stamp for `index` with release ordering.
    pub fn write_request(&self, index: u32, r: &Request) {
        let p = self.request_ptr(index);
        // SAFETY: the producer owns this slot until it publishes it; every
        // field but the stamp is written plainly, the stamp atomically last.
        unsafe {
            std::ptr::addr_of_mut!((*p).user_data).write_volatile(r.user_data);
            std::ptr::addr_of_mut!((*p).op).write_volatile(r.op);
            std::ptr::addr_of_mut!((*p).sock).write_volatile(r.sock);
            std::ptr::addr_of_mut!((*p).buf_off).write_volatile(r.buf_off);
            std::ptr::addr_of_mut!((*p).buf_len).write_volatile(r.buf_len);
            std::ptr::addr_of_mut!((*p).args).write_volatile(r.args);
            AtomicU16::from_ptr(std::ptr::addr_of_mut!((*p).stamp))
                .store(stamp(index, self.layout.ring_entries), Ordering::Release);
        }
    }

    pub fn read_completion(&self, index: u32) -> Completion {
        // SAFETY: as for read_request; every bit pattern is a valid Completion.
        unsafe { std::ptr::read_volatile(self.completion_ptr(index)) }
    }

    /// Writes a completion into slot `index` and publishes it (stamp last).
    pub fn write_completion(&self, index: u32, c: &Completion) {
        let p = self.completion_ptr(index);
        // SAFETY: the server owns this slot until it publishes it.
        unsafe {
            std::ptr::addr_of_mut!((*p).user_data).write_volatile(c.user_data);
            std::ptr::addr_of_mut!((*p).op).write_volatile(c.op);
            std::ptr::addr_of_mut!((*p).errno).write_volatile(c.errno);
            std::ptr::addr_of_mut!((*p).result).write_volatile(c.result);
            std::ptr::addr_of_mut!((*p).aux).write_volatile(c.aux);
            AtomicU16::from_ptr(std::ptr::addr_of_mut!((*p).stamp))
                .store(stamp(index, self.layout.ring_entries), Ordering::Release);
        }
    }

    /// Raw pointer to a checked arena range. The other side may write these
    /// bytes at any time: hand the pointer to the kernel (send/recv) or copy
    /// through it, never form a Rust reference to it.
    pub fn arena_ptr(&self, range: ArenaRange) -> Option<*mut u8> {
        if range.end() > self.layout.arena_size as usize {
            return None;
        }
        // SAFETY: the range was just checked to lie inside this channel's arena.
        Some(unsafe {
            self.base
                .add(self.layout.arena_offset() + range.off as usize)
        })
    }

    /// Copies `src` into the arena at `off`. Returns false if it does not fit.
    pub fn copy_to_arena(&self, off: u32, src: &[u8]) -> bool {
        let Ok(len) = u32::try_from(src.len()) else {
            return false;
        };
        match self.arena_ptr(ArenaRange { off, len }) {
            Some(p) => {
                // SAFETY: p..p+len is inside the arena (checked); src is a distinct
                // private buffer, so the ranges do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
                true
            }
            None => false,
        }
    }

    /// Copies arena bytes at `off` into `dst`. Returns false if out of range.
    pub fn copy_from_arena(&self, off: u32, dst: &mut [u8]) -> bool {
        let Ok(len) = u32::try_from(dst.len()) else {
            return false;
        };
        match self.arena_ptr(ArenaRange { off, len }) {
            Some(p) => {
                // SAFETY: as in copy_to_arena, with the roles swapped.
                unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
                true
            }
            None => false,
        }
    }
}

/// A fresh zeroed region of `layout` on a memfd, header written (tests).
#[cfg(test)]
pub(crate) fn test_region(layout: Layout) -> Region {
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: memfd_create with a valid C string; the result is checked.
    let fd = unsafe { libc::memfd_create(c"tcps-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh, owned descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fd is valid; the size is the layout's.
    assert_eq!(
        unsafe { libc::ftruncate(fd.as_raw_fd(), layout.region_size() as i64) },
        0
    );
    let r = Region::map(fd.as_fd(), layout).unwrap();
    r.init_header();
    r
}

/// A region with two of every ring (4096-byte receive rings, 4-entry send
/// queues), for the ring types' tests.
#[cfg(test)]
pub(crate) fn test_rings() -> Region {
    test_region(Layout {
        n_channels: 1,
        ring_entries: 4,
        arena_size: 4096,
        send_queues: 2,
        sq_entries: 4,
        recv_rings: 2,
        rq_bytes: 4096,
    })
}
