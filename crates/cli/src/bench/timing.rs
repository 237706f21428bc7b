//! The timing loops and fixtures the call benchmarks share: a draining
//! kernel receiver, timed bursts of sends (synchronous and asynchronous),
//! the core-to-core floor, CPU pinning and socket buffers.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A kernel-socket receiver that drains every connection as fast as it can
/// and counts the bytes it read, so the sender can wait until it caught up.
pub fn spawn_drain(read: Arc<AtomicU64>) -> std::io::Result<SocketAddr> {
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
pub fn send_cost_ns(iters: usize, size: usize, read: &AtomicU64, mut send: impl FnMut()) -> u64 {
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
pub fn async_cost_ns(
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
pub const BENCH_SOCKET_BUFFER: i32 = 4 << 20;

/// Median round trip of a cache line between this thread and a thread
/// pinned to `cpu`: the hardware floor of any shared-memory channel.
pub fn core_to_core_rtt_ns(cpu: usize, iters: usize) -> u64 {
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

pub fn pin_self_away_from(cpu: usize) {
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
pub fn median_ns(iters: usize, mut f: impl FnMut()) -> u64 {
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
pub fn force_buffers(fd: i32, force_opt: i32) {
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
