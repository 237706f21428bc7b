//! Blocking on offloaded sockets and kernel fds with no round trip: when
//! every offloaded entry of a wait can be answered from its receive or
//! accept ring (readability) or its send queue (POLLOUT), the thread sleeps in one real poll(2) on the kernel fds and
//! the attachment's host doorbell, which the server rings when it published
//! to one of those rings (`tcps::Client::sleep_on_rings`). No helper
//! thread, no call parked at the server. `TCPS_HOST_DOORBELL=0` turns it
//! off.

use libc::{c_int, pollfd};
use tcps::{Client, PollFd};

static DOORBELL: tcps::Switch = tcps::Switch::new("TCPS_HOST_DOORBELL");

/// Whether waits may sleep on the host doorbell (`TCPS_HOST_DOORBELL`,
/// default on).
pub fn enabled() -> bool {
    DOORBELL.on()
}

/// Sleeps until a ring of `tcps` moves, a kernel fd of `kernel` is ready,
/// or `timeout_ms` (<0: forever) passes, without asking the server.
/// Readiness is collected by the caller's next pass. `Ok(false)`: this wait
/// cannot be done here; nothing was waited for.
pub fn sleep(
    c: &Client,
    tcps: &mut [PollFd],
    kernel: &mut [pollfd],
    timeout_ms: c_int,
) -> Result<bool, i32> {
    if !enabled() {
        return Ok(false);
    }
    // POLLOUT: room by the preload's rule (SO_SNDBUF bytes in flight).
    let room = |id: u32| crate::sendq::writable(c, id);
    c.sleep_on_rings(tcps, kernel, timeout_ms, &room)
        .map_err(|e| crate::errno::errno_of(&e))
}

/// [`sleep`] over the sockets of several servers at once (a group,
/// `group.rs`): `parts` pairs each attachment with its entries.
pub fn sleep_many(
    parts: &mut [(&Client, &mut [PollFd])],
    kernel: &mut [pollfd],
    timeout_ms: c_int,
) -> Result<bool, i32> {
    if !enabled() {
        return Ok(false);
    }
    let room = |c: &Client, id: u32| crate::sendq::writable(c, id);
    tcps::sleep_on_rings_many(parts, kernel, timeout_ms, &room)
        .map_err(|e| crate::errno::errno_of(&e))
}
