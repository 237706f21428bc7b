//! A small region in a memfd, mapped twice: the server's `Region` view, and
//! raw bytes standing for the host, which may write anything anywhere in
//! its region (`scribble`).

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use tcps_proto::{Layout, Region};

pub struct Shared {
    pub region: Region,
    host: *mut u8,
    size: usize,
}

// SAFETY: one fuzzing thread uses it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub const LAYOUT: Layout = Layout {
    n_channels: 2,
    ring_entries: 8,
    arena_size: 4096,
    send_queues: 2,
    sq_entries: 8,
    recv_rings: 2,
    rq_bytes: 4096,
};

/// The region, made once per process.
pub fn shared() -> &'static Shared {
    static S: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let size = LAYOUT.region_size();
        // SAFETY: plain syscalls on a fresh memfd we own.
        let fd = unsafe {
            let fd = libc::memfd_create(c"tcps-fuzz".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            assert_eq!(libc::ftruncate(fd, size as i64), 0, "ftruncate");
            OwnedFd::from_raw_fd(fd)
        };
        let region = Region::map(fd.as_fd(), LAYOUT).expect("map the region");
        region.init_header();
        // SAFETY: a second shared mapping of the same memfd, kept for the
        // life of the process.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        assert_ne!(host, libc::MAP_FAILED);
        Shared {
            region,
            host: host.cast(),
            size,
        }
    })
}

impl Shared {
    /// The host writes `data` at `offset` of its region (clipped to `len`
    /// bytes and to the region), zeroing the rest of those `len` bytes.
    pub fn scribble(&self, offset: usize, len: usize, data: &[u8]) {
        let len = len.min(self.size.saturating_sub(offset));
        let n = data.len().min(len);
        // SAFETY: offset..offset+len is inside the mapping; nothing else
        // runs meanwhile (the server's views read it afterwards).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.host.add(offset), n);
            std::ptr::write_bytes(self.host.add(offset + n), 0, len - n);
        }
    }
}

/// A little-endian u32 of the input at `i` (0 past the end).
#[allow(dead_code)] // not every target reads numbers
pub fn u32_at(data: &[u8], i: usize) -> u32 {
    let mut b = [0u8; 4];
    for (k, x) in b.iter_mut().enumerate() {
        *x = data.get(i + k).copied().unwrap_or(0);
    }
    u32::from_le_bytes(b)
}
