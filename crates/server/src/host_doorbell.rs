//! The host doorbell: a pipe this server writes a byte to when it woke a
//! thread of the host that sleeps on a ring or send queue, so that the host
//! can block in one poll(2) on its kernel fds and its rings at once
//! (`epoll_wait` over a mixed set under the preload), with no call parked
//! here and no helper thread. The opposite direction of the host's doorbell
//! the server sleeps on (`Host::doorbell`).
//!
//! A host has up to `DOORBELL_SLOTS` of them, one per thread that sleeps
//! this way at once: it asks for each once (`ControlMsg::HostDoorbell`,
//! `handle` = the slot). The server makes the pipe itself and hands out
//! only the read end. The write end is an open file of the server's
//! alone, so its O_NONBLOCK is the server's: a host can neither make the
//! server's write block (as it could with a shared eventfd, by clearing
//! O_NONBLOCK and filling the counter) nor write to it. A full pipe (a
//! host that never reads) means it is rung already.
//!
//! A sleeper registers on each ring or send queue it watches (and on the
//! ready log) with its slot: `host_waiting` from `BELL_SLEEPER` up, the
//! lost-wake-up handshake, and its slot's bit in `bell_slots`. A publish
//! that finds it reports the slots (`Woke::bells`, gathered in the host's
//! `bells_owed`); at the end of the pass each owed doorbell is rung once,
//! however many publishes named it, and only the threads whose rings
//! moved wake. Such a publish makes no futex wake: the one doorbell write
//! is the whole wake-up.

use crate::sys;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use tcps_proto::ready_log::DOORBELL_SLOTS;

/// One doorbell: a pipe.
struct Bell {
    /// The write end (the host holds the read end).
    tx: OwnedFd,
    /// The read end, kept to hand out a duplicate when asked again.
    rx: OwnedFd,
}

/// A host's doorbells.
#[derive(Default)]
pub struct HostDoorbells {
    bells: Vec<Option<Bell>>,
}

impl HostDoorbells {
    /// Doorbell `slot`, made on first request: a duplicate of its read
    /// end to hand out. EINVAL for a slot past `DOORBELL_SLOTS`.
    pub fn get(&mut self, slot: u32) -> Result<OwnedFd, i32> {
        if slot >= DOORBELL_SLOTS {
            return Err(libc::EINVAL);
        }
        let i = slot as usize;
        if self.bells.len() <= i {
            self.bells.resize_with(i + 1, || None);
        }
        let bell = match &mut self.bells[i] {
            Some(b) => b,
            none => {
                let (rx, tx) = sys::pipe()?;
                none.insert(Bell { tx, rx })
            }
        };
        bell.rx
            .try_clone()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))
    }

    /// Every doorbell as (slot, write end, read end): what a hot upgrade
    /// carries (`upgrade::record`).
    pub fn carried(&self) -> Vec<(u32, RawFd, RawFd)> {
        let made = self.bells.iter().enumerate();
        made.filter_map(|(i, b)| {
            let b = b.as_ref()?;
            Some((i as u32, b.tx.as_raw_fd(), b.rx.as_raw_fd()))
        })
        .collect()
    }

    /// Puts back doorbell `slot` a hot upgrade carried (its two ends).
    pub fn restore(&mut self, slot: u32, tx: OwnedFd, rx: OwnedFd) {
        let i = (slot as usize).min(DOORBELL_SLOTS as usize - 1);
        if self.bells.len() <= i {
            self.bells.resize_with(i + 1, || None);
        }
        self.bells[i] = Some(Bell { tx, rx });
    }

    /// End of a worker pass: rings the doorbells the pass's publishes
    /// found sleepers of (`owed`, bit per slot, from the rings' and
    /// queues' `bell_slots`: host-written, so only a hint; bits of
    /// doorbells never made are ignored). Never blocks (the write ends are
    /// non-blocking and only the server's; EAGAIN means the pipe is full
    /// of unread rings). Returns how many it rang.
    pub fn ring(&self, owed: u64) -> u32 {
        let mut rung = 0;
        for (i, b) in self.bells.iter().enumerate() {
            if let Some(b) = b.as_ref().filter(|_| owed & (1 << i) != 0) {
                sys::pipe_ring(b.tx.as_raw_fd());
                rung += 1;
            }
        }
        rung
    }
}
