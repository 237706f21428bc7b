//! Network namespaces as the nodes of a cluster (issue 17,
//! `docs/DEPLOYMENT.md`): an application node, a TCP-server node and a
//! client node, joined by veth pairs whose addresses exist only inside
//! them, all deleted when the `Nodes` guard drops (however the run ends:
//! an error, Ctrl-C through `harness::check_interrupted`, a panic).
//!
//! Used by `tcps bench cluster` and by the tests `crates/cli/tests/cluster.rs`
//! and `cluster_multi.rs` (which include this file with `#[path]`): std and
//! libc only.
//!
//! Links (`sub` picks the third octet, so concurrent tests differ):
//! application `.2` — server `.1` in 10.78.sub (the fabric), client `.2` —
//! server `.1` in 10.79.sub, and with `clients_to_app` client `.2` —
//! application `.1` in 10.80.sub (clients of a program on kernel sockets
//! or a local TCP server on the application node).
//!
//! `Nodes::create_two_servers` adds a second TCP-server node
//! `{prefix}srv2-{tag}` (a host with several servers, `TCPS_REMOTE=a,b`):
//! application `.2` — srv2 `.1` in 10.81.sub, client `.2` — srv2 `.1` in
//! 10.82.sub; each server node then routes to every client-node address
//! through its own client link (its default route), so both can connect
//! out to the same client address.

use std::process::{Command, Stdio};

/// `ip ARGS`, its error output on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (package iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The second TCP-server node: its namespace, its application link (the
/// server's and the application node's addresses, the devices) and its
/// address on its own link to the client node.
#[allow(dead_code)] // app_addr: read by tests/cluster_multi.rs, not by the bench
pub struct Server2 {
    pub ns: String,
    pub srv_app_addr: String,
    pub app_addr: String,
    pub app_dev: String,
    pub srv_dev: String,
    pub srv_cli_addr: String,
}

/// The three namespaces (four with a second server) and their links;
/// deleted on drop.
pub struct Nodes {
    pub app: String,
    pub srv: String,
    pub cli: String,
    /// The application link: the server's and the application node's
    /// addresses, and its devices. UCX must use them (`UCX_NET_DEVICES`):
    /// with several interfaces it would also offer the node's other
    /// addresses, which the peer cannot reach, and its connection times out.
    /// With a second server the application node has two such links: it
    /// names both (`app_devs`).
    pub srv_app_addr: String,
    pub app_addr: String,
    pub app_dev: String,
    pub srv_dev: String,
    /// The client link: the server's address on it.
    pub srv_cli_addr: String,
    /// With `clients_to_app`: the application node's address on its own
    /// link to the client node.
    pub app_cli_addr: Option<String>,
    /// With `create_two_servers`: the second TCP-server node.
    pub srv2: Option<Server2>,
    /// Devices made in the root namespace (removed on drop if they are
    /// still there: a failure before they moved).
    devs: Vec<String>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let srv2 = self.srv2.as_ref().map(|s| &s.ns);
        for ns in [&self.app, &self.srv, &self.cli].into_iter().chain(srv2) {
            // What still runs on a node goes with it (a program's forked
            // workers outlive a master killed by a failed run).
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill(2) of a process in our namespace.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for d in &self.devs {
            let _ = Command::new("ip")
                .args(["link", "del", d])
                .stderr(Stdio::null())
                .output();
        }
    }
}

impl Nodes {
    /// Namespaces `{prefix}app-{tag}`, `{prefix}srv-{tag}`,
    /// `{prefix}cli-{tag}` (`tag` at most 11 bytes: it names devices too).
    #[allow(dead_code)] // tests/cluster.rs (the bench calls create_with)
    pub fn create(
        prefix: &str,
        tag: &str,
        sub: u32,
        clients_to_app: bool,
    ) -> Result<Nodes, String> {
        Nodes::create_with(prefix, tag, sub, clients_to_app, false)
    }

    /// `create` without the client-to-application link, plus the second
    /// TCP-server node `{prefix}srv2-{tag}` and its links.
    #[allow(dead_code)] // tests/cluster_multi.rs
    pub fn create_two_servers(prefix: &str, tag: &str, sub: u32) -> Result<Nodes, String> {
        Nodes::create_with(prefix, tag, sub, false, true)
    }

    /// `create`, with the second TCP-server node if `two_servers` (the
    /// bench: both links to the client node's side, `clients_to_app`).
    pub fn create_with(
        prefix: &str,
        tag: &str,
        sub: u32,
        clients_to_app: bool,
        two_servers: bool,
    ) -> Result<Nodes, String> {
        let net = |n: u32| format!("10.{n}.{sub}");
        let mut n = Nodes {
            app: format!("{prefix}app-{tag}"),
            srv: format!("{prefix}srv-{tag}"),
            cli: format!("{prefix}cli-{tag}"),
            srv_app_addr: format!("{}.1", net(78)),
            app_addr: format!("{}.2", net(78)),
            app_dev: format!("tA{tag}"),
            srv_dev: format!("tAs{tag}"),
            srv_cli_addr: format!("{}.1", net(79)),
            app_cli_addr: clients_to_app.then(|| format!("{}.1", net(80))),
            srv2: two_servers.then(|| Server2 {
                ns: format!("{prefix}srv2-{tag}"),
                srv_app_addr: format!("{}.1", net(81)),
                app_addr: format!("{}.2", net(81)),
                app_dev: format!("tB{tag}"),
                srv_dev: format!("tBs{tag}"),
                srv_cli_addr: format!("{}.1", net(82)),
            }),
            devs: Vec::new(),
        };
        let srv2 = n.srv2.as_ref().map(|s| s.ns.clone());
        for ns in [n.app.clone(), n.srv.clone(), n.cli.clone()]
            .into_iter()
            .chain(srv2.clone())
        {
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let (app, srv, cli) = (n.app.clone(), n.srv.clone(), n.cli.clone());
        let (ad, sd) = (n.app_dev.clone(), n.srv_dev.clone());
        n.link(&app, &srv, &ad, &sd, &net(78))?;
        n.link(
            &cli,
            &srv,
            &format!("tC{tag}"),
            &format!("tCs{tag}"),
            &net(79),
        )?;
        if clients_to_app {
            n.link(
                &cli,
                &app,
                &format!("tD{tag}"),
                &format!("tDa{tag}"),
                &net(80),
            )?;
        }
        if let Some(s2) = srv2 {
            let (ad, sd) = (format!("tB{tag}"), format!("tBs{tag}"));
            n.link(&app, &s2, &ad, &sd, &net(81))?;
            let (cd, sd) = (format!("tE{tag}"), format!("tEs{tag}"));
            n.link(&cli, &s2, &cd, &sd, &net(82))?;
            for (ns, via) in [(&srv, net(79)), (&s2, net(82))] {
                ip(&[
                    "-n",
                    ns,
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("{via}.2"),
                ])?;
            }
        }
        // HTTP/1.0 opens a connection per request: give the clients every
        // ephemeral port (these sysctls are per namespace).
        let _ = Nodes::exec(&n.cli)
            .args(["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000"])
            .arg("net.ipv4.tcp_tw_reuse=1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        Ok(n)
    }

    /// A veth pair from namespace `a` (address `.2`) to `b` (`.1`) in `net`.
    fn link(
        &mut self,
        a: &str,
        b: &str,
        dev_a: &str,
        dev_b: &str,
        net: &str,
    ) -> Result<(), String> {
        ip(&["link", "add", dev_a, "type", "veth", "peer", "name", dev_b])?;
        self.devs.push(dev_a.to_string());
        ip(&["link", "set", dev_a, "netns", a])?;
        ip(&["link", "set", dev_b, "netns", b])?;
        for (ns, dev, host) in [(a, dev_a, 2), (b, dev_b, 1)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{net}.{host}/24"),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// The application node's fabric devices, for its `UCX_NET_DEVICES`:
    /// one per server node (a comma list with two).
    pub fn app_devs(&self) -> String {
        match &self.srv2 {
            Some(s2) => format!("{},{}", self.app_dev, s2.app_dev),
            None => self.app_dev.clone(),
        }
    }

    /// `ip netns exec NS`: the command to prefix.
    pub fn exec(ns: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        c
    }

    /// Namespaces `{prefix}*-{tag}` left behind by a run that was killed:
    /// `tag` ends with the run's pid, and that process is gone.
    pub fn remove_stale(prefix: &str) {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let Some(rest) = name.strip_prefix(prefix) else {
                continue;
            };
            let tag = rest.rsplit('-').next().unwrap_or("");
            let pid = tag.trim_start_matches(|c: char| !c.is_ascii_digit());
            if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
}
