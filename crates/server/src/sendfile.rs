//! `Op::SendFile`: the server sends file data itself ("direct communication
//! with the file server", thesis 000 §1.2). The host hands an open file
//! over once (`ControlMsg::FileOpen`, SCM_RIGHTS on its control socket);
//! afterwards each sendfile is an ordinary channel request naming the file,
//! an offset and a count, and no file byte crosses the channel or the
//! host's memory.
//!
//! One non-blocking sendfile(2) per request, like a non-blocking socket in
//! the kernel: it may send less than asked, or answer EAGAIN; the host
//! library waits for POLLOUT and asks again for a blocking socket.
//!
//! Files must be regular files. The worker reads them synchronously: a file
//! on a slow or hung file system (NFS, FUSE) stalls this worker — a limit
//! of this design, documented in docs/PRELOAD.md.

use crate::calls::Res;
use crate::host::Host;
use std::os::fd::{AsRawFd, OwnedFd};
use tracing::debug;

/// Largest range one request may ask for.
pub const MAX_COUNT: u32 = 1 << 30;
/// Most files one host may keep open here.
pub const MAX_FILES: usize = 4096;

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `ControlMsg::FileOpen`: keep the regular file passed along as `handle`.
pub fn open(host: &mut Host, handle: u32, fds: Vec<OwnedFd>) -> Result<(), i32> {
    let [file]: [OwnedFd; 1] = fds.try_into().map_err(|_| libc::EINVAL)?;
    // SAFETY: fstat into a zeroed stat we own, on a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return Err(last_errno());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EINVAL);
    }
    if host.files.len() >= MAX_FILES && !host.files.contains_key(&handle) {
        return Err(libc::EMFILE);
    }
    host.files.insert(handle, file);
    Ok(())
}

/// `ControlMsg::FileClose`.
pub fn close(host: &mut Host, handle: u32) -> Result<(), i32> {
    host.files.remove(&handle).map(drop).ok_or(libc::EBADF)
}

/// `Op::SendFile`: one non-blocking sendfile from file `file` to `sock`.
pub fn call(host: &mut Host, sock: u32, file: u32, offset: u64, count: u32) -> Res {
    if count > MAX_COUNT || offset > i64::MAX as u64 {
        return Err(libc::EINVAL);
    }
    let f = host.files.get(&file).ok_or(libc::EBADF)?.as_raw_fd();
    let s = host.socket(sock).ok_or(libc::EBADF)?;
    if !s.writers.is_empty() {
        // Parked sends go first: keep the socket's byte order.
        return Err(libc::EAGAIN);
    }
    let mut off = offset as libc::off_t;
    let sfd = s.fd.as_raw_fd();
    let guard = crate::guard::Guard::call(s.host_held);
    // SAFETY: sendfile between two descriptors we hold; `off` is ours.
    let n = unsafe { libc::sendfile(sfd, f, &mut off, count as usize) };
    let e = last_errno();
    drop(guard);
    if n < 0 {
        if e == libc::EINTR {
            // The guard cut short a sendfile the host made blocking.
            crate::guard::interrupted(host, sfd);
            return Err(libc::EAGAIN);
        }
        debug!(host = host.id, sock, errno = e, "sendfile failed");
        return Err(e);
    }
    host.stats.bytes_sent += n as u64;
    Ok((n as i64, 0))
}
