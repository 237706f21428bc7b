//! The host doorbell: an eventfd this server adds 1 to when it woke a
//! thread of the host that sleeps on a ring, so that the host can block in
//! one poll(2) on its kernel fds and its rings at once (`epoll_wait` over a
//! mixed set under the preload), with no call parked here and no helper
//! thread. The opposite direction of the host's doorbell the server sleeps
//! on (`Host::doorbell`).
//!
//! The host asks for it once (`ControlMsg::HostDoorbell`); the server makes
//! the eventfd itself (so it never writes to a descriptor a host chose) and
//! hands it out. It is rung at most once per worker pass and host, and only
//! when the pass published to a ring a doorbell sleeper of that host had
//! registered on (`host_waiting` from `BELL_SLEEPER` up, the rings'
//! lost-wake-up handshake; counted in `bell_wants`). Such a publish makes
//! no futex wake: the one doorbell write is the whole wake-up.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub struct HostDoorbell {
    fd: OwnedFd,
    /// The host's `stats.bell_wants` when it was last rung (or made).
    rung_at: u64,
}

impl HostDoorbell {
    /// The doorbell in `slot`, made on first request (`wants`: the host's
    /// `bell_wants` now): a duplicate of its eventfd to hand out.
    pub fn get(slot: &mut Option<HostDoorbell>, wants: u64) -> Result<OwnedFd, i32> {
        let bell = match slot {
            Some(b) => b,
            None => {
                // SAFETY: plain syscall; the result is checked before use.
                let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                if fd < 0 {
                    return Err(std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EMFILE));
                }
                slot.insert(HostDoorbell {
                    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
                    fd: unsafe { OwnedFd::from_raw_fd(fd) },
                    rung_at: wants,
                })
            }
        };
        bell.fd
            .try_clone()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))
    }

    /// End of a worker pass: rings if the pass published to a ring a
    /// doorbell sleeper of the host registered on (`wants`, the host's
    /// `bell_wants`, moved from `rung_at`). Never blocks (the eventfd is
    /// non-blocking; EAGAIN would mean the counter is about to overflow,
    /// i.e. it is rung already). Returns whether it rang.
    pub fn ring_if_woken(&mut self, wants: u64) -> bool {
        if self.rung_at == wants {
            return false;
        }
        self.rung_at = wants;
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a local buffer to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        true
    }
}
