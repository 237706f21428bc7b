//! Surviving the TCP server's death.
//!
//! When the server dies, every offloaded socket is as good as reset: each
//! reports its error once and is quiet afterwards, so a program's event
//! loop neither spins nor floods its log. A wait (`epoll_wait`, `poll`,
//! `select`) reports `EPOLLERR|EPOLLHUP` (`POLLERR|POLLHUP`) once per
//! socket and afterwards waits on its kernel fds alone; the next call on a
//! socket fails with ECONNRESET, later ones with ENOTCONN (sends: EPIPE);
//! `accept` fails once with ECONNABORTED and then blocks (EAGAIN when
//! non-blocking). New TCP sockets follow `TCPS_FALLBACK` (`attach.rs`),
//! until a server that came back is attached (`--reattach`, `reattach.rs`),
//! which takes the listeners over; the other sockets keep the dead
//! attachment (its epoch, `state.rs`) and stay as described here.
//!
//! The death is noticed by the host library (its waits check the server
//! every 100 ms, and a doorbell sleep wakes when the server's end of the
//! doorbell closes), which marks the attachment detached; here that is one
//! load per wait.

use crate::log;
use crate::state;
use std::sync::atomic::{AtomicU32, Ordering};
use tcps::Client;

/// The last epoch whose death was announced (one line per death).
static ANNOUNCED: AtomicU32 = AtomicU32::new(0);

// Per socket (`fdtable::IdState::reported`): `epoch << 8 | what it already
// reported` of the death of that epoch's attachment. Ids of a dead
// attachment come back under the next one (`--reattach`); should that one
// die too, a socket of the older attachment still unreported under a
// shared id stays quiet.
const IN_WAIT: u32 = 1;
const ON_CALL: u32 = 2;

/// Whether `c`'s server is gone (one load; the host library notices).
pub fn gone(c: &Client) -> bool {
    if c.is_attached() {
        return false;
    }
    let e = state::epoch_of(c);
    if state::is_group() && state::in_group(e) {
        crate::group::member_gone(e);
    } else if e == state::epoch() && ANNOUNCED.swap(e, Ordering::Relaxed) != e {
        if state::reattach_enabled() {
            log::emit("the tcps server is gone: offloaded sockets report a reset once; new sockets follow --fallback until a server is back (--reattach)");
        } else {
            // Nobody will accept on the listeners again: the kernel must
            // refuse new connections (with --reattach a new server takes
            // the listeners over, queue and all).
            let n = c.stop_listening();
            log::emit(&format!(
                "the tcps server is gone: offloaded sockets report a reset once, {n} listener(s) stopped listening (new connections are refused); new sockets follow --fallback"
            ));
            exit_if_asked();
        }
    }
    true
}

/// `TCPS_EXIT_ON_SERVER_DEATH=1` (`tcps run --exit-on-server-death`): the
/// program exits with status 75 (EX_TEMPFAIL) when its server is gone, so
/// that its supervisor restarts it (with a server that came back).
fn exit_if_asked() {
    let on = tcps::setting_str("TCPS_EXIT_ON_SERVER_DEATH")
        .and_then(Result::ok)
        .is_some_and(|v| matches!(v.trim(), "1" | "on" | "yes" | "true"));
    if on {
        log::emit("exiting with status 75 (TCPS_EXIT_ON_SERVER_DEATH=1)");
        // SAFETY: _exit ends the process at once, as a fatal error does;
        // nothing of the program runs after it.
        unsafe { libc::_exit(75) };
    }
}

/// Asks the server whether it is still there (a system call), then as
/// [`gone`]: for a new socket, which must not be offloaded to a dead one.
pub fn check(c: &Client) -> bool {
    c.check_server();
    gone(c)
}

/// Marks `what` reported for socket `id` of `c`; true the first time.
fn first(c: &Client, id: u32, what: u32) -> bool {
    first_at(state::epoch_of(c), id, what)
}

/// As [`first`], for socket `id` of attachment `epoch`.
fn first_at(epoch: u32, id: u32, what: u32) -> bool {
    let slot = &crate::fdtable::id_state_at(epoch, id).reported;
    let mut v = slot.load(Ordering::Relaxed);
    loop {
        let new = match v >> 8 {
            e if e == epoch && v & what != 0 => return false,
            e if e == epoch => v | what,
            e if e > epoch => return false,
            _ => epoch << 8 | what,
        };
        match slot.compare_exchange_weak(v, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
}

/// Whether a wait reports socket `id` of `c` reset now (once per socket).
pub fn report_in_wait(c: &Client, id: u32) -> bool {
    first(c, id, IN_WAIT)
}

/// The error a call on socket `id` of `c` gets (`gone` holds): ECONNRESET
/// the first time, then `later`.
pub fn call_error(c: &Client, id: u32, later: i32) -> i32 {
    if first(c, id, ON_CALL) {
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
        first(c, id, ON_CALL);
    }
    errno
}

/// `accept` on listener `id` of `c` (placeholder `fd`): ECONNABORTED once,
/// then EAGAIN if non-blocking; `None`: it blocks (`sock.rs`, until a
/// signal or a new attachment takes the listener over).
pub fn accept_error(fd: libc::c_int, c: &Client, id: u32, flags_nonblock: bool) -> Option<i32> {
    if first(c, id, ON_CALL) {
        return Some(libc::ECONNABORTED);
    }
    // SAFETY: F_GETFL on the placeholder, which carries the O_NONBLOCK.
    let fl = unsafe { crate::real::fcntl()(fd, libc::F_GETFL) };
    if flags_nonblock || (fl >= 0 && fl & libc::O_NONBLOCK != 0) {
        return Some(libc::EAGAIN);
    }
    None
}

/// Asks each server of the group whether it is still there (a system call
/// each), at most every 100 ms however often it is called: a server whose
/// link was cut without a word is noticed by a wait that sleeps in slices.
pub fn check_members() {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    static LAST_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 100;
    let last = LAST_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 100
        || LAST_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    for (_, m) in state::members() {
        check(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_socket_reports_once_per_dead_attachment() {
        let id = 4711;
        assert!(first_at(1, id, IN_WAIT));
        assert!(!first_at(1, id, IN_WAIT));
        assert!(first_at(1, id, ON_CALL));
        // The next attachment hands the id out again, and dies too: its
        // socket reports anew.
        assert!(first_at(2, id, IN_WAIT));
        assert!(!first_at(2, id, IN_WAIT));
        // The older socket under the shared id stays quiet (no ping-pong).
        assert!(!first_at(1, id, IN_WAIT));
        assert!(!first_at(1, id, ON_CALL));
        assert!(first_at(2, id, ON_CALL));
    }
}
