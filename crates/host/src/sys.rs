//! Raw system calls on this process's own kernel sockets (`crate::kernelfd`
//! says why it has them). Made with `syscall(2)`, not libc's wrappers: under
//! the preload library libc's socket functions are interposed.

use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;

fn last_errno() -> io::Error {
    io::Error::last_os_error()
}

/// The lowest number our descriptors take: half the descriptor limit, at
/// most 32768, so they stay clear of the numbers a program uses.
fn high_base() -> i32 {
    static BASE: OnceLock<i32> = OnceLock::new();
    *BASE.get_or_init(|| {
        // SAFETY: getrlimit writes into a local rlimit.
        let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return 0;
        }
        (r.rlim_cur / 2).min(32768) as i32
    })
}

/// Moves `fd` (ours) to a high number, close-on-exec; keeps it where it is
/// if that fails. Returns the descriptor to use.
pub(crate) fn move_high(fd: RawFd) -> RawFd {
    let base = high_base();
    if fd >= base {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC on our descriptor; the result is checked.
    let high = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base) } as i32;
    if high < 0 {
        return fd;
    }
    close(fd);
    high
}

/// close(2) without the preload library's interposition.
pub(crate) fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this library owns.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// A result of a raw system call: -1 is the errno.
pub(crate) fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(rc)
    }
}

/// A new TCP socket of this process (close-on-exec, at a high number).
pub(crate) fn new_tcp_socket(domain: i32, protocol: i32) -> io::Result<RawFd> {
    let ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    // SAFETY: socket(2) with integer arguments.
    let fd = check(unsafe { libc::syscall(libc::SYS_socket, domain, ty, protocol) })? as RawFd;
    Ok(move_high(fd))
}

pub(crate) fn setsockopt(fd: RawFd, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is readable for its length.
    check(unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            fd,
            level,
            name,
            value.as_ptr(),
            value.len() as libc::socklen_t,
        )
    })
    .map(drop)
}

pub(crate) fn getsockopt(fd: RawFd, level: i32, name: i32, out: &mut [u8]) -> io::Result<usize> {
    let mut len = out.len() as libc::socklen_t;
    // SAFETY: `out` is writable for `len` bytes; `len` is a valid socklen_t.
    check(unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            fd,
            level,
            name,
            out.as_mut_ptr(),
            &mut len as *mut libc::socklen_t,
        )
    })?;
    Ok((len as usize).min(out.len()))
}

/// An errno as an `io::Error`.
pub(crate) fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// What names open file `fd` on another node that sees the same tree
/// (`Client::file_open` on a remote server): its path (from
/// `/proc/self/fd`), size and modification time in nanoseconds. A regular
/// file only (EINVAL otherwise); a deleted one has no path (ENOENT).
pub(crate) fn file_identity(fd: RawFd) -> io::Result<(Vec<u8>, u64, u64)> {
    // SAFETY: fstat into a zeroed stat we own; `fd` is only read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(last_errno());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let path = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    let path = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    if !path.starts_with(b"/") || path.ends_with(b" (deleted)") {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let mtime_ns = (st.st_mtime as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(st.st_mtime_nsec as u64);
    Ok((path, st.st_size as u64, mtime_ns))
}
