//! Waiting on the sockets of several servers at once (a host that uses a
//! group of servers, `group.rs`) and on kernel fds: `poll` and `select`
//! over such a mix (`poll.rs` sorts the entries by server), and the sleep
//! of `epoll_wait` when its entries are on several servers. Each server's
//! sockets are looked at on their own attachment; a sleep is one poll(2)
//! on every attachment's host doorbell and the kernel fds
//! (`tcps::sleep_on_many`), in slices after which each server is asked
//! whether it is still there (a cut link ends its part of the wait).

use crate::deadline::Deadline;
use crate::{real, ring_sleep};
use libc::{c_int, pollfd};
use tcps::{Client, PollFd};

/// The longest sleep between two looks at the servers' health.
pub const SLICE_MS: c_int = 100;
/// A sleep when the rings cannot be watched (an entry that needs the
/// server): a short nap, then a look again.
const NAP_MS: c_int = 2;

/// One server's entries of a wait, and where each came from in the
/// caller's list.
pub struct Part {
    pub c: &'static Client,
    pub fds: Vec<PollFd>,
    pub at: Vec<usize>,
}

/// The part of `parts` for attachment `c` (made on first use).
pub fn part_for<'a>(parts: &'a mut Vec<Part>, c: &'static Client) -> &'a mut Part {
    let i = match parts.iter().position(|p| std::ptr::eq(p.c, c)) {
        Some(i) => i,
        None => {
            parts.push(Part {
                c,
                fds: Vec::new(),
                at: Vec::new(),
            });
            parts.len() - 1
        }
    };
    &mut parts[i]
}

/// Whether a server of `parts` is gone (each is asked at most every 100
/// ms: `gone::check_members`).
fn a_server_died(parts: &[Part]) -> bool {
    crate::gone::check_members();
    parts.iter().any(|p| crate::gone::gone(p.c))
}

/// Fills `revents` of every part and of `kernel`; returns how many entries
/// are ready, after waiting up to `timeout_ms` (<0: forever) for the first.
/// `Ok(None)`: a server of the wait died meanwhile (sort the entries again).
pub fn wait(
    parts: &mut [Part],
    kernel: &mut [pollfd],
    timeout_ms: c_int,
) -> Result<Option<usize>, i32> {
    let deadline = Deadline::after(timeout_ms);
    loop {
        let mut n = 0;
        for p in parts.iter_mut().filter(|p| !p.fds.is_empty()) {
            match crate::sendq::poll(p.c, &mut p.fds, 0) {
                Ok(k) => n += k,
                Err(_) if crate::gone::gone(p.c) => return Ok(None),
                Err(e) => return Err(crate::errno::errno_of(&e)),
            }
        }
        n += if kernel.is_empty() {
            0
        } else {
            real::poll_fds(kernel, 0)?
        };
        let remaining = deadline.left();
        if n > 0 || remaining == 0 {
            return Ok(Some(n));
        }
        let slice = if remaining < 0 {
            SLICE_MS
        } else {
            remaining.min(SLICE_MS)
        };
        let mut rings: Vec<(&Client, &mut [PollFd])> =
            parts.iter_mut().map(|p| (p.c, &mut p.fds[..])).collect();
        if !ring_sleep::sleep_many(&mut rings, kernel, slice)? {
            real::poll_fds(kernel, slice.min(NAP_MS))?;
        }
        if a_server_died(parts) {
            return Ok(None);
        }
    }
}
