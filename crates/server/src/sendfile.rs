//! `ControlMsg::SendFile`: the server sends file data itself ("direct
//! communication with the file server", thesis §1.2): the host passes the
//! open file (SCM_RIGHTS on its control socket) and a range, and no file
//! byte crosses the channel or the host's memory.
//!
//! One non-blocking sendfile(2) per message, like a non-blocking socket in
//! the kernel: it may send less than asked, or answer EAGAIN; the host
//! library waits for POLLOUT and asks again for a blocking socket.
//!
//! The file must be a regular file. The worker reads it synchronously: a
//! file on a slow or hung file system (NFS, FUSE) stalls this worker — a
//! limit of this design, documented in docs/PRELOAD.md.

use crate::host::Host;
use std::os::fd::{AsRawFd, OwnedFd};
use tcps_proto::handshake::ControlMsg;
use tracing::debug;

/// Largest range one message may ask for.
pub const MAX_COUNT: u32 = 1 << 30;

pub fn serve(host: &mut Host, sock: u32, offset: u64, count: u32, fds: Vec<OwnedFd>) -> ControlMsg {
    match send(host, sock, offset, count, fds) {
        Ok(bytes) => ControlMsg::Sent { sock, bytes },
        Err(errno) => ControlMsg::Reply {
            handle: sock,
            errno,
        },
    }
}

fn send(
    host: &mut Host,
    sock: u32,
    offset: u64,
    count: u32,
    fds: Vec<OwnedFd>,
) -> Result<u64, i32> {
    let [file]: [OwnedFd; 1] = fds.try_into().map_err(|_| libc::EINVAL)?;
    if count > MAX_COUNT || offset > i64::MAX as u64 {
        return Err(libc::EINVAL);
    }
    // SAFETY: fstat into a zeroed stat we own, on a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EINVAL);
    }
    let s = host.socket(sock).ok_or(libc::EBADF)?;
    if !s.writers.is_empty() {
        // Parked sends go first: keep the socket's byte order.
        return Err(libc::EAGAIN);
    }
    let mut off = offset as libc::off_t;
    // SAFETY: sendfile between two descriptors we hold; `off` is ours.
    let n = unsafe { libc::sendfile(s.fd.as_raw_fd(), file.as_raw_fd(), &mut off, count as usize) };
    if n < 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        debug!(host = host.id, sock, errno = e, "sendfile failed");
        return Err(e);
    }
    host.stats.bytes_sent += n as u64;
    Ok(n as u64)
}
