//! `Socket` and `Bind` of a remote host. A local host makes and binds its
//! kernel sockets itself, so the kernel judges its privileges (PROTOCOL
//! §6); a host on another node cannot hand a descriptor over, so the
//! server makes them for it. The socket belongs to the server process;
//! what the kernel would check against the host's own credentials the
//! server checks against the uid the host is mapped to (its auth file's
//! `uid=N` or `--fabric-uid`): a port below
//! `net.ipv4.ip_unprivileged_port_start` only for uid 0. Options go through
//! the same allow-list as on connections the server accepted (so no
//! SO_REUSEPORT: a remote host cannot join another's port group).

use crate::calls::common::{arena_bytes, insert_socket, Res};
use crate::config::Config;
use crate::host::Host;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tcps_proto::msg::ArenaRange;
use tracing::warn;

pub(crate) fn socket(cfg: &Config, host: &mut Host, domain: i32, ty: i32, protocol: i32) -> Res {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EAFNOSUPPORT);
    }
    if ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != libc::SOCK_STREAM {
        return Err(libc::ESOCKTNOSUPPORT);
    }
    if protocol != 0 && protocol != libc::IPPROTO_TCP {
        return Err(libc::EPROTONOSUPPORT);
    }
    crate::calls::common::check_quota(cfg, host)?;
    let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(domain, flags, libc::IPPROTO_TCP) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    // SAFETY: a fresh descriptor, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let id = insert_socket(cfg, host, fd, ty & libc::SOCK_NONBLOCK != 0)?;
    Ok((id as i64, 0))
}

/// The first port an unprivileged user may bind.
fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

pub(crate) fn bind(host: &mut Host, ch: u32, sock: u32, addr: ArenaRange) -> Res {
    let raw = arena_bytes(host, ch, addr);
    let parsed = tcps_proto::addr::parse(&raw).map_err(|_| libc::EINVAL)?;
    let port = parsed.port();
    if port != 0 && port < unprivileged_port_start() && host.uid != 0 {
        warn!(
            host = host.id,
            uid = host.uid,
            port,
            "remote bind refused: a privileged port"
        );
        return Err(libc::EACCES);
    }
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    // SAFETY: bind(2) on a socket of this host's table with the host's
    // sockaddr bytes (parsed above: a valid sockaddr_in/in6 of that length).
    let r = unsafe {
        libc::bind(
            fd,
            raw.as_ptr() as *const libc::sockaddr,
            raw.len() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    Ok((0, 0))
}
