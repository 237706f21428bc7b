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
//! The same sendfile runs for a file range queued on a socket's send queue
//! (`DESC_FILE`, `calls::sendq::file`): there it is a job in the socket's
//! write queue, resumed where it stopped, with no request per attempt.
//!
//! Files must be regular files on a local file system ([`LOCAL_FS`]). The
//! worker reads them synchronously, and closes them: a file on a network
//! or user-space file system (NFS, CIFS, FUSE, 9p) can make either wait
//! for as long as that server chooses, and a file on /proc or /sys runs
//! kernel code of its own on every read. Those are refused at `FileOpen`
//! (EOPNOTSUPP, logged; the host's sendfile fails with it).

use crate::calls::common::Res;
use crate::host::Host;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use tracing::{debug, warn};

/// File systems (statfs `f_type`) whose regular files the worker may read
/// and close: local, block- or memory-backed, where a read of cached or
/// local data does not wait on another machine or process. ext2/3/4 share
/// one magic; overlayfs (containers) passes reads to its local layers;
/// squashfs and erofs are read-only images. Anything else is refused.
const LOCAL_FS: &[(i64, &str)] = &[
    (0xEF53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58F6, "ramfs"),
    (0x794C_7630, "overlayfs"),
    (0xF2F5_2010, "f2fs"),
    (0x7371_7368, "squashfs"),
    (0xE0F5_E1E2, "erofs"),
];

/// The statfs type of the file system holding `fd`.
fn fs_type(fd: i32) -> Result<i64, i32> {
    // SAFETY: statfs is plain data; zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs into a statfs we own, on a descriptor we own.
    if unsafe { libc::fstatfs(fd, &mut st) } != 0 {
        return Err(crate::sys::errno());
    }
    Ok(st.f_type as i64)
}

/// Largest range one request may ask for.
pub const MAX_COUNT: u32 = 1 << 30;
/// Most files one host may keep open here.
pub const MAX_FILES: usize = 4096;

/// `ControlMsg::FileOpen`: keep the regular file passed along as `handle`.
pub fn open(host: &mut Host, handle: u32, fds: Vec<OwnedFd>) -> Result<(), i32> {
    let [file]: [OwnedFd; 1] = fds.try_into().map_err(|_| libc::EINVAL)?;
    readable(&file)?;
    keep(host, handle, file, None)
}

/// EBADF unless `file` was opened for reading: an `O_PATH` descriptor
/// (fstat works on it) or one opened write-only would be accepted here and
/// fail only in the job, after the host was told the bytes went; the
/// kernel's sendfile(2) answers EBADF at the call.
fn readable(file: &OwnedFd) -> Result<(), i32> {
    // SAFETY: F_GETFL on a descriptor we own.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(crate::sys::errno());
    }
    let path_only = flags & libc::O_PATH != 0;
    if path_only || flags & libc::O_ACCMODE == libc::O_WRONLY {
        return Err(libc::EBADF);
    }
    Ok(())
}

/// Keeps `file` as the host's file `handle` if it is a regular file on a
/// local file system (a passed one, or one the server opened for a remote
/// host: `crate::shared_files`) and, if `same_as` names one, the file of
/// that size and modification time in nanoseconds (ESTALE otherwise).
pub fn keep(
    host: &mut Host,
    handle: u32,
    file: OwnedFd,
    same_as: Option<(u64, u64)>,
) -> Result<(), i32> {
    // SAFETY: fstat into a zeroed stat we own, on a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return Err(crate::sys::errno());
    }
    let mtime_ns = (st.st_mtime as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(st.st_mtime_nsec as u64);
    if let Some(want) = same_as.filter(|&w| w != (st.st_size as u64, mtime_ns)) {
        debug!(
            host = host.id,
            size = st.st_size,
            mtime_ns,
            ?want,
            "file differs from the one the host means"
        );
        return Err(libc::ESTALE);
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EINVAL);
    }
    let fs = fs_type(file.as_raw_fd())?;
    if !LOCAL_FS.iter().any(|&(magic, _)| magic == fs) {
        warn!(
            host = host.id,
            pid = host.pid,
            fs_type = format_args!("{fs:#x}"),
            "sendfile: file refused: not on a local file system the worker may read without waiting"
        );
        // Closed here, before it is kept: on such a file system even the
        // close might wait. (fstat/fstatfs answered: the file system
        // responds.)
        return Err(libc::EOPNOTSUPP);
    }
    if host.files.len() >= MAX_FILES && !host.files.contains_key(&handle) {
        return Err(libc::EMFILE);
    }
    host.files.insert(handle, Arc::new(file));
    Ok(())
}

/// `ControlMsg::FileClose` (after `calls::sendq::file::close` took what
/// the host queued before it).
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
    let n = send_range(host, sock, f, offset, count)?;
    Ok((n as i64, 0))
}

/// One non-blocking sendfile(2) of `count` bytes at `offset` of the open
/// file `f` to socket `sock` (`offset + count` fits an `off_t`: checked by
/// the callers). The bytes sent (0: end of file), or EAGAIN. A socket the
/// host closed still sends what was queued on it before (a job).
pub fn send_range(
    host: &mut Host,
    sock: u32,
    f: RawFd,
    offset: u64,
    count: u32,
) -> Result<usize, i32> {
    let s = host.sockets.get(sock as usize).ok_or(libc::EBADF)?;
    let mut off = offset as libc::off_t;
    let sfd = s.fd.as_raw_fd();
    let guard = crate::guard::Guard::call(s.host_held);
    // SAFETY: sendfile between two open descriptors (the file is held by
    // the caller); `off` is ours.
    let n = unsafe { libc::sendfile(sfd, f, &mut off, count as usize) };
    crate::sys::count(1);
    let e = crate::sys::errno();
    drop(guard);
    if n < 0 {
        if e == libc::EINTR {
            // The guard cut short a sendfile the host made blocking.
            host.interrupted(sfd);
            return Err(libc::EAGAIN);
        }
        if e != libc::EAGAIN {
            debug!(host = host.id, sock, errno = e, "sendfile failed");
        }
        return Err(e);
    }
    host.stats.bytes_sent += n as u64;
    Ok(n as usize)
}
