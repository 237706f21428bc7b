//! The fault matrix (issue 18 item 5): a mixed workload, and SIGKILL at
//! seeded random points, to the host or to the TCP server. After each point:
//!
//! - **hang**: every call and every transfer returns within 2 s of the kill
//!   (clients read with a 2 s timeout; a host's blocked call must come back);
//! - **leak**: the server's descriptors (all, and memfds apart) and attached
//!   hosts return to their count before the point, and the killed host's
//!   listening port can be bound again, within 2 s; the server's resident
//!   memory grows by less than 64 MiB after its first point;
//! - **corruption**: every transfer that completed has the right checksum,
//!   and every transfer cut by the kill is a prefix of what was sent;
//! - **unserved**: the server (or, after a server kill, its successor)
//!   still serves a new host.
//!
//! Workloads ([`Scenario`]): a native host serving files with synchronous
//! and asynchronous sends (killed during attach or mid-call), a native host
//! streaming from registered memory through its send queue (killed
//! mid-queue), a fork-per-connection Python server under `tcps run`
//! (killed parent or child, mid-fork), redis under `tcps run`, and the
//! server itself killed under the first workload, with a native host and
//! a program under `tcps run` blocked in recv — also 0–15 ms after it was
//! asked for a hot upgrade (SIGUSR2), which lands the kill before, during
//! (workers pausing, the exec, the new binary restoring) or after it.
//!
//! The table is printed (and written to `$TCPS_FAULT_TABLE` if set);
//! `TCPS_FAULT_SEED`, `TCPS_FAULT_FIRST` and `TCPS_FAULT_POINTS` (both
//! engines together) replay a run; a failure prints how to replay its point. `scripts/fault-matrix.sh` runs the long version.

mod common;
mod fault;
mod preload;

use common::*;
use fault::*;
use preload::{free_port, need, Net};
use std::fmt::Write as _;
use std::io::Write;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps::Client;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// A file-serving native host killed 0–15 ms after it starts.
    HostAttach,
    /// The same host killed while clients fetch files from it.
    HostMidCall,
    /// A native host streaming from registered memory, killed mid-queue.
    HostMidSendq,
    /// A fork-per-connection Python server under `tcps run`; the parent or
    /// a forked child killed.
    HostMidFork,
    /// redis-server under `tcps run`, killed under SET/GET traffic.
    Redis,
    /// The TCP server killed under the file-serving workload.
    Server,
    /// The same, the kill 0–15 ms after SIGUSR2 (a hot upgrade).
    Upgrade,
}

const SCENARIOS: [Scenario; 7] = [
    Scenario::HostAttach,
    Scenario::HostMidCall,
    Scenario::HostMidSendq,
    Scenario::HostMidFork,
    Scenario::Redis,
    Scenario::Server,
    Scenario::Upgrade,
];

/// Counts of the server's resources, compared before and after a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Footprint {
    fds: usize,
    memfds: usize,
    hosts: usize,
}

fn footprint(srv: &Server) -> Footprint {
    let mut fds = 0;
    let mut memfds = 0;
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", srv.pid())) {
        for e in dir.flatten() {
            fds += 1;
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            if target.to_string_lossy().starts_with("/memfd:") {
                memfds += 1;
            }
        }
    }
    let hosts = srv.stat_json()["hosts"]
        .as_array()
        .map(|a| a.len())
        .unwrap_or(usize::MAX);
    Footprint { fds, memfds, hosts }
}

/// What a process's descriptors point at, for a leak's report.
fn fd_targets(pid: u32) -> String {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let t = std::fs::read_link(e.path()).unwrap_or_default();
                    format!("{}->{}", e.file_name().to_string_lossy(), t.display())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.join(" ")
}

// ---- the matrix ------------------------------------------------------------------

struct Matrix {
    engine: &'static str,
    srv: Server,
    /// The server's footprint with no host attached.
    idle: Footprint,
    /// Resident memory (KiB) of the current server after its first point
    /// (warm: its allocator has its arenas), 0 before that.
    rss_base: u64,
    /// The largest growth from there of any server of the run.
    rss_growth: u64,
    tmp: TempDir,
}

impl Matrix {
    fn new(engine: &'static str) -> Matrix {
        let srv = start_server_for(engine);
        let idle = footprint(&srv);
        Matrix {
            engine,
            srv,
            idle,
            rss_base: 0,
            rss_growth: 0,
            tmp: TempDir::new("fault"),
        }
    }

    /// After a host was killed: the server returns to its idle footprint,
    /// and `port` (the host's listener, if any) can be bound again.
    fn check_freed(&self, port: Option<u16>, out: &mut Outcome) {
        let t = Instant::now();
        let mut now = footprint(&self.srv);
        while now != self.idle && t.elapsed() < PROMPT {
            std::thread::sleep(Duration::from_millis(10));
            now = footprint(&self.srv);
        }
        if now != self.idle {
            out.leak.push(format!(
                "server holds {now:?}, {:?} when idle; its descriptors: {}; its log ends: {}",
                self.idle,
                fd_targets(self.srv.pid()),
                self.srv
                    .log_text()
                    .lines()
                    .rev()
                    .take(6)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
        if let Some(port) = port {
            // As a restarted kernel-socket server would: SO_REUSEADDR
            // (connections the host closed first are in TIME_WAIT), then
            // listen, which fails while any listener holds the port.
            let bound = (0..200).any(|_| {
                listen_again(port) || {
                    std::thread::sleep(Duration::from_millis(10));
                    false
                }
            });
            if !bound {
                out.leak.push(format!("port {port} still in use"));
            }
        }
    }

    /// Notes the current server's memory: its base after its first point,
    /// its growth since then after later ones.
    fn note_rss(&mut self) {
        let now = rss_kib(self.srv.pid());
        if self.rss_base == 0 {
            self.rss_base = now;
        }
        self.rss_growth = self.rss_growth.max(now.saturating_sub(self.rss_base));
    }

    /// A new host attaches and echoes through the server.
    fn check_serves(&self, out: &mut Outcome) {
        let socket = self.srv.socket.clone();
        let r = std::panic::catch_unwind(move || {
            let c = Client::attach(&socket).expect("attach");
            echo_roundtrip(&c, kernel_echo_server("127.0.0.1:0"), b"after a fault");
            c.detach();
        });
        if r.is_err() {
            out.unserved
                .push("a new host could not attach and echo".into());
        }
    }
}

/// Whether a kernel socket can listen on 127.0.0.1:`port` (std sets
/// SO_REUSEADDR before it binds).
fn listen_again(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn start_server_for(engine: &str) -> Server {
    // The io_uring matrix runs with balancing on (connections handed to
    // the host as kernel sockets too), the epoll one with everything offloaded.
    let balance = if engine == "uring" { "on" } else { "off" };
    Server::start(engine, &["--poll", "adaptive", "--balance", balance])
}

/// Whether `line` appears in the file at `path` within `limit`.
fn wait_for_line(path: &std::path::Path, line: &str, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l.trim() == line) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// 5–200 ms: a kill at some point of the workload's life.
fn some_delay(rng: &mut Rng) -> Duration {
    Duration::from_millis(5 + rng.below(195))
}

fn point_host_serve(m: &Matrix, rng: &mut Rng, during_attach: bool) -> Outcome {
    let mut out = Outcome::default();
    let mut kid = spawn_child(&m.srv, "fault-serve", "fault::child_fault_serve", &[]);
    let mut port = None;
    let mut clients = None;
    if during_attach {
        std::thread::sleep(Duration::from_micros(rng.below(15_000)));
    } else {
        let p: u16 = kid
            .read_mark("port", Duration::from_secs(20))
            .parse()
            .unwrap();
        port = Some(p);
        clients = Some(Clients::start(
            3,
            rng.next_u64(),
            move |seed, stop, tally| fetch_files(p, seed, stop, tally),
        ));
        std::thread::sleep(some_delay(rng));
    }
    kill9(&mut kid);
    if let Some(c) = clients {
        c.finish(&mut out);
    }
    m.check_freed(port, &mut out);
    out
}

fn point_host_sendq(m: &Matrix, rng: &mut Rng) -> Outcome {
    let mut out = Outcome::default();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let seed = rng.next_u64();
    let mut kid = spawn_child(
        &m.srv,
        "fault-stream",
        "fault::child_fault_stream",
        &[
            ("TCPS_FAULT_ADDR", l.local_addr().unwrap().to_string()),
            ("TCPS_FAULT_STREAM_SEED", seed.to_string()),
        ],
    );
    let conn = accept_within(&l);
    let tally = Arc::new(Tally::default());
    let reader = {
        let tally = tally.clone();
        std::thread::spawn(move || read_stream(conn, seed, &tally))
    };
    kid.read_mark("streaming", Duration::from_secs(20));
    std::thread::sleep(some_delay(rng));
    kill9(&mut kid);
    let t = Instant::now();
    while !reader.is_finished() && t.elapsed() < PROMPT + Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    if !reader.is_finished() {
        out.hang
            .push("the stream did not end after the host died".into());
    }
    tally.drain_into(&mut out);
    m.check_freed(None, &mut out);
    out
}

fn point_host_fork(m: &Matrix, rng: &mut Rng) -> Outcome {
    let mut out = Outcome::default();
    need("python3");
    let port = free_port();
    let probe = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/preload/forking_upper.py"
    );
    let stats = m.tmp.path().join("fork.stats");
    let log = m.tmp.path().join("fork.log");
    let mut parent = preload::command(
        Net::Tcps,
        &m.srv,
        &stats,
        &log,
        &["python3", probe, &port.to_string()],
    )
    .spawn()
    .expect("spawn the forking server");
    preload::wait_port(port, &mut parent, "forking_upper.py", &log);
    let clients = Clients::start(3, rng.next_u64(), move |seed, stop, tally| {
        upper_client(port, seed, stop, tally)
    });
    std::thread::sleep(some_delay(rng));
    // The parent, or one of its forked children if it has any.
    let kids = children(parent.id());
    if rng.below(2) == 0 && !kids.is_empty() {
        let victim = kids[rng.below(kids.len() as u64) as usize];
        // SAFETY: kill(2) on a process we started (or its child).
        unsafe { libc::kill(victim as i32, libc::SIGKILL) };
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = parent.kill();
    let _ = parent.wait();
    clients.finish(&mut out);
    // Forked children serve their one connection, then exit.
    m.check_freed(Some(port), &mut out);
    out
}

fn point_redis(m: &Matrix, rng: &mut Rng) -> Outcome {
    let mut out = Outcome::default();
    need("redis-server");
    let port = free_port();
    let dir = m.tmp.path().join(format!("redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = m.tmp.path().join("redis.stats");
    let log = m.tmp.path().join("redis.log");
    let mut redis = preload::redis_server(Net::Tcps, &m.srv, &stats, &log, port, &dir);
    let clients = Clients::start(2, rng.next_u64(), move |seed, stop, tally| {
        redis_client(port, seed, stop, tally)
    });
    std::thread::sleep(some_delay(rng));
    let _ = redis.kill();
    let _ = redis.wait();
    clients.finish(&mut out);
    m.check_freed(Some(port), &mut out);
    out
}

/// The server killed under file traffic (`upgrading`: 0–15 ms after it
/// was asked for a hot upgrade), with a native host blocked in a recv:
/// every host call returns within `PROMPT`; a new server serves.
fn point_server(m: &mut Matrix, rng: &mut Rng, upgrading: bool) -> Outcome {
    let mut out = Outcome::default();
    let mut serve = spawn_child(&m.srv, "fault-serve", "fault::child_fault_serve", &[]);
    let p: u16 = serve
        .read_mark("port", Duration::from_secs(20))
        .parse()
        .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut block = spawn_child(
        &m.srv,
        "fault-block",
        "fault::child_fault_block",
        &[("TCPS_FAULT_ADDR", l.local_addr().unwrap().to_string())],
    );
    let _held = accept_within(&l);
    block.read_mark("blocked", Duration::from_secs(20));
    // An unmodified program (Python under `tcps run`) blocked in recv too.
    let log = m.tmp.path().join("blocked-py.log");
    let _ = std::fs::remove_file(&log);
    let script = format!(
        "import socket,sys\ns=socket.create_connection(('127.0.0.1',{}))\n\
         print('blocked',flush=True)\ntry:\n s.recv(16)\nexcept OSError as e:\n pass\n\
         print('returned',flush=True)\n",
        l.local_addr().unwrap().port()
    );
    let stats = m.tmp.path().join("blocked-py.stats");
    let mut py = preload::command(Net::Tcps, &m.srv, &stats, &log, &["python3", "-c", &script])
        .spawn()
        .expect("spawn python3 under tcps run");
    let _held_py = accept_within(&l);
    wait_for_line(&log, "blocked", Duration::from_secs(20));
    let clients = Clients::start(3, rng.next_u64(), move |seed, stop, tally| {
        fetch_files(p, seed, stop, tally)
    });
    std::thread::sleep(some_delay(rng));
    m.note_rss();
    if upgrading {
        m.srv.signal(libc::SIGUSR2);
        std::thread::sleep(Duration::from_micros(rng.below(15_000)));
    }
    m.srv.kill9();
    returns_promptly(&mut serve, "a host blocked in accept", &mut out);
    returns_promptly(&mut block, "a host blocked in recv", &mut out);
    if !wait_for_line(&log, "returned", PROMPT) {
        out.hang
            .push("a program under tcps run: its blocked recv did not return".into());
    }
    let _ = py.kill();
    let _ = py.wait();
    clients.finish(&mut out);
    // The successor: a fresh server, its own idle footprint.
    m.srv = start_server_for(m.engine);
    m.idle = footprint(&m.srv);
    m.rss_base = 0;
    out
}

/// One row of the table.
#[derive(Default)]
struct Row {
    points: u64,
    completed: u64,
    cut: u64,
    hangs: u64,
    leaks: u64,
    corruptions: u64,
    unserved: u64,
}

/// `$name` as a number (decimal or 0x-hex), `default` if unset.
fn env_u64(name: &str, default: u64) -> u64 {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    let n = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    n.unwrap_or_else(|_| panic!("${name}={v:?} is not a number"))
}

fn run_matrix(engine: &'static str, points: u64) {
    let seed0 = env_u64("TCPS_FAULT_SEED", 0x18f4_2026);
    let mut m = Matrix::new(engine);
    let mut rows: Vec<Row> = SCENARIOS.iter().map(|_| Row::default()).collect();
    let mut failures = Vec::new();
    let started = Instant::now();
    let first = env_u64("TCPS_FAULT_FIRST", 0);
    for i in first..first + points {
        let seed = seed0 ^ (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rng = Rng::new(seed);
        // The server's own death is the costliest point: one in twelve
        // (half of them during an upgrade); the five host scenarios share
        // the rest.
        let k = rng.below(12) as usize;
        let sc = match k {
            11 if rng.below(2) == 1 => Scenario::Upgrade,
            11 => Scenario::Server,
            _ => SCENARIOS[k % 5],
        };
        let mut out = match sc {
            Scenario::HostAttach => point_host_serve(&m, &mut rng, true),
            Scenario::HostMidCall => point_host_serve(&m, &mut rng, false),
            Scenario::HostMidSendq => point_host_sendq(&m, &mut rng),
            Scenario::HostMidFork => point_host_fork(&m, &mut rng),
            Scenario::Redis => point_redis(&m, &mut rng),
            Scenario::Server => point_server(&mut m, &mut rng, false),
            Scenario::Upgrade => point_server(&mut m, &mut rng, true),
        };
        m.check_serves(&mut out);
        m.note_rss();
        let row = &mut rows[SCENARIOS.iter().position(|s| *s == sc).unwrap()];
        row.points += 1;
        row.completed += out.completed;
        row.cut += out.cut;
        row.hangs += !out.hang.is_empty() as u64;
        row.leaks += !out.leak.is_empty() as u64;
        row.corruptions += !out.corrupt.is_empty() as u64;
        row.unserved += !out.unserved.is_empty() as u64;
        if out.failed() {
            let what = [&out.hang, &out.leak, &out.corrupt, &out.unserved]
                .iter()
                .flat_map(|v| v.iter())
                .cloned()
                .collect::<Vec<_>>()
                .join("; ");
            eprintln!("{engine}: point {i} ({sc:?}, seed {seed:#x}) failed: {what}");
            failures.push(format!(
                "point {i} {sc:?}: {what} (replay: TCPS_FAULT_SEED={seed0:#x} \
                 TCPS_FAULT_FIRST={i} TCPS_FAULT_POINTS=2 cargo test --release -p tcps-cli \
                 --test fault_matrix fault_matrix_{engine})"
            ));
        }
    }
    let table = table(engine, seed0, &rows, m.rss_growth, started.elapsed());
    println!("{table}");
    if let Ok(path) = std::env::var("TCPS_FAULT_TABLE") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open $TCPS_FAULT_TABLE");
        f.write_all(table.as_bytes()).unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {points} fault points failed:\n{}\n{table}\nserver log:\n{}",
        failures.len(),
        failures.join("\n"),
        m.srv.log_text()
    );
    assert!(
        m.rss_growth < 64 * 1024,
        "the server's resident memory grew by {} KiB over the run",
        m.rss_growth
    );
    assert!(m.srv.is_alive(), "the server died by itself");
}

fn table(engine: &str, seed: u64, rows: &[Row], rss_growth: u64, took: Duration) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "fault matrix, {engine} engine, seed {seed:#x}, {:.0} s; \
         server memory growth after its first point: {} KiB",
        took.as_secs_f64(),
        rss_growth
    );
    let _ = writeln!(
        t,
        "{:<14} {:>6} {:>10} {:>6} {:>6} {:>6} {:>8} {:>9}",
        "scenario", "points", "completed", "cut", "hangs", "leaks", "corrupt", "unserved"
    );
    for (sc, r) in SCENARIOS.iter().zip(rows) {
        let _ = writeln!(
            t,
            "{:<14} {:>6} {:>10} {:>6} {:>6} {:>6} {:>8} {:>9}",
            format!("{sc:?}"),
            r.points,
            r.completed,
            r.cut,
            r.hangs,
            r.leaks,
            r.corruptions,
            r.unserved
        );
    }
    t
}

/// Points per engine: half of `$TCPS_FAULT_POINTS` (default 200).
fn points() -> u64 {
    env_u64("TCPS_FAULT_POINTS", 200).div_ceil(2)
}

#[test]
fn fault_matrix_uring() {
    if std::env::var(ROLE_ENV).is_ok() {
        return;
    }
    run_matrix("uring", points());
}

#[test]
fn fault_matrix_epoll() {
    if std::env::var(ROLE_ENV).is_ok() {
        return;
    }
    run_matrix("epoll", points());
}
