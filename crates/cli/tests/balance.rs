//! Dynamic host/server balancing (`docs/ARCHITECTURE.md` "Balancing"): a
//! program under `tcps run` serves a mix of offloaded connections and
//! connections the server handed over as kernel sockets, and cannot tell;
//! `--balance off` and `TCPS_BALANCE` keep everything offloaded; `tcps
//! stat` and the metrics count both kinds. The share is forced with the
//! testing aid `--balance-force-direct` (the measured one depends on the
//! machine's load).

mod common;
mod preload;

use common::{Rng, Server, TempDir, TCPS};
use preload::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const ECHO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/balance_echo.py");

/// Waits (bounded) until the script printed `listening` (a probe
/// connection would be one of the connections it counts).
fn wait_listening(child: &mut Child, log: &Path) {
    let t = Instant::now();
    while !read(log).contains("listening") {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("echo server exited ({st}):\n{}", read(log));
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "never listened:\n{}",
            read(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `conns` clients, each sending its own bytes (different sizes, some
/// large) and reading the echo to EOF; panics on a byte out of place.
fn clients(port: u16, conns: usize) {
    let hs: Vec<_> = (0..conns)
        .map(|i| {
            std::thread::spawn(move || {
                let data = Rng::new(i as u64 + 7).bytes(20_000 + i * 37_117);
                assert!(
                    echo_client(port, data),
                    "connection {i}: bytes out of place"
                );
            })
        })
        .collect();
    for h in hs {
        h.join().expect("a client failed");
    }
}

/// Runs the echo script under `tcps run` with `args`, `conns` clients; the
/// script's summary line and its host's `tcps stat` entry (read while it
/// still runs: the script waits for a last connection).
fn run_echo(
    srv: &Server,
    dir: &TempDir,
    tag: &str,
    conns: usize,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Summary, Value) {
    let port = free_port();
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.log"));
    let p = port.to_string();
    let total = (conns + 1).to_string();
    let mut argv = vec!["python3", ECHO, &p, "--conns", &total];
    argv.extend_from_slice(args);
    let mut cmd = command(Net::Tcps, srv, &stats, &log, &argv);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the echo server");
    wait_listening(&mut child, &log);
    clients(port, conns);
    // The server publishes its counters every 100 ms.
    let pid = child.id();
    let t = Instant::now();
    let host = loop {
        let h = stat_host(srv, pid);
        let n = h.as_ref().map_or(0, |h| {
            let c = &h["counters"];
            ["accepts_eager", "accepts_on_demand", "accepts_direct"]
                .iter()
                .map(|k| c[k].as_u64().unwrap_or(0))
                .sum::<u64>()
        });
        if n >= conns as u64 || t.elapsed() > Duration::from_secs(10) {
            break h.unwrap_or_else(|| panic!("no stat entry for pid {pid}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    clients(port, 1);
    let st = common::wait_timeout(&mut child, Duration::from_secs(20));
    assert!(
        st.is_some_and(|s| s.success()),
        "echo server did not finish: {st:?}\n{}",
        read(&log)
    );
    // What the program saw matches what the clients sent.
    let seen: Vec<String> = read(&log)
        .lines()
        .filter(|l| l.starts_with("conn "))
        .map(String::from)
        .collect();
    assert_eq!(seen.len(), conns + 1, "{}", read(&log));
    let t = summaries(&stats);
    assert_eq!(t.len(), 1, "{t:?}");
    (t[0].clone(), host)
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(u64::MAX)
}

/// `--balance off`: every connection is offloaded, even with a forced share.
#[test]
fn balance_off_keeps_every_connection_offloaded() {
    need("python3");
    let srv = Server::start(
        "uring",
        &[
            "--poll",
            "adaptive",
            "--balance",
            "off",
            "--balance-force-direct",
            "100",
        ],
    );
    let dir = TempDir::new("balance-off");
    let (sum, host) = run_echo(&srv, &dir, "off", 6, &[], &[]);
    assert_eq!((sum.accepted, sum.direct), (7, 0), "{sum:?}");
    assert_eq!(num(&host["counters"], "accepts_direct"), 0, "{host}");
    assert_eq!(host["balance"]["reason"], "off", "{host}");
    assert_eq!(num(&host["balance"], "share_pct"), 0, "{host}");
}

/// A forced 50 % share on the accept ring path (eager accept): half the
/// connections are kernel sockets of the program, half offloaded; every
/// byte comes back in order; stat and the metrics count both.
#[test]
fn forced_share_mixes_direct_and_offloaded_eager_accept() {
    need("python3");
    for engine in ["uring", "epoll"] {
        let srv = Server::start(
            engine,
            &[
                "--poll",
                "adaptive",
                "--balance-force-direct",
                "50",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
        );
        let dir = TempDir::new("balance-eager");
        let (sum, host) = run_echo(&srv, &dir, engine, 12, &[], &[]);
        // 13 connections, every other one direct (error diffusion).
        assert_eq!(sum.accepted + sum.direct, 13, "{engine}: {sum:?}");
        assert!((6..=7).contains(&sum.direct), "{engine}: {sum:?}");
        let c = &host["counters"];
        assert!(
            num(c, "accepts_direct") >= 6 && num(c, "accepts_eager") >= 6,
            "{engine}: {host}"
        );
        assert_eq!(host["balance"]["reason"], "forced", "{host}");
        assert_eq!(host["balance"]["takes_direct"], true, "{host}");
        // The metrics' total counts them too (published every 100 ms).
        let t = Instant::now();
        loop {
            let direct = metrics_direct(&srv.metrics_addr());
            if direct == Some(sum.direct) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{engine}: {direct:?} {sum:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `tcps_accepts_direct_total` from the metrics at `addr`.
fn metrics_direct(addr: &str) -> Option<u64> {
    let mut s = TcpStream::connect(addr).expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("tcps_accepts_direct_total "))
        .and_then(|v| v.parse::<u64>().ok())
}

/// The same through the server's `Accept` call (eager accept off), with
/// clients' bytes already sent when the program accepts (they wait in the
/// kernel, and a direct connection gets them all, in order), and a
/// non-blocking listener.
#[test]
fn forced_share_through_the_accept_call_keeps_bytes_in_order() {
    need("python3");
    let srv = Server::start(
        "uring",
        &[
            "--poll",
            "adaptive",
            "--eager-accept",
            "off",
            "--balance-force-direct",
            "50",
        ],
    );
    let dir = TempDir::new("balance-call");
    let (sum, host) = run_echo(&srv, &dir, "call", 8, &["--delay", "0.5"], &[]);
    assert_eq!(sum.accepted + sum.direct, 9, "{sum:?}");
    assert!((4..=5).contains(&sum.direct), "{sum:?}");
    let c = &host["counters"];
    assert!(num(c, "accepts_on_demand") >= 4, "{host}");
    let (sum, _) = run_echo(&srv, &dir, "call-nb", 8, &["--nonblocking"], &[]);
    assert!((4..=5).contains(&sum.direct), "{sum:?}");
    // The program's exit says how many went direct: a run under `tcps run`
    // never turns into a kernel run without a word.
    let log = read(&dir.path().join("call-nb.log"));
    let line = log
        .lines()
        .find(|l| l.contains("handed over as kernel sockets by balancing"))
        .unwrap_or_else(|| panic!("no exit line on direct connections:\n{log}"));
    assert!(
        line.contains(&format!(
            "{} were offloaded and {} handed over",
            sum.accepted, sum.direct
        )),
        "{line}"
    );
}

/// `TCPS_BALANCE` 0 on the listener, or `TCPS_BALANCE=off` for the
/// process: nothing is handed over.
#[test]
fn listener_option_and_env_keep_connections_offloaded() {
    need("python3");
    let srv = Server::start(
        "uring",
        &["--poll", "adaptive", "--balance-force-direct", "100"],
    );
    let dir = TempDir::new("balance-opt");
    let (sum, host) = run_echo(&srv, &dir, "opt", 4, &["--no-balance"], &[]);
    assert_eq!((sum.accepted, sum.direct), (5, 0), "{sum:?}");
    assert_eq!(num(&host["counters"], "accepts_direct"), 0, "{host}");
    let (sum, host) = run_echo(&srv, &dir, "env", 4, &[], &[("TCPS_BALANCE", "off")]);
    assert_eq!((sum.accepted, sum.direct), (5, 0), "{sum:?}");
    assert_eq!(host["balance"]["reason"], "host-cannot", "{host}");
    // And all of them direct at 100 %.
    let (sum, _) = run_echo(&srv, &dir, "all", 4, &[], &[]);
    assert_eq!((sum.accepted, sum.direct), (0, 5), "{sum:?}");
}

/// `tcps stat` shows the BALANCE table.
#[test]
fn stat_shows_the_balance() {
    let srv = Server::start("uring", &["--poll", "adaptive", "--balance", "on"]);
    let c = srv.attach();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let out = Command::new(TCPS)
        .args(["stat", "--socket"])
        .arg(&srv.socket)
        .output()
        .expect("tcps stat");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .skip_while(|l| !l.starts_with("BALANCE"))
        .nth(1)
        .unwrap_or_else(|| panic!("no BALANCE table:\n{text}"));
    // The native API takes no direct connections.
    assert!(
        line.contains("host-cannot") && line.contains("0/0"),
        "{text}"
    );
    c.close(s).unwrap();
}

/// A Python asyncio echo server (epoll, non-blocking accept) with a forced
/// share: direct and offloaded connections in one epoll set, every byte
/// back in order.
#[test]
fn asyncio_epoll_mixes_direct_and_offloaded() {
    need("python3");
    let srv = Server::start(
        "uring",
        &["--poll", "adaptive", "--balance-force-direct", "30"],
    );
    let dir = TempDir::new("balance-asyncio");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/asyncio_echo.py");
    const CONNS: usize = 20;
    let port = free_port();
    let (p, n) = (port.to_string(), CONNS.to_string());
    let stats = dir.path().join("asyncio.stats");
    let log = dir.path().join("asyncio.log");
    let argv = ["python3", script, &p, "--conns", &n];
    let mut child = command(Net::Tcps, &srv, &stats, &log, &argv)
        .spawn()
        .expect("spawn asyncio");
    // The readiness probe is a connection too.
    wait_port(port, &mut child, "asyncio echo", &log);
    clients(port, CONNS - 1);
    let st = common::wait_timeout(&mut child, Duration::from_secs(20));
    assert!(st.is_some_and(|s| s.success()), "{st:?}\n{}", read(&log));
    let t = summaries(&stats);
    assert_eq!(t.len(), 1, "{t:?}");
    // 30 %: 6 of 20 (error diffusion), the rest offloaded.
    assert_eq!((t[0].direct, t[0].accepted), (6, 14), "{t:?}");
}

/// nginx (master + 2 workers that inherit the listener across fork, epoll,
/// accept4 non-blocking, sendfile) with half its connections direct: curl
/// gets every file byte-exact, wrk sees no error, and both kinds were used.
#[test]
fn nginx_serves_direct_and_offloaded() {
    for p in ["nginx", "wrk", "curl"] {
        need(p);
    }
    let srv = Server::start(
        "uring",
        &["--poll", "adaptive", "--balance-force-direct", "50"],
    );
    let dir = TempDir::new("balance-nginx");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    let mut rng = Rng::new(5);
    let files = [
        ("big.bin", 1usize << 20),
        ("16k.bin", 16 << 10),
        ("odd.bin", 12345),
    ];
    for (name, len) in files {
        std::fs::write(www.join(name), rng.bytes(len)).unwrap();
    }
    let port = free_port();
    let (mut nginx, stats, log) =
        start_nginx(Net::Tcps, &srv, dir.path(), &www, port, true, "nginx");
    for round in 0..4 {
        for (name, len) in files {
            let out = Command::new("curl")
                .args(["-s", &format!("http://127.0.0.1:{port}/{name}")])
                .output()
                .expect("curl");
            let want = std::fs::read(www.join(name)).unwrap();
            assert_eq!(out.stdout.len(), len, "{name} (round {round})");
            assert!(out.stdout == want, "{name} differs (round {round})");
        }
    }
    assert!(wrk_requests(port, "16k.bin") > 100);
    stop(&mut nginx.0, libc::SIGQUIT);
    let sums = wait_summaries(&stats, 3);
    let direct: u64 = sums.iter().map(|s| s.direct).sum();
    let offloaded: u64 = sums.iter().map(|s| s.accepted).sum();
    assert!(direct >= 8 && offloaded >= 8, "{sums:?}\n{}", read(&log));
}

/// The native API: a process that asks for direct connections gets kernel
/// sockets from `accept_any` (blocking, byte-exact, the peer's address);
/// `accept` hands a direct connection back to the server (`SocketAdopt`),
/// so it still returns a working socket id.
#[test]
fn native_api_takes_direct_connections() {
    let srv = Server::start(
        "uring",
        &["--poll", "adaptive", "--balance-force-direct", "100"],
    );
    let c = srv.attach();
    c.take_direct_connections()
        .expect("take direct connections");
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let addr = c.getsockname(l).unwrap();
    let mut k = TcpStream::connect(addr).unwrap();
    k.write_all(b"sent before the accept").unwrap();
    let mut peer = [0u8; 128];
    let (got, len) = c.accept_any(l, 0, &mut peer).expect("accept_any");
    let tcps::Accepted::Direct(fd) = got else {
        panic!("not direct at a forced 100 %: {got:?}");
    };
    let mut d = TcpStream::from(fd);
    assert!(
        !is_nonblocking(&d),
        "blocking, as accept4 without SOCK_NONBLOCK"
    );
    assert_eq!(d.peer_addr().unwrap(), k.local_addr().unwrap());
    assert!(len == 16, "an IPv4 sockaddr: {len}");
    let mut b = [0u8; 22];
    d.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"sent before the accept");
    d.write_all(b"back").unwrap();
    let mut b = [0u8; 4];
    k.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"back");
    // accept4's flags are applied to the kernel socket.
    let _k3 = TcpStream::connect(addr).unwrap();
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    let (got, _) = c.accept_any(l, flags, &mut []).expect("accept_any");
    let tcps::Accepted::Direct(fd) = got else {
        panic!("not direct: {got:?}");
    };
    assert!(is_nonblocking(&fd) && is_cloexec(&fd));
    // accept(): adopted by the server again, an ordinary socket id.
    let mut k2 = TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).expect("accept");
    k2.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        n += c.recv(s, &mut b[n..], 0).unwrap();
    }
    assert_eq!(&b, b"ping");
    c.send_all(s, b"pong").unwrap();
    k2.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong");
    // Published every 100 ms.
    let t = Instant::now();
    let v = loop {
        let v = srv.stat_json();
        if v["total"]["counters"]["accepts_direct"] == 3 || t.elapsed() > Duration::from_secs(5) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["total"]["counters"]["accepts_direct"], 3, "{v}");
    assert_eq!(v["hosts"][0]["balance"]["takes_direct"], true, "{v}");
    c.close(s).unwrap();
    c.close(l).unwrap();
}

/// A host can take only its own direct connections, once: another host's
/// handle, a taken one or a made-up one is ENOENT, and the host stays
/// attached (the server trusts no handle it did not give out).
#[test]
fn direct_handles_are_per_host_and_taken_once() {
    use tcps_proto::handshake::ControlMsg;
    let srv = Server::start(
        "uring",
        &["--poll", "adaptive", "--balance-force-direct", "100"],
    );
    let (a, b) = (srv.attach(), srv.attach());
    a.take_direct_connections().unwrap();
    b.take_direct_connections().unwrap();
    let l = a.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let _k = TcpStream::connect(a.getsockname(l).unwrap()).unwrap();
    let (got, _) = a.accept_any(l, 0, &mut []).unwrap();
    assert!(matches!(got, tcps::Accepted::Direct(_)), "{got:?}");
    let errno_of = |c: &tcps::Client, handle: u32| match c
        .control_exchange(&ControlMsg::Direct { handle }, &[])
    {
        Ok((ControlMsg::Reply { errno, .. }, fds)) => (errno, fds.len()),
        other => panic!("{other:?}"),
    };
    // Handles count from 1 per host: a took 1. A second connection is
    // accepted ahead into a's accept ring (handle 2, waiting for a): b
    // cannot take it, a still can.
    let _k2 = TcpStream::connect(a.getsockname(l).unwrap()).unwrap();
    let pending = |v: &Value| -> u64 {
        let hosts = v["hosts"].as_array().cloned().unwrap_or_default();
        hosts
            .iter()
            .map(|h| num(&h["balance"], "pending_direct"))
            .sum()
    };
    let t = Instant::now();
    while pending(&srv.stat_json()) != 1 {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", srv.stat_json());
        std::thread::sleep(Duration::from_millis(20));
    }
    for h in [1, 2, 77, u32::MAX] {
        assert_eq!(errno_of(&b, h), (libc::ENOENT, 0), "b, handle {h}");
    }
    let (got, _) = a.accept_any(l, 0, &mut []).unwrap();
    assert!(matches!(got, tcps::Accepted::Direct(_)), "{got:?}");
    for h in [1, 2, 77, u32::MAX] {
        assert_eq!(errno_of(&a, h), (libc::ENOENT, 0), "a, handle {h}");
    }
    a.nop().expect("a still attached");
    b.nop().expect("b still attached");
    // Closing the listener closes a direct connection accepted ahead and
    // never taken, at once (as an offloaded one), not after 10 s.
    let mut k3 = TcpStream::connect(a.getsockname(l).unwrap()).unwrap();
    let t = Instant::now();
    while pending(&srv.stat_json()) != 1 {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", srv.stat_json());
        std::thread::sleep(Duration::from_millis(20));
    }
    a.close(l).unwrap();
    k3.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let t = Instant::now();
    let r = k3.read(&mut [0u8; 8]);
    assert!(
        matches!(r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?} after {:?}",
        t.elapsed()
    );
}

/// Whether FD_CLOEXEC is set on `fd`.
fn is_cloexec(fd: &impl std::os::fd::AsRawFd) -> bool {
    // SAFETY: F_GETFD on a descriptor the caller owns.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
    fl & libc::FD_CLOEXEC != 0
}

/// Whether O_NONBLOCK is set on `fd`'s open file.
fn is_nonblocking(fd: &impl std::os::fd::AsRawFd) -> bool {
    // SAFETY: F_GETFL on a descriptor the caller owns.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    fl & libc::O_NONBLOCK != 0
}
