//! Closes that may block, kept off the workers.
//!
//! close(2) of a TCP socket blocks only with SO_LINGER on and a positive
//! time, while unsent data remains (up to that time: a host chooses it, so
//! it is unbounded). Such a close runs on a short-lived closer thread; the
//! worker goes on at once. The result on the wire is the same (Linux sends
//! the rest in the background either way); only the wait moves.
//!
//! At most [`MAX_CLOSERS`] such closes wait at once; beyond that (or if no
//! thread can be started) the socket's linger is turned off and it is
//! closed at once: the data still goes out, nobody waits for it.

use crate::engine::Engine;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tracing::{debug, warn};

/// Most lingering closes waiting on closer threads at once.
pub const MAX_CLOSERS: usize = 64;

static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Closes `fd`, a kernel socket whose SO_LINGER may be on (`may_linger`:
/// the server did not see all its options, or the host set SO_LINGER):
/// off the calling thread if its close could block. Its waits and
/// operations in `engine` end first. An ordinary close (`may_linger`
/// false) is the engine's (io_uring: an operation in the pass's batch;
/// epoll: close(2)), with no extra system call.
pub fn close_socket(engine: &mut dyn Engine, fd: OwnedFd, may_linger: bool) {
    if !may_linger || !crate::sys::lingers(fd.as_raw_fd()) {
        return engine.close(fd);
    }
    engine.forget(fd.as_raw_fd(), 0);
    crate::sys::count(1); // the close, here or on a closer thread
                          // A listener's close never waits (and its port must be free when its
                          // close returns).
    if crate::sys::getsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Ok(1) {
        return drop(fd);
    }
    if WAITING.fetch_add(1, Ordering::AcqRel) < MAX_CLOSERS {
        // Shared with the thread so a failed spawn gives it back.
        let slot = Arc::new(Mutex::new(Some(fd)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("tcps-closer".into())
            .spawn(move || {
                drop(take(&theirs));
                WAITING.fetch_sub(1, Ordering::AcqRel);
            });
        WAITING.fetch_sub(usize::from(spawned.is_err()), Ordering::AcqRel);
        match spawned {
            Ok(_) => return debug!("lingering close handed to a closer thread"),
            Err(e) => warn!(error = %e, "cannot start a closer thread"),
        }
        if let Some(fd) = take(&slot) {
            close_without_linger(fd);
        }
        return;
    }
    WAITING.fetch_sub(1, Ordering::AcqRel);
    warn!(
        limit = MAX_CLOSERS,
        "too many lingering closes waiting: closing without lingering"
    );
    close_without_linger(fd);
}

fn take(slot: &Mutex<Option<OwnedFd>>) -> Option<OwnedFd> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Turns SO_LINGER off, then closes: never waits.
fn close_without_linger(fd: OwnedFd) {
    let off = [0u8; std::mem::size_of::<libc::linger>()];
    let _ = crate::sys::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, &off);
    drop(fd);
}
