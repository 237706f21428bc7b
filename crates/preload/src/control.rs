//! Messages on the attachment's control socket (fork snapshots, exec,
//! sendfile). They go through the host library's own exchange
//! (`tcps::Client::control_exchange`), which serializes every control
//! message of the process (memory registration and socket adoption
//! included) under one lock, so two threads never read each other's replies.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use tcps_proto::handshake::ControlMsg;

/// The control socket of the current attachment (-1: none): the library
/// notes the Unix socket the host library opens while attaching
/// (`sock.rs`), so that a forked child can close its copy of its parent's.
static CTL_FD: AtomicI32 = AtomicI32::new(-1);

pub fn note_socket(fd: RawFd) {
    CTL_FD.store(fd, Ordering::Release);
}

/// Forgets (and returns) the control socket: a forked child closes its
/// copy of the parent's.
pub fn take_socket() -> RawFd {
    CTL_FD.swap(-1, Ordering::AcqRel)
}

/// Held across fork (`fork.rs`): the child must not inherit it locked.
pub fn lock_for_fork() -> Vec<std::sync::MutexGuard<'static, ()>> {
    crate::state::members()
        .map(|(_, c)| c.control_lock())
        .collect()
}

/// Sends `msg` (with `fds`) on `c`'s control socket and returns the
/// server's answer and the descriptors it carried.
pub fn exchange_on(
    c: &tcps::Client,
    msg: ControlMsg,
    fds: &[RawFd],
) -> Result<(ControlMsg, Vec<OwnedFd>), i32> {
    c.control_exchange(&msg, fds)
        .map_err(|e| crate::errno::errno_of(&e))
}

/// A message answered by `Reply { handle, errno }`: Ok on errno 0.
pub fn call_on(c: &tcps::Client, msg: ControlMsg) -> Result<(), i32> {
    match exchange_on(c, msg, &[])?.0 {
        ControlMsg::Reply { errno: 0, .. } => Ok(()),
        ControlMsg::Reply { errno, .. } => Err(errno),
        _ => Err(libc::EPROTO),
    }
}
