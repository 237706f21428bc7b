//! A host's registered memory: memfds the host passed on its control socket,
//! mapped here so the server sends from them and receives into them
//! directly (no copy at the server, none at the host).
//!
//! A registration is refused unless the memfd is sealed against shrinking
//! and at least as large as claimed, so the mapping can never fault. It is
//! unmapped only when no send or receive uses it (EBUSY otherwise).
//!
//! Every mapping takes the server's address space (a sparse memfd costs
//! no memory but up to 64 GiB of addresses) and one of its VMAs, so each
//! host has a budget ([`Budget`]: `--max-registered-bytes-per-host`,
//! ENOMEM beyond; `--max-registrations-per-host`, ENOSPC beyond).

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use tcps_proto::msg::MemRange;
use tcps_proto::sendq::MAX_REGISTRATIONS;

/// Largest registration (bytes).
const MAX_REGISTRATION_LEN: u64 = 1 << 36;

/// One mapped memfd.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is shared memory owned by this value; the worker that
// owns the host is the only thread using it (an operation in flight only
// keeps it mapped: `Registry::keep`).
unsafe impl Send for Mapping {}
// SAFETY: as above; nothing is read or written through `&Mapping`.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `Registry::register` mapped; no
        // pointer into it outlives the registration (`in_use` was zero).
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

struct Entry {
    /// Shared with operations in flight (`keep`): unmapped when the last
    /// of them completed, also after the registration or host went away.
    map: std::sync::Arc<Mapping>,
    /// Parked or queued calls pointing into the mapping.
    in_use: u32,
    /// The memfd, kept for a hot upgrade to map it again (`upgrade`).
    fd: OwnedFd,
}

#[derive(Default)]
pub struct Registry {
    entries: Vec<Option<Entry>>,
    /// Bytes mapped by the live registrations.
    mapped: u64,
}

/// What a host may have registered at once.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub max_bytes: u64,
    pub max_count: u32,
}

impl Budget {
    pub fn of(cfg: &crate::config::Config) -> Budget {
        Budget {
            max_bytes: cfg.max_registered_bytes_per_host,
            max_count: cfg.max_registrations_per_host,
        }
    }
}

impl Registry {
    /// Maps `fd` as registration `handle` of `len` bytes; an errno if the
    /// handle is taken or out of range, the memfd is unsafe to map, or the
    /// host is at its budget (ENOSPC: registrations, ENOMEM: bytes).
    pub fn register(
        &mut self,
        handle: u32,
        fd: OwnedFd,
        len: u64,
        budget: Budget,
    ) -> Result<(), i32> {
        if handle >= MAX_REGISTRATIONS || len == 0 || len > MAX_REGISTRATION_LEN {
            return Err(libc::EINVAL);
        }
        let h = handle as usize;
        if self.entries.get(h).is_some_and(Option::is_some) {
            return Err(libc::EEXIST);
        }
        if self.count() >= budget.max_count as usize {
            return Err(libc::ENOSPC);
        }
        if self.mapped.saturating_add(len) > budget.max_bytes {
            return Err(libc::ENOMEM);
        }
        let raw = fd.as_raw_fd();
        // SAFETY: F_GET_SEALS on a descriptor we own.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(libc::EPERM);
        }
        // SAFETY: fstat into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(raw, &mut st) } != 0 || (st.st_size as u64) < len {
            return Err(libc::EINVAL);
        }
        // SAFETY: a fresh shared mapping of a sealed file at least `len`
        // long; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(crate::sys::errno());
        }
        let base = NonNull::new(p as *mut u8).ok_or(libc::ENOMEM)?;
        if self.entries.len() <= h {
            self.entries.resize_with(h + 1, || None);
        }
        self.mapped += len;
        self.entries[h] = Some(Entry {
            map: std::sync::Arc::new(Mapping {
                base,
                len: len as usize,
            }),
            in_use: 0,
            fd,
        });
        Ok(())
    }

    /// Unmaps registration `handle`; EBUSY while calls use it.
    pub fn deregister(&mut self, handle: u32) -> Result<(), i32> {
        let slot = self.entries.get_mut(handle as usize).ok_or(libc::EINVAL)?;
        match slot {
            None => Err(libc::EINVAL),
            Some(e) if e.in_use > 0 => Err(libc::EBUSY),
            Some(e) => {
                self.mapped -= e.map.len as u64;
                *slot = None;
                Ok(())
            }
        }
    }

    /// The address of a registered range: EINVAL for an unknown handle,
    /// EFAULT for a range outside the registration.
    pub fn resolve(&self, r: MemRange) -> Result<*mut u8, i32> {
        let e = self
            .entries
            .get(r.mem as usize)
            .and_then(Option::as_ref)
            .ok_or(libc::EINVAL)?;
        let end = r.off.checked_add(u64::from(r.len)).ok_or(libc::EFAULT)?;
        if end > e.map.len as u64 {
            return Err(libc::EFAULT);
        }
        // SAFETY: off + len ≤ the mapping's length.
        Ok(unsafe { e.map.base.as_ptr().add(r.off as usize) })
    }

    /// A call starts using registration `handle` (it was resolved).
    pub fn hold(&mut self, handle: u16) {
        if let Some(Some(e)) = self.entries.get_mut(handle as usize) {
            e.in_use += 1;
        }
    }

    /// A call stopped using registration `handle`.
    pub fn release(&mut self, handle: u16) {
        if let Some(Some(e)) = self.entries.get_mut(handle as usize) {
            e.in_use = e.in_use.saturating_sub(1);
        }
    }

    /// What keeps registration `handle` mapped while the kernel reads from
    /// it after the call returned (an operation in flight,
    /// `Engine::submit_send`).
    pub fn keep(&self, handle: u16) -> Option<crate::engine::Mapped> {
        let e = self.entries.get(handle as usize)?.as_ref()?;
        Some(e.map.clone())
    }

    /// Every registration as (handle, memfd, length): what a hot upgrade
    /// carries (`upgrade::record`).
    pub fn carried(&self) -> Vec<(u32, std::os::fd::RawFd, u64)> {
        let live = self.entries.iter().enumerate();
        live.filter_map(|(h, e)| {
            Some((
                h as u32,
                e.as_ref()?.fd.as_raw_fd(),
                e.as_ref()?.map.len as u64,
            ))
        })
        .collect()
    }

    pub fn count(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// Bytes mapped by the live registrations.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(len: i64, seals: i32) -> OwnedFd {
        // SAFETY: memfd_create with a valid name; checked.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor; resized and sealed before use.
        unsafe {
            assert_eq!(libc::ftruncate(fd, len), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, seals), 0);
            }
            OwnedFd::from_raw_fd(fd)
        }
    }

    const ANY: Budget = Budget {
        max_bytes: u64::MAX,
        max_count: u32::MAX,
    };

    #[test]
    fn budgets_bound_count_and_bytes() {
        let mut r = Registry::default();
        let b = Budget {
            max_bytes: 3 * 4096,
            max_count: 2,
        };
        let fd = || memfd(8192, libc::F_SEAL_SHRINK);
        assert_eq!(r.register(0, fd(), 8192, b), Ok(()));
        assert_eq!(r.register(1, fd(), 8192, b), Err(libc::ENOMEM));
        assert_eq!(r.register(1, fd(), 4096, b), Ok(()));
        assert_eq!(r.register(2, fd(), 4096, b), Err(libc::ENOSPC));
        assert_eq!(r.mapped(), 3 * 4096);
        assert_eq!(r.deregister(0), Ok(()));
        assert_eq!(r.mapped(), 4096);
        assert_eq!(r.register(2, fd(), 8192, b), Ok(()));
    }

    #[test]
    fn unsealed_or_short_memfds_are_refused() {
        let mut r = Registry::default();
        assert_eq!(r.register(0, memfd(4096, 0), 4096, ANY), Err(libc::EPERM));
        assert_eq!(
            r.register(0, memfd(4096, libc::F_SEAL_SHRINK), 8192, ANY),
            Err(libc::EINVAL)
        );
        assert_eq!(
            r.register(
                MAX_REGISTRATIONS,
                memfd(4096, libc::F_SEAL_SHRINK),
                4096,
                ANY
            ),
            Err(libc::EINVAL)
        );
        assert_eq!(
            r.register(1, memfd(4096, libc::F_SEAL_SHRINK), 4096, ANY),
            Ok(())
        );
        assert_eq!(
            r.register(1, memfd(4096, libc::F_SEAL_SHRINK), 4096, ANY),
            Err(libc::EEXIST)
        );
    }

    #[test]
    fn ranges_are_bounded_and_busy_registrations_stay() {
        let mut r = Registry::default();
        r.register(2, memfd(8192, libc::F_SEAL_SHRINK), 8192, ANY)
            .unwrap();
        let range = |off, len| MemRange { mem: 2, off, len };
        assert!(r.resolve(range(0, 8192)).is_ok());
        assert_eq!(r.resolve(range(4096, 4097)), Err(libc::EFAULT));
        assert_eq!(r.resolve(range(u64::MAX, 2)), Err(libc::EFAULT));
        assert_eq!(
            r.resolve(MemRange {
                mem: 3,
                off: 0,
                len: 1
            }),
            Err(libc::EINVAL)
        );
        r.hold(2);
        assert_eq!(r.deregister(2), Err(libc::EBUSY));
        r.release(2);
        assert_eq!(r.deregister(2), Ok(()));
        assert_eq!(r.resolve(range(0, 1)), Err(libc::EINVAL));
        assert_eq!(r.deregister(2), Err(libc::EINVAL));
    }
}
