//! `tcps bench ttcp` (thesis §6.3): one connection, the host transmits N
//! bytes in writes of S bytes to a receiver in another process; throughput
//! at the receiver, CPU of the host (sender) and of the TCP server, and the
//! PE index (throughput per CPU utilisation), for kernel sockets and the
//! tcps send variants.

use super::server::ServerProcess;
use clap::Args;
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Instant;
use tcps::Client;

const VARIANTS: [&str; 5] = [
    "kernel",
    "sync",
    "sync-registered",
    "async",
    "async-registered",
];

#[derive(Args, Debug)]
pub struct TtcpArgs {
    /// Bytes transmitted per run
    #[arg(long, default_value_t = 256 << 20)]
    pub bytes: usize,
    /// Write sizes in bytes
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384,65536")]
    pub sizes: Vec<usize>,
    /// Variants: kernel, sync (tcps_send, copying), sync-registered
    /// (tcps_send_registered), async (tcps_send_async, copying),
    /// async-registered (tcps_send_async_registered)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel,sync,sync-registered,async,async-registered"
    )]
    pub variants: Vec<String>,
    /// Runs per size and variant (the median throughput run is reported)
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Poll mode of the TCP server started for the benchmark
    #[arg(long, default_value = "adaptive")]
    pub poll: String,
    /// Engine of the TCP server
    #[arg(long, default_value = "uring")]
    pub engine: String,
    /// Pin the TCP server to these CPUs (`tcps server --cpus`); default: unpinned
    #[arg(long)]
    pub server_cpus: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// The receiver, run as `tcps bench ttcp-recv` in a process of its own:
/// prints its port, then for each connection reads to EOF and prints
/// "<bytes> <ns from the first byte to EOF>".
#[derive(Args, Debug)]
pub struct TtcpRecvArgs {}

pub fn recv_main(_: TtcpRecvArgs) -> Result<(), Box<dyn std::error::Error>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", l.local_addr()?.port())?;
    out.flush()?;
    let mut buf = vec![0u8; 1 << 20];
    for s in l.incoming() {
        let mut s = s?;
        let mut n = 0u64;
        let mut first = None;
        loop {
            let r = s.read(&mut buf)?;
            if r == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            n += r as u64;
        }
        let ns = first.map_or(0, |t| t.elapsed().as_nanos());
        writeln!(out, "{n} {ns}")?;
        out.flush()?;
    }
    Ok(())
}

struct Receiver {
    child: Child,
    lines: BufReader<ChildStdout>,
    addr: SocketAddr,
}

impl Receiver {
    fn start() -> Result<Receiver, Box<dyn std::error::Error>> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench", "ttcp-recv"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().ok_or("receiver stdout")?);
        let mut l = String::new();
        lines.read_line(&mut l)?;
        let port: u16 = l
            .trim()
            .parse()
            .map_err(|_| format!("receiver said {l:?}"))?;
        Ok(Receiver {
            child,
            lines,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        })
    }

    /// Bytes and nanoseconds of the connection that just ended.
    fn result(&mut self) -> Result<(u64, u64), Box<dyn std::error::Error>> {
        let mut l = String::new();
        if self.lines.read_line(&mut l)? == 0 {
            return Err("the receiver exited".into());
        }
        let mut it = l.split_whitespace().map(|v| v.parse::<u64>());
        match (it.next(), it.next()) {
            (Some(Ok(n)), Some(Ok(ns))) => Ok((n, ns)),
            _ => Err(format!("receiver said {l:?}").into()),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds of a process: the sum of its threads' run time in
/// /proc/PID/task/*/schedstat (nanoseconds), else utime + stime of
/// /proc/PID/stat (clock ticks, 10 ms: too coarse for short runs).
fn cpu_seconds(pid: u32) -> Result<f64, Box<dyn std::error::Error>> {
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        let mut ns = 0u64;
        let mut any = false;
        for t in tasks.flatten() {
            let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
                continue;
            };
            if let Some(Ok(v)) = s.split_whitespace().next().map(str::parse::<u64>) {
                ns += v;
                any = true;
            }
        }
        if any {
            return Ok(ns as f64 / 1e9);
        }
    }
    stat_cpu_seconds(pid)
}

/// utime + stime of a process, in seconds (/proc/PID/stat).
fn stat_cpu_seconds(pid: u32) -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which ends with the last ')'.
    let rest = &stat[stat.rfind(')').ok_or("bad /proc stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

#[derive(Serialize, Clone)]
struct TtcpRow {
    variant: String,
    size: usize,
    bytes: u64,
    /// At the receiver: bytes / (first byte .. EOF), 10^6 bytes per second
    mb_per_s: f64,
    /// Wall time of the run at the sender (start .. the receiver saw EOF)
    elapsed_s: f64,
    /// CPU seconds of the sending (host) process (its threads' schedstat run time)
    host_cpu_s: f64,
    /// CPU seconds of the TCP server (0 for kernel)
    server_cpu_s: f64,
    total_cpu_s: f64,
    /// total_cpu_s / elapsed_s (1.0 = one CPU busy)
    cpu_utilisation: f64,
    /// Thesis §6.3: throughput / CPU utilisation, MB/s per (CPU-second per second)
    pe_index: f64,
    /// mb_per_s / kernel's at the same size
    throughput_vs_kernel: Option<f64>,
    /// pe_index / kernel's at the same size
    pe_vs_kernel: Option<f64>,
}

#[derive(Serialize)]
struct TtcpReport {
    results: Vec<TtcpRow>,
    bytes: usize,
    runs: usize,
    poll: String,
    engine: String,
    server_cpus: Option<String>,
}

/// Transmits `total` bytes in writes of `size` with one variant.
fn transmit(
    variant: &str,
    client: &Client,
    addr: SocketAddr,
    total: usize,
    size: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let buf = vec![0x5au8; size];
    let writes = total / size;
    if variant == "kernel" {
        let mut s = TcpStream::connect(addr)?;
        for _ in 0..writes {
            s.write_all(&buf)?;
        }
        return Ok(());
    }
    let ts = client.tcp_connect(addr)?;
    let r = (|| -> Result<(), Box<dyn std::error::Error>> {
        match variant {
            "sync" => {
                for _ in 0..writes {
                    client.send_all(ts, &buf)?;
                }
            }
            "async" => {
                for _ in 0..writes {
                    let mut off = 0;
                    while off < size {
                        off += client.send_async(ts, &buf[off..], 0)?;
                    }
                }
                client.flush_async(ts, None)?;
            }
            "sync-registered" | "async-registered" => {
                let (p, mem) = client.alloc_registered(size)?;
                // SAFETY: a fresh allocation of at least `size` bytes.
                unsafe { std::ptr::write_bytes(p, 0x5a, size) };
                let r = (|| -> Result<(), Box<dyn std::error::Error>> {
                    for _ in 0..writes {
                        if variant == "async-registered" {
                            // ttcp sends one buffer over and over: it is
                            // never written, so no completion is awaited.
                            client.send_async_registered(ts, p, size, 0, mem)?;
                        } else {
                            let mut off = 0;
                            while off < size {
                                // SAFETY: inside the registration.
                                let q = unsafe { p.add(off) };
                                off += client.send_registered(ts, q, size - off, 0, mem)?;
                            }
                        }
                    }
                    client.flush_async(ts, None)?;
                    Ok(())
                })();
                let d = client.deregister_memory(mem);
                r?;
                d?;
            }
            v => return Err(format!("unknown variant {v}").into()),
        }
        Ok(())
    })();
    let c = client.close(ts);
    r?;
    c?;
    Ok(())
}

type Error = Box<dyn std::error::Error>;

/// What every transmission of a run uses: the host's attachment, the
/// receiver process, and the processes whose CPU time is read around it.
struct Setup {
    client: Client,
    recv: Receiver,
    /// This (the sending, host) process.
    me: u32,
    server_pid: u32,
}

impl Setup {
    /// One transmission of `total` bytes in writes of `size` with variant
    /// `v`, timed at the sender and the receiver, CPU read around it.
    fn one_run(&mut self, v: &str, size: usize, total: usize) -> Result<TtcpRow, Error> {
        let (me, server_pid) = (self.me, self.server_pid);
        let (h0, s0) = (cpu_seconds(me)?, cpu_seconds(server_pid)?);
        let t = Instant::now();
        transmit(v, &self.client, self.recv.addr, total, size)?;
        let (n, ns) = self.recv.result()?;
        let elapsed = t.elapsed().as_secs_f64();
        let (h1, s1) = (cpu_seconds(me)?, cpu_seconds(server_pid)?);
        if n != total as u64 {
            return Err(format!("{v} {size}: the receiver got {n} of {total} bytes").into());
        }
        let host = h1 - h0;
        let srv = if v == "kernel" { 0.0 } else { s1 - s0 };
        let mbps = n as f64 / (ns.max(1) as f64 / 1e9) / 1e6;
        let util = (host + srv) / elapsed;
        Ok(TtcpRow {
            variant: v.to_string(),
            size,
            bytes: n,
            mb_per_s: mbps,
            elapsed_s: elapsed,
            host_cpu_s: host,
            server_cpu_s: srv,
            total_cpu_s: host + srv,
            cpu_utilisation: util,
            pe_index: if util > 0.0 { mbps / util } else { f64::NAN },
            throughput_vs_kernel: None,
            pe_vs_kernel: None,
        })
    }

    /// `runs` transmissions; the one of median throughput.
    fn median_run(
        &mut self,
        v: &str,
        size: usize,
        total: usize,
        runs: usize,
    ) -> Result<TtcpRow, Error> {
        let mut rows = Vec::new();
        for _ in 0..runs {
            rows.push(self.one_run(v, size, total)?);
        }
        rows.sort_by(|x, y| x.mb_per_s.total_cmp(&y.mb_per_s));
        Ok(rows[rows.len() / 2].clone())
    }
}

/// Each row against the kernel's at the same size.
fn add_kernel_ratios(rows: &mut [TtcpRow]) {
    let kernel: Vec<(usize, f64, f64)> = rows
        .iter()
        .filter(|r| r.variant == "kernel")
        .map(|r| (r.size, r.mb_per_s, r.pe_index))
        .collect();
    for r in rows {
        if let Some(&(_, mb, pe)) = kernel.iter().find(|k| k.0 == r.size) {
            r.throughput_vs_kernel = Some(r.mb_per_s / mb);
            r.pe_vs_kernel = Some(r.pe_index / pe);
        }
    }
}

fn print_report(a: &TtcpArgs, report: &TtcpReport) -> Result<(), Error> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    println!(
        "ttcp: {} bytes per run, median of {} runs, TCP server --poll {} --engine {}{}",
        a.bytes,
        a.runs,
        a.poll,
        a.engine,
        a.server_cpus
            .as_ref()
            .map_or(String::new(), |c| format!(" --cpus {c}"))
    );
    println!(
        "{:>16} {:>6} {:>8} {:>6} {:>7} {:>7} {:>7} {:>5} {:>7} {:>6}",
        "variant", "size", "MB/s", "xkern", "host_s", "srv_s", "cpu_s", "util", "PE", "xkern"
    );
    for r in &report.results {
        println!(
            "{:>16} {:>6} {:>8.0} {:>6.2} {:>7.3} {:>7.3} {:>7.3} {:>5.2} {:>7.0} {:>6.2}",
            r.variant,
            r.size,
            r.mb_per_s,
            r.throughput_vs_kernel.unwrap_or(f64::NAN),
            r.host_cpu_s,
            r.server_cpu_s,
            r.total_cpu_s,
            r.cpu_utilisation,
            r.pe_index,
            r.pe_vs_kernel.unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

pub fn run(a: TtcpArgs) -> Result<(), Error> {
    if a.sizes.is_empty() || a.sizes.contains(&0) || a.runs == 0 {
        return Err("--sizes must be positive and --runs at least 1".into());
    }
    for v in &a.variants {
        if !VARIANTS.contains(&v.as_str()) {
            return Err(format!("unknown variant {v:?} (expected one of {VARIANTS:?})").into());
        }
    }
    let mut extra = vec!["--poll", &a.poll, "--engine", &a.engine];
    if let Some(c) = &a.server_cpus {
        extra.extend(["--cpus", c]);
    }
    let server = ServerProcess::start(&extra)?;
    let mut setup = Setup {
        server_pid: server.pid(),
        client: Client::attach(&server.socket)?,
        recv: Receiver::start()?,
        me: std::process::id(),
    };
    let mut rows: Vec<TtcpRow> = Vec::new();
    for &size in &a.sizes {
        let total = a.bytes / size * size;
        if total == 0 {
            return Err(format!("--bytes {} is less than one write of {size}", a.bytes).into());
        }
        for v in &a.variants {
            let row = setup.median_run(v, size, total, a.runs)?;
            if !a.json {
                eprintln!(
                    "{v:>16} {size:>6} B: {:.0} MB/s, host {:.3} s, server {:.3} s CPU",
                    row.mb_per_s, row.host_cpu_s, row.server_cpu_s
                );
            }
            rows.push(row);
        }
    }
    add_kernel_ratios(&mut rows);
    let report = TtcpReport {
        results: rows,
        bytes: a.bytes,
        runs: a.runs,
        poll: a.poll.clone(),
        engine: a.engine.clone(),
        server_cpus: a.server_cpus.clone(),
    };
    print_report(&a, &report)?;
    // As before the split: the receiver, then the server, then the client.
    let Setup { client, recv, .. } = setup;
    drop(recv);
    drop(server);
    drop(client);
    Ok(())
}
