//! Sockets a local host made itself: `ControlMsg::SocketAdopt` and
//! `ControlMsg::SocketDup`.
//!
//! The kernel, not tcps, decides what a host may do: a local host creates,
//! binds and listens on its kernel sockets in its own process, under its
//! uid, capabilities, network namespace, cgroup and LSM label, and passes
//! each socket here once (SCM_RIGHTS). The server checks that it is a TCP
//! socket, counts it against the host's quota and runs the data path on it.
//! Where the host has no descriptor of its own (a connection the server
//! accepted) and wants what the server's allow-list refuses
//! (`sockopt_policy`), it asks for a duplicate of its own socket and does
//! it itself, again under its own credentials.

use crate::config::Config;
use crate::guard::HostHeld;
use crate::host::Host;
use crate::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tcps_proto::handshake::ControlMsg;
use tracing::debug;

/// Whether `m` is answered by [`on_control`].
pub fn handles(m: &ControlMsg) -> bool {
    matches!(
        m,
        ControlMsg::SocketAdopt { .. } | ControlMsg::SocketDup { .. }
    )
}

/// Answers a `SocketAdopt` or `SocketDup` of `host`: the reply and the
/// descriptor it carries, if any (EINVAL for any other message).
pub fn on_control(
    cfg: &Config,
    host: &mut Host,
    m: ControlMsg,
    fds: Vec<OwnedFd>,
) -> (ControlMsg, Option<OwnedFd>) {
    match m {
        ControlMsg::SocketAdopt {
            handle,
            nonblocking,
        } => {
            let reply = match adopt(cfg, host, fds, nonblocking) {
                Ok(sock) => {
                    // The host's socket(2), as the statistics count it.
                    host.stats.calls[tcps_proto::Op::Socket as usize] += 1;
                    ControlMsg::Adopted { handle, sock }
                }
                Err(errno) => ControlMsg::Reply { handle, errno },
            };
            debug!(host = host.id, ?reply, "socket adopt");
            (reply, None)
        }
        ControlMsg::SocketDup { handle } => match dup(host, handle) {
            Ok(fd) => (ControlMsg::Reply { handle, errno: 0 }, Some(fd)),
            Err(errno) => (ControlMsg::Reply { handle, errno }, None),
        },
        other => (
            ControlMsg::Reply {
                handle: other.handle(),
                errno: libc::EINVAL,
            },
            None,
        ),
    }
}

/// Takes the one socket that came with the message; returns its new id.
fn adopt(
    cfg: &Config,
    host: &mut Host,
    mut fds: Vec<OwnedFd>,
    nonblocking: bool,
) -> Result<u32, i32> {
    if fds.len() != 1 {
        return Err(libc::EINVAL); // the extra descriptors close when dropped
    }
    let fd = fds.remove(0);
    check_tcp_socket(fd.as_raw_fd())?;
    // Refused before its description is touched.
    crate::calls::common::check_quota(cfg, host)?;
    // The server never blocks on a socket. O_NONBLOCK lives in the open
    // file description, shared with the host's copy, which the host
    // library never blocks on.
    sys::set_nonblocking(fd.as_raw_fd())?;
    // The host keeps its copy: it can clear O_NONBLOCK again at any time,
    // so blocking calls on it are guarded, and connections accepted on it
    // are its owner's (`guard`).
    let held = HostHeld::of(fd.as_raw_fd());
    let id = crate::calls::common::insert_socket(cfg, host, fd, nonblocking)?;
    if let Some(s) = host.socket_mut(id) {
        s.host_held = held;
    }
    Ok(id)
}

/// A duplicate of the kernel socket of `host`'s own socket `sock`: the host
/// can only name sockets in its own table.
fn dup(host: &mut Host, sock: u32) -> Result<OwnedFd, i32> {
    let s = host.socket_mut(sock).ok_or(libc::EBADF)?;
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the result is checked.
    let fd = unsafe { libc::fcntl(s.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(sys::errno());
    }
    // From now on the host shares the description (`guard`).
    s.host_held = HostHeld::of(fd);
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Is `fd` an AF_INET/AF_INET6 SOCK_STREAM TCP socket? ENOTSOCK for a non
/// socket, EAFNOSUPPORT / ESOCKTNOSUPPORT / EPROTONOSUPPORT for another kind.
pub fn check_tcp_socket(fd: RawFd) -> Result<(), i32> {
    // SAFETY: fstat into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; fd is a descriptor we own.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(sys::errno());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(libc::ENOTSOCK);
    }
    let domain = sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EAFNOSUPPORT);
    }
    if sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(libc::ESOCKTNOSUPPORT);
    }
    if sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)? != libc::IPPROTO_TCP {
        return Err(libc::EPROTONOSUPPORT);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(fd: i32) -> OwnedFd {
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    #[test]
    fn only_tcp_sockets_are_adopted() {
        // SAFETY: plain syscalls.
        let (tcp, udp, unix, file) = unsafe {
            (
                own(libc::socket(libc::AF_INET6, libc::SOCK_STREAM, 0)),
                own(libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)),
                own(libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0)),
                own(libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY)),
            )
        };
        assert_eq!(check_tcp_socket(tcp.as_raw_fd()), Ok(()));
        assert_eq!(
            check_tcp_socket(udp.as_raw_fd()),
            Err(libc::ESOCKTNOSUPPORT)
        );
        assert_eq!(check_tcp_socket(unix.as_raw_fd()), Err(libc::EAFNOSUPPORT));
        assert_eq!(check_tcp_socket(file.as_raw_fd()), Err(libc::ENOTSOCK));
    }
}
