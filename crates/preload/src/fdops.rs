//! Calls on the descriptor rather than the connection: close, dup, dup2,
//! dup3, fcntl, ioctl.
//!
//! These act on the placeholder fd with the real call (so descriptor flags,
//! numbering and sharing between dups are exactly the kernel's) and keep
//! the fd table and the server in step: the tcps socket is closed when the
//! last fd naming it is closed; O_NONBLOCK is mirrored to the server.

use crate::errno::{errno_of, fail};
use crate::log::debug;
use crate::sock::on_socket;
use crate::{epoll, fdtable, real, state};
use libc::{c_int, c_ulong, c_void};

/// Drops `fd` from the table (if offloaded) after the kernel closed or
/// replaced it; closes the tcps socket with its last fd.
pub(crate) fn forget(fd: c_int) {
    if let Some((epoch, id, last)) = fdtable::remove(fd) {
        epoll::forget_fd(fd);
        if last {
            crate::handoff::forget_refused(epoch, id);
            // At the attachment the socket was made in (a dead one only
            // closes this process's own descriptor of it).
            if let Some(c) = state::client_at(epoch) {
                let r = c.close(id);
                debug!("close(fd {fd}): tcps socket {id} closed ({r:?})");
            }
            // A listener opened on several servers closes at each.
            crate::group::close_siblings(epoch, id);
        }
    }
}

/// Whether this call touches an offloaded socket from a child that shares
/// its parent's memory (`state::in_shared_child`): then only the real call
/// is made, on the child's own descriptor table; the library's tables and
/// the server are the parent's and stay as they are.
fn shared_child_on(fds: &[c_int]) -> bool {
    fds.iter().any(|&fd| fdtable::lookup(fd).is_some()) && state::in_shared_child()
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fdtable::lookup(fd).is_some() {
        if shared_child_on(&[fd]) {
            return real::close()(fd);
        }
        forget(fd);
    } else {
        if crate::handoff::is_control_fd(fd) {
            // A program closing every descriptor before exec.
            crate::handoff::before_closing(fd as u32, fd as u32);
        }
        epoll::forget_set(fd);
    }
    real::close()(fd)
}

/// A descriptor of socket `id` may now cross exec(2) (it lost FD_CLOEXEC):
/// the server stops receiving ahead into this process's ring, so bytes that
/// arrive from now on stay in the kernel socket the new program image will
/// get (`docs/PRELOAD.md`). Best effort: a socket in pull mode keeps it.
fn may_cross_exec(c: &tcps::Client, id: u32) {
    if c.is_attached() {
        let r = c.setsockopt_int(
            id,
            tcps_proto::eager::SOL_TCPS,
            tcps_proto::eager::TCPS_EAGER_RECV,
            0,
        );
        debug!("tcps socket {id} may cross exec: receiving ahead stopped ({r:?})");
    }
}

/// Records `nfd` (a fresh duplicate of `fd`) as naming `fd`'s socket.
fn dup_entry(fd: c_int, nfd: c_int) -> c_int {
    if nfd < 0 {
        return nfd;
    }
    if let Some((epoch, id)) = fdtable::lookup_at(fd) {
        if !fdtable::fits(nfd, id) {
            // SAFETY: closing the duplicate we just made.
            unsafe { real::close()(nfd) };
            return fail(libc::EMFILE);
        }
        fdtable::insert(nfd, epoch, id);
        debug!("dup: fd {nfd} also names tcps socket {id} (fd {fd})");
        // SAFETY: F_GETFD on the descriptor we just made.
        if unsafe { real::fcntl()(nfd, libc::F_GETFD) } & libc::FD_CLOEXEC == 0 {
            if let Some(c) = state::client_at(epoch) {
                may_cross_exec(c, id);
            }
        }
    }
    nfd
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if shared_child_on(&[fd]) {
        return real::dup()(fd);
    }
    dup_entry(fd, real::dup()(fd))
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, nfd: c_int) -> c_int {
    if fd == nfd || shared_child_on(&[fd, nfd]) {
        return real::dup2()(fd, nfd);
    }
    let r = real::dup2()(fd, nfd);
    if r >= 0 {
        forget(nfd);
    }
    dup_entry(fd, r)
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, nfd: c_int, flags: c_int) -> c_int {
    if shared_child_on(&[fd, nfd]) {
        return real::dup3()(fd, nfd, flags);
    }
    let r = real::dup3()(fd, nfd, flags);
    if r >= 0 && fd != nfd {
        forget(nfd);
    }
    dup_entry(fd, r)
}

/// fcntl(2). The third argument is read as an integer: every command we
/// handle takes an int or a pointer, which the x86-64 and AArch64 Linux
/// calling conventions pass in the same register as a named argument.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let changes = matches!(
        cmd,
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC | libc::F_SETFL | libc::F_SETFD
    );
    if changes && shared_child_on(&[fd]) {
        return real::fcntl()(fd, cmd, arg);
    }
    on_socket!(fd, |c, id| {
        match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => dup_entry(fd, real::fcntl()(fd, cmd, arg)),
            libc::F_SETFL => {
                let before = real::fcntl()(fd, libc::F_GETFL);
                let r = real::fcntl()(fd, cmd, arg);
                let nb = arg as c_int & libc::O_NONBLOCK;
                // (A listener opened on several servers stays non-blocking
                // at each: the preload blocks for it, `group_accept.rs`.)
                let group = crate::group::siblings(state::epoch_of(c), id).is_some();
                if r == 0 && before >= 0 && before & libc::O_NONBLOCK != nb && !group {
                    if let Err(e) = c.fcntl(id, libc::F_SETFL, i64::from(nb)) {
                        return fail(errno_of(&e));
                    }
                    debug!("fcntl(fd {fd}): O_NONBLOCK {}", nb != 0);
                }
                r
            }
            libc::F_SETFD => {
                let r = real::fcntl()(fd, cmd, arg);
                if r == 0 && arg as c_int & libc::FD_CLOEXEC == 0 {
                    may_cross_exec(c, id);
                }
                r
            }
            // F_GETFL, F_GETFD, F_SETOWN, ...: the placeholder carries the
            // descriptor's flags.
            _ => real::fcntl()(fd, cmd, arg),
        }
    }, else real::fcntl()(fd, cmd, arg))
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl(fd, cmd, arg)
}

/// FIONREAD on a socket without a receive ring: a peek at the server that
/// counts without copying (up to 256 KiB). A peek that finds nothing
/// queued but a pending error (ECONNRESET after an RST) consumes the error
/// at the server, which the kernel's FIONREAD never does: the error is
/// kept here as pending (`IdState::pending_err`), for the program's next
/// call and its polls (POLLERR), and the count is 0.
fn peek_count(c: &tcps::Client, id: u32) -> std::io::Result<usize> {
    let mut p = [tcps::PollFd {
        sock: id,
        events: libc::POLLIN,
        revents: 0,
    }];
    c.poll(&mut p, 0)?;
    let mut buf = vec![0u8; 256 * 1024];
    let r = c.recv(
        id,
        &mut buf,
        libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_DONTWAIT,
    );
    match r {
        // The peek consumed the error at the server: it stays pending here.
        Err(e)
            if p[0].revents & libc::POLLERR != 0
                && !matches!(errno_of(&e), libc::EAGAIN | libc::ENOTCONN) =>
        {
            crate::fdtable::keep_error(c, id, errno_of(&e));
            Ok(0)
        }
        r => r,
    }
}

/// ioctl(2): FIONBIO and FIONREAD on offloaded sockets; interface ioctls
/// (SIOC*) are answered by a throwaway kernel socket, as any socket would;
/// anything else is ENOTTY (and logged).
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    let changes = matches!(req, libc::FIONCLEX | libc::FIOCLEX | libc::FIONBIO);
    if changes && shared_child_on(&[fd]) {
        return real::ioctl()(fd, req, arg);
    }
    on_socket!(fd, |c, id| {
        match req {
            libc::FIONCLEX | libc::FIOCLEX => {
                let r = real::ioctl()(fd, req, arg);
                if r == 0 && req == libc::FIONCLEX {
                    may_cross_exec(c, id);
                }
                r
            }
            libc::FIONBIO => {
                if arg.is_null() {
                    return fail(libc::EFAULT);
                }
                let on = *(arg as *const c_int) != 0;
                let fl = real::fcntl()(fd, libc::F_GETFL);
                let want = if on { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK };
                fcntl(fd, libc::F_SETFL, want as c_ulong)
            }
            libc::FIONREAD => {
                if arg.is_null() {
                    return fail(libc::EFAULT);
                }
                // What the receive ring holds, else (no ring) a peek that
                // counts without copying (up to 256 KiB).
                let r = match c.ring_pending(id) {
                    Ok(Some(n)) => Ok(n),
                    Ok(None) => peek_count(c, id),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(n) => {
                        *(arg as *mut c_int) = n as c_int;
                        0
                    }
                    // A listener (without an accept ring): EINVAL.
                    Err(e)
                        if errno_of(&e) == libc::ENOTCONN
                            && c.getsockopt_int(id, libc::SOL_SOCKET, libc::SO_ACCEPTCONN)
                                .is_ok_and(|v| v != 0) =>
                    {
                        fail(libc::EINVAL)
                    }
                    // Nothing yet, or not connected: the kernel says 0.
                    Err(e) if matches!(errno_of(&e), libc::EAGAIN | libc::ENOTCONN) => {
                        *(arg as *mut c_int) = 0;
                        0
                    }
                    Err(e) => fail(errno_of(&e)),
                }
            }
            r if (0x8900..0x8a00).contains(&r) => {
                let s = real::socket()(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                if s < 0 {
                    return -1;
                }
                let res = real::ioctl()(s, req, arg);
                let saved = crate::errno::last_errno();
                real::close()(s);
                crate::errno::set_errno(saved);
                res
            }
            _ => {
                debug!("ioctl(fd {fd}, {req:#x}) on an offloaded socket: ENOTTY");
                fail(libc::ENOTTY)
            }
        }
    }, else real::ioctl()(fd, req, arg))
}
