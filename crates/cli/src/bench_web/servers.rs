//! Starting the servers of one curve: the TCP server, and the example web
//! server or the unmodified nginx through `tcps run`, each pinned and in
//! the server network namespace.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::env::{Env, PORT};
use super::netns::{Netns, SERVER_ADDR};
use super::types::{cpu_list, Error, WebArgs};
use super::variants::{Net, Variant};
use super::workload::{self, Workload};
use crate::harness::{self, Proc};

/// The servers of one curve: the TCP server (if the variant uses one) and
/// the web server, with the web server's log (its counters at exit).
pub struct Servers {
    pub tcps: Option<Proc>,
    pub web: Proc,
    pub web_log: PathBuf,
    /// The TCP server's control socket (tcps variants).
    pub tcps_socket: Option<PathBuf>,
}

impl Servers {
    /// Stops both, the TCP server first. (Dropped instead, their `Proc`
    /// guards kill them.)
    pub fn stop(self) {
        let Servers { tcps, mut web, .. } = self;
        drop(tcps);
        web.stop(Duration::from_secs(3));
    }
}

/// The cores of the host (the web server) and of the TCP server: Regular
/// on both core groups counts them all as the host's.
pub fn core_groups(a: &WebArgs, v: &Variant) -> (Vec<usize>, Vec<usize>) {
    if v.net == Net::Kernel && !v.host_cores_only {
        let mut all = a.host_cpus.clone();
        all.extend(&a.server_cpus);
        (all, vec![])
    } else {
        (a.host_cpus.clone(), a.server_cpus.clone())
    }
}

/// Runs the TCP server (if the variant uses one) and the web server for one
/// curve; both are stopped when the returned guards drop.
pub fn start(env: &Env, w: &Workload, v: &Variant) -> Result<Servers, Error> {
    let a = env.args;
    let sock = env.tmp.join("tcps.sock");
    let _ = fs::remove_file(&sock);
    let server = if v.net == Net::Tcps {
        let log = env.tmp.join(format!("tcps-server-{}-{}.log", w.id, v.id));
        let f = fs::File::create(&log)?;
        let child = Netns::exec(&env.ns.server)
            .arg(env.exe)
            .args(["server", "--socket"])
            .arg(&sock)
            .args(["--cpus", &cpu_list(&a.server_cpus), "--poll", &a.poll])
            .args(&v.server_args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .map_err(|e| format!("cannot start the TCP server: {e}"))?;
        let mut p = Proc {
            name: "the TCP server",
            child,
            log,
        };
        harness::wait_for("the TCP server's socket", Duration::from_secs(10), || {
            p.check_alive()?;
            Ok(sock.exists())
        })?;
        Some(p)
    } else {
        None
    };
    let (host, _) = core_groups(a, v);
    let cores = cpu_list(&host);
    let log = env.tmp.join(format!("webserver-{}-{}.log", w.id, v.id));
    if v.nginx {
        let web = start_nginx(env, w, &cores, &sock, &log)?;
        return Ok(Servers {
            tcps_socket: server.as_ref().map(|_| sock.clone()),
            tcps: server,
            web,
            web_log: log,
        });
    }
    let f = fs::File::create(&log)?;
    let net = if v.net == Net::Tcps { "tcps" } else { "kernel" };
    let child = Netns::exec(&env.ns.server)
        .args(["taskset", "-c", &cores])
        .arg(env.webserver)
        .args([
            "--net",
            net,
            "--addr",
            SERVER_ADDR,
            "--port",
            &PORT.to_string(),
        ])
        .arg("--root")
        .arg(workload::root_of(env.tmp, w))
        .args(["--send-size", &w.send_size.to_string()])
        .args(["--threads", &a.connections.to_string(), "--quiet"])
        .args(&v.web_args)
        .env("TCPS_SOCKET", &sock)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", env.webserver.display()))?;
    let mut web = Proc {
        name: "the web server",
        child,
        log: log.clone(),
    };
    harness::wait_for("the web server to listen", Duration::from_secs(10), || {
        web.check_alive()?;
        Ok(fs::read_to_string(&log)
            .map(|t| t.contains("listening on"))
            .unwrap_or(false))
    })?;
    Ok(Servers {
        tcps_socket: server.as_ref().map(|_| sock.clone()),
        tcps: server,
        web,
        web_log: log,
    })
}

/// The unmodified nginx through `tcps run` (one worker, sendfile on, the
/// workload's site as root) pinned to `cores`; up once its pid file exists
/// and its worker accepts.
fn start_nginx(
    env: &Env,
    w: &Workload,
    cores: &str,
    sock: &Path,
    log: &Path,
) -> Result<Proc, Error> {
    let dir = env.tmp.join(format!("nginx-{}", w.id));
    let conf = harness::write_nginx_conf(
        &dir,
        &format!("{SERVER_ADDR}:{PORT}"),
        &workload::root_of(env.tmp, w),
    )?;
    let f = fs::File::create(log)?;
    let child = Netns::exec(&env.ns.server)
        .args(["taskset", "-c", cores])
        .arg(env.exe)
        .arg("run")
        .arg("--socket")
        .arg(sock)
        .args(["--", "nginx", "-c"])
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .map_err(|e| format!("cannot start nginx through tcps run: {e}"))?;
    let mut web = Proc {
        name: "nginx",
        child,
        log: log.to_path_buf(),
    };
    let pid_file = dir.join("nginx.pid");
    harness::wait_for("nginx to start", Duration::from_secs(10), || {
        web.check_alive()?;
        Ok(pid_file.exists() && !harness::children_of(web.pid()).is_empty())
    })?;
    // The worker attaches and listens on its first accept.
    std::thread::sleep(Duration::from_millis(300));
    Ok(web)
}
