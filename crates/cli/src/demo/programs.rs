//! The demo's servers and their load: the example web server or the
//! unmodified nginx, through tcps or on kernel sockets, driven by wrk.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::context::{Ctx, Error, Row};
use super::site::check_response;
use crate::harness::{self, check_interrupted, cpu_us, parse_wrk, wait_for, Proc};

/// What serves the site.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Program {
    /// examples/webserver.c, through the native API or kernel sockets.
    WebServer,
    /// The unmodified nginx, under `tcps run` or plain.
    Nginx,
}

/// One row of the table: a program on a network path.
#[derive(Clone, Copy)]
pub(super) struct Variant {
    pub(super) name: &'static str,
    pub(super) program: Program,
    /// Through tcps (the TCP server must be up) or on kernel sockets.
    pub(super) tcps: bool,
}

pub(super) const VARIANTS: [Variant; 4] = [
    Variant {
        name: "web/tcps",
        program: Program::WebServer,
        tcps: true,
    },
    Variant {
        name: "nginx/tcps",
        program: Program::Nginx,
        tcps: true,
    },
    Variant {
        name: "web/kernel",
        program: Program::WebServer,
        tcps: false,
    },
    Variant {
        name: "nginx/kernel",
        program: Program::Nginx,
        tcps: false,
    },
];

/// Starts `v`'s server and waits until it serves the index correctly;
/// `server`, the TCP server, must stay alive meanwhile.
fn start(ctx: &Ctx, v: Variant, mut server: Option<&mut Proc>) -> Result<Proc, Error> {
    let log = ctx.tmp.join(format!("{}.log", v.name.replace('/', "-")));
    let mut cmd = match v.program {
        Program::WebServer => webserver_command(ctx, v)?,
        Program::Nginx => nginx_command(ctx, v)?,
    };
    let logf = fs::File::create(&log)?;
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", v.name))?;
    let mut web = Proc {
        name: v.name,
        child,
        log,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], ctx.args.port));
    wait_for(
        &format!("{} to listen", v.name),
        Duration::from_secs(10),
        || {
            web.check_alive()?;
            if let Some(s) = server.as_deref_mut() {
                s.check_alive()?;
            }
            Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
        },
    )?;
    check_response(ctx.args.port, ctx.index).map_err(|e| format!("{} misbehaves: {e}", v.name))?;
    Ok(web)
}

/// examples/webserver; through tcps in the recommended configuration
/// (`tcps bench web`'s `all`): zero-copy asynchronous sends from the
/// registered file cache, and the connections balancing hands over served
/// on kernel sockets.
fn webserver_command(ctx: &Ctx, v: Variant) -> Result<Command, Error> {
    let a = ctx.args;
    let threads = a.webserver_threads.unwrap_or(a.connections.max(4));
    let mut cmd = Command::new(ctx.webserver);
    let net = if v.tcps { "tcps" } else { "kernel" };
    cmd.args(["--net", net, "--addr", "127.0.0.1", "--port"])
        .arg(a.port.to_string())
        .arg("--root")
        .arg(ctx.tmp)
        .args(["--threads", &threads.to_string(), "--quiet"]);
    let mut how = format!("--net {net}");
    if v.tcps {
        cmd.args(["--mode", "async-registered", "--take-direct"])
            .env("TCPS_SOCKET", ctx.tmp.join("tcps.sock"));
        how.push_str(" --mode async-registered --take-direct");
    }
    eprintln!(
        "starting the web server ({how}, {threads} threads) on port {}…",
        a.port
    );
    Ok(cmd)
}

/// nginx (sendfile on), unmodified: under `tcps run` (one worker) or plain
/// (one worker per core).
fn nginx_command(ctx: &Ctx, v: Variant) -> Result<Command, Error> {
    let nginx = ctx
        .nginx
        .ok_or("nginx is not installed (apt-get install nginx-light)")?;
    let dir = ctx.tmp.join(v.name.replace('/', "-"));
    // Each side in its best configuration on the same cores: on kernel
    // sockets one worker per core (nginx's own advice); through tcps one
    // worker, the TCP server taking the other core's network work.
    let workers = if v.tcps { 1 } else { cores() };
    let listen = format!("127.0.0.1:{}", ctx.args.port);
    let conf = harness::write_nginx_conf_workers(&dir, &listen, ctx.tmp, workers)?;
    let mut cmd;
    if v.tcps {
        cmd = Command::new(ctx.exe);
        cmd.arg("run")
            .arg("--socket")
            .arg(ctx.tmp.join("tcps.sock"))
            .arg("--")
            .arg(nginx);
        eprintln!(
            "starting nginx through `tcps run` on port {}…",
            ctx.args.port
        );
    } else {
        cmd = Command::new(nginx);
        eprintln!(
            "starting nginx ({workers} workers) on port {}…",
            ctx.args.port
        );
    }
    cmd.arg("-c").arg(conf);
    Ok(cmd)
}

/// The cores this process may run on.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs wrk against the index for `--duration` seconds and waits for it;
/// returns its exit status and the file of its output.
fn run_wrk(ctx: &Ctx, name: &str) -> Result<(std::process::ExitStatus, PathBuf), Error> {
    let a = ctx.args;
    let url = format!("http://127.0.0.1:{}/index.html", a.port);
    let wrk_out = ctx.tmp.join(format!("wrk-{}.out", name.replace('/', "-")));
    let wrk_outf = fs::File::create(&wrk_out)?;
    let child = Command::new(ctx.wrk)
        .arg(format!("-t{}", a.threads_wrk.min(a.connections)))
        .arg(format!("-c{}", a.connections))
        .arg(format!("-d{}s", a.duration))
        .arg("--latency")
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(wrk_outf.try_clone()?)
        .stderr(wrk_outf)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", ctx.wrk.display()))?;
    let mut wrk_proc = Proc {
        name: "wrk",
        child,
        log: wrk_out.clone(),
    };
    // wrk stops by itself after --duration; allow generous slack for its
    // 2 s request timeout and reporting.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.duration + 30);
    let status = loop {
        if let Some(st) = wrk_proc.child.try_wait()? {
            break st;
        }
        check_interrupted()?;
        if Instant::now() > deadline {
            return Err(format!("wrk did not finish within {:?}", deadline - started).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok((status, wrk_out))
}

/// Starts `v`'s server, drives it with wrk, stops it. Host CPU is the
/// server's whole process tree (nginx: master and worker).
pub(super) fn run_variant(
    ctx: &Ctx,
    v: Variant,
    mut server: Option<&mut Proc>,
) -> Result<Row, Error> {
    let a = ctx.args;
    let mut web = start(ctx, v, server.as_deref_mut())?;
    eprintln!(
        "driving {} for {} s ({} connections)…",
        v.name, a.duration, a.connections
    );
    let server_cpu_us = |s: Option<&Proc>| s.map(|s| cpu_us(s.pid())).transpose();
    let host0 = harness::tree_cpu_us(web.pid())?;
    let server0 = server_cpu_us(server.as_deref())?;
    let (status, wrk_out) = run_wrk(ctx, v.name)?;
    let host1 = harness::tree_cpu_us(web.pid())?;
    let server1 = server_cpu_us(server.as_deref())?;
    let stdout = fs::read_to_string(&wrk_out).unwrap_or_default();
    if !status.success() {
        return Err(format!("wrk failed ({status}):\n{stdout}").into());
    }
    let wrk = parse_wrk(&stdout)?;
    web.check_alive()?;
    web.stop(Duration::from_secs(3));
    if wrk.requests == 0 {
        return Err(format!("wrk completed no request through {}:\n{stdout}", v.name).into());
    }
    for e in &wrk.errors {
        eprintln!("  wrk ({}): {e}", v.name);
    }
    let n = wrk.requests as f64;
    Ok(Row {
        variant: v.name,
        host_cpu_us: (host1 - host0) / n,
        server_cpu_us: match (server0, server1) {
            (Some(a), Some(b)) => Some((b - a) / n),
            _ => None,
        },
        wrk,
    })
}
