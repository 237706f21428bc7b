//! `tcps bench pingpong`: send/recv round trips between two tcps sockets
//! in one host thread, with the host library's counters around them, and
//! the same exchange on two kernel sockets in the same thread right before,
//! side by side (p50, p99 and the tcps/kernel ratios). `--repeat N` runs
//! N such pairs (kernel, then tcps, alternating) and reports each and the
//! medians of the ratios: timing on a shared machine is noisy.

use clap::Args;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Instant;
use tcps::Client;

#[derive(Args, Debug)]
pub struct PingpongArgs {
    /// Round trips (each is 2 sends and 2 recvs)
    #[arg(long, default_value_t = 100_000)]
    pub count: usize,
    /// Message size in bytes
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Control socket of a running server [default: $TCPS_SOCKET or the default path]
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// Skip the kernel-socket run
    #[arg(long)]
    pub no_kernel: bool,
    /// Runs (each: kernel, then tcps); the medians of the ratios are reported
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
}

/// Per round trip nanoseconds: mean, p50, p99.
#[derive(Serialize, Clone, Copy, Default)]
struct Latency {
    mean_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
}

impl Latency {
    /// From per-round-trip samples (sorted here) and the whole run's time.
    fn of(mut v: Vec<u64>, total_ns: u128) -> Latency {
        v.sort_unstable();
        let at = |q: usize| v.get((v.len() * q / 100).min(v.len().saturating_sub(1)));
        Latency {
            mean_ns: (total_ns / v.len().max(1) as u128) as u64,
            p50_ns: at(50).copied().unwrap_or(0),
            p99_ns: at(99).copied().unwrap_or(0),
        }
    }
}

/// Times `count` round trips of `one` (after a tenth as many untimed,
/// then `warm`).
fn time_round_trips(
    count: usize,
    mut one: impl FnMut() -> std::io::Result<()>,
    warm: impl FnOnce(),
) -> std::io::Result<Latency> {
    for _ in 0..count / 10 {
        one()?;
    }
    warm();
    let mut v = Vec::with_capacity(count);
    let t = Instant::now();
    for _ in 0..count {
        let s = Instant::now();
        one()?;
        v.push(s.elapsed().as_nanos() as u64);
    }
    Ok(Latency::of(v, t.elapsed().as_nanos()))
}

/// The same exchange on two connected kernel sockets in this thread.
fn kernel_pingpong(count: usize, size: usize) -> std::io::Result<Latency> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut left = TcpStream::connect(l.local_addr()?)?;
    let (mut right, _) = l.accept()?;
    left.set_nodelay(true)?;
    right.set_nodelay(true)?;
    let msg: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut buf = vec![0u8; size];
    time_round_trips(
        count,
        || {
            left.write_all(&msg)?;
            right.read_exact(&mut buf)?;
            right.write_all(&buf)?;
            left.read_exact(&mut buf)
        },
        || {},
    )
}

#[derive(Serialize, Clone)]
struct PingpongReport {
    round_trips: usize,
    size: usize,
    socket_calls: u64,
    ns_per_round_trip: u64,
    tcps: Latency,
    /// The same on kernel sockets (absent with --no-kernel), and the
    /// tcps/kernel ratios of p50 and p99.
    kernel: Option<Latency>,
    p50_ratio: Option<f64>,
    p99_ratio: Option<f64>,
    /// Times the host rang the server's doorbell (an eventfd write: a system call).
    doorbells: u64,
    /// Times a host thread slept on a futex (a system call).
    sleeps: u64,
    /// Channel exchanges completed while spinning (no system call).
    spins_satisfied: u64,
    /// Host bytes copied per network byte (copying API: about 1).
    copies_per_network_byte: f64,
}

/// `--repeat`: every run, and the medians of their ratios.
#[derive(Serialize)]
struct Repeated {
    runs: Vec<PingpongReport>,
    p50_ratio_median: Option<f64>,
    p99_ratio_median: Option<f64>,
}

/// The median of the present values (None if there are none).
fn median(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut v: Vec<f64> = v.flatten().collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Two connected tcps sockets (TCP_NODELAY) and their listener.
fn tcps_pair(client: &Client) -> Result<(u32, u32, u32), Box<dyn std::error::Error>> {
    let listener = client.tcp_listen("127.0.0.1:0".parse()?, 16)?;
    let addr = client.getsockname(listener)?;
    let left = client.tcp_connect(addr)?;
    let (right, _) = client.accept(listener, 0)?;
    for s in [left, right] {
        client.setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    }
    Ok((listener, left, right))
}

/// One run: the kernel's exchange (unless `--no-kernel`), then tcps'.
fn one_run(
    a: &PingpongArgs,
    client: &Client,
    left: u32,
    right: u32,
) -> Result<PingpongReport, Box<dyn std::error::Error>> {
    let msg: Vec<u8> = (0..a.size).map(|i| i as u8).collect();
    let mut buf = vec![0u8; a.size];
    let recv_exact = |s: u32, buf: &mut [u8]| -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let n = client.recv(s, &mut buf[got..], 0)?;
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ECONNRESET));
            }
            got += n;
        }
        Ok(())
    };
    let kernel = if a.no_kernel {
        None
    } else {
        Some(kernel_pingpong(a.count, a.size)?)
    };
    let mut before = client.stats();
    let tcps = time_round_trips(
        a.count,
        || {
            client.send_all(left, &msg)?;
            recv_exact(right, &mut buf)?;
            client.send_all(right, &buf)?;
            recv_exact(left, &mut buf)
        },
        || before = client.stats(),
    )?;
    let after = client.stats();
    if buf != msg {
        return Err("pingpong payload corrupted".into());
    }
    Ok(PingpongReport {
        round_trips: a.count,
        size: a.size,
        socket_calls: after.calls - before.calls,
        ns_per_round_trip: tcps.mean_ns,
        tcps,
        kernel,
        p50_ratio: kernel.map(|k| tcps.p50_ns as f64 / k.p50_ns.max(1) as f64),
        p99_ratio: kernel.map(|k| tcps.p99_ns as f64 / k.p99_ns.max(1) as f64),
        doorbells: after.doorbells - before.doorbells,
        sleeps: after.sleeps - before.sleeps,
        spins_satisfied: after.spins_satisfied - before.spins_satisfied,
        copies_per_network_byte: (after.bytes_copied - before.bytes_copied) as f64
            / ((after.bytes_sent - before.bytes_sent)
                + (after.bytes_received - before.bytes_received))
                .max(1) as f64,
    })
}

fn print_run(r: &PingpongReport) {
    println!(
        "{} round trips of {} B: {} socket calls, {} ns per round trip; doorbells {}, futex sleeps {}",
        r.round_trips, r.size, r.socket_calls, r.ns_per_round_trip, r.doorbells, r.sleeps
    );
    let us = |ns: u64| ns as f64 / 1000.0;
    println!(
        "tcps:   p50 {:.1} µs, p99 {:.1} µs",
        us(r.tcps.p50_ns),
        us(r.tcps.p99_ns)
    );
    if let (Some(k), Some(r50), Some(r99)) = (r.kernel, r.p50_ratio, r.p99_ratio) {
        println!(
            "kernel: p50 {:.1} µs, p99 {:.1} µs, mean {:.1} µs (same thread, just before)",
            us(k.p50_ns),
            us(k.p99_ns),
            us(k.mean_ns)
        );
        println!("tcps/kernel: p50 {r50:.2}x, p99 {r99:.2}x");
    }
}

pub fn run(a: PingpongArgs) -> Result<(), Box<dyn std::error::Error>> {
    let client = match &a.socket {
        Some(p) => Client::attach(p)?,
        None => Client::attach_default()?,
    };
    let (listener, left, right) = tcps_pair(&client)?;
    let mut runs = Vec::new();
    for _ in 0..a.repeat.max(1) {
        runs.push(one_run(&a, &client, left, right)?);
    }
    for s in [left, right, listener] {
        client.close(s)?;
    }
    let p50 = median(runs.iter().map(|r| r.p50_ratio));
    let p99 = median(runs.iter().map(|r| r.p99_ratio));
    if a.json {
        if runs.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&runs[0])?);
        } else {
            let r = Repeated {
                runs,
                p50_ratio_median: p50,
                p99_ratio_median: p99,
            };
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
        return Ok(());
    }
    for r in &runs {
        print_run(r);
    }
    if let (true, Some(p50), Some(p99)) = (runs.len() > 1, p50, p99) {
        println!(
            "median of {} runs, tcps/kernel: p50 {p50:.2}x, p99 {p99:.2}x",
            runs.len()
        );
    }
    Ok(())
}
