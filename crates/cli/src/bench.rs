//! `tcps bench`: measurements that print medians and ratios against the
//! kernel-socket baseline taken side by side in the same run.

use clap::{Args, Subcommand};
use serde::Serialize;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps::Client;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Cost of one send call as the application sees it (thesis Table 6.2):
    /// kernel send(2) vs tcps_send on a connected TCP socket whose reader keeps up.
    CallCost(CallCostArgs),
    /// Send/recv round trips between two tcps sockets connected to each
    /// other, in one host thread: the host's steady-state system calls per
    /// socket call (run it under `strace -c -f`; see scripts/syscall-count.sh).
    Pingpong(PingpongArgs),
    /// The web-server experiments of thesis §6.4: every workload and variant,
    /// stepped offered load, CPU split, ratios to Regular; results.json,
    /// summary.md and plots in --out (see docs/BENCHMARKS.md).
    Web(crate::bench_web::WebArgs),
    /// ttcp (thesis §6.3): one connection, the host transmits N bytes in
    /// writes of S to a receiver in another process; throughput at the
    /// receiver, CPU of host and TCP server, PE index, for kernel / sync /
    /// sync-registered / async / async-registered.
    Ttcp(crate::bench_ttcp::TtcpArgs),
    /// The receiver of `ttcp` (run by it in a process of its own).
    #[command(hide = true)]
    TtcpRecv(crate::bench_ttcp::TtcpRecvArgs),
}

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
}

#[derive(Args, Debug)]
pub struct CallCostArgs {
    /// Message sizes in bytes
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,4096,16384")]
    pub sizes: Vec<usize>,
    /// Calls measured per size and variant (the median is reported)
    #[arg(long, default_value_t = 20000)]
    pub iters: usize,
    /// Poll mode of the TCP server started for the benchmark
    #[arg(long, default_value = "busy")]
    pub poll: String,
    /// Engine of the TCP server
    #[arg(long, default_value = "uring")]
    pub engine: String,
    /// CPU for the TCP server; the benchmark (host) pins itself to another one
    #[arg(long, default_value_t = 1)]
    pub server_cpu: usize,
    /// Use an already running server at this control socket instead of starting one
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Asynchronous calls per timed burst (at most the per-socket pipeline, 64)
    #[arg(long, default_value_t = 32)]
    pub burst: usize,
    /// Print JSON: {"results":[{"size":..,"kernel_ns":..,"sync_ns":..,"async_ns":..,"async_registered_ns":..},..]}
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        BenchCommand::CallCost(a) => call_cost(a),
        BenchCommand::Pingpong(a) => pingpong(a),
        BenchCommand::Web(a) => crate::bench_web::run(a),
        BenchCommand::Ttcp(a) => crate::bench_ttcp::run(a),
        BenchCommand::TtcpRecv(a) => crate::bench_ttcp::recv_main(a),
    }
}

#[derive(Serialize)]
struct CallCostRow {
    size: usize,
    kernel_ns: u64,
    sync_ns: u64,
    /// sync_ns / kernel_ns
    sync_ratio: f64,
    /// `send_async` (copying): median per-call cost over bursts of `burst` calls
    async_ns: f64,
    /// async_ns / kernel_ns
    async_ratio: f64,
    /// `send_async_registered` (no copy): median per-call cost over bursts
    async_registered_ns: f64,
    /// async_registered_ns / kernel_ns
    async_registered_ratio: f64,
}

#[derive(Serialize)]
struct CallCostReport {
    results: Vec<CallCostRow>,
    /// One channel round trip with no socket work (a `Nop` call).
    nop_ns: u64,
    /// The floor under `nop_ns`: two threads on the host's and the server's
    /// CPUs bouncing a cache line (this VM's core-to-core round trip, which
    /// varies from run to run with where the vCPUs are placed).
    core_to_core_rtt_ns: u64,
    iters: usize,
    /// Asynchronous calls per timed burst.
    burst: usize,
    poll: String,
    engine: String,
}

/// A TCP server started for a benchmark; killed on drop.
pub struct ServerProcess {
    child: Child,
    pub socket: PathBuf,
    dir: PathBuf,
}

impl ServerProcess {
    pub fn start(extra: &[&str]) -> Result<ServerProcess, Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("tcps-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("tcps.sock");
        let child = Command::new(std::env::current_exe()?)
            .arg("server")
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err("TCP server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(ServerProcess { child, socket, dir })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // SAFETY: sending SIGTERM to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A kernel-socket receiver that drains every connection as fast as it can
/// and counts the bytes it read, so the sender can wait until it caught up.
fn spawn_drain(read: Arc<AtomicU64>) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let read = read.clone();
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    read.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    Ok(addr)
}

/// Times `iters` calls of `send` (each sending `size` bytes) in bursts of at
/// most 1 MiB, waiting untimed after each burst until the reader has drained
/// everything: the reader keeps up, so no timed call finds the socket
/// buffers full (the thesis measured against a remote receiver).
fn send_cost_ns(iters: usize, size: usize, read: &AtomicU64, mut send: impl FnMut()) -> u64 {
    let burst = (MAX_BURST_BYTES / size.max(1)).clamp(1, 256);
    let mut sent = read.load(Ordering::Relaxed);
    let mut samples = Vec::with_capacity(iters);
    let warmup = iters / 10 + 10;
    let mut done = 0;
    while done < iters + warmup {
        for _ in 0..burst.min(iters + warmup - done) {
            let t = Instant::now();
            send();
            let ns = t.elapsed().as_nanos() as u64;
            if done >= warmup {
                samples.push(ns);
            }
            done += 1;
            sent += size as u64;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while read.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// The cost of one asynchronous call, timed as the thesis did: a burst of
/// `burst` calls between two clock reads, divided by `burst`; the median
/// over `iters / burst` bursts (at least 200). After each burst, untimed,
/// `settle` waits until every call finished and the reader drained them.
fn async_cost_ns(
    iters: usize,
    burst: usize,
    mut send: impl FnMut(),
    mut settle: impl FnMut(usize),
) -> f64 {
    let bursts = (iters / burst).max(200);
    let warmup = bursts / 10 + 5;
    let mut samples = Vec::with_capacity(bursts);
    for i in 0..bursts + warmup {
        let t = Instant::now();
        for _ in 0..burst {
            send();
        }
        let ns = t.elapsed().as_nanos() as f64 / burst as f64;
        settle(burst);
        if i >= warmup {
            samples.push(ns);
        }
    }
    samples.sort_unstable_by(f64::total_cmp);
    samples[samples.len() / 2]
}

const MAX_BURST_BYTES: usize = 1 << 20;
/// Socket buffers of the benchmark connections: a whole burst fits.
const BENCH_SOCKET_BUFFER: i32 = 4 << 20;

/// Median round trip of a cache line between this thread and a thread
/// pinned to `cpu`: the hardware floor of any shared-memory channel.
fn core_to_core_rtt_ns(cpu: usize, iters: usize) -> u64 {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let ping = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let pong = ping.clone();
    const STOP: u64 = u64::MAX;
    let t = std::thread::spawn(move || {
        // SAFETY: cpu_set_t is plain data; the call only affects this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let mut last = 0;
        while last != STOP {
            let v = pong.0 .0.load(Ordering::Acquire);
            if v != last {
                last = v;
                pong.1 .0.store(v, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut i = 0u64;
    let ns = median_ns(iters, || {
        i += 1;
        ping.0 .0.store(i, Ordering::Release);
        while ping.1 .0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
    });
    ping.0 .0.store(STOP, Ordering::Release);
    let _ = t.join();
    ns
}

fn pin_self_away_from(cpu: usize) {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if n < 2 {
        return;
    }
    let mine = if cpu == 0 { 1 } else { 0 };
    // SAFETY: cpu_set_t is plain data; the call only affects this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(mine, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Median nanoseconds of `iters` calls of `f` (after a warm-up).
fn median_ns(iters: usize, mut f: impl FnMut()) -> u64 {
    for _ in 0..iters / 10 + 10 {
        f();
    }
    let mut v: Vec<u64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Sets a socket buffer to BENCH_SOCKET_BUFFER, past net.core.[rw]mem_max
/// when allowed (`*BUFFORCE` needs CAP_NET_ADMIN), else as far as allowed.
fn force_buffers(fd: i32, force_opt: i32) {
    let plain = if force_opt == libc::SO_SNDBUFFORCE {
        libc::SO_SNDBUF
    } else {
        libc::SO_RCVBUF
    };
    let v: libc::c_int = BENCH_SOCKET_BUFFER;
    // SAFETY: setting an int option from a valid local on our own socket.
    unsafe {
        if libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            force_opt,
            &v as *const _ as *const libc::c_void,
            4,
        ) != 0
        {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                plain,
                &v as *const _ as *const libc::c_void,
                4,
            );
        }
    }
}

fn call_cost(a: CallCostArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.sizes.is_empty() || a.iters == 0 {
        return Err("--sizes and --iters must be non-empty / positive".into());
    }
    if a.burst == 0 || a.burst > 64 {
        return Err("--burst must be 1..=64 (the per-socket pipeline)".into());
    }
    // The drain threads start before this thread pins itself, so they may
    // run on any CPU.
    let read = Arc::new(AtomicU64::new(0));
    let drain = spawn_drain(read.clone())?;
    pin_self_away_from(a.server_cpu);
    // Before the server starts spinning on its CPU.
    let core_to_core_rtt_ns = core_to_core_rtt_ns(a.server_cpu, a.iters);
    let server = match &a.socket {
        Some(_) => None,
        None => Some(ServerProcess::start(&[
            "--poll",
            &a.poll,
            "--engine",
            &a.engine,
            "--cpus",
            &a.server_cpu.to_string(),
        ])?),
    };
    let socket = a
        .socket
        .clone()
        .or(server.as_ref().map(|s| s.socket.clone()))
        .ok_or("no server")?;
    let client = Client::attach(&socket)?;
    let kernel = TcpStream::connect(drain)?;
    kernel.set_nodelay(true)?;
    force_buffers(kernel.as_raw_fd(), libc::SO_SNDBUFFORCE);
    let ts = client.tcp_connect(drain)?;
    client.setsockopt_int(ts, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    // Without CAP_NET_ADMIN the server refuses the FORCE variant (EPERM):
    // fall back to the capped SO_SNDBUF, as a kernel socket would.
    if client
        .setsockopt_int(
            ts,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            BENCH_SOCKET_BUFFER,
        )
        .is_err()
    {
        client.setsockopt_int(ts, libc::SOL_SOCKET, libc::SO_SNDBUF, BENCH_SOCKET_BUFFER)?;
    }

    let nop_ns = median_ns(a.iters, || {
        let _ = client.nop();
    });
    // Untimed: one pass of copying asynchronous sends over the library's
    // staging pool (16 MiB by default, TCPS_ASYNC_POOL_KIB), so the timed
    // calls do not pay its first-touch page faults (about 1.3 µs per 64 B
    // call until the pool has been used once).
    {
        let pool_bytes = std::env::var("TCPS_ASYNC_POOL_KIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(16 * 1024)
            * 1024;
        let chunk = vec![0x5au8; 64 * 1024];
        let target = read.load(Ordering::Relaxed) + (2 * pool_bytes) as u64;
        let mut sent = 0;
        while sent < 2 * pool_bytes {
            sent += client.send_async(ts, &chunk, 0)?;
        }
        client.flush_async(ts, Some(Duration::from_secs(30)))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while read.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let mut rows = Vec::new();
    for &size in &a.sizes {
        let buf = vec![0x5au8; size];
        let kfd = kernel.as_raw_fd();
        let kernel_ns = send_cost_ns(a.iters, size, &read, || {
            // SAFETY: sending from a valid buffer on our own socket.
            unsafe {
                libc::send(
                    kfd,
                    buf.as_ptr() as *const libc::c_void,
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
        });
        let sync_ns = send_cost_ns(a.iters, size, &read, || {
            let _ = client.send(ts, &buf, 0);
        });
        // Untimed, after each burst: every send finished at the server
        // and the reader drained it, so the next burst starts from empty
        // queues and socket buffers.
        let mut sent = read.load(Ordering::Relaxed);
        let mut settle = |n: usize| {
            sent += (n * size) as u64;
            if let Err(e) = client.flush_async(ts, Some(Duration::from_secs(10))) {
                eprintln!("call-cost: flush_async: {e}");
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while read.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(20));
            }
        };
        let mut failed = None;
        let async_ns = async_cost_ns(
            a.iters,
            a.burst,
            || {
                if let Err(e) = client.send_async(ts, &buf, 0) {
                    failed.get_or_insert(e);
                }
            },
            &mut settle,
        );
        if let Some(e) = failed.take() {
            return Err(format!("send_async ({size} B): {e}").into());
        }
        let (rbuf, mem) = client.alloc_registered(size)?;
        // SAFETY: rbuf is a fresh allocation of at least `size` bytes.
        unsafe { std::ptr::write_bytes(rbuf, 0x5a, size) };
        let async_registered_ns = async_cost_ns(
            a.iters,
            a.burst,
            || {
                // The buffer is never written while in flight, so the io
                // handle is not needed.
                if let Err(e) = client.send_async_registered(ts, rbuf, size, 0, mem) {
                    failed.get_or_insert(e);
                }
            },
            &mut settle,
        );
        if let Some(e) = failed.take() {
            return Err(format!("send_async_registered ({size} B): {e}").into());
        }
        client.flush_async(ts, Some(Duration::from_secs(10)))?;
        client.deregister_memory(mem)?;
        let k = kernel_ns.max(1) as f64;
        if !a.json {
            eprintln!(
                "size {size:>6} B: kernel {kernel_ns} ns, tcps sync {sync_ns} ns, \
                 async {async_ns:.1} ns, async registered {async_registered_ns:.1} ns"
            );
        }
        rows.push(CallCostRow {
            size,
            kernel_ns,
            sync_ns,
            sync_ratio: sync_ns as f64 / k,
            async_ns,
            async_ratio: async_ns / k,
            async_registered_ns,
            async_registered_ratio: async_registered_ns / k,
        });
    }
    let _ = client.close(ts);
    let report = CallCostReport {
        results: rows,
        nop_ns,
        core_to_core_rtt_ns,
        iters: a.iters,
        burst: a.burst,
        poll: a.poll.clone(),
        engine: a.engine.clone(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "cost of one send call (median of {} calls), TCP server --poll {} --engine {}",
            a.iters, a.poll, a.engine
        );
        println!(
            "channel round trip (nop): {} ns; core-to-core cache-line round trip: {} ns",
            report.nop_ns, report.core_to_core_rtt_ns
        );
        println!(
            "async: median over bursts of {} calls of (burst time / {})",
            a.burst, a.burst
        );
        println!(
            "{:>8} {:>10} {:>8} {:>6} {:>9} {:>6} {:>9} {:>7}",
            "size", "kernel_ns", "sync_ns", "ratio", "async_ns", "ratio", "areg_ns", "ratio"
        );
        for r in &report.results {
            println!(
                "{:>8} {:>10} {:>8} {:>6.2} {:>9.1} {:>6.3} {:>9.1} {:>7.3}",
                r.size,
                r.kernel_ns,
                r.sync_ns,
                r.sync_ratio,
                r.async_ns,
                r.async_ratio,
                r.async_registered_ns,
                r.async_registered_ratio
            );
        }
    }
    drop(server);
    Ok(())
}

#[derive(Serialize)]
struct PingpongReport {
    round_trips: usize,
    size: usize,
    socket_calls: u64,
    ns_per_round_trip: u64,
    /// Times the host rang the server's doorbell (an eventfd write: a system call).
    doorbells: u64,
    /// Times a host thread slept on a futex (a system call).
    sleeps: u64,
    /// Channel exchanges completed while spinning (no system call).
    spins_satisfied: u64,
    /// Host bytes copied per network byte (copying API: about 1).
    copies_per_network_byte: f64,
}

fn pingpong(a: PingpongArgs) -> Result<(), Box<dyn std::error::Error>> {
    let client = match &a.socket {
        Some(p) => Client::attach(p)?,
        None => Client::attach_default()?,
    };
    let listener = client.tcp_listen("127.0.0.1:0".parse()?, 16)?;
    let addr = client.getsockname(listener)?;
    let left = client.tcp_connect(addr)?;
    let (right, _) = client.accept(listener, 0)?;
    for s in [left, right] {
        client.setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    }
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
    let before = client.stats();
    let t = Instant::now();
    for _ in 0..a.count {
        client.send_all(left, &msg)?;
        recv_exact(right, &mut buf)?;
        client.send_all(right, &buf)?;
        recv_exact(left, &mut buf)?;
    }
    let elapsed = t.elapsed();
    let after = client.stats();
    if buf != msg {
        return Err("pingpong payload corrupted".into());
    }
    for s in [left, right, listener] {
        client.close(s)?;
    }
    let r = PingpongReport {
        round_trips: a.count,
        size: a.size,
        socket_calls: after.calls - before.calls,
        ns_per_round_trip: (elapsed.as_nanos() / a.count.max(1) as u128) as u64,
        doorbells: after.doorbells - before.doorbells,
        sleeps: after.sleeps - before.sleeps,
        spins_satisfied: after.spins_satisfied - before.spins_satisfied,
        copies_per_network_byte: (after.bytes_copied - before.bytes_copied) as f64
            / ((after.bytes_sent - before.bytes_sent)
                + (after.bytes_received - before.bytes_received))
                .max(1) as f64,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{} round trips of {} B: {} socket calls, {} ns per round trip; doorbells {}, futex sleeps {}",
            r.round_trips, r.size, r.socket_calls, r.ns_per_round_trip, r.doorbells, r.sleeps
        );
    }
    Ok(())
}
