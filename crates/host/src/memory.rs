//! Registered memory: host memory the TCP server maps too, so data sent from
//! it (or received into it) is never copied by the host library, and the
//! server's `send(2)`/`recv(2)` use it in place.
//!
//! Every registration is a memfd, passed to the server on the control
//! socket (`ControlMsg::Register`) and sealed against shrinking so the
//! server's mapping can never fault. Two ways in:
//!
//! * [`Registry::alloc`]: fresh memory (an mmap of a new memfd) — the
//!   simplest, for buffers allocated with sending in mind;
//! * [`Registry::register`]: existing, page-aligned private memory (e.g. a
//!   file cache) is *moved in place* onto a memfd: its contents are copied
//!   once, then the same addresses are remapped (`MAP_FIXED`) onto the memfd,
//!   so the application's pointers stay valid. Nothing else may touch the
//!   range while it is being registered.
//!
//! Why not register arbitrary memory as RDMA does? Another process can only
//! reach a process's anonymous memory by copying it (`process_vm_readv`),
//! which is exactly the copy registration exists to avoid; a shared file
//! mapping is the one zero-copy way, so registration makes the memory one.

use crate::control::Control;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use tcps_proto::handshake::ControlMsg;
use tcps_proto::sendq::MAX_REGISTRATIONS;

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// One registration: `len` bytes at `base` (0: the slot is free). Read
/// without a lock on the send path.
#[derive(Default)]
struct Slot {
    base: AtomicUsize,
    len: AtomicUsize,
}

/// How a registration was made (what deregistering it must undo).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// [`Registry::alloc`]: unmapped when freed.
    Allocated,
    /// [`Registry::register`]: stays mapped (now shared) for the application.
    InPlace,
}

pub(crate) struct Registry {
    slots: Box<[Slot]>,
    /// Registration bookkeeping, one at a time (the control socket's
    /// exchanges are serialized by `Control` itself).
    books: Mutex<Vec<Option<Kind>>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            slots: (0..MAX_REGISTRATIONS).map(|_| Slot::default()).collect(),
            books: Mutex::new(vec![None; MAX_REGISTRATIONS as usize]),
        }
    }

    /// The offset of `[ptr, ptr+len)` inside registration `handle`; EINVAL
    /// if the handle is unknown or the range is not inside it.
    #[inline]
    pub fn offset_of(&self, handle: u32, ptr: *const u8, len: usize) -> io::Result<u64> {
        let slot = self.slots.get(handle as usize).ok_or(errno(libc::EINVAL))?;
        let base = slot.base.load(Ordering::Acquire);
        let size = slot.len.load(Ordering::Relaxed);
        let p = ptr as usize;
        if base == 0 || p < base || p.checked_add(len).is_none_or(|e| e > base + size) {
            return Err(errno(libc::EINVAL));
        }
        Ok((p - base) as u64)
    }

    /// The registration holding `[ptr, ptr+len)`, if any (a scan: for calls
    /// that are not given a handle).
    pub fn find(&self, ptr: *const u8, len: usize) -> Option<(u32, u64)> {
        (0..self.slots.len() as u32).find_map(|h| Some((h, self.offset_of(h, ptr, len).ok()?)))
    }

    /// Allocates `len` bytes of registered memory (rounded up to pages);
    /// `populate` faults the pages in now (for memory used at once, like the
    /// staging pool, so no send pays a first-touch fault).
    pub fn alloc(&self, ctl: &Control, len: usize, populate: bool) -> io::Result<(*mut u8, u32)> {
        let len = len.max(1).next_multiple_of(page());
        let fd = sealed_memfd(len)?;
        let extra = if populate { libc::MAP_POPULATE } else { 0 };
        let p = map_shared(fd.as_raw_fd(), std::ptr::null_mut(), len, extra)?;
        match self.add(ctl, fd, p, len, Kind::Allocated) {
            Ok(h) => Ok((p, h)),
            Err(e) => {
                // SAFETY: unmapping the mapping made just above.
                unsafe { libc::munmap(p as *mut libc::c_void, len) };
                Err(e)
            }
        }
    }

    /// Registers existing memory in place (see the module docs): `ptr` and
    /// `len` must be page aligned (EINVAL otherwise).
    pub fn register(&self, ctl: &Control, ptr: *mut u8, len: usize) -> io::Result<u32> {
        let pg = page();
        if ptr.is_null()
            || len == 0
            || !(ptr as usize).is_multiple_of(pg)
            || !len.is_multiple_of(pg)
        {
            return Err(errno(libc::EINVAL));
        }
        let fd = sealed_memfd(len)?;
        // Copy the contents into the memfd through a temporary mapping, then
        // put the memfd where the memory was.
        let tmp = map_shared(fd.as_raw_fd(), std::ptr::null_mut(), len, 0)?;
        // SAFETY: `ptr..ptr+len` is the caller's memory (the C contract),
        // `tmp` a fresh mapping of the same length; they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr, tmp, len);
            libc::munmap(tmp as *mut libc::c_void, len);
        }
        let p = map_shared(fd.as_raw_fd(), ptr, len, libc::MAP_FIXED)?;
        self.add(ctl, fd, p, len, Kind::InPlace)
    }

    /// Tells the server about a new registration and records it.
    fn add(
        &self,
        ctl: &Control,
        fd: OwnedFd,
        p: *mut u8,
        len: usize,
        kind: Kind,
    ) -> io::Result<u32> {
        let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
        let handle = books
            .iter()
            .position(Option::is_none)
            .ok_or(errno(libc::ENOSPC))? as u32;
        let msg = ControlMsg::Register {
            handle,
            len: len as u64,
        };
        ctl.call(&msg, &[fd.as_raw_fd()])?;
        books[handle as usize] = Some(kind);
        let slot = &self.slots[handle as usize];
        slot.len.store(len, Ordering::Relaxed);
        slot.base.store(p as usize, Ordering::Release);
        Ok(handle)
    }

    /// Deregisters `handle` (the caller checked no send of ours uses it; the
    /// server checks its own side and answers EBUSY). Memory from
    /// [`alloc`](Self::alloc) is unmapped; memory registered in place stays
    /// mapped, contents intact.
    pub fn deregister(&self, ctl: &Control, handle: u32) -> io::Result<()> {
        let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
        let kind = books
            .get(handle as usize)
            .copied()
            .flatten()
            .ok_or(errno(libc::EINVAL))?;
        ctl.call(&ControlMsg::Deregister { handle }, &[])?;
        books[handle as usize] = None;
        let slot = &self.slots[handle as usize];
        let base = slot.base.swap(0, Ordering::AcqRel);
        let len = slot.len.swap(0, Ordering::Relaxed);
        if kind == Kind::Allocated && base != 0 {
            // SAFETY: unmapping memory `alloc` mapped, now unknown to the server.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
        Ok(())
    }
}

/// A memfd of `len` bytes sealed so it can never shrink or grow.
fn sealed_memfd(len: usize) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"tcps-registered".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: resizing and sealing our own memfd.
    let ok = unsafe {
        libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) == 0
            && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn map_shared(fd: RawFd, at: *mut u8, len: usize, extra: i32) -> io::Result<*mut u8> {
    // SAFETY: a shared mapping of our memfd; with MAP_FIXED, `at..at+len` is
    // memory the caller owns and hands over (see `register`).
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | extra,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}
