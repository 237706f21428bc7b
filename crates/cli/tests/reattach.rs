//! `tcps run --reattach` (issue 18 item 2): a long-running program survives
//! a restart of the TCP server with only the connections of the moment
//! lost. The server is killed with SIGKILL and a new one started at the
//! same control socket path; the program (same pid) serves new connections
//! on the listener it made before (bytes checked), the connections open at
//! the kill report their error once, and during the outage the program
//! neither spins nor floods its log. Without `--reattach` the listener
//! stays dead (as before, `preload_server_death.rs`).

mod common;
mod preload;

use common::{cpu_ticks, spawn_logged, within, Rng, Server, TempDir, TCPS};
use preload::*;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EPOLL_PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/server_death.py");
const BLOCKING_PROBE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/preload/reattach_blocking.py"
);

/// How long the server stays dead in each test.
const OUTAGE: Duration = Duration::from_millis(1500);

/// A new `tcps server` at `socket` (the one a killed server used), with
/// `extra` options: the restart.
fn restart(engine: &str, socket: &Path, extra: &[&str]) -> Server {
    let dir = TempDir::new(&format!("srv2-{engine}"));
    let log = dir.path().join("server.log");
    let mut args: Vec<&OsStr> = ["server", "--socket"].map(OsStr::new).to_vec();
    args.push(socket.as_os_str());
    args.extend(["--engine", engine, "--balance", "off"].map(OsStr::new));
    args.extend(extra.iter().map(OsStr::new));
    let child = spawn_logged(&args, &log, None);
    let srv = Server {
        child: Some(child),
        socket: socket.to_path_buf(),
        log,
        engine: engine.to_string(),
        dir,
    };
    let t = Instant::now();
    while !srv.log_text().contains("tcps server listening") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the new server never listened:\n{}",
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    srv
}

/// `tcps run [--reattach] --socket S -- argv`, with a stats file, output to
/// `log` (as `preload::command`, with the flag).
fn run(reattach: bool, srv: &Server, stats: &Path, log: &Path, argv: &[&str]) -> Command {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open log");
    let mut c = Command::new(TCPS);
    c.arg("run");
    if reattach {
        c.arg("--reattach");
    }
    c.arg("--socket").arg(&srv.socket).arg("--").args(argv);
    c.env("TCPS_PRELOAD_LIB", preload_lib())
        .env("TCPS_PRELOAD_STATS", stats)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("dup log"))
        .stderr(f);
    common::die_with_parent(&mut c);
    c
}

fn count(out: &str, prefix: &str) -> usize {
    out.lines().filter(|l| l.starts_with(prefix)).count()
}

/// Milliseconds of CPU `pids` use over `span`.
fn cpu_ms_over(pids: &[u32], span: Duration) -> u64 {
    let before: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    std::thread::sleep(span);
    let after: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    (after - before) * 1000 / hz
}

/// Echo clients with random payloads of a few sizes (bytes checked),
/// bounded in time: the program serves on `port` again.
fn serves(port: u16, seed: u64) {
    within(
        Duration::from_secs(20),
        "echo clients after the restart",
        move || {
            let mut rng = Rng::new(seed);
            for size in [1, 70_000, 1 << 20] {
                assert!(
                    echo_client(port, rng.bytes(size)),
                    "{size} bytes came back altered"
                );
            }
        },
    );
}

/// A connection of the dead server ends (EOF or reset), it does not hang.
fn ended(c: &mut TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 65536];
    // What was in flight at the kill may still come (at most a few MB).
    for _ in 0..100 {
        match c.read(&mut b) {
            Ok(0) => return true,
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
            Ok(_) => continue,
        }
    }
    false
}

engine_tests!(
    epoll_program_serves_again,
    blocking_accept_serves_again,
    poll_accept_serves_again,
    nginx_survives_a_server_restart
);

/// An epoll echo server (the probe of `preload_server_death.rs`) with a
/// listener and two connections: after the kill each socket reports once;
/// the new server takes the listener over and new connections on the same
/// port are echoed byte for byte; a listener made afterwards is the new
/// server's. The probe keeps the dead connections open (`keep`), so the
/// new server hands their socket ids out again: sends on them fail
/// (EPIPE) and closing them leaves the new server's sockets under the same
/// ids alone (two connections held across it still echo).
fn epoll_program_serves_again(engine: &str) {
    let mut srv = Server::start(engine, &[]);
    let dir = TempDir::new("reattach-epoll");
    let log = dir.path().join("probe.out");
    let stats = dir.path().join("probe.stats");
    let mut cmd = run(true, &srv, &stats, &log, &["python3", EPOLL_PROBE, "keep"]);
    cmd.stdin(Stdio::piped());
    let mut probe = cmd.spawn().expect("spawn the probe");
    let mut stdin = probe.stdin.take().unwrap();
    let port: u16 = wait_line(&log, "listening ")[10..].trim().parse().unwrap();
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    for c in &mut held {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        echo(c, b"before the restart");
    }
    serves(port, 1);
    srv.kill9();
    wait_line(&log, "accept error");
    let cpu = cpu_ms_over(&[probe.id()], OUTAGE);
    let srv2 = restart(engine, &srv.socket, &[]);
    serves(port, 2);
    for c in &mut held {
        assert!(ended(c), "a connection of the dead server stays open");
    }
    // Connections of the new server, under the ids the dead ones had.
    let mut fresh: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    for c in &mut fresh {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        echo(c, b"new server");
    }
    stdin.write_all(b"poke\n").unwrap();
    wait_line(&log, "poked ");
    stdin.write_all(b"closedead\n").unwrap();
    wait_line(&log, "closed ");
    for c in &mut fresh {
        echo(c, b"still there after the dead sockets were closed");
    }
    assert!(
        stat_host(&srv2, probe.id()).is_some(),
        "the program is not attached to the new server:\n{}",
        read(&log)
    );
    // A new listener is offloaded to the new server.
    stdin.write_all(b"new\n").unwrap();
    let new_port: u16 = wait_line(&log, "relisten ")[9..].trim().parse().unwrap();
    serves(new_port, 3);
    let offloaded = stat_host(&srv2, probe.id()).map(|h| h["sockets"].clone());
    stop(&mut probe, libc::SIGTERM);
    let out = read(&log);
    assert_eq!(count(&out, "errhup listener"), 1, "{out}");
    assert_eq!(count(&out, "accept error ECONNABORTED"), 1, "{out}");
    assert_eq!(count(&out, "errhup client"), 2, "{out}");
    assert_eq!(count(&out, "recv error ECONNRESET"), 2, "{out}");
    assert_eq!(count(&out, "epoll error"), 0, "{out}");
    assert_eq!(count(&out, "errhup relistener"), 0, "{out}");
    assert_eq!(count(&out, "poked 2"), 1, "{out}");
    assert_eq!(count(&out, "dead send error EPIPE"), 2, "{out}");
    assert_eq!(count(&out, "closed 2"), 1, "{out}");
    assert_eq!(
        count(&out, "tcps["),
        2,
        "one line for the death, one for the return:\n{out}"
    );
    assert!(
        out.contains("1 listeners taken over"),
        "the listener was not taken over:\n{out}"
    );
    assert!(
        cpu < 100,
        "{cpu} ms of CPU while the server was dead:\n{out}"
    );
    eprintln!("outage: {cpu} ms CPU; sockets at the new server: {offloaded:?}\n{out}");
}

/// The serial echo server (`reattach_blocking.py`): blocked in recv on a
/// connection at the kill (ECONNRESET), then in accept (ECONNABORTED once,
/// then it blocks without spinning), and the accept waiting there returns
/// the new server's connections; twice (a restart of the restarted
/// server).
fn blocking_accept_serves_again(engine: &str) {
    blocking_probe(engine, "accept");
}

/// As [`blocking_accept_serves_again`], waiting in poll(2) before accept:
/// the listener reports POLLERR|POLLHUP once, then the poll sleeps until
/// the new server has a connection for it.
fn poll_accept_serves_again(engine: &str) {
    blocking_probe(engine, "poll");
}

fn blocking_probe(engine: &str, mode: &str) {
    let mut srv = Server::start(engine, &[]);
    let dir = TempDir::new("reattach-blocking");
    let log = dir.path().join("probe.out");
    let stats = dir.path().join("probe.stats");
    let argv = ["python3", BLOCKING_PROBE, mode];
    let mut probe = run(true, &srv, &stats, &log, &argv).spawn().unwrap();
    let port: u16 = wait_line(&log, "listening ")[10..].trim().parse().unwrap();
    serves(port, 4);
    // Two restarts: the second kills the attachment made by the first.
    let (mut cpu, mut dead) = (Vec::new(), Vec::new());
    for round in 1..=2 {
        let mut held = TcpStream::connect(("127.0.0.1", port)).unwrap();
        held.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        echo(&mut held, b"held across the kill");
        srv.kill9();
        wait_count(&log, "accept error", round);
        cpu.push(cpu_ms_over(&[probe.id()], OUTAGE));
        assert!(ended(&mut held), "the held connection stays open");
        // (The killed one keeps its directory, which holds the socket.)
        let next = restart(engine, &srv.socket, &[]);
        dead.push(std::mem::replace(&mut srv, next));
        serves(port, 4 + round as u64);
    }
    stop(&mut probe, libc::SIGTERM);
    let out = read(&log);
    assert_eq!(count(&out, "recv error ECONNRESET"), 2, "{out}");
    assert_eq!(count(&out, "accept error ECONNABORTED"), 2, "{out}");
    assert_eq!(count(&out, "accept error"), 2, "{out}");
    let errhups = if mode == "poll" { 2 } else { 0 };
    assert_eq!(count(&out, "poll errhup"), errhups, "{out}");
    assert_eq!(
        count(&out, "served "),
        11,
        "3 + (the held one + 3) x 2:\n{out}"
    );
    assert_eq!(count(&out, "tcps["), 4, "{out}");
    assert!(
        out.contains("(attachment 3): 1 listeners taken over"),
        "{out}"
    );
    assert!(
        cpu.iter().all(|&ms| ms < 100),
        "{cpu:?} ms of CPU while the server was dead:\n{out}"
    );
    eprintln!("{mode}: outages {cpu:?} ms CPU\n{out}");
}

/// Waits (at most 10 s) until `log` has `n` lines starting with `prefix`.
fn wait_count(log: &Path, prefix: &str, n: usize) {
    let t = Instant::now();
    while count(&read(log), prefix) < n {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "fewer than {n} {prefix:?} lines:\n{}",
            read(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Without `--reattach` the program does not attach again: after a restart
/// the listener of the dead server stays dead (a client is refused) and
/// the program is not attached to the new server.
#[test]
fn without_reattach_the_listener_stays_dead() {
    let mut srv = Server::start("uring", &[]);
    let dir = TempDir::new("reattach-off");
    let log = dir.path().join("probe.out");
    let stats = dir.path().join("probe.stats");
    let argv = ["python3", BLOCKING_PROBE, "accept"];
    let mut probe = run(false, &srv, &stats, &log, &argv).spawn().unwrap();
    let port: u16 = wait_line(&log, "listening ")[10..].trim().parse().unwrap();
    serves(port, 6);
    srv.kill9();
    wait_line(&log, "accept error");
    let srv2 = restart("uring", &srv.socket, &[]);
    std::thread::sleep(Duration::from_millis(600));
    // The program's listener stopped listening when it saw the death, so
    // a client is refused (not queued for nobody, nor served).
    let r = TcpStream::connect(("127.0.0.1", port));
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "without --reattach a client was not refused: {r:?}"
    );
    assert!(stat_host(&srv2, probe.id()).is_none());
    stop(&mut probe, libc::SIGTERM);
    let out = read(&log);
    assert_eq!(count(&out, "served "), 3, "{out}");
    // The accept blocked at the kill: its one error.
    assert_eq!(count(&out, "accept error"), 1, "{out}");
    assert_eq!(count(&out, "accept error ECONNABORTED"), 1, "{out}");
    assert!(!out.contains("is back"), "{out}");
}

/// `curl` of `url`: the body's SHA-256, bounded in time.
fn curl_sha(url: &str, out: &Path) -> [u8; 32] {
    let st = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "15", "-o"])
        .arg(out)
        .arg(url)
        .status()
        .expect("run curl");
    assert!(st.success(), "curl {url} failed: {st}");
    common::sha256(&std::fs::read(out).unwrap())
}

/// Unmodified nginx, master_process on (2 workers, which inherit the
/// master's listener and run as nobody), sendfile on: curl gets the same
/// bytes before and after a server restart, from the same processes; a
/// keep-alive connection open at the kill ends; the workers use almost no
/// CPU and log a few lines while the server is dead. Both servers let the
/// workers (nobody) attach (`--socket-mode 666`): they attach again under
/// the uid they run as then. A worker killed afterwards is replaced by one
/// that is the new server's.
fn nginx_survives_a_server_restart(engine: &str) {
    need("nginx");
    need("curl");
    let open = ["--socket-mode", "666"];
    let mut srv = Server::start(engine, &open);
    let dir = TempDir::new("reattach-nginx");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    let body = Rng::new(7).bytes(300_000);
    std::fs::write(www.join("a.bin"), &body).unwrap();
    let want = common::sha256(&body);
    let port = free_port();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir.path(), &www, port, true)).unwrap();
    let stats = dir.path().join("nginx.stats");
    std::fs::write(&stats, b"").unwrap();
    std::fs::set_permissions(&stats, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let log = dir.path().join("nginx.log");
    let argv = [
        "nginx",
        "-c",
        conf.to_str().unwrap(),
        "-p",
        dir.path().to_str().unwrap(),
    ];
    let mut nginx = Daemon(run(true, &srv, &stats, &log, &argv).spawn().unwrap());
    wait_port(port, &mut nginx.0, "nginx", &log);
    let url = format!("http://127.0.0.1:{port}/a.bin");
    let got = dir.path().join("got");
    for _ in 0..3 {
        assert_eq!(curl_sha(&url, &got), want, "nginx before the restart");
    }
    let pids = nginx_pids(nginx.0.id());
    assert!(pids.len() >= 3, "master + 2 workers expected: {pids:?}");
    let mut keep = TcpStream::connect(("127.0.0.1", port)).unwrap();
    keep.write_all(b"GET /a.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    keep.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    keep.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    srv.kill9();
    std::thread::sleep(Duration::from_millis(300));
    let error_log = dir.path().join("error.log");
    let lines_before = read(&error_log).lines().count();
    let cpu = cpu_ms_over(&pids, OUTAGE);
    let lines = read(&error_log).lines().count() - lines_before;
    let srv2 = restart(engine, &srv.socket, &open);
    for _ in 0..10 {
        assert_eq!(curl_sha(&url, &got), want, "nginx after the restart");
    }
    assert!(
        ended(&mut keep),
        "a connection of the dead server stays open"
    );
    assert_eq!(nginx_pids(nginx.0.id()), pids, "nginx's processes changed");
    let workers = pids
        .iter()
        .filter(|&&p| stat_host(&srv2, p).is_some())
        .count();
    // A worker that dies now is replaced by the master, whose attachment
    // is still the dead one (it sleeps in sigsuspend): its fork attaches
    // again first, and the new worker inherits the listener there.
    let master = nginx.0.id();
    let victim = *pids.iter().find(|&&p| p != master).unwrap();
    // SAFETY: signalling a process of this test.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let t = Instant::now();
    let replaced = loop {
        let now = nginx_pids(master);
        if let Some(&p) = now.iter().find(|p| !pids.contains(p)) {
            break p;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no new worker: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for _ in 0..10 {
        assert_eq!(
            curl_sha(&url, &got),
            want,
            "nginx after a worker was replaced"
        );
    }
    let t = Instant::now();
    while stat_host(&srv2, replaced).is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the new worker {replaced} is not attached to the new server:\n{}",
            read(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let summary = read(&log);
    stop(&mut nginx.0, libc::SIGQUIT);
    assert!(
        workers >= 1,
        "no nginx process attached to the new server:\n{summary}"
    );
    assert!(
        cpu < 200,
        "nginx used {cpu} ms of CPU while the server was dead"
    );
    assert!(
        lines < 20,
        "nginx logged {lines} lines while the server was dead:\n{}",
        read(&error_log)
    );
    eprintln!("nginx: outage {cpu} ms CPU, {lines} log lines; {workers} processes attached again\n{summary}");
}

/// `tcps run --reattach` started before any server: the program runs (on
/// kernel sockets, one warning line from `tcps run`), and once a server
/// answers its new sockets are offloaded there.
#[test]
fn starts_before_the_server() {
    let dir = TempDir::new("reattach-early");
    let socket = dir.path().join("tcps.sock");
    let log = dir.path().join("probe.out");
    let stats = dir.path().join("probe.stats");
    let mut cmd = Command::new(TCPS);
    cmd.args(["run", "--reattach", "--wait", "0", "--socket"])
        .arg(&socket)
        .args(["--", "python3", EPOLL_PROBE])
        .env("TCPS_PRELOAD_LIB", preload_lib())
        .env("TCPS_PRELOAD_STATS", &stats)
        .stdin(Stdio::piped());
    let f = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    cmd.stdout(f.try_clone().unwrap()).stderr(f);
    common::die_with_parent(&mut cmd);
    let mut probe = cmd.spawn().expect("spawn the probe");
    let mut stdin = probe.stdin.take().unwrap();
    let port: u16 = wait_line(&log, "listening ")[10..].trim().parse().unwrap();
    // The first listener is the kernel's.
    serves(port, 8);
    let srv = restart("uring", &socket, &[]);
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(b"new\n").unwrap();
    let new_port: u16 = wait_line(&log, "relisten ")[9..].trim().parse().unwrap();
    serves(new_port, 9);
    // The new listener's bytes went through the server (its counters are
    // published every 100 ms).
    let sent = counters_once_sent(&srv, probe.id(), 1_000_000)
        .and_then(|c| c["bytes_sent"].as_u64())
        .unwrap_or(0);
    // The kernel listener still serves.
    serves(port, 10);
    stop(&mut probe, libc::SIGTERM);
    let out = read(&log);
    assert!(
        sent >= 1_000_000,
        "{sent} bytes sent through the server:\n{out}"
    );
    assert_eq!(count(&out, "tcps run: warning"), 1, "{out}");
    assert_eq!(count(&out, "tcps["), 1, "one line for the attach:\n{out}");
}

/// A child that dropped privileges after it inherited its parent's
/// attachment (as nginx's workers do) cannot attach to a restarted server
/// whose socket is not open to its user: it says so once, with the uid and
/// the fix, instead of retrying in silence (`--socket-group`, `--socket-mode`).
#[test]
fn a_child_that_dropped_privileges_says_why_it_cannot_reattach() {
    let mut srv = Server::start("uring", &[]);
    let dir = TempDir::new("reattach-setuid");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let log = dir.path().join("probe.out");
    let stats = dir.path().join("probe.stats");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/preload/reattach_setuid.py"
    );
    let mut probe = run(true, &srv, &stats, &log, &["python3", script])
        .spawn()
        .unwrap();
    wait_line(&log, "child waiting");
    srv.kill9();
    let _srv2 = restart("uring", &srv.socket, &[]);
    let t = Instant::now();
    while !read(&log).contains("refuses this process (uid 65534)") {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the child never said why it cannot attach again:\n{}",
            read(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = read(&log);
    assert!(out.contains("--socket-group"), "no fix named: {out}");
    assert_eq!(
        out.matches("refuses this process").count(),
        1,
        "said more than once: {out}"
    );
    stop(&mut probe, libc::SIGTERM);
}
