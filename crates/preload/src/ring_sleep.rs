//! Blocking on offloaded sockets and kernel fds with no round trip: when
//! every offloaded entry of a wait can be answered from its receive or
//! accept ring, the thread registers on those rings and sleeps in one real
//! poll(2) on the kernel fds and the attachment's host doorbell, which the
//! server rings when it woke a ring sleeper of this process
//! (`tcps::RingWait`). No helper thread, no call parked at the server.
//!
//! One sleeper at a time per process: the doorbell is one eventfd, and a
//! sleeper empties it before its last look at the rings (a ring rung after
//! that look stays readable until it polls). A second thread emptying it
//! could swallow the first one's ring, so while one thread sleeps here the
//! others wait the old way (`poll::wait_mixed`'s helper thread and the
//! server). Single-threaded event loops (nginx, redis) always come here.
//! `TCPS_HOST_DOORBELL=0` turns it off.

use crate::{real, state};
use libc::{c_int, pollfd};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use tcps::{Client, PollFd};

/// The sleeper: `generation << 1 | 1` while held (a forked child, in a new
/// generation, does not inherit a sleeper of its parent), else 0.
static SLEEPER: AtomicU64 = AtomicU64::new(0);

/// 0 unknown, 1 on, 2 off (`TCPS_HOST_DOORBELL`).
static ENABLED: AtomicU8 = AtomicU8::new(0);

fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let off = tcps::setting_str("TCPS_HOST_DOORBELL")
                .is_some_and(|v| v.is_ok_and(|v| matches!(v.trim(), "0" | "off" | "no" | "false")));
            ENABLED.store(if off { 2 } else { 1 }, Ordering::Relaxed);
            !off
        }
    }
}

/// Held while this thread is the process's doorbell sleeper.
struct Sleeper;

impl Sleeper {
    fn take() -> Option<Sleeper> {
        let me = state::generation() << 1 | 1;
        let v = SLEEPER.load(Ordering::Acquire);
        if v == me {
            return None; // another thread of this process sleeps here
        }
        SLEEPER
            .compare_exchange(v, me, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| Sleeper)
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        SLEEPER.store(0, Ordering::Release);
    }
}

/// Sleeps until a ring of `tcps` moves, a kernel fd of `kernel` is ready,
/// or `timeout_ms` (<0: forever) passes, without asking the server.
/// Readiness is collected by the caller's next pass. `Ok(false)`: this wait
/// cannot be done here (an entry needs the server, another thread sleeps
/// here, or no doorbell); nothing was waited for.
pub fn sleep(
    c: &Client,
    tcps: &mut [PollFd],
    kernel: &[pollfd],
    timeout_ms: c_int,
) -> Result<bool, i32> {
    if !enabled() {
        return Ok(false);
    }
    let Some(_sleeper) = Sleeper::take() else {
        return Ok(false);
    };
    let Ok(bell) = c.host_doorbell() else {
        return Ok(false);
    };
    let Some(_registered) = c.ring_wait(tcps) else {
        return Ok(false);
    };
    drain(bell);
    // The last look, after registering and emptying the bell: a ring that
    // moves from here on rings the bell.
    for t in tcps.iter_mut() {
        t.revents = 0;
    }
    match c.poll(tcps, 0) {
        Ok(0) => {}
        Ok(_) => return Ok(true),
        Err(e) => return Err(crate::errno::errno_of(&e)),
    }
    let mut fds: Vec<pollfd> = kernel.iter().map(|p| pollfd { revents: 0, ..*p }).collect();
    fds.push(pollfd {
        fd: bell,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: `fds` is a valid array of pollfds for its length.
    let n = unsafe { real::poll()(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        return Err(crate::errno::last_errno());
    }
    Ok(true)
}

/// Empties the doorbell (non-blocking: nothing to read is fine).
fn drain(bell: c_int) {
    let mut b = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a local buffer from our eventfd.
    unsafe { real::read()(bell, b.as_mut_ptr().cast(), b.len()) };
}
