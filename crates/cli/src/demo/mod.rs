//! `tcps demo`: the example web server (examples/webserver.c) and the
//! unmodified nginx, each through tcps and on kernel sockets, driven by wrk,
//! side by side.
//!
//! 1. a temp dir with a few static files (a 16 KiB `index.html`, `site`);
//! 2. `tcps server --socket <tmp>/tcps.sock --poll <poll>`;
//! 3. `webserver --net tcps --mode async-registered --take-direct` (the
//!    recommended configuration: every mechanism, balancing included), then
//!    `tcps run -- nginx` (one worker, sendfile on), each driven by
//!    `wrk --latency` for --duration seconds, measuring the CPU time of the
//!    web server and of the TCP server (/proc/<pid>/stat utime+stime,
//!    before and after);
//! 4. the same two on kernel sockets (no TCP server involved);
//! 5. steps 3 and 4 again for `--rounds` rounds (3), alternating which
//!    side goes first, nginx on kernel sockets with one worker per core
//!    (each side in its best configuration on the same cores);
//! 6. a table of medians with their spread, the tcps / kernel ratios of
//!    each program, and one line saying what tcps gives and costs here.
//!
//! Every child is held by a guard that stops it on every path out.

mod context;
mod programs;
mod site;
mod table;

pub use context::DemoArgs;
use context::{Ctx, Error};

use crate::harness::{
    check_interrupted, find_webserver, install_signal_handlers, wait_for, which, Proc, TempDir,
};
use clap::ValueEnum;
use programs::{run_variant, Program, VARIANTS};
use site::make_site;
use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

pub fn run(args: DemoArgs) -> Result<(), Error> {
    install_signal_handlers();
    let wrk = which("wrk").ok_or(
        "wrk not found in PATH: install it with `apt-get install wrk` (scripts/demo.sh does that)",
    )?;
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the tcps executable: {e}"))?;
    let webserver = find_webserver(&exe)?;
    let nginx = if args.no_nginx {
        None
    } else {
        Some(which("nginx").ok_or(
            "nginx not found in PATH: install it with `apt-get install nginx-light` \
             (scripts/demo.sh does that), or leave it out with --no-nginx",
        )?)
    };
    if TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], args.port)),
        Duration::from_millis(200),
    )
    .is_ok()
    {
        return Err(format!(
            "port {} is already in use on 127.0.0.1: pick another with --port",
            args.port
        )
        .into());
    }

    let tmp = TempDir::new()?;
    let index = make_site(&tmp.0)?;
    let ctx = Ctx {
        args: &args,
        tmp: &tmp.0,
        exe: &exe,
        webserver: &webserver,
        nginx: nginx.as_deref(),
        wrk: &wrk,
        index: &index,
    };

    let poll = args
        .poll
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| "adaptive".to_string());
    let sock = tmp.0.join("tcps.sock");
    let slog = tmp.0.join("tcps-server.log");
    eprintln!("starting TCP server (tcps server --poll {poll})…");
    let mut cmd = Command::new(&exe);
    cmd.arg("server")
        .arg("--socket")
        .arg(&sock)
        .arg("--poll")
        .arg(&poll);
    if let Some(c) = &args.cpus {
        cmd.arg("--cpus").arg(c);
    }
    let slogf = fs::File::create(&slog)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(slogf.try_clone()?)
        .stderr(slogf)
        .spawn()
        .map_err(|e| format!("cannot start {} server: {e}", exe.display()))?;
    let mut server = Proc {
        name: "the TCP server",
        child,
        log: slog,
    };
    wait_for("the TCP server's socket", Duration::from_secs(10), || {
        server.check_alive()?;
        Ok(sock.exists())
    })?;

    let wanted = |v: &programs::Variant| v.program == Program::WebServer || nginx.is_some();
    let chosen: Vec<programs::Variant> = VARIANTS.iter().copied().filter(|v| wanted(v)).collect();
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        eprintln!("round {} of {}…", round + 1, args.rounds);
        // Alternating which side goes first: a drift of the machine (the
        // cores' latency flips for minutes at a time) favours neither.
        let order: Vec<programs::Variant> = if round % 2 == 0 {
            chosen.clone()
        } else {
            chosen.iter().rev().copied().collect()
        };
        for v in order {
            let srv = if v.tcps { Some(&mut server) } else { None };
            rows.push(run_variant(&ctx, v, srv)?);
            check_interrupted()?;
        }
    }
    server.stop(Duration::from_secs(3));
    let names: Vec<&'static str> = chosen.iter().map(|v| v.name).collect();
    table::print(&rows, &names, args.rounds, programs::cores());
    Ok(())
}
