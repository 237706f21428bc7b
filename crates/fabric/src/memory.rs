//! Memory a peer may read and write: mapped here (anonymous, or a shared
//! file such as a host's region memfd), registered with `ucp_mem_map`,
//! described to the peer by its packed rkey.

use crate::context::Context;
use crate::error::{check, Error, Result};
use crate::sys;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr;
use std::sync::Arc;

pub(crate) struct MemInner {
    ctx: Context,
    base: *mut u8,
    len: usize,
    memh: sys::ucp_mem_h,
}

// SAFETY: the mapping is plain shared memory, read and written only by
// byte copies (`read`/`write`) as the region's other views are; the memh
// is only unmapped once, in Drop, through the thread-safe context.
unsafe impl Send for MemInner {}
// SAFETY: as above.
unsafe impl Sync for MemInner {}

impl Drop for MemInner {
    fn drop(&mut self) {
        // SAFETY: memh came from ucp_mem_map on this context; no operation
        // uses it any more (each pending operation holds an Arc of this).
        unsafe { sys::ucp_mem_unmap(self.ctx.0.raw, self.memh) };
        // SAFETY: base/len are the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Registered memory (cheap to clone; unmapped when the last clone and the
/// last operation using it are gone).
#[derive(Clone)]
pub struct Memory(pub(crate) Arc<MemInner>);

impl Memory {
    /// `len` bytes of fresh zeroed private memory, registered.
    pub fn alloc(ctx: &Context, len: usize) -> Result<Memory> {
        Self::map(ctx, len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }

    /// The first `len` bytes of a shared file (e.g. a region memfd), mapped
    /// `MAP_SHARED` and registered: writes through it are seen by every
    /// other mapping of the file. The file must be at least `len` long.
    pub fn map_shared(ctx: &Context, fd: impl AsFd, len: usize) -> Result<Memory> {
        let fd = fd.as_fd().as_raw_fd();
        // SAFETY: fstat on a borrowed, open descriptor into a local struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_size as u64) < len as u64 {
            return Err(Error::new(-5, "map_shared: file shorter than len"));
        }
        Self::map(ctx, len, libc::MAP_SHARED, fd)
    }

    fn map(ctx: &Context, len: usize, flags: i32, fd: i32) -> Result<Memory> {
        if len == 0 {
            return Err(Error::new(-5, "Memory: zero length"));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a new mapping at an address of the kernel's choice.
        let base = unsafe { libc::mmap(ptr::null_mut(), len, prot, flags, fd, 0) };
        if base == libc::MAP_FAILED {
            return Err(Error::new(-4, "mmap"));
        }
        // SAFETY: all-zero is a valid ucp_mem_map_params_t.
        let mut p: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
            | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
            | sys::UCP_MEM_MAP_PARAM_FIELD_PROT;
        p.address = base;
        p.length = len;
        p.prot = sys::UCP_MEM_MAP_PROT_LOCAL_READ
            | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE
            | sys::UCP_MEM_MAP_PROT_REMOTE_READ
            | sys::UCP_MEM_MAP_PROT_REMOTE_WRITE;
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: p names the mapping just made; memh is an out pointer.
        let status = unsafe { sys::ucp_mem_map(ctx.0.raw, &p, &mut memh) };
        if status != sys::UCS_OK {
            // SAFETY: the mapping made above, not registered.
            unsafe { libc::munmap(base, len) };
            return Err(Error::new(status, "ucp_mem_map"));
        }
        Ok(Memory(Arc::new(MemInner {
            ctx: ctx.clone(),
            base: base.cast(),
            len,
            memh,
        })))
    }

    pub fn len(&self) -> usize {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The address a peer names in `ucp_put`/`ucp_get` (with the rkey).
    pub fn addr(&self) -> u64 {
        self.0.base as u64
    }

    pub(crate) fn range(&self, off: usize, len: usize) -> Result<*mut u8> {
        match off.checked_add(len) {
            Some(end) if end <= self.0.len => {
                // SAFETY: off + len is within the mapping.
                Ok(unsafe { self.0.base.add(off) })
            }
            _ => Err(Error::new(-19, "memory range out of bounds")),
        }
    }

    /// Copies `out.len()` bytes at `off` out (a peer may be writing them:
    /// a byte copy, as of any shared memory).
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        let p = self.range(off, out.len())?;
        // SAFETY: p..p+len is inside the live mapping, which no Rust
        // reference aliases; out is a distinct buffer.
        unsafe { ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` in at `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        let p = self.range(off, data.len())?;
        // SAFETY: as in `read`.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// The packed rkey a peer unpacks (`Endpoint::remote_region`) to reach
    /// this memory; it reveals nothing but access to this memory.
    pub fn pack_rkey(&self) -> Result<Vec<u8>> {
        let mut buf: *mut libc::c_void = ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: memh is live; buf and size are out pointers.
        check(
            unsafe { sys::ucp_rkey_pack(self.0.ctx.0.raw, self.0.memh, &mut buf, &mut size) },
            "ucp_rkey_pack",
        )?;
        // SAFETY: UCX returned a buffer of `size` bytes, released once
        // after the copy.
        let out = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: as above.
        unsafe { sys::ucp_rkey_buffer_release(buf) };
        Ok(out)
    }
}
