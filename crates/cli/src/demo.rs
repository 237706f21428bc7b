//! `tcps demo`: the example web server (examples/webserver.c) through tcps
//! and on kernel sockets, driven by wrk, side by side.
//!
//! 1. a temp dir with a few static files (a 16 KiB `index.html`);
//! 2. `tcps server --socket <tmp>/tcps.sock --poll <poll>`;
//! 3. `webserver --net tcps`, driven by `wrk --latency` for --duration seconds,
//!    measuring the CPU time of the web server and of the TCP server
//!    (/proc/<pid>/stat utime+stime, before and after);
//! 4. the same with `webserver --net kernel` (no TCP server involved);
//! 5. a table: requests/s, p50, p99, CPU µs per request on each side.
//!
//! Every child is held by a guard that stops it on every path out.

use crate::server_cmd::PollArg;
use clap::ValueEnum;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Set by SIGINT/SIGTERM: the demo stops at the next step and cleans up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub(crate) extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub(crate) fn check_interrupted() -> Result<(), Error> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

/// A child process that is stopped (SIGTERM, then SIGKILL) and reaped when
/// dropped.
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the end of its log if the process has exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), Error> {
        if let Some(status) = self.child.try_wait()? {
            return Err(format!(
                "{} exited ({status}); the end of its log:\n{}",
                self.name,
                log_tail(&self.log)
            )
            .into());
        }
        Ok(())
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Idempotent.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// The demo's temp dir, removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<Self, Error> {
        let base = std::env::temp_dir();
        for i in 0..100u32 {
            let p = base.join(format!("tcps-demo-{}-{i}", std::process::id()));
            match fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("cannot create {}: {e}", p.display()).into()),
            }
        }
        Err(format!("cannot create a temp dir in {}", base.display()).into())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(15);
    let tail = lines[start..].join("\n");
    if tail.is_empty() {
        "(empty)".to_string()
    } else {
        tail
    }
}

/// Finds `name` in $PATH.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// `$TCPS_EXAMPLES/webserver`, else `<exe_dir>/../../examples/build/webserver`.
pub(crate) fn find_webserver(exe: &Path) -> Result<PathBuf, Error> {
    let candidate = match std::env::var_os("TCPS_EXAMPLES") {
        Some(dir) => PathBuf::from(dir).join("webserver"),
        None => {
            let dir = exe
                .parent()
                .ok_or("cannot locate the tcps executable's directory")?;
            dir.join("../../examples/build/webserver")
        }
    };
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(format!(
            "web server not found at {} — build it with `make` in the repository \
             (or set TCPS_EXAMPLES to the directory that holds it)",
            candidate.display()
        )
        .into())
    }
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

/// CPU time (user + system) of a process so far, in µs.
pub(crate) fn cpu_us(pid: u32) -> Result<f64, Error> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| format!("unexpected format of {path}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': field 3 (state) is fields[0]; utime is field 14, stime 15.
    let get = |n: usize| -> Result<u64, Error> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("unexpected format of {path} (field {n})").into())
    };
    let ticks = get(14)? + get(15)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return Err("sysconf(_SC_CLK_TCK) failed".into());
    }
    Ok(ticks as f64 * 1e6 / hz as f64)
}

pub(crate) fn wait_for<F: FnMut() -> Result<bool, Error>>(
    what: &str,
    timeout: Duration,
    mut ready: F,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        check_interrupted()?;
        if ready()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// What wrk reported.
#[derive(Debug, Default, Clone)]
pub(crate) struct WrkResult {
    pub(crate) requests: u64,
    pub(crate) rps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) errors: Vec<String>,
}

/// "559.00us", "1.18ms", "2.01s", "1.50m" → µs.
fn parse_latency(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600e6)
    } else {
        return None;
    };
    num.trim().parse::<f64>().ok().map(|v| v * mult)
}

pub(crate) fn parse_wrk(out: &str) -> Result<WrkResult, Error> {
    let mut r = WrkResult::default();
    let (mut rps, mut p50, mut p99, mut reqs) = (None, None, None, None);
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            rps = v.trim().parse::<f64>().ok();
        } else if let Some(v) = t.strip_prefix("50%") {
            p50 = parse_latency(v);
        } else if let Some(v) = t.strip_prefix("99%") {
            p99 = parse_latency(v);
        } else if t.contains(" requests in ") {
            reqs = t
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
        } else if t.starts_with("Socket errors:") || t.starts_with("Non-2xx or 3xx responses:") {
            r.errors.push(t.to_string());
        }
    }
    let missing = |what: &str| format!("could not find {what} in wrk's output:\n{out}");
    r.rps = rps.ok_or_else(|| missing("Requests/sec"))?;
    r.p50_us = p50.ok_or_else(|| missing("the 50% latency"))?;
    r.p99_us = p99.ok_or_else(|| missing("the 99% latency"))?;
    r.requests = reqs.ok_or_else(|| missing("the request count"))?;
    Ok(r)
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
        cmd.env("TCPS_SOCKET", ctx.tmp.join("tcps.sock"));
    }
    eprintln!(
        "starting the web server (--net {variant}, {threads} threads) on port {}…",
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
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
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

    const WRK_OUT: &str = "Running 3s test @ http://127.0.0.1:18090/index.html
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   572.13us  180.00us   5.10ms   80.00%
    Req/Sec     3.49k   200.00     3.80k    70.00%
  Latency Distribution
     50%  559.00us
     75%  600.00us
     90%  700.00us
     99%    1.18ms
  21505 requests in 3.10s, 338.37MB read
  Socket errors: connect 0, read 0, write 0, timeout 4
Requests/sec:   6937.30
Transfer/sec:    109.15MB
";

    #[test]
    fn parses_wrk_output() {
        let r = parse_wrk(WRK_OUT).unwrap();
        assert_eq!(r.requests, 21505);
        assert!((r.rps - 6937.30).abs() < 1e-6);
        assert!((r.p50_us - 559.0).abs() < 1e-6);
        assert!((r.p99_us - 1180.0).abs() < 1e-6);
        assert_eq!(r.errors.len(), 1);
        assert!(parse_wrk("garbage").is_err());
    }

    #[test]
    fn latency_units() {
        assert_eq!(parse_latency("62.00us"), Some(62.0));
        assert_eq!(parse_latency("2.00s"), Some(2e6));
        assert_eq!(parse_latency("1.50m"), Some(90e6));
        assert_eq!(parse_latency("x"), None);
    }

    #[test]
    fn own_cpu_time() {
        assert!(cpu_us(std::process::id()).unwrap() >= 0.0);
    }

    #[test]
    fn site_is_deterministic() {
        let t = TempDir::new().unwrap();
        let a = make_site(&t.0).unwrap();
        let b = make_site(&t.0).unwrap();
        assert_eq!(a.len(), 16 * 1024);
        assert_eq!(a, b);
    }
}
