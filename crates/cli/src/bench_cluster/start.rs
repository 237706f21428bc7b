//! Starting one configuration in the nodes: the TCP servers (on the
//! application node for local, on the server node for remote, one on each
//! server node for remote2), then the web server or nginx on the
//! application node, up once a client on the client node gets the first
//! file of the request stream through every address it is served on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::args::{ClusterArgs, Error};
use super::configs::{App, Config, Net};
use crate::bench_web::types::cpu_list;
use crate::bench_web::workload::{self, Workload};
use crate::cluster_nodes::{Nodes, Server2};
use crate::harness::{self, Proc};

/// The web server's (and nginx's) port.
pub const PORT: u16 = 8080;
/// The fabric listener's port on the server node.
pub const FABRIC_PORT: u16 = 7010;

/// What a run fixes before its first measurement.
pub struct Env<'a> {
    pub args: &'a ClusterArgs,
    pub nodes: &'a Nodes,
    pub tmp: &'a Path,
    /// This `tcps` (TCP server, `tcps run`, the fabric-pump helper).
    pub exe: &'a Path,
    pub webserver: &'a Path,
    pub wrk: &'a Path,
    pub workload: &'a Workload,
    /// The fabric secret (mode 600).
    pub key: &'a Path,
    /// The request stream's first path (the readiness probe's).
    pub probe: &'a str,
}

impl Env<'_> {
    /// The second TCP-server node (made when a configuration needs it).
    fn srv2(&self) -> Result<&Server2, Error> {
        let s = self.nodes.srv2.as_ref();
        s.ok_or_else(|| "no second TCP-server node".into())
    }

    /// `ADDR:PORT` of the fabric listeners: one, or (remote2) a comma list
    /// of both server nodes' (`TCPS_REMOTE`).
    pub fn fabric_addrs(&self, c: &Config) -> Result<String, Error> {
        let one = format!("{}:{FABRIC_PORT}", self.nodes.srv_app_addr);
        if c.net != Net::Remote2 {
            return Ok(one);
        }
        Ok(format!("{one},{}:{FABRIC_PORT}", self.srv2()?.srv_app_addr))
    }

    /// The application node's fabric devices (`UCX_NET_DEVICES`): both
    /// links for remote2 (each helper keeps the one to its server).
    fn app_devs(&self, c: &Config) -> String {
        match c.net {
            Net::Remote2 => self.nodes.app_devs(),
            _ => self.nodes.app_dev.clone(),
        }
    }

    /// The address the application listens on: the application node's on
    /// the client link, or (remote) the server node's, whose sockets it
    /// uses, or (remote2) every address, so that each server binds its own.
    pub fn listen_addr(&self, c: &Config) -> &str {
        match (c.net, &self.nodes.app_cli_addr) {
            (Net::Remote2, _) => "0.0.0.0",
            (Net::Remote, _) | (_, None) => &self.nodes.srv_cli_addr,
            (_, Some(a)) => a,
        }
    }

    /// Where the client node reaches the application: one URL, or
    /// (remote2) one through each server node.
    pub fn urls(&self, c: &Config) -> Result<Vec<String>, Error> {
        let url = |a: &str| format!("http://{a}:{PORT}");
        Ok(match c.net {
            Net::Remote2 => vec![
                url(&self.nodes.srv_cli_addr),
                url(&self.srv2()?.srv_cli_addr),
            ],
            _ => vec![url(self.listen_addr(c))],
        })
    }
}

/// One configuration's processes; stopped (application first) on drop.
pub struct Running {
    pub app: Proc,
    /// Its TCP servers (none, one, or one per server node) and their
    /// control sockets, in the same order.
    pub servers: Vec<Proc>,
    pub sockets: Vec<PathBuf>,
}

impl Running {
    pub fn stop(mut self) {
        self.app.stop(Duration::from_secs(3));
        for s in &mut self.servers {
            s.stop(Duration::from_secs(3));
        }
    }
}

fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Result<Proc, Error> {
    let f = fs::File::create(&log)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Proc { name, child, log })
}

/// TCP server `k` (0, or 1 on the second server node) of a local or
/// remote configuration, up (its control socket `sock`, and when remote
/// its fabric listener). Both servers of remote2 run on --server-cpus.
fn start_server(env: &Env, c: &Config, k: usize, sock: &Path) -> Result<Proc, Error> {
    let a = env.args;
    let _ = fs::remove_file(sock);
    // Its node, its fabric listener and device.
    let (ns, fabric) = match (c.net, k) {
        (Net::Local, _) => (&env.nodes.app, None),
        (_, 0) => {
            let n = env.nodes;
            (&n.srv, Some((&n.srv_app_addr, &n.srv_dev)))
        }
        _ => {
            let s = env.srv2()?;
            (&s.ns, Some((&s.srv_app_addr, &s.srv_dev)))
        }
    };
    let mut cmd = Nodes::exec(ns);
    cmd.arg(env.exe).args(["server", "--socket"]).arg(sock);
    cmd.args(["--cpus", &cpu_list(&a.server_cpus), "--poll", &a.poll]);
    // Every connection offloaded (a remote host cannot take direct ones).
    cmd.args(["--balance", "off"]);
    if let Some((addr, dev)) = fabric {
        cmd.args(["--fabric-listen", &format!("{addr}:{FABRIC_PORT}")])
            .arg("--fabric-auth")
            .arg(env.key)
            .env("UCX_NET_DEVICES", dev);
    }
    let n = if k == 0 {
        String::new()
    } else {
        format!("-{}", k + 1)
    };
    let log = env.tmp.join(format!("tcps-server-{}{n}.log", c.id));
    let mut p = spawn("the TCP server", cmd, log.clone())?;
    harness::wait_for("the TCP server", Duration::from_secs(20), || {
        p.check_alive()?;
        let listening = fabric.is_none()
            || fs::read_to_string(&log).is_ok_and(|t| t.contains("fabric listener"));
        Ok(sock.exists() && listening)
    })?;
    Ok(p)
}

/// How a program on the application node reaches its TCP server: the
/// environment of a native host (the example web server).
fn host_env(env: &Env, c: &Config, cmd: &mut Command, sock: &Path) -> Result<(), Error> {
    match c.net {
        Net::Kernel => {}
        Net::Local => {
            cmd.env("TCPS_SOCKET", sock);
        }
        Net::Remote | Net::Remote2 => {
            cmd.env("TCPS_REMOTE", env.fabric_addrs(c)?)
                .env("TCPS_FABRIC_AUTH", env.key)
                .env("TCPS_BIN", env.exe)
                .env("UCX_NET_DEVICES", env.app_devs(c));
        }
    }
    Ok(())
}

/// The cores of the application: Regular's get the server's too.
fn app_cores(a: &ClusterArgs, c: &Config) -> String {
    let mut cores = a.host_cpus.clone();
    if c.net == Net::Kernel {
        cores.extend(&a.server_cpus);
    }
    cpu_list(&cores)
}

fn web_command(env: &Env, c: &Config, sock: &Path) -> Result<Command, Error> {
    let a = env.args;
    let w = env.workload;
    let mut cmd = Nodes::exec(&env.nodes.app);
    cmd.args(["taskset", "-c", &app_cores(a, c)])
        .arg(env.webserver);
    let net = if c.net == Net::Kernel {
        "kernel"
    } else {
        "tcps"
    };
    cmd.args(["--net", net, "--addr", env.listen_addr(c)]);
    cmd.args(["--port", &PORT.to_string(), "--root"]);
    cmd.arg(workload::root_of(env.tmp, w));
    cmd.args(["--send-size", &w.send_size.to_string()]);
    cmd.args(["--threads", &a.connections.to_string(), "--quiet"]);
    if c.net != Net::Kernel {
        cmd.args(["--mode", &a.mode]);
    }
    host_env(env, c, &mut cmd, sock)?;
    Ok(cmd)
}

/// nginx (one process: `master_process off`, the same single process on
/// the pinned host CPUs in all three ways), directly or under `tcps run`.
fn nginx_command(env: &Env, c: &Config, sock: &Path) -> Result<Command, Error> {
    let dir = env.tmp.join(format!("nginx-{}", c.id));
    let listen = format!("{}:{PORT}", env.listen_addr(c));
    let conf = harness::write_nginx_conf(&dir, &listen, &workload::root_of(env.tmp, env.workload))?;
    // One process, and no SO_REUSEPORT (a remote host's options go through
    // the server's allow-list, which has none).
    let text = fs::read_to_string(&conf)?
        .replace("master_process on;", "master_process off;")
        .replace(" reuseport", "");
    fs::write(&conf, text)?;
    let mut cmd = Nodes::exec(&env.nodes.app);
    cmd.args(["taskset", "-c", &app_cores(env.args, c)]);
    match c.net {
        Net::Kernel => {}
        Net::Local => {
            cmd.arg(env.exe)
                .args(["run", "--fallback", "fail", "--socket"]);
            cmd.arg(sock).arg("--");
        }
        Net::Remote | Net::Remote2 => {
            cmd.arg(env.exe)
                .args(["run", "--fallback", "fail", "--remote"]);
            cmd.args([&env.fabric_addrs(c)?, "--fabric-auth"])
                .arg(env.key)
                .arg("--");
            cmd.env("UCX_NET_DEVICES", env.app_devs(c));
        }
    }
    cmd.args(["nginx", "-c"]).arg(conf);
    Ok(cmd)
}

/// A GET of `url` from the client node succeeds.
fn answers(env: &Env, url: &str) -> bool {
    Nodes::exec(&env.nodes.cli)
        .args(["curl", "-sf", "--max-time", "5", "-o", "/dev/null", url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts configuration `c`; it answers the client node when this returns.
pub fn start(env: &Env, c: &Config) -> Result<Running, Error> {
    let sockets: Vec<PathBuf> = (0..c.net.servers())
        .map(|k| match k {
            0 => env.tmp.join("tcps.sock"),
            _ => env.tmp.join(format!("tcps{}.sock", k + 1)),
        })
        .collect();
    let sock = env.tmp.join("tcps.sock");
    let mut servers = Vec::new();
    for (k, s) in sockets.iter().enumerate() {
        // On an error, those already up stop as they drop.
        servers.push(start_server(env, c, k, s)?);
    }
    let cmd = match c.app {
        App::Web => web_command(env, c, &sock)?,
        App::Nginx => nginx_command(env, c, &sock)?,
    };
    let log = env.tmp.join(format!("app-{}.log", c.id));
    let name = match c.app {
        App::Web => "the web server",
        App::Nginx => "nginx",
    };
    let mut run = Running {
        app: spawn(name, cmd, log)?,
        servers,
        sockets,
    };
    for url in env.urls(c)? {
        let url = format!("{url}{}", env.probe);
        harness::wait_for(
            &format!("{name} to answer {url}"),
            Duration::from_secs(30),
            || {
                run.app.check_alive()?;
                for s in &mut run.servers {
                    s.check_alive()?;
                }
                Ok(answers(env, &url))
            },
        )?;
    }
    Ok(run)
}
