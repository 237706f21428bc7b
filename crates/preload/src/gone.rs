//! Surviving the TCP server's death.
//!
//! When the server dies, every offloaded socket is as good as reset: each
//! reports its error once and is quiet afterwards, so a program's event
//! loop neither spins nor floods its log. A wait (`epoll_wait`, `poll`,
//! `select`) reports `EPOLLERR|EPOLLHUP` (`POLLERR|POLLHUP`) once per
//! socket and afterwards waits on its kernel fds alone; the next call on a
//! socket fails with ECONNRESET, later ones with ENOTCONN (sends: EPIPE);
//! `accept` fails once with ECONNABORTED and then blocks (EAGAIN when
//! non-blocking). New TCP sockets follow `TCPS_FALLBACK` (`attach.rs`).
//!
//! The death is noticed by the host library (its waits check the server
//! every 100 ms, and a doorbell sleep wakes when the server's end of the
//! doorbell closes), which marks the attachment detached; here that is one
//! load per wait.

use crate::fdtable::MAX_IDS;
use crate::log;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use tcps::Client;

/// The death was announced (one line per process).
static ANNOUNCED: AtomicBool = AtomicBool::new(false);

/// Per socket id: what it already reported of the death.
static REPORTED: [AtomicU8; MAX_IDS] = [const { AtomicU8::new(0) }; MAX_IDS];
const IN_WAIT: u8 = 1;
const ON_CALL: u8 = 2;

/// Whether `c`'s server is gone (one load; the host library notices).
pub fn gone(c: &Client) -> bool {
    if c.is_attached() {
        return false;
    }
    if !ANNOUNCED.swap(true, Ordering::Relaxed) {
        log::emit(
            "the tcps server is gone: offloaded sockets report a reset once; new sockets follow --fallback",
        );
    }
    true
}

/// Asks the server whether it is still there (a system call), then as
/// [`gone`]: for a new socket, which must not be offloaded to a dead one.
pub fn check(c: &Client) -> bool {
    c.check_server();
    gone(c)
}

/// Marks `what` reported for socket `id`; true the first time.
fn first(id: u32, what: u8) -> bool {
    let slot = &REPORTED[id as usize % MAX_IDS];
    slot.fetch_or(what, Ordering::Relaxed) & what == 0
}

/// Whether a wait reports socket `id`'s reset now (once per socket).
pub fn report_in_wait(id: u32) -> bool {
    first(id, IN_WAIT)
}

/// The error a call on socket `id` gets (`gone` holds): ECONNRESET the
/// first time, then `later`.
pub fn call_error(id: u32, later: i32) -> i32 {
    if first(id, ON_CALL) {
        libc::ECONNRESET
    } else {
        later
    }
}

/// A call on socket `id` failed with `errno` in the host library: if that
/// was the death (the server went away while it waited: ECONNRESET), it
/// was this socket's report, and later calls get the later error.
pub fn seen_by_call(c: &Client, id: u32, errno: i32) -> i32 {
    if errno == libc::ECONNRESET && gone(c) {
        first(id, ON_CALL);
    }
    errno
}

/// `accept` on listener `id` (placeholder `fd`): ECONNABORTED once, then
/// EAGAIN if non-blocking, else it blocks (until a signal: EINTR).
pub fn accept_error(fd: libc::c_int, id: u32, flags_nonblock: bool) -> i32 {
    if first(id, ON_CALL) {
        return libc::ECONNABORTED;
    }
    // SAFETY: F_GETFL on the placeholder, which carries the O_NONBLOCK.
    let fl = unsafe { crate::real::fcntl()(fd, libc::F_GETFL) };
    if flags_nonblock || (fl >= 0 && fl & libc::O_NONBLOCK != 0) {
        return libc::EAGAIN;
    }
    loop {
        // SAFETY: a poll on no descriptors: sleeps until a signal.
        unsafe { crate::real::poll()(std::ptr::null_mut(), 0, -1) };
        if crate::errno::last_errno() == libc::EINTR {
            return libc::EINTR;
        }
    }
}
