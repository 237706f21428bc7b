//! `tcps demo`: the example web server (examples/webserver.c) through tcps
//! and on kernel sockets, driven by wrk, side by side.
//!
//! 1. a temp dir with a few static files (a 16 KiB `index.html`);
//! 2. `tcps server --socket <tmp>/tcps.sock --poll <poll>`;
//! 3. `webserver --net tcps --mode async-registered --take-direct` (the
//!    recommended configuration: every mechanism, balancing included),
//!    driven by `wrk --latency` for --duration seconds,
//!    measuring the CPU time of the web server and of the TCP server
//!    (/proc/<pid>/stat utime+stime, before and after);
//! 4. the same with `webserver --net kernel` (no TCP server involved);
//! 5. a table: requests/s, p50, p99, CPU µs per request on each side.
//!
//! Every child is held by a guard that stops it on every path out.

use crate::harness::{
    check_interrupted, cpu_us, find_webserver, install_signal_handlers, parse_wrk, wait_for, which,
    Proc, TempDir, WrkResult,
};
use crate::server_cmd::PollArg;
use clap::ValueEnum;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Needs wrk (apt-get install wrk) and the C examples (`make`). \
Set TCPS_EXAMPLES to the directory holding the webserver binary if it is not in \
<repo>/examples/build."
)]
pub struct DemoArgs {
    /// Seconds wrk drives each variant
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: u64,
    /// Concurrent wrk connections (keep-alive)
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub connections: u32,
    /// wrk threads
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads_wrk: u32,
    /// Port of the web server
    #[arg(long, default_value_t = 8080, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// How the TCP server's workers wait for work
    #[arg(long, value_enum, default_value = "adaptive")]
    pub poll: PollArg,
    /// Web server worker threads; each serves one connection at a time
    /// [default: --connections, at least 4]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub webserver_threads: Option<u32>,
    /// CPUs for the TCP server's workers (passed to `tcps server --cpus`)
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
}

/// Deterministic static files; returns the bytes of index.html.
fn make_site(root: &Path) -> Result<Vec<u8>, Error> {
    let mut index = String::with_capacity(16 * 1024);
    index.push_str("<!DOCTYPE html>\n<html><head><title>tcps demo</title></head><body>\n");
    let mut i = 0u32;
    while index.len() < 16 * 1024 - 64 {
        let _ = writeln!(
            index,
            "<p>line {i:05}: the host runs the application; the TCP server runs TCP/IP.</p>"
        );
        i += 1;
    }
    index.push_str("</body></html>\n");
    let mut index = index.into_bytes();
    index.resize(16 * 1024, b'\n');
    fs::write(root.join("index.html"), &index)?;
    let small: Vec<u8> = (0..1024u32).map(|i| b'a' + (i % 26) as u8).collect();
    fs::write(root.join("small.txt"), small)?;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let big: Vec<u8> = (0..1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    fs::write(root.join("big.bin"), big)?;
    Ok(index)
}

/// GET /index.html over HTTP/1.0 and compare the body with the file.
fn check_response(port: u16, expect: &[u8]) -> Result<(), Error> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: demo\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)
        .map_err(|e| format!("reading the response: {e}"))?;
    let _ = s.shutdown(Shutdown::Both);
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the response has no header/body separator")?;
    let status = resp[..split]
        .split(|&b| b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim().to_string())
        .unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") && !status.starts_with("HTTP/1.0 200") {
        return Err(format!("GET /index.html answered {status:?}").into());
    }
    if &resp[split + 4..] != expect {
        return Err(format!(
            "GET /index.html returned {} body bytes that differ from the file ({} bytes)",
            resp.len() - split - 4,
            expect.len()
        )
        .into());
    }
    Ok(())
}

/// One variant's results.
struct Row {
    variant: &'static str,
    wrk: WrkResult,
    host_cpu_us: f64,
    server_cpu_us: Option<f64>,
}

struct Ctx<'a> {
    args: &'a DemoArgs,
    tmp: &'a Path,
    webserver: &'a Path,
    wrk: &'a Path,
    index: &'a [u8],
}

/// Starts the web server (`net` = `variant`, "tcps" or "kernel") and waits
/// until it listens and serves the index correctly; `server`, the TCP
/// server, must stay alive meanwhile.
fn start_webserver(
    ctx: &Ctx,
    variant: &'static str,
    mut server: Option<&mut Proc>,
) -> Result<Proc, Error> {
    let a = ctx.args;
    let threads = a.webserver_threads.unwrap_or(a.connections.max(4));
    let log = ctx.tmp.join(format!("webserver-{variant}.log"));
    let logf = fs::File::create(&log)?;
    let mut cmd = Command::new(ctx.webserver);
    cmd.arg("--net")
        .arg(variant)
        .arg("--root")
        .arg(ctx.tmp)
        .arg("--port")
        .arg(a.port.to_string())
        .arg("--addr")
        .arg("127.0.0.1")
        .arg("--threads")
        .arg(threads.to_string())
        .arg("--quiet")
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    if variant == "tcps" {
        // The recommended configuration (`tcps bench web`'s `all`):
        // zero-copy asynchronous sends from the registered file cache, and
        // the connections balancing hands over served on kernel sockets.
        cmd.args(["--mode", "async-registered", "--take-direct"])
            .env("TCPS_SOCKET", ctx.tmp.join("tcps.sock"));
    }
    let how: Vec<String> = cmd
        .get_args()
        .skip_while(|a| *a != "--net")
        .take(2)
        .chain(cmd.get_args().skip_while(|a| *a != "--mode"))
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    eprintln!(
        "starting the web server ({}, {threads} threads) on port {}…",
        how.join(" "),
        a.port
    );
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", ctx.webserver.display()))?;
    let mut web = Proc {
        name: "the web server",
        child,
        log: log.clone(),
    };
    wait_for("the web server to listen", Duration::from_secs(10), || {
        web.check_alive()?;
        if let Some(s) = server.as_deref_mut() {
            s.check_alive()?;
        }
        Ok(fs::read_to_string(&log)
            .map(|t| t.contains("listening on"))
            .unwrap_or(false))
    })?;
    check_response(a.port, ctx.index)
        .map_err(|e| format!("the web server (--net {variant}) misbehaves: {e}"))?;
    Ok(web)
}

/// Runs wrk against the index for `--duration` seconds and waits for it;
/// returns its exit status and the file of its output.
fn run_wrk(ctx: &Ctx, variant: &str) -> Result<(std::process::ExitStatus, PathBuf), Error> {
    let a = ctx.args;
    let url = format!("http://127.0.0.1:{}/index.html", a.port);
    let wrk_out = ctx.tmp.join(format!("wrk-{variant}.out"));
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

/// Starts the web server (`net` = "tcps" or "kernel"), drives it with wrk,
/// stops it.
fn run_variant(
    ctx: &Ctx,
    variant: &'static str,
    mut server: Option<&mut Proc>,
) -> Result<Row, Error> {
    let a = ctx.args;
    let mut web = start_webserver(ctx, variant, server.as_deref_mut())?;
    eprintln!(
        "driving the web server through {} for {} s ({} connections)…",
        if variant == "tcps" {
            "tcps"
        } else {
            "kernel sockets"
        },
        a.duration,
        a.connections
    );
    let server_cpu_us = |s: Option<&Proc>| s.map(|s| cpu_us(s.pid())).transpose();
    let host0 = cpu_us(web.pid())?;
    let server0 = server_cpu_us(server.as_deref())?;
    let (status, wrk_out) = run_wrk(ctx, variant)?;
    let host1 = cpu_us(web.pid())?;
    let server1 = server_cpu_us(server.as_deref())?;
    let stdout = fs::read_to_string(&wrk_out).unwrap_or_default();
    if !status.success() {
        return Err(format!("wrk failed ({status}):\n{stdout}").into());
    }
    let wrk = parse_wrk(&stdout)?;
    web.check_alive()?;
    web.stop(Duration::from_secs(3));
    if wrk.requests == 0 {
        return Err(format!("wrk completed no request through {variant}:\n{stdout}").into());
    }
    for e in &wrk.errors {
        eprintln!("  wrk ({variant}): {e}");
    }
    let n = wrk.requests as f64;
    Ok(Row {
        variant,
        host_cpu_us: (host1 - host0) / n,
        server_cpu_us: match (server0, server1) {
            (Some(a), Some(b)) => Some((b - a) / n),
            _ => None,
        },
        wrk,
    })
}

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
        "{:<8} {:>12} {:>10} {:>10} {:>18} {:>24}",
        "variant", "requests/s", "p50", "p99", "host CPU µs/req", "TCP server CPU µs/req"
    );
    for r in rows {
        let server = r
            .server_cpu_us
            .map(|v| format!("{v:.1}"))
            .unwrap_or_else(|| "-".to_string());
        println!(
            "{:<8} {:>12.0} {:>10} {:>10} {:>18.1} {:>24}",
            r.variant,
            r.wrk.rps,
            fmt_latency(r.wrk.p50_us),
            fmt_latency(r.wrk.p99_us),
            r.host_cpu_us,
            server
        );
    }
    let get = |v: &str| rows.iter().find(|r| r.variant == v);
    if let (Some(t), Some(k)) = (get("tcps"), get("kernel")) {
        if k.wrk.rps > 0.0 {
            println!();
            println!(
                "tcps / kernel requests/s: {:.2}   host CPU per request, tcps / kernel: {:.2}",
                t.wrk.rps / k.wrk.rps,
                if k.host_cpu_us > 0.0 {
                    t.host_cpu_us / k.host_cpu_us
                } else {
                    f64::NAN
                }
            );
        }
    }
    println!(
        "(host CPU = the web server process, user+system; with kernel sockets it includes \
         the kernel's TCP/IP work done in its system calls. TCP server CPU = the `tcps server` \
         process. wrk runs on the same machine.)"
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
        webserver: &webserver,
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

    let mut rows = Vec::new();
    rows.push(run_variant(&ctx, "tcps", Some(&mut server))?);
    server.stop(Duration::from_secs(3));
    check_interrupted()?;
    rows.push(run_variant(&ctx, "kernel", None)?);
    print_table(&rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_is_deterministic() {
        let t = TempDir::new().unwrap();
        let a = make_site(&t.0).unwrap();
        let b = make_site(&t.0).unwrap();
        assert_eq!(a.len(), 16 * 1024);
        assert_eq!(a, b);
    }
}
