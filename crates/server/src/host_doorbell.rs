//! The host doorbell: a pipe this server writes a byte to when it woke a
//! thread of the host that sleeps on a ring or send queue, so that the host
//! can block in one poll(2) on its kernel fds and its rings at once
//! (`epoll_wait` over a mixed set under the preload), with no call parked
//! here and no helper thread. The opposite direction of the host's doorbell
//! the server sleeps on (`Host::doorbell`).
//!
//! The host asks for it once (`ControlMsg::HostDoorbell`); the server makes
//! the pipe itself and hands out only the read end. The write end is an
//! open file of the server's alone, so its O_NONBLOCK is the server's: a
//! host can neither make the server's write block (as it could with a
//! shared eventfd, by clearing O_NONBLOCK and filling the counter) nor
//! write to it. A full pipe (a host that never reads) means it is rung
//! already. It is rung at most once per worker pass and host, and only when
//! the pass published to a ring or queue a doorbell sleeper of that host
//! had registered on (`host_waiting` from `BELL_SLEEPER` up, the
//! lost-wake-up handshake; counted in `bell_wants`). Such a publish makes no
//! futex wake: the one doorbell write is the whole wake-up.

use crate::sys;
use std::os::fd::{AsRawFd, OwnedFd};

pub struct HostDoorbell {
    /// The write end (the host holds the read end).
    tx: OwnedFd,
    /// The read end, kept to hand out a duplicate when asked again.
    rx: OwnedFd,
    /// The host's `stats.bell_wants` when it was last rung (or made).
    rung_at: u64,
}

impl HostDoorbell {
    /// The doorbell in `slot`, made on first request (`wants`: the host's
    /// `bell_wants` now): a duplicate of its read end to hand out.
    pub fn get(slot: &mut Option<HostDoorbell>, wants: u64) -> Result<OwnedFd, i32> {
        let bell = match slot {
            Some(b) => b,
            None => {
                let (rx, tx) = sys::pipe()?;
                slot.insert(HostDoorbell {
                    tx,
                    rx,
                    rung_at: wants,
                })
            }
        };
        bell.rx
            .try_clone()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))
    }

    /// End of a worker pass: rings if the pass published to a ring or
    /// queue a doorbell sleeper of the host registered on (`wants`, the
    /// host's `bell_wants`, moved from `rung_at`). Never blocks (the write
    /// end is non-blocking and only the server's; EAGAIN means the pipe is
    /// full of unread rings). Returns whether it rang.
    pub fn ring_if_woken(&mut self, wants: u64) -> bool {
        if self.rung_at == wants {
            return false;
        }
        self.rung_at = wants;
        sys::pipe_ring(self.tx.as_raw_fd());
        true
    }
}
