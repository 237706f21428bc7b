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
//! 5. a table: requests/s, p50, p99, CPU µs per request on each side, and
//!    the tcps / kernel ratios of each program.
//!
//! Every child is held by a guard that stops it on every path out.

mod context;
mod programs;
mod site;

pub use context::DemoArgs;
use context::{Ctx, Error, Row};

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

fn fmt_latency(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.0} µs")
    }
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:<13} {:>12} {:>10} {:>10} {:>18} {:>24}",
        "variant", "requests/s", "p50", "p99", "host CPU µs/req", "TCP server CPU µs/req"
    );
    for r in rows {
        let server = r
            .server_cpu_us
            .map(|v| format!("{v:.1}"))
            .unwrap_or_else(|| "-".to_string());
        println!(
            "{:<13} {:>12.0} {:>10} {:>10} {:>18.1} {:>24}",
            r.variant,
            r.wrk.rps,
            fmt_latency(r.wrk.p50_us),
            fmt_latency(r.wrk.p99_us),
            r.host_cpu_us,
            server
        );
    }
    let get = |v: &str| rows.iter().find(|r| r.variant == v);
    println!();
    for program in ["web", "nginx"] {
        let (Some(t), Some(k)) = (
            get(&format!("{program}/tcps")),
            get(&format!("{program}/kernel")),
        ) else {
            continue;
        };
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let total = |r: &Row| r.host_cpu_us + r.server_cpu_us.unwrap_or(0.0);
        println!(
            "{program}: tcps / kernel requests/s {:.2}, p50 {:.2}, host CPU per request {:.2}, \
             total CPU per request {:.2}",
            ratio(t.wrk.rps, k.wrk.rps),
            ratio(t.wrk.p50_us, k.wrk.p50_us),
            ratio(t.host_cpu_us, k.host_cpu_us),
            ratio(total(t), total(k)),
        );
    }
    println!(
        "(host CPU = the web server's processes, user+system; with kernel sockets it includes \
         the kernel's TCP/IP work done in its system calls. TCP server CPU = the `tcps server` \
         process; total = both. wrk runs on the same machine.)"
    );
}

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
    let mut rows = Vec::new();
    for v in VARIANTS.iter().filter(|v| v.tcps && wanted(v)) {
        rows.push(run_variant(&ctx, *v, Some(&mut server))?);
        check_interrupted()?;
    }
    server.stop(Duration::from_secs(3));
    for v in VARIANTS.iter().filter(|v| !v.tcps && wanted(v)) {
        rows.push(run_variant(&ctx, *v, None)?);
        check_interrupted()?;
    }
    print_table(&rows);
    Ok(())
}
