//! Which socket options the server sets or reads *for* a host.
//!
//! The rule: the kernel, not tcps, decides what a host may do. A local host
//! creates, binds and listens on its sockets itself and sets their options
//! on its own descriptor, so the kernel checks its own credentials
//! (`docs/PROTOCOL.md` §6). The server still acts for a host where the host
//! has no descriptor of its own: options on connections the server accepted
//! (and any request a host sends over the channel). There the server, which
//! may run as root, applies only options on this ALLOW-LIST: options that
//! need no privilege, whose values hold no pointer (a pointer would be read
//! in the server's address space), with the value checks the kernel makes
//! of an unprivileged caller. Everything else is EPERM; the host library
//! then asks for a duplicate of the socket (`ControlMsg::SocketDup`) and
//! sets the option itself, under its own credentials.
//!
//! There is deliberately no capability reading here: capabilities taken
//! from `/proc/PID/status` describe a process that can change (user
//! namespaces, exec of a setuid binary, setuid after attach).

/// Why an option is refused (EPERM), for the log line.
pub type Refusal = &'static str;

const NOT_LISTED: Refusal =
    "not on the server's allow-list (set it on the host's own descriptor: SocketDup)";

fn int_value(value: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(value.get(..4)?.try_into().ok()?))
}

/// May the server set option (`level`, `name`) to `value` for a host?
/// `allowed_cc` lists the congestion controls unprivileged users may pick
/// (`/proc/sys/net/ipv4/tcp_allowed_congestion_control`).
pub fn may_set(level: i32, name: i32, value: &[u8], allowed_cc: &str) -> Result<(), Refusal> {
    use libc::*;
    match (level, name) {
        // Unprivileged, plain integers or pointer-free structs (linger,
        // timeval) whose range the kernel checks the same for everyone.
        (SOL_SOCKET, SO_REUSEADDR | SO_KEEPALIVE | SO_LINGER | SO_RCVBUF | SO_SNDBUF)
        | (SOL_SOCKET, SO_RCVTIMEO | SO_SNDTIMEO | SO_OOBINLINE | SO_RCVLOWAT)
        | (
            IPPROTO_TCP,
            TCP_NODELAY | TCP_CORK | TCP_KEEPIDLE | TCP_KEEPINTVL | TCP_KEEPCNT | TCP_QUICKACK,
        )
        | (IPPROTO_TCP, TCP_USER_TIMEOUT | TCP_NOTSENT_LOWAT | TCP_MAXSEG | TCP_WINDOW_CLAMP)
        | (IPPROTO_TCP, TCP_DEFER_ACCEPT | TCP_LINGER2 | TCP_SYNCNT)
        | (IPPROTO_IP, IP_TOS | IP_TTL)
        | (IPPROTO_IPV6, IPV6_TCLASS | IPV6_UNICAST_HOPS | IPV6_V6ONLY) => Ok(()),
        // Above 6 needs CAP_NET_ADMIN (sk_setsockopt).
        (SOL_SOCKET, SO_PRIORITY) => match int_value(value) {
            Some(p) if (0..=6).contains(&p) => Ok(()),
            Some(_) => Err("SO_PRIORITY above 6 needs CAP_NET_ADMIN"),
            None => Ok(()), // too short: the kernel's EINVAL
        },
        // Outside the allowed set needs CAP_NET_ADMIN (and may load a module).
        (IPPROTO_TCP, TCP_CONGESTION) => {
            if congestion_allowed(value, allowed_cc) {
                Ok(())
            } else {
                Err("TCP_CONGESTION not in tcp_allowed_congestion_control")
            }
        }
        _ => Err(NOT_LISTED),
    }
}

/// The name a TCP_CONGESTION value holds (up to its NUL, as the kernel
/// reads it) is one of `allowed` (whitespace-separated names).
fn congestion_allowed(value: &[u8], allowed: &str) -> bool {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    let Ok(name) = std::str::from_utf8(&value[..end]) else {
        return false;
    };
    !name.is_empty() && allowed.split_whitespace().any(|a| a == name)
}

/// May the server read option (`level`, `name`) for a host? Reads whose
/// value holds no pointer and tells nothing beyond the socket itself.
pub fn may_get(level: i32, name: i32) -> Result<(), Refusal> {
    use libc::*;
    match (level, name) {
        (SOL_SOCKET, SO_ERROR | SO_TYPE | SO_PROTOCOL | SO_DOMAIN | SO_ACCEPTCONN)
        | (SOL_SOCKET, SO_RCVBUF | SO_SNDBUF | SO_KEEPALIVE | SO_REUSEADDR | SO_REUSEPORT)
        | (SOL_SOCKET, SO_LINGER | SO_RCVTIMEO | SO_SNDTIMEO | SO_OOBINLINE | SO_PRIORITY)
        | (SOL_SOCKET, SO_RCVLOWAT)
        | (
            IPPROTO_TCP,
            TCP_NODELAY | TCP_CORK | TCP_KEEPIDLE | TCP_KEEPINTVL | TCP_KEEPCNT | TCP_INFO,
        )
        | (
            IPPROTO_TCP,
            TCP_MAXSEG | TCP_QUICKACK | TCP_USER_TIMEOUT | TCP_NOTSENT_LOWAT | TCP_CONGESTION,
        )
        | (IPPROTO_TCP, TCP_WINDOW_CLAMP | TCP_DEFER_ACCEPT | TCP_LINGER2 | TCP_SYNCNT)
        | (IPPROTO_IP, IP_TOS | IP_TTL)
        | (IPPROTO_IPV6, IPV6_TCLASS | IPV6_UNICAST_HOPS | IPV6_V6ONLY) => Ok(()),
        _ => Err(NOT_LISTED),
    }
}

/// `/proc/sys/net/ipv4/tcp_allowed_congestion_control` ("" if unreadable:
/// then no name is allowed through the server).
pub fn allowed_congestion_control() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CC: &str = "reno cubic\n";

    fn set(level: i32, name: i32, v: &[u8]) -> bool {
        may_set(level, name, v, CC).is_ok()
    }

    #[test]
    fn unprivileged_pointer_free_options_pass() {
        let one = 1i32.to_ne_bytes();
        assert!(set(libc::IPPROTO_TCP, libc::TCP_NODELAY, &one));
        assert!(set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, &one));
        assert!(set(libc::SOL_SOCKET, libc::SO_LINGER, &[0u8; 8]));
        assert!(set(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &[0u8; 16]));
        assert!(set(libc::IPPROTO_IP, libc::IP_TOS, &one));
        assert!(set(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &one));
    }

    #[test]
    fn privileged_or_pointer_holding_options_are_refused() {
        let one = 1i32.to_ne_bytes();
        for (level, name) in [
            (libc::IPPROTO_TCP, libc::TCP_REPAIR),
            (libc::IPPROTO_TCP, libc::TCP_REPAIR_QUEUE),
            (libc::IPPROTO_TCP, libc::TCP_ULP),
            (libc::IPPROTO_IP, libc::IP_OPTIONS),
            (libc::IPPROTO_IP, libc::IP_TRANSPARENT),
            (libc::IPPROTO_IP, libc::IP_XFRM_POLICY),
            (libc::IPPROTO_IPV6, libc::IPV6_HOPOPTS),
            (libc::SOL_SOCKET, libc::SO_MARK),
            (libc::SOL_SOCKET, libc::SO_BINDTODEVICE),
            (libc::SOL_SOCKET, libc::SO_BINDTOIFINDEX),
            (libc::SOL_SOCKET, libc::SO_PREFER_BUSY_POLL),
            (libc::SOL_SOCKET, libc::SO_BUSY_POLL),
            (libc::SOL_SOCKET, libc::SO_ATTACH_FILTER),
            (libc::SOL_SOCKET, libc::SO_ATTACH_BPF),
            (libc::SOL_SOCKET, libc::SO_SNDBUFFORCE),
            (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE),
            (libc::SOL_SOCKET, libc::SO_DEBUG),
            (libc::SOL_SOCKET, libc::SO_REUSEPORT),
        ] {
            assert!(!set(level, name, &one), "({level}, {name}) allowed");
        }
    }

    #[test]
    fn values_are_checked_as_the_kernel_checks_an_unprivileged_caller() {
        let p = |v: i32| set(libc::SOL_SOCKET, libc::SO_PRIORITY, &v.to_ne_bytes());
        assert!(p(0) && p(6));
        assert!(!p(7) && !p(-1));
        let cc = |v: &[u8]| set(libc::IPPROTO_TCP, libc::TCP_CONGESTION, v);
        assert!(cc(b"cubic") && cc(b"reno\0junk"));
        assert!(!cc(b"bbr") && !cc(b"") && !cc(b"cub") && !cc(&[0xff, 0]));
        assert!(may_set(libc::IPPROTO_TCP, libc::TCP_CONGESTION, b"cubic", "").is_err());
    }

    #[test]
    fn reads_are_listed_too() {
        assert!(may_get(libc::SOL_SOCKET, libc::SO_ERROR).is_ok());
        assert!(may_get(libc::IPPROTO_TCP, libc::TCP_INFO).is_ok());
        assert!(may_get(libc::SOL_SOCKET, libc::SO_GET_FILTER).is_err());
        assert!(may_get(libc::IPPROTO_TCP, libc::TCP_ZEROCOPY_RECEIVE).is_err());
        assert!(may_get(libc::SOL_SOCKET, libc::SO_PEERSEC).is_err());
    }
}
