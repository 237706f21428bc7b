//! `tcps bench call-cost` (thesis Table 6.2): the cost of one send call as
//! the application sees it, kernel send(2) against tcps' synchronous and
//! asynchronous sends on a connected socket whose reader keeps up.

use clap::Args;
use serde::Serialize;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps::Client;

use super::server::ServerProcess;
use super::timing::{self, BENCH_SOCKET_BUFFER};

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

type Error = Box<dyn std::error::Error>;

/// What every measurement of a run sends on: a kernel socket and a tcps
/// socket connected to the same draining reader, and the count of bytes
/// that reader has read (the sender waits, untimed, until it caught up).
struct Conns {
    read: Arc<AtomicU64>,
    kernel: TcpStream,
    client: Client,
    ts: u32,
}

impl Conns {
    /// Connects both sockets to the reader at `drain`, with TCP_NODELAY and
    /// send buffers a whole burst fits in.
    fn open(
        read: Arc<AtomicU64>,
        drain: std::net::SocketAddr,
        socket: &std::path::Path,
    ) -> Result<Conns, Error> {
        let client = Client::attach(socket)?;
        let kernel = TcpStream::connect(drain)?;
        kernel.set_nodelay(true)?;
        timing::force_buffers(kernel.as_raw_fd(), libc::SO_SNDBUFFORCE);
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
        Ok(Conns {
            read,
            kernel,
            client,
            ts,
        })
    }

    /// Untimed: one pass of copying asynchronous sends over the library's
    /// staging pool (16 MiB by default, TCPS_ASYNC_POOL_KIB), so the timed
    /// calls do not pay its first-touch page faults (about 1.3 µs per 64 B
    /// call until the pool has been used once).
    fn warm_async_pool(&self) -> Result<(), Error> {
        let pool_bytes = std::env::var("TCPS_ASYNC_POOL_KIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(16 * 1024)
            * 1024;
        let chunk = vec![0x5au8; 64 * 1024];
        let target = self.read.load(Ordering::Relaxed) + (2 * pool_bytes) as u64;
        let mut sent = 0;
        while sent < 2 * pool_bytes {
            sent += self.client.send_async(self.ts, &chunk, 0)?;
        }
        self.client
            .flush_async(self.ts, Some(Duration::from_secs(30)))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.read.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }

    /// Untimed, after each burst of asynchronous sends of `size` bytes:
    /// every send finished at the server and the reader drained it, so the
    /// next burst starts from empty queues and socket buffers.
    fn settler(&self, size: usize) -> impl FnMut(usize) + '_ {
        let mut sent = self.read.load(Ordering::Relaxed);
        move |n: usize| {
            sent += (n * size) as u64;
            if let Err(e) = self
                .client
                .flush_async(self.ts, Some(Duration::from_secs(10)))
            {
                eprintln!("call-cost: flush_async: {e}");
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.read.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Median cost of one asynchronous call of `size` bytes, copying
    /// (`send_async`) and from registered memory (`send_async_registered`).
    fn async_costs(&self, a: &CallCostArgs, size: usize, buf: &[u8]) -> Result<(f64, f64), Error> {
        let (client, ts) = (&self.client, self.ts);
        let mut settle = self.settler(size);
        let mut failed = None;
        let async_ns = timing::async_cost_ns(
            a.iters,
            a.burst,
            || {
                if let Err(e) = client.send_async(ts, buf, 0) {
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
        let async_registered_ns = timing::async_cost_ns(
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
        Ok((async_ns, async_registered_ns))
    }

    /// One row: every variant's cost of a send of `size` bytes.
    fn row(&self, a: &CallCostArgs, size: usize) -> Result<CallCostRow, Error> {
        let buf = vec![0x5au8; size];
        let kfd = self.kernel.as_raw_fd();
        let kernel_ns = timing::send_cost_ns(a.iters, size, &self.read, || {
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
        let sync_ns = timing::send_cost_ns(a.iters, size, &self.read, || {
            let _ = self.client.send(self.ts, &buf, 0);
        });
        let (async_ns, async_registered_ns) = self.async_costs(a, size, &buf)?;
        let k = kernel_ns.max(1) as f64;
        if !a.json {
            eprintln!(
                "size {size:>6} B: kernel {kernel_ns} ns, tcps sync {sync_ns} ns, \
                 async {async_ns:.1} ns, async registered {async_registered_ns:.1} ns"
            );
        }
        Ok(CallCostRow {
            size,
            kernel_ns,
            sync_ns,
            sync_ratio: sync_ns as f64 / k,
            async_ns,
            async_ratio: async_ns / k,
            async_registered_ns,
            async_registered_ratio: async_registered_ns / k,
        })
    }
}

fn print_report(a: &CallCostArgs, report: &CallCostReport) -> Result<(), Error> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
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
    Ok(())
}

pub fn run(a: CallCostArgs) -> Result<(), Error> {
    if a.sizes.is_empty() || a.iters == 0 {
        return Err("--sizes and --iters must be non-empty / positive".into());
    }
    if a.burst == 0 || a.burst > 64 {
        return Err("--burst must be 1..=64 (the per-socket pipeline)".into());
    }
    // The drain threads start before this thread pins itself, so they may
    // run on any CPU.
    let read = Arc::new(AtomicU64::new(0));
    let drain = timing::spawn_drain(read.clone())?;
    timing::pin_self_away_from(a.server_cpu);
    // Before the server starts spinning on its CPU.
    let core_to_core_rtt_ns = timing::core_to_core_rtt_ns(a.server_cpu, a.iters);
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
    let conns = Conns::open(read, drain, &socket)?;
    let nop_ns = timing::median_ns(a.iters, || {
        let _ = conns.client.nop();
    });
    conns.warm_async_pool()?;
    let mut rows = Vec::new();
    for &size in &a.sizes {
        rows.push(conns.row(&a, size)?);
    }
    let _ = conns.client.close(conns.ts);
    let report = CallCostReport {
        results: rows,
        nop_ns,
        core_to_core_rtt_ns,
        iters: a.iters,
        burst: a.burst,
        poll: a.poll.clone(),
        engine: a.engine.clone(),
    };
    print_report(&a, &report)?;
    drop(server);
    Ok(())
}
