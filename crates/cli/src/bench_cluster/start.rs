//! Starting one configuration in the nodes: the TCP server (on the
//! application node for local, on the server node for remote), then the
//! web server or nginx on the application node, up once a client on the
//! client node gets the first file of the request stream.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::args::{ClusterArgs, Error};
use super::configs::{App, Config, Net};
use crate::bench_web::types::cpu_list;
use crate::bench_web::workload::{self, Workload};
use crate::cluster_nodes::Nodes;
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
    /// `ADDR:PORT` of the fabric listener.
    pub fn fabric_addr(&self) -> String {
        format!("{}:{FABRIC_PORT}", self.nodes.srv_app_addr)
    }

    /// The address the application listens on: the application node's on
    /// the client link, or (remote) the server node's, whose sockets it uses.
    pub fn listen_addr(&self, c: &Config) -> &str {
        match (c.net, &self.nodes.app_cli_addr) {
            (Net::Remote, _) | (_, None) => &self.nodes.srv_cli_addr,
            (_, Some(a)) => a,
        }
    }

    pub fn url(&self, c: &Config) -> String {
        format!("http://{}:{PORT}", self.listen_addr(c))
    }
}

/// One configuration's processes; stopped (application first) on drop.
pub struct Running {
    pub app: Proc,
    pub server: Option<Proc>,
    /// The TCP server's control socket.
    pub socket: Option<PathBuf>,
}

impl Running {
    pub fn stop(mut self) {
        self.app.stop(Duration::from_secs(3));
        if let Some(mut s) = self.server.take() {
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

/// The TCP server of a local or remote configuration, up (its control
/// socket, and for remote its fabric listener).
fn start_server(env: &Env, c: &Config, sock: &Path) -> Result<Proc, Error> {
    let a = env.args;
    let _ = fs::remove_file(sock);
    let ns = if c.net == Net::Remote {
        &env.nodes.srv
    } else {
        &env.nodes.app
    };
    let mut cmd = Nodes::exec(ns);
    cmd.arg(env.exe).args(["server", "--socket"]).arg(sock);
    cmd.args(["--cpus", &cpu_list(&a.server_cpus), "--poll", &a.poll]);
    // Every connection offloaded (a remote host cannot take direct ones).
    cmd.args(["--balance", "off"]);
    if c.net == Net::Remote {
        cmd.args(["--fabric-listen", &env.fabric_addr(), "--fabric-auth"])
            .arg(env.key)
            .env("UCX_NET_DEVICES", &env.nodes.srv_dev);
    }
    let log = env.tmp.join(format!("tcps-server-{}.log", c.id));
    let mut p = spawn("the TCP server", cmd, log.clone())?;
    harness::wait_for("the TCP server", Duration::from_secs(20), || {
        p.check_alive()?;
        let listening = c.net != Net::Remote
            || fs::read_to_string(&log).is_ok_and(|t| t.contains("fabric listener"));
        Ok(sock.exists() && listening)
    })?;
    Ok(p)
}

/// How a program on the application node reaches its TCP server: the
/// environment of a native host (the example web server).
fn host_env(env: &Env, c: &Config, cmd: &mut Command, sock: &Path) {
    match c.net {
        Net::Kernel => {}
        Net::Local => {
            cmd.env("TCPS_SOCKET", sock);
        }
        Net::Remote => {
            cmd.env("TCPS_REMOTE", env.fabric_addr())
                .env("TCPS_FABRIC_AUTH", env.key)
                .env("TCPS_BIN", env.exe)
                .env("UCX_NET_DEVICES", &env.nodes.app_dev);
        }
    }
}

/// The cores of the application: Regular's get the server's too.
fn app_cores(a: &ClusterArgs, c: &Config) -> String {
    let mut cores = a.host_cpus.clone();
    if c.net == Net::Kernel {
        cores.extend(&a.server_cpus);
    }
    cpu_list(&cores)
}

fn web_command(env: &Env, c: &Config, sock: &Path) -> Command {
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
    host_env(env, c, &mut cmd, sock);
    cmd
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
        Net::Remote => {
            cmd.arg(env.exe)
                .args(["run", "--fallback", "fail", "--remote"]);
            cmd.args([&env.fabric_addr(), "--fabric-auth"])
                .arg(env.key)
                .arg("--");
            cmd.env("UCX_NET_DEVICES", &env.nodes.app_dev);
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
    let sock = env.tmp.join("tcps.sock");
    let server = match c.net {
        Net::Kernel => None,
        _ => Some(start_server(env, c, &sock)?),
    };
    let cmd = match c.app {
        App::Web => web_command(env, c, &sock),
        App::Nginx => nginx_command(env, c, &sock)?,
    };
    let log = env.tmp.join(format!("app-{}.log", c.id));
    let name = match c.app {
        App::Web => "the web server",
        App::Nginx => "nginx",
    };
    let mut run = Running {
        app: spawn(name, cmd, log)?,
        server,
        socket: (c.net != Net::Kernel).then_some(sock),
    };
    let url = format!("{}{}", env.url(c), env.probe);
    harness::wait_for(
        &format!("{name} to answer {url}"),
        Duration::from_secs(30),
        || {
            run.app.check_alive()?;
            if let Some(s) = &mut run.server {
                s.check_alive()?;
            }
            Ok(answers(env, &url))
        },
    )?;
    Ok(run)
}
