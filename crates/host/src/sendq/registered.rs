//! Registered memory: the staging pool of copying asynchronous sends,
//! registering and ending registrations (never while a send from one is in
//! flight), and the synchronous zero-copy calls on registered memory.

use super::pool::{Pool, MAX_PIECE};
use crate::client::Client;
use crate::sys::errno;
use std::io;
use std::sync::PoisonError;
use tcps_proto::msg::MemRange;
use tcps_proto::{Call, Op};

/// Default size of the staging pool of copying asynchronous sends.
const DEFAULT_POOL_KIB: usize = 16 * 1024;

impl Client {
    /// The staging pool, registered on first use (`TCPS_ASYNC_POOL_KIB`).
    pub(super) fn pool(&self) -> io::Result<&Pool> {
        let r = self.conn.sendq.pool.get_or_init(|| {
            let kib = crate::settings::setting_num::<usize>("TCPS_ASYNC_POOL_KIB")
                .unwrap_or(DEFAULT_POOL_KIB)
                .clamp(MAX_PIECE / 1024, 1 << 22);
            let len = kib * 1024;
            self.conn
                .memory
                .alloc(self.conn.control(), len, true)
                .map(|(p, h)| Pool::new(p, h, len))
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        });
        r.as_ref().map_err(|&e| errno(e))
    }

    /// Whether registration `mem` is used by a send still in flight.
    fn registration_busy(&self, mem: u32) -> bool {
        self.reap_orphans();
        let st = &self.conn.sendq;
        let in_orphans = st
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|o| o.pending.iter().any(|p| u32::from(p.mem) == mem));
        in_orphans
            || self.conn.socks.any(|k| {
                let mut g = k.send.lock();
                self.refresh_bound(&mut g);
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
        let sock = match op {
            Op::RecvReg => Some(self.conn.socks.get_or_insert(s)?),
            _ => self.conn.socks.get(s),
        };
        if let Some(sock) = sock {
            self.async_error_of(sock)?;
        }
        if let (Op::RecvReg, Some(sock)) = (op, sock) {
            // A socket whose first receive is into registered memory keeps
            // receiving on demand, straight into it (no copy): it gets no
            // ring unless the server set one up at accept.
            self.eager_prefer_plain(sock);
            // A socket with a receive ring: copy from it (one copy, counted).
            // SAFETY: `ptr..ptr+len` lies inside a registration (checked
            // above), memory this process owns and lets the server write;
            // nothing else reads it during the call.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            if let Some(n) = self.ring_recv(s, sock, buf, flags)? {
                return Ok(n);
            }
        }
        let flags = sock.map_or(flags, |k| k.request_flags(flags));
        // `mem` passed `offset_of`: a registration's handle, which fits.
        let data = MemRange {
            mem: mem as u16,
            off,
            len: len32,
        };
        let call = if op == Op::SendReg {
            Call::SendReg {
                sock: s,
                data,
                flags,
            }
        } else {
            Call::RecvReg {
                sock: s,
                data,
                flags,
            }
        };
        let c = self.simple_call(call)?;
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
