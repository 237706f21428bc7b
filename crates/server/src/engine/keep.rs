//! What an operation in flight keeps alive until its completion has been
//! reaped ([`Keep`]), in forms that cost no allocation per operation: a
//! clone of a shared mapping's `Arc`, an accept's slot, or a send's
//! buffers taken from a per-thread pool ([`SendBuffers`]). Connection
//! caching (issue 15 item 2): a worker serving connections at a steady
//! rate takes nothing from the heap for their operations.

use std::any::Any;
use std::cell::{RefCell, UnsafeCell};
use std::mem::ManuallyDrop;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// A shared mapping an operation reads from or writes into: a host's
/// region or one of its registrations. Held, a host that goes away
/// meanwhile cannot unmap it under the kernel.
pub type Mapped = Arc<dyn Any + Send + Sync>;

/// What an operation in flight keeps alive until its completion has been
/// reaped.
pub enum Keep {
    /// It names no memory, or only memory that never goes away.
    Nothing,
    /// A shared mapping (a receive into a host's ring).
    Mapped(Mapped),
    /// An accept's slot: the engine puts the connection there.
    Accept(Arc<AcceptSlot>),
    /// A send's header, vectors and mappings.
    Send(SendBuffers),
    /// Anything else (rare operations: a connect's address).
    Boxed(Box<dyn Any + Send>),
}

/// Most sets of send buffers one thread keeps for reuse.
const POOL_MAX: usize = 256;

thread_local! {
    // Boxed: the parts of a send in flight must not move, and taking them
    // from the pool must not allocate.
    #[allow(clippy::vec_box)]
    static POOL: RefCell<Vec<Box<SendParts>>> = const { RefCell::new(Vec::new()) };
}

/// A send's `msghdr`, its iovecs and the mappings they name, at stable
/// addresses until the send's completion is reaped. Dropped, the parts go
/// back to this thread's pool (mappings released, vectors kept), so the
/// next send takes them without allocating.
pub struct SendBuffers(ManuallyDrop<Box<SendParts>>);

pub struct SendParts {
    pub maps: Vec<Mapped>,
    pub iov: Vec<libc::iovec>,
    pub msg: libc::msghdr,
}

// SAFETY: the raw pointers (`msg`'s, `iov`'s) name the mappings `maps`
// holds and `iov` itself; nothing dereferences them but the kernel, and the
// value only moves between the worker's own structures.
unsafe impl Send for SendParts {}

impl SendBuffers {
    /// Empty buffers, from the pool if it has any.
    pub fn take() -> SendBuffers {
        let parts = POOL
            .try_with(|p| p.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                Box::new(SendParts {
                    maps: Vec::new(),
                    iov: Vec::new(),
                    // SAFETY: a zeroed msghdr is valid (no name, no vectors).
                    msg: unsafe { std::mem::zeroed() },
                })
            });
        SendBuffers(ManuallyDrop::new(parts))
    }

    pub fn parts(&mut self) -> &mut SendParts {
        &mut self.0
    }

    /// Points the header at the vectors (after the last `iov` push: the
    /// vector's buffer no longer moves); the header.
    pub fn seal(&mut self) -> *const libc::msghdr {
        let p = self.parts();
        p.msg.msg_iov = p.iov.as_mut_ptr();
        p.msg.msg_iovlen = p.iov.len() as _;
        &p.msg
    }
}

impl Drop for SendBuffers {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        let mut parts = unsafe { ManuallyDrop::take(&mut self.0) };
        parts.maps.clear();
        parts.iov.clear();
        // SAFETY: a zeroed msghdr is valid.
        parts.msg = unsafe { std::mem::zeroed() };
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOL_MAX {
                p.push(parts);
            }
        });
    }
}

/// Where an accept operation (`Engine::submit_accept`) puts the peer's
/// address and, once its completion is reaped, the connection: shared by
/// the engine (until the completion) and the accept ring that waits for
/// it, so neither the kernel's write nor the new descriptor outlives it
/// (a slot nobody takes closes its connection when the last holder drops it).
pub struct AcceptSlot {
    addr: UnsafeCell<libc::sockaddr_storage>,
    len: UnsafeCell<libc::socklen_t>,
    conn: Mutex<Option<OwnedFd>>,
}

// SAFETY: the kernel writes `addr` and `len` between the submission and the
// completion; they are read only after the completion was reaped (`take`),
// on the worker thread that owns the engine, and never written by it.
unsafe impl Sync for AcceptSlot {}
// SAFETY: as above; the cells hold plain data.
unsafe impl Send for AcceptSlot {}

impl std::fmt::Debug for AcceptSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptSlot").finish_non_exhaustive()
    }
}

impl AcceptSlot {
    pub fn new() -> Arc<AcceptSlot> {
        Arc::new(AcceptSlot {
            // SAFETY: a zeroed sockaddr_storage is valid.
            addr: UnsafeCell::new(unsafe { std::mem::zeroed() }),
            len: UnsafeCell::new(std::mem::size_of::<libc::sockaddr_storage>() as _),
            conn: Mutex::new(None),
        })
    }

    /// `slot` ready for another accept, if nothing else holds it (the
    /// engine let its clone go when it reaped the completion): the
    /// listener keeps it instead of allocating a new one.
    pub fn recycle(mut slot: Arc<AcceptSlot>) -> Option<Arc<AcceptSlot>> {
        let s = Arc::get_mut(&mut slot)?;
        *s.len.get_mut() = std::mem::size_of::<libc::sockaddr_storage>() as _;
        *s.conn.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        Some(slot)
    }

    /// The kernel's pointers for an accept.
    pub(super) fn ptrs(&self) -> (*mut libc::sockaddr, *mut libc::socklen_t) {
        (self.addr.get() as *mut libc::sockaddr, self.len.get())
    }

    /// The engine reaped the accept: it returned descriptor `fd`.
    pub(super) fn set_conn(&self, fd: OwnedFd) {
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd);
    }

    /// The connection and the peer's address (its bytes, at most the
    /// storage), once the completion was reaped; `None` before or if it
    /// failed.
    pub fn take(&self) -> Option<(OwnedFd, libc::sockaddr_storage, libc::socklen_t)> {
        let fd = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        // SAFETY: the completion was reaped (`conn` is set only then): the
        // kernel no longer writes the cells.
        let (addr, len) = unsafe { (*self.addr.get(), *self.len.get()) };
        let max = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        Some((fd, addr, len.min(max)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_buffers_are_reused() {
        let mut a = SendBuffers::take();
        a.parts().iov.reserve(8);
        let held: Mapped = Arc::new(7u32);
        a.parts().maps.push(held.clone());
        let addr = a.parts() as *const SendParts;
        drop(a);
        assert_eq!(Arc::strong_count(&held), 1, "the mapping is released");
        let mut b = SendBuffers::take();
        assert_eq!(b.parts() as *const SendParts, addr, "the same parts again");
        assert!(b.parts().iov.is_empty() && b.parts().iov.capacity() >= 8);
        assert!(b.parts().maps.is_empty());
    }
}
