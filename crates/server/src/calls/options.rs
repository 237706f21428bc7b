//! The calls that never wait: socket options (the allow-list, `SOL_TCPS`,
//! timeouts, SO_LINGER), names, `fcntl`, and the refused `Socket`/`Bind`.

use super::common::{arena_bytes, write_arena, Res};
use super::eager::setup;
use crate::host::Host;
use crate::sys::{self, RawAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;
use tcps_proto::msg::ArenaRange;
use tracing::{debug, warn};

pub(crate) fn with_fd(
    host: &Host,
    sock: u32,
    f: impl FnOnce(i32) -> sys::SysResult<(i64, u64)>,
) -> Res {
    let s = host.socket(sock).ok_or(libc::EBADF)?;
    f(s.fd.as_raw_fd())
}

/// `Op::Socket` from a local host: refused. A local host creates its
/// kernel sockets itself, under its own credentials, and hands them over
/// with `ControlMsg::SocketAdopt` (`docs/PROTOCOL.md` §6): a socket made
/// here would carry the server's uid, capabilities and network namespace.
/// The op stays in the protocol for a future fabric transport.
pub(crate) fn new_socket(host: &mut Host) -> Res {
    warn!(
        host = host.id,
        pid = host.pid,
        uid = host.uid,
        "socket refused: a local host creates its sockets itself (ControlMsg::SocketAdopt)"
    );
    Err(libc::EPERM)
}

/// `Op::Bind` from a local host: refused, like `Op::Socket`. The host
/// binds its own socket, so the kernel checks its own right to the port
/// (CAP_NET_BIND_SERVICE, SO_REUSEPORT groups of the same owner).
pub(crate) fn bind(host: &mut Host, sock: u32) -> Res {
    host.socket(sock).ok_or(libc::EBADF)?;
    warn!(
        host = host.id,
        pid = host.pid,
        uid = host.uid,
        sock,
        "bind refused: a local host binds its own socket (the kernel checks its credentials)"
    );
    Err(libc::EPERM)
}

pub(crate) fn setsockopt(
    host: &mut Host,
    ch: u32,
    sock: u32,
    level: i32,
    name: i32,
    v: ArenaRange,
) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let value = arena_bytes(host, ch, v);
    if setup::is_tcps_level(level) {
        return setup::setsockopt(host, sock, name, &value);
    }
    let allowed_cc = if level == libc::IPPROTO_TCP && name == libc::TCP_CONGESTION {
        crate::sockopt_policy::allowed_congestion_control()
    } else {
        String::new()
    };
    if let Err(why) = crate::sockopt_policy::may_set(level, name, &value, &allowed_cc) {
        return Err(refused(host, "setsockopt", level, name, why));
    }
    sys::setsockopt(fd, level, name, &value)?;
    // The kernel socket is non-blocking, so it would ignore these: the
    // server times parked calls out itself.
    if level == libc::SOL_SOCKET && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO) {
        let t = timeval(&value);
        if let Some(s) = host.socket_mut(sock) {
            if name == libc::SO_RCVTIMEO {
                s.rcv_timeout = t;
            } else {
                s.snd_timeout = t;
            }
        }
    }
    Ok((0, 0))
}

/// Logs an option the allow-list refused (debug: a host can ask often);
/// the errno, EPERM.
pub(crate) fn refused(host: &Host, call: &str, level: i32, name: i32, why: &str) -> i32 {
    debug!(
        host = host.id,
        pid = host.pid,
        uid = host.uid,
        level,
        name,
        why,
        "{call} refused"
    );
    libc::EPERM
}

/// Longest SO_RCVTIMEO / SO_SNDTIMEO kept; longer is forever (`None`), as
/// the kernel treats a timeout beyond its longest wait.
pub(crate) const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A `struct timeval` option value as a timeout (`None`: wait forever).
pub(crate) fn timeval(v: &[u8]) -> Option<Duration> {
    let sec = i64::from_ne_bytes(v.get(0..8)?.try_into().ok()?);
    let usec = i64::from_ne_bytes(v.get(8..16)?.try_into().ok()?);
    let d = Duration::from_secs(sec.max(0) as u64)
        .saturating_add(Duration::from_micros(usec.clamp(0, 999_999) as u64));
    (!d.is_zero() && d <= MAX_SOCKET_TIMEOUT).then_some(d)
}

pub(crate) fn getsockopt(
    host: &Host,
    ch: u32,
    sock: u32,
    level: i32,
    name: i32,
    v: ArenaRange,
) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    if setup::is_tcps_level(level) {
        if v.len < 4 {
            return Err(libc::EINVAL);
        }
        let x = setup::getsockopt(host, sock, name)?;
        write_arena(host, ch, v, &x.to_ne_bytes());
        return Ok((0, 4));
    }
    if let Err(why) = crate::sockopt_policy::may_get(level, name) {
        return Err(refused(host, "getsockopt", level, name, why));
    }
    let mut buf = vec![0u8; v.len as usize];
    let len = sys::getsockopt(fd, level, name, &mut buf)?;
    write_arena(host, ch, v, &buf[..len.min(buf.len())]);
    Ok((0, len as u64))
}

pub(crate) fn sockname(
    host: &Host,
    ch: u32,
    sock: u32,
    a: ArenaRange,
    f: fn(i32) -> sys::SysResult<RawAddr>,
) -> Res {
    let fd = host.socket(sock).ok_or(libc::EBADF)?.fd.as_raw_fd();
    let raw = f(fd)?;
    Ok((0, write_arena(host, ch, a, raw.as_bytes())))
}

pub(crate) fn fcntl(host: &mut Host, sock: u32, cmd: i32, arg: i64) -> Res {
    let s = host.socket_mut(sock).ok_or(libc::EBADF)?;
    match cmd {
        libc::F_GETFL => Ok((
            (libc::O_RDWR | if s.nonblocking { libc::O_NONBLOCK } else { 0 }) as i64,
            0,
        )),
        libc::F_SETFL => {
            s.nonblocking = arg & libc::O_NONBLOCK as i64 != 0;
            Ok((0, 0))
        }
        _ => Err(libc::EINVAL),
    }
}

/// SO_LINGER set through the server: the socket's close checks it (and a
/// listener's accepted connections look it up again).
pub(crate) fn note_linger(host: &mut Host, sock: u32, level: i32, name: i32) {
    if level == libc::SOL_SOCKET && name == libc::SO_LINGER {
        if let Some(s) = host.socket_mut(sock) {
            s.may_linger = true;
            s.listener_lingers = None;
        }
    }
}
