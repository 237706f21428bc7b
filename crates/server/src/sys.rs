//! Thin wrappers over the libc calls the server makes: each returns the
//! errno as `Err(i32)` so a call's outcome can be handed to the host as is.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub type SysResult<T> = Result<T, i32>;

pub fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

thread_local! {
    /// System calls this thread made since `take_count` last looked.
    static SYSCALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `n` system calls of this thread (the wrappers here count
/// themselves; the engines count each `io_uring_enter` / epoll call, and
/// futex wakes and closes are counted where they are made). A worker's
/// count reaches `tcps stat` when it publishes (`stats::Board::publish`).
pub fn count(n: u64) {
    SYSCALLS.with(|c| c.set(c.get() + n));
}

/// This thread's system calls since the last look (and zero again).
pub fn take_count() -> u64 {
    SYSCALLS.with(|c| c.replace(0))
}

fn check(ret: libc::c_int) -> SysResult<libc::c_int> {
    count(1);
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: isize) -> SysResult<usize> {
    count(1);
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret as usize)
    }
}

/// Owns a freshly returned descriptor.
fn own(fd: libc::c_int) -> OwnedFd {
    // SAFETY: callers pass a descriptor the kernel just returned to us and
    // nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A `sockaddr_storage` and its length.
pub struct RawAddr {
    pub storage: libc::sockaddr_storage,
    pub len: libc::socklen_t,
}

impl std::fmt::Debug for RawAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawAddr({:?})", self.as_bytes())
    }
}

impl RawAddr {
    pub fn empty() -> RawAddr {
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
        RawAddr {
            storage: unsafe { std::mem::zeroed() },
            len: std::mem::size_of::<libc::sockaddr_storage>() as _,
        }
    }

    pub fn from_bytes(b: &[u8]) -> RawAddr {
        let mut a = RawAddr::empty();
        let n = b.len().min(std::mem::size_of::<libc::sockaddr_storage>());
        // SAFETY: n bytes fit in the storage; the source is a distinct slice.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), &mut a.storage as *mut _ as *mut u8, n)
        };
        a.len = n as _;
        a
    }

    pub fn as_bytes(&self) -> &[u8] {
        let n = (self.len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
        // SAFETY: reading n initialised bytes of our own storage.
        unsafe { std::slice::from_raw_parts(&self.storage as *const _ as *const u8, n) }
    }

    fn ptr(&self) -> *const libc::sockaddr {
        &self.storage as *const _ as *const libc::sockaddr
    }

    fn mut_ptr(&mut self) -> *mut libc::sockaddr {
        &mut self.storage as *mut _ as *mut libc::sockaddr
    }
}

pub fn connect(fd: RawFd, a: &RawAddr) -> SysResult<()> {
    // SAFETY: the address points to our storage and its length is bounded by it.
    check(unsafe { libc::connect(fd, a.ptr(), a.len) }).map(drop)
}

pub fn listen(fd: RawFd, backlog: i32) -> SysResult<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::listen(fd, backlog) }).map(drop)
}

/// Accepts a connection; the new socket is always non-blocking at the server.
pub fn accept(fd: RawFd) -> SysResult<(OwnedFd, RawAddr)> {
    let mut a = RawAddr::empty();
    // SAFETY: a is a writable sockaddr_storage with its size in a.len.
    let nfd = check(unsafe {
        libc::accept4(
            fd,
            a.mut_ptr(),
            &mut a.len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    })?;
    Ok((own(nfd), a))
}

/// # Safety
/// `buf..buf+len` must be valid for reads for the duration of the call.
pub unsafe fn send(fd: RawFd, buf: *const u8, len: usize, flags: i32) -> SysResult<usize> {
    check_size(libc::send(
        fd,
        buf as *const libc::c_void,
        len,
        flags | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
    ))
}

/// # Safety
/// `buf..buf+len` must be valid for writes for the duration of the call.
pub unsafe fn recv(fd: RawFd, buf: *mut u8, len: usize, flags: i32) -> SysResult<usize> {
    check_size(libc::recv(
        fd,
        buf as *mut libc::c_void,
        len,
        flags | libc::MSG_DONTWAIT,
    ))
}

/// Whether `fd`'s next byte is urgent data (SO_OOBINLINE off) with nothing
/// received after it. A normal receive starting there skips the byte and
/// the kernel forgets it (a later `MSG_OOB` receive gets EINVAL), where
/// the application's own receive would have waited for more: read-ahead
/// must stop there. One ioctl (SIOCATMARK); at the mark, a one-byte peek,
/// whose error (e.g. ECONNRESET, which the peek consumed) is returned.
pub fn urgent_byte_alone(fd: RawFd) -> SysResult<bool> {
    const SIOCATMARK: u64 = 0x8905;
    let mut at: libc::c_int = 0;
    // SAFETY: SIOCATMARK writes one int into a local.
    if unsafe { libc::ioctl(fd, SIOCATMARK as _, &mut at) } != 0 || at == 0 {
        return Ok(false);
    }
    let mut byte = 0u8;
    // SAFETY: one byte into a local.
    match unsafe { recv(fd, &mut byte, 1, libc::MSG_PEEK) } {
        Ok(_) => Ok(false), // data after the mark, or EOF: receive on
        Err(libc::EAGAIN) => Ok(true),
        Err(e) => Err(e),
    }
}

pub fn shutdown(fd: RawFd, how: i32) -> SysResult<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::shutdown(fd, how) }).map(drop)
}

/// Sets SO_RCVTIMEO or SO_SNDTIMEO (`name`) of `fd` to whole seconds.
pub fn set_timeout_secs(fd: RawFd, name: i32, secs: i64) -> SysResult<()> {
    // A `struct timeval` on 64-bit Linux: tv_sec, then tv_usec (0).
    let mut tv = [0u8; 16];
    tv[..8].copy_from_slice(&secs.to_ne_bytes());
    setsockopt(fd, libc::SOL_SOCKET, name, &tv)
}

pub fn setsockopt(fd: RawFd, level: i32, name: i32, value: &[u8]) -> SysResult<()> {
    // SAFETY: value is a valid slice of the given length.
    check(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value.as_ptr() as *const libc::c_void,
            value.len() as _,
        )
    })
    .map(drop)
}

/// Reads an option into `out`; returns the option's full length.
pub fn getsockopt(fd: RawFd, level: i32, name: i32, out: &mut [u8]) -> SysResult<usize> {
    let mut len = out.len() as libc::socklen_t;
    // SAFETY: out is writable for len bytes; the kernel writes at most len.
    check(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            out.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(len as usize)
}

/// Whether a socket's SO_LINGER is on with a positive time (its close may
/// wait); true when it cannot be read (be careful).
pub fn lingers(fd: RawFd) -> bool {
    let mut b = [0u8; std::mem::size_of::<libc::linger>()];
    match getsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &mut b) {
        Ok(_) => {
            let on = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            let secs = i32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            on != 0 && secs > 0
        }
        Err(_) => true,
    }
}

pub fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> SysResult<i32> {
    let mut b = [0u8; 4];
    getsockopt(fd, level, name, &mut b)?;
    Ok(i32::from_ne_bytes(b))
}

pub fn getsockname(fd: RawFd) -> SysResult<RawAddr> {
    let mut a = RawAddr::empty();
    // SAFETY: a is writable storage with its size in a.len.
    check(unsafe { libc::getsockname(fd, a.mut_ptr(), &mut a.len) })?;
    Ok(a)
}

pub fn getpeername(fd: RawFd) -> SysResult<RawAddr> {
    let mut a = RawAddr::empty();
    // SAFETY: as in getsockname.
    check(unsafe { libc::getpeername(fd, a.mut_ptr(), &mut a.len) })?;
    Ok(a)
}

/// poll(2) with a zero timeout: the readiness of many sockets in one call.
pub fn poll_now(fds: &mut [libc::pollfd]) -> SysResult<usize> {
    // SAFETY: fds is a valid, writable array of its length.
    check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) }).map(|n| n as usize)
}

/// CLOCK_REALTIME in nanoseconds (the clock of the kernel's receive
/// timestamps, [`arrival_ns`]).
pub fn realtime_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Asks the kernel to stamp arriving packets (`SO_TIMESTAMPNS`; the kernel
/// stamps every packet while any socket asks), for [`arrival_ns`]; or
/// stops (a socket handed back to a program).
pub fn stamp_arrivals(fd: RawFd, on: bool) {
    let on = libc::c_int::from(on);
    count(1);
    // SAFETY: an int option from a local.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// When the first unread byte of connected socket `fd` arrived (the
/// kernel's receive timestamp, CLOCK_REALTIME ns): a one-byte `MSG_PEEK`.
/// `None` with nothing queued, or no stamp (the socket never asked,
/// [`stamp_arrivals`], or the packet arrived while nothing asked).
pub fn arrival_ns(fd: RawFd) -> Option<u64> {
    // Only a socket with bytes queued is peeked: a peek that finds none
    // reports (and so clears) a pending error such as ECONNRESET, which
    // the receive that follows must still see. SIOCINQ leaves it alone.
    let mut queued: libc::c_int = 0;
    count(1);
    // SAFETY: SIOCINQ writes one int into a local.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) } != 0 || queued <= 0 {
        return None;
    }
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: &mut byte as *mut u8 as *mut libc::c_void,
        iov_len: 1,
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    count(1);
    // SAFETY: `msg` points at a local byte, iovec and control buffer.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if n <= 0 {
        return None;
    }
    // SAFETY: walking the control buffer the kernel filled, with the
    // kernel's own macros; the timespec is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_TIMESTAMPNS {
                let t = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                if t.tv_sec == 0 && t.tv_nsec == 0 {
                    return None;
                }
                return Some((t.tv_sec as u64).wrapping_mul(1_000_000_000) + t.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    None
}

pub fn eventfd() -> SysResult<OwnedFd> {
    // SAFETY: plain syscall.
    check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }).map(own)
}

/// A pipe, both ends non-blocking and close-on-exec: `(read, write)`.
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the local array.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    Ok((own(fds[0]), own(fds[1])))
}

/// Writes one byte to a non-blocking pipe (rings it); EAGAIN (full) is fine.
pub fn pipe_ring(fd: RawFd) {
    let one = [1u8];
    count(1);
    // SAFETY: writing 1 byte from a valid buffer.
    unsafe { libc::write(fd, one.as_ptr() as *const libc::c_void, 1) };
}

/// Adds one to an eventfd (rings it).
pub fn eventfd_ring(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a valid buffer; EAGAIN (counter full) is fine.
    unsafe { libc::write(fd, one.as_ptr() as *const libc::c_void, 8) };
}

/// Resets an eventfd's counter, never blocking: a host's doorbell is
/// shared with the host, which could clear O_NONBLOCK on it (the flag is
/// the open file's) and drain it first; RWF_NOWAIT asks this one read not
/// to wait whatever the file's flags (kernels without it for eventfd
/// answer EOPNOTSUPP: then a poll first, and a plain read only if ready).
pub fn eventfd_drain(fd: RawFd) {
    let mut b = [0u8; 8];
    let iov = libc::iovec {
        iov_base: b.as_mut_ptr() as *mut libc::c_void,
        iov_len: 8,
    };
    count(1);
    // SAFETY: one iovec over a valid 8-byte buffer; offset -1: no seek.
    let r = unsafe { libc::preadv2(fd, &iov, 1, -1, libc::RWF_NOWAIT) };
    if r >= 0 || errno() != libc::EOPNOTSUPP {
        return;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
        // SAFETY: reading 8 bytes into a valid buffer.
        unsafe { libc::read(fd, b.as_mut_ptr() as *mut libc::c_void, 8) };
    }
}

/// Clears O_NONBLOCK on a descriptor the server alone holds.
pub fn set_blocking(fd: RawFd) -> SysResult<()> {
    // SAFETY: plain fcntl calls on a descriptor we own.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) }).map(drop)
}

/// Sets O_NONBLOCK on a descriptor (its open file description: shared with
/// the host for a socket it made, see `guard`).
pub fn set_nonblocking(fd: RawFd) -> SysResult<()> {
    // SAFETY: plain fcntl calls on a descriptor we own.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }).map(drop)
}

/// A memfd of `size` bytes, sealed so its size can never change again: the
/// host gets this descriptor, and a host that could shrink the file would
/// make the server's mapping fault (SIGBUS) — a host must only hurt itself.
pub fn memfd(name: &std::ffi::CStr, size: usize) -> SysResult<OwnedFd> {
    // SAFETY: name is a valid C string.
    let fd = own(check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?);
    // SAFETY: fd is ours; size fits in off_t for any region we create.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) })?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: adding seals to our own memfd.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(fd)
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> SysResult<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        check(libc::sched_setaffinity(
            0,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ))
        .map(drop)
    }
}

#[cfg(test)]
mod drain_tests {
    use super::*;

    /// `eventfd_drain` empties the counter, and never waits even when the
    /// other holder of the eventfd (a host) made it blocking.
    #[test]
    fn drain_never_waits() {
        let fd = eventfd().unwrap();
        let raw = fd.as_raw_fd();
        eventfd_ring(raw);
        eventfd_ring(raw);
        eventfd_drain(raw);
        let mut p = libc::pollfd {
            fd: raw,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "still readable");
        set_blocking(raw).unwrap();
        let t = std::time::Instant::now();
        eventfd_drain(raw); // empty and blocking: must return at once
        assert!(t.elapsed() < std::time::Duration::from_millis(100));
    }
}
