//! Messages on the attachment's control socket (fork snapshots, sendfile):
//! one request and its reply at a time per process, under a lock, so two
//! threads never read each other's replies.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};

/// The control socket of the current attachment (-1: none): the library
/// notes the Unix socket the host library opens while attaching
/// (`sock.rs`), since `tcps::Client` does not expose it.
static CTL_FD: AtomicI32 = AtomicI32::new(-1);
static LOCK: Mutex<()> = Mutex::new(());

pub fn note_socket(fd: RawFd) {
    CTL_FD.store(fd, Ordering::Release);
}

/// Forgets (and returns) the control socket: a forked child closes its
/// copy of the parent's.
pub fn take_socket() -> RawFd {
    CTL_FD.swap(-1, Ordering::AcqRel)
}

/// Held across fork (`fork.rs`): the child must not inherit it locked.
pub fn lock_for_fork() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `msg` (with `fds`) and returns the server's reply.
pub fn exchange(msg: ControlMsg, fds: &[RawFd]) -> Result<ControlMsg, i32> {
    exchange_fds(msg, fds).map(|(m, _)| m)
}

/// As [`exchange`], also returning the descriptors the reply carried.
pub fn exchange_fds(msg: ControlMsg, fds: &[RawFd]) -> Result<(ControlMsg, Vec<OwnedFd>), i32> {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctl = CTL_FD.load(Ordering::Acquire);
    if ctl < 0 {
        return Err(libc::ENOTCONN);
    }
    fdpass::send_with_fds(ctl, &msg.encode(), fds).map_err(|e| crate::errno_of(&e))?;
    let mut b = [0u8; CONTROL_MSG_LEN + 1];
    // The control socket has a receive timeout (set at attach): bounded.
    let (n, got) = fdpass::recv_with_fds(ctl, &mut b, 0).map_err(|e| crate::errno_of(&e))?;
    Ok((ControlMsg::decode(&b[..n]).ok_or(libc::EPROTO)?, got))
}

/// A message answered by `Reply { handle, errno }`: Ok on errno 0.
pub fn call(msg: ControlMsg, handle: u32) -> Result<(), i32> {
    match exchange(msg, &[])? {
        ControlMsg::Reply {
            handle: h,
            errno: 0,
        } if h == handle => Ok(()),
        ControlMsg::Reply { handle: h, errno } if h == handle => Err(errno),
        _ => Err(libc::EPROTO),
    }
}
