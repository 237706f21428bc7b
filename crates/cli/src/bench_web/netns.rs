//! The benchmark's network: two namespaces of its own joined by a veth pair.
//!
//! `tcpsbw-s-<pid>` holds the servers (TCP server and web server) at
//! 10.77.0.1, `tcpsbw-c-<pid>` the clients at 10.77.0.2. The addresses exist
//! only inside these namespaces, so nothing leaves the machine and concurrent
//! runs (other pids) cannot collide. Dropping the guard deletes both
//! namespaces (which deletes the veth pair); a run that was SIGKILLed leaves
//! namespaces whose pid is gone, and the next run deletes those first.

use std::process::{Command, Stdio};

use super::types::Error;
use crate::cluster_nodes::{ip, Nodes};

pub const SERVER_ADDR: &str = "10.77.0.1";
pub const CLIENT_ADDR: &str = "10.77.0.2";
const PREFIX: &str = "tcpsbw-";

/// Both namespaces; deleted on drop.
pub struct Netns {
    pub server: String,
    pub client: String,
}

impl Netns {
    pub fn create() -> Result<Netns, Error> {
        Nodes::remove_stale(PREFIX);
        let pid = std::process::id();
        let ns = Netns {
            server: format!("{PREFIX}s-{pid}"),
            client: format!("{PREFIX}c-{pid}"),
        };
        // Interface names are at most 15 bytes.
        let (vs, vc) = (
            format!("tbws{}", pid % 10_000_000),
            format!("tbwc{}", pid % 10_000_000),
        );
        ip(&["netns", "add", &ns.server])?;
        // From here on, dropping `ns` cleans up whatever was created.
        ip(&["netns", "add", &ns.client])?;
        ip(&[
            "link", "add", &vs, "netns", &ns.server, "type", "veth", "peer", "name", &vc, "netns",
            &ns.client,
        ])?;
        for (n, dev, addr) in [
            (&ns.server, &vs, SERVER_ADDR),
            (&ns.client, &vc, CLIENT_ADDR),
        ] {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", n, "link", "set", dev, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        // HTTP/1.0 opens a connection per request: give the clients every
        // ephemeral port (these sysctls are per namespace).
        let _ = Command::new("ip")
            .args(["netns", "exec", &ns.client, "sysctl", "-qw"])
            .arg("net.ipv4.ip_local_port_range=1024 65000")
            .arg("net.ipv4.tcp_tw_reuse=1")
            .stdout(Stdio::null())
            .status();
        Ok(ns)
    }

    /// `ip netns exec <ns>`: the command to prefix.
    pub fn exec(ns: &str) -> Command {
        Nodes::exec(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.client]);
        let _ = ip(&["netns", "del", &self.server]);
    }
}
