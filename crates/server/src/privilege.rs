//! What a host may do: read from its credentials at attach time.
//!
//! A host must not do through the server what it could not do itself. The
//! server runs with more privilege than its hosts (it may be root), so it
//! checks the host's effective capabilities before privileged operations.

/// Capabilities relevant to socket calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Privileges {
    /// CAP_NET_BIND_SERVICE: bind ports below `ip_unprivileged_port_start`.
    pub bind_service: bool,
    /// CAP_NET_ADMIN: SO_MARK, SO_PRIORITY above 6, IP_TRANSPARENT, ...
    pub net_admin: bool,
    /// CAP_NET_RAW: SO_BINDTODEVICE, IP_TRANSPARENT.
    pub net_raw: bool,
}

const CAP_NET_BIND_SERVICE: u32 = 10;
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;

impl Privileges {
    /// Parses the `CapEff:` line of `/proc/<pid>/status`.
    pub fn from_status(status: &str) -> Privileges {
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        let has = |bit: u32| eff & (1u64 << bit) != 0;
        Privileges {
            bind_service: has(CAP_NET_BIND_SERVICE),
            net_admin: has(CAP_NET_ADMIN),
            net_raw: has(CAP_NET_RAW),
        }
    }

    /// Reads a live process's privileges; none if it cannot be read.
    pub fn of_pid(pid: u32) -> Privileges {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| Privileges::from_status(&s))
            .unwrap_or_default()
    }

    /// May this host bind `port`?
    pub fn may_bind(&self, port: u16, unprivileged_start: u16) -> bool {
        port == 0 || port >= unprivileged_start || self.bind_service
    }

    /// May this host set this socket option to `value`?
    pub fn may_setsockopt(&self, level: i32, name: i32, value: &[u8]) -> bool {
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => self.net_raw,
            (libc::SOL_SOCKET, libc::SO_MARK) => self.net_admin,
            // The kernel checks the *server's* CAP_NET_ADMIN for these.
            (libc::SOL_SOCKET, libc::SO_SNDBUFFORCE) | (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE) => {
                self.net_admin
            }
            (libc::SOL_SOCKET, libc::SO_PRIORITY) => {
                let v = value
                    .get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .unwrap_or(0);
                (0..=6).contains(&v) || self.net_admin
            }
            (libc::SOL_IP, libc::IP_TRANSPARENT) | (libc::SOL_IPV6, libc::IPV6_TRANSPARENT) => {
                self.net_admin || self.net_raw
            }
            (libc::SOL_SOCKET, libc::SO_DEBUG) => self.net_admin,
            _ => true,
        }
    }
}

/// `/proc/sys/net/ipv4/ip_unprivileged_port_start` (1024 if unreadable).
pub fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_nobody() {
        let root = Privileges::from_status("Name:\tx\nCapEff:\t000001ffffffffff\n");
        assert!(root.bind_service && root.net_admin && root.net_raw);
        let nobody = Privileges::from_status("CapEff:\t0000000000000000\n");
        assert_eq!(nobody, Privileges::default());
        assert!(!nobody.may_bind(80, 1024));
        assert!(nobody.may_bind(0, 1024));
        assert!(nobody.may_bind(8080, 1024));
        assert!(root.may_bind(80, 1024));
        assert!(!nobody.may_setsockopt(libc::SOL_SOCKET, libc::SO_PRIORITY, &7i32.to_ne_bytes()));
        assert!(nobody.may_setsockopt(libc::SOL_SOCKET, libc::SO_PRIORITY, &3i32.to_ne_bytes()));
        assert!(nobody.may_setsockopt(libc::IPPROTO_TCP, libc::TCP_NODELAY, &1i32.to_ne_bytes()));
        assert!(!nobody.may_setsockopt(
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &(1i32 << 24).to_ne_bytes()
        ));
        assert!(root.may_setsockopt(
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &(1i32 << 24).to_ne_bytes()
        ));
    }
}
