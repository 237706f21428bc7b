//! Hot upgrade (issue 18 item 3): `tcps server --upgrade` (SIGUSR2) execs
//! the server's binary in place and carries every host and connection.
//!
//! Under load — wrk plus clients that check every body's SHA-256 on one
//! keep-alive connection each — the example web server (asynchronous
//! registered sends, receive and accept rings) and unmodified nginx under
//! `tcps run` (sendfile, fork) go through two upgrades: wrk sees no error
//! and no non-2xx answer, no checking client loses its connection or a
//! byte, the server keeps its pid, and a new host attaches afterwards.
//! Calls parked at the server (a blocking recv, accept, poll) are
//! answered with ERETRY and re-issued by the host library: they return
//! what arrives after the upgrade. Bytes read ahead and not yet taken (a
//! receive ring, a pull buffer) arrive intact after it, and the server
//! holds as many descriptors after it as before. Refusals leave the old server running:
//! a new binary that cannot load the state record, and sends that do not
//! finish (a peer that does not read) — the bytes arrive intact later —,
//! and a server with remote (fabric) hosts.
//! Signals that arrive during an upgrade are kept (SIGTERM stops the new
//! image cleanly). Every scenario but the fabric and signal ones runs on
//! both engines.

mod common;
mod preload;

use common::*;
use preload::{free_port, need, start_nginx, wait_port, Daemon, Net};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Files of the site: name → contents (seeded random bytes).
fn site(dir: &Path) -> HashMap<String, Vec<u8>> {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let mut rng = Rng::new(18);
    let mut files = HashMap::new();
    for (name, len) in [
        ("small.html", 700),
        ("mid.bin", 64 << 10),
        ("big.bin", 1 << 20),
    ] {
        let bytes = rng.bytes(len);
        std::fs::write(www.join(name), &bytes).unwrap();
        files.insert(name.to_string(), bytes);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    files
}

/// The example web server, built against this tree's libtcps.so.
fn webserver(dir: &Path) -> PathBuf {
    let target = Path::new(TCPS).parent().unwrap();
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "tcps-host"])
        .current_dir(&ws)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "cargo build -p tcps-host failed");
    let out = dir.join("webserver");
    let st = Command::new("cc")
        .args(["-O2", "-pthread", "-I"])
        .arg(ws.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(ws.join("examples/webserver.c"))
        .arg("-L")
        .arg(target)
        .arg("-ltcps")
        .arg(format!("-Wl,-rpath,{}", target.display()))
        .status()
        .expect("cc (build-essential) builds examples/webserver.c");
    assert!(st.success(), "cc examples/webserver.c failed");
    out
}

/// What the checking clients saw.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    problems: Mutex<Vec<String>>,
}

/// One response on a keep-alive connection: status and body.
fn response(r: &mut BufReader<TcpStream>) -> std::io::Result<(String, Vec<u8>)> {
    let mut status = String::new();
    r.read_line(&mut status)?;
    let mut len = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = vec![0u8; len.ok_or(std::io::ErrorKind::InvalidData)?];
    r.read_exact(&mut body)?;
    Ok((status.trim().to_string(), body))
}

/// A client on one keep-alive connection until `stop`: fetches every file
/// in turn and compares its SHA-256. A lost connection is a problem.
fn checker(port: u16, files: Arc<HashMap<String, Vec<u8>>>, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    let want: Vec<(String, String)> = files
        .iter()
        .map(|(n, b)| (n.clone(), hex(&sha256(b))))
        .collect();
    let conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    while !stop.load(Ordering::Relaxed) {
        for (name, sum) in &want {
            let req = format!("GET /{name} HTTP/1.1\r\nHost: t\r\n\r\n");
            let got = w.write_all(req.as_bytes()).and_then(|_| response(&mut r));
            match got {
                Ok((status, body)) if status.contains(" 200") && hex(&sha256(&body)) == *sum => {
                    t.requests.fetch_add(1, Ordering::Relaxed);
                }
                Ok((status, body)) => {
                    let p = format!("/{name}: {status}, {} bytes, wrong bytes", body.len());
                    t.problems.lock().unwrap().push(p);
                    return;
                }
                Err(e) => {
                    t.problems
                        .lock()
                        .unwrap()
                        .push(format!("/{name}: connection lost: {e}"));
                    return;
                }
            }
        }
    }
}

/// wrk for `secs` seconds against /mid.bin (a thread); its output.
fn wrk(port: u16, secs: u32) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut cmd = Command::new("wrk");
        cmd.args(["-t2", "-c16", &format!("-d{secs}s")])
            .arg(format!("http://127.0.0.1:{port}/mid.bin"));
        let out = output(cmd);
        assert!(out.status.success(), "wrk failed");
        String::from_utf8_lossy(&out.stdout).to_string()
    })
}

/// Runs `cmd` to its end (forking under `FORKING`, see `no_forks`).
fn output(mut cmd: Command) -> std::process::Output {
    let child = {
        let _forking = FORKING.read().unwrap_or_else(|p| p.into_inner());
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    child.wait_with_output().unwrap()
}

/// `tcps server --upgrade`: its exit status and output.
fn upgrade(srv: &Server) -> (bool, String) {
    let mut cmd = Command::new(TCPS);
    cmd.args(["server", "--upgrade", "--socket"])
        .arg(&srv.socket);
    let out = output(cmd);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[track_caller]
fn upgrade_ok(srv: &Server) {
    let (ok, text) = upgrade(srv);
    assert!(ok, "upgrade failed: {text}\n{}", srv.log_text());
}

fn upgrades_done(srv: &Server) -> u64 {
    srv.stat_json()["server"]["upgrade"]["done"]
        .as_u64()
        .unwrap()
}

/// A new host attaches and echoes 1 MiB through a listener of its own.
fn new_host_served(srv: &Server) {
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let payload = Rng::new(7).bytes(1 << 20);
    let p2 = payload.clone();
    let client = std::thread::spawn(move || kernel_echo_client(addr, &p2));
    let (s, _) = c.accept(l, 0).unwrap();
    tcps_serve_echo(&c, s);
    let got = client.join().unwrap();
    assert_eq!(
        hex(&sha256(&got)),
        hex(&sha256(&payload)),
        "new host's echo corrupted"
    );
}

/// wrk and 4 checking clients against `port` for 6 s with two upgrades
/// in the middle; asserts nothing failed, nothing was lost, same pid.
fn two_upgrades_under_load(srv: &Server, port: u16, files: HashMap<String, Vec<u8>>) {
    let pid = srv.pid();
    let files = Arc::new(files);
    let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let wrk = wrk(port, 6);
    let checkers: Vec<_> = (0..4)
        .map(|_| {
            let (f, s, t) = (files.clone(), stop.clone(), tally.clone());
            std::thread::spawn(move || checker(port, f, s, t))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let before = tally.requests.load(Ordering::Relaxed);
    upgrade_ok(srv);
    std::thread::sleep(Duration::from_millis(1500));
    upgrade_ok(srv);
    std::thread::sleep(Duration::from_millis(1500));
    let after = tally.requests.load(Ordering::Relaxed);
    let text = wrk.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for c in checkers {
        c.join().unwrap();
    }
    let problems = tally.problems.lock().unwrap().clone();
    assert!(
        problems.is_empty(),
        "checking clients: {problems:?}\n{}",
        srv.log_text()
    );
    assert!(
        after > before,
        "the checking clients made no progress across the upgrades"
    );
    assert!(
        !text.contains("Non-2xx"),
        "wrk saw non-2xx answers:\n{text}"
    );
    assert!(
        !text.contains("Socket errors"),
        "wrk saw socket errors:\n{text}"
    );
    assert!(
        text.contains(" requests in "),
        "wrk ran no requests:\n{text}"
    );
    assert_eq!(srv.pid(), pid);
    assert_eq!(srv.stat_json()["server"]["pid"].as_u64(), Some(pid as u64));
    assert_eq!(upgrades_done(srv), 2);
    eprintln!(
        "{} checked requests; wrk:\n{text}",
        tally.requests.load(Ordering::Relaxed)
    );
    new_host_served(srv);
}

fn webserver_under_wrk(engine: &str) {
    need("wrk");
    let dir = TempDir::new("upgrade-web");
    let files = site(dir.path());
    let srv = Server::start(engine, &["--poll", "adaptive"]);
    let port = free_port();
    let log = dir.path().join("web.log");
    let mut web = Daemon(
        Command::new(webserver(dir.path()))
            .args(["--net", "tcps", "--mode", "async-registered"])
            .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
            .arg("--root")
            .arg(dir.path().join("www"))
            .args(["--threads", "32", "--quiet"])
            .env("TCPS_SOCKET", &srv.socket)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_port(port, &mut web.0, "webserver", &log);
    two_upgrades_under_load(&srv, port, files);
    assert!(web.0.try_wait().unwrap().is_none(), "the web server died");
}

fn nginx_under_wrk(engine: &str) {
    need("wrk");
    need("nginx");
    let dir = TempDir::new("upgrade-nginx");
    let files = site(dir.path());
    let srv = Server::start(engine, &["--poll", "adaptive"]);
    let port = free_port();
    let www = dir.path().join("www");
    let (mut nginx, _stats, _log) =
        start_nginx(Net::Tcps, &srv, dir.path(), &www, port, true, "up");
    two_upgrades_under_load(&srv, port, files);
    assert!(nginx.0.try_wait().unwrap().is_none(), "nginx died");
}

engine_tests!(webserver_under_wrk, nginx_under_wrk);

/// Calls parked at the server cross the upgrade: a blocking recv (no
/// read-ahead), a blocking accept (no accept-ahead) and a poll are
/// answered with ERETRY and re-issued by the host library; each returns
/// what arrives after the upgrade.
fn parked_calls_are_reissued(engine: &str) {
    let srv = Server::start(engine, &["--eager-recv", "off", "--eager-accept", "off"]);
    let c = Arc::new(srv.attach());
    let (l, addr) = tcps_listener(&c);
    let mut k = TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    let c2 = c.clone();
    let recv = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let n = c2.recv(s, &mut buf, 0).expect("the parked recv");
        buf[..n].to_vec()
    });
    let c3 = c.clone();
    let accept = std::thread::spawn(move || c3.accept(l, 0).map(|(s, _)| s));
    let c4 = c.clone();
    let poll = std::thread::spawn(move || {
        let mut fds = [tcps::PollFd {
            sock: s,
            events: libc::POLLPRI,
            revents: 0,
        }];
        c4.poll(&mut fds, 4000).map(|n| (n, fds[0].revents))
    });
    // Parked: the server shows them.
    let t = Instant::now();
    loop {
        let d = &srv.stat_json()["total"]["depths"];
        if d["parked_calls"].as_u64() == Some(2) && d["parked_polls"].as_u64() == Some(1) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "calls never parked: {d}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    upgrade_ok(&srv);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !recv.is_finished() && !accept.is_finished() && !poll.is_finished(),
        "a parked call returned at the upgrade"
    );
    k.write_all(b"after the upgrade").unwrap();
    assert_eq!(recv.join().unwrap(), b"after the upgrade");
    let _k2 = TcpStream::connect(addr).unwrap();
    accept.join().unwrap().expect("the parked accept");
    let (n, revents) = poll.join().unwrap().expect("the parked poll");
    assert_eq!(
        (n, revents),
        (0, 0),
        "the poll times out as before the upgrade"
    );
    assert_eq!(upgrades_done(&srv), 1);
}

/// Starts a server from a copy of the tcps binary in `dir` (what an
/// upgrade execs is that file).
fn server_from_copy(engine: &str, dir: &TempDir) -> (Server, PathBuf) {
    let exe = dir.path().join("tcps");
    {
        // No child of this test process holds the copy open for writing
        // when the server (or its upgrade) executes it (ETXTBSY).
        let _quiet = no_forks();
        std::fs::copy(TCPS, &exe).unwrap();
    }
    let socket = dir.path().join("tcps.sock");
    let log = dir.path().join("server.log");
    let child = {
        let _forking = FORKING.read().unwrap_or_else(|p| p.into_inner());
        Command::new(&exe)
            .args(["server", "--engine", engine, "--balance", "off", "--socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap()
    };
    let srv = Server {
        child: Some(child),
        socket,
        log,
        engine: engine.into(),
        dir: TempDir::new("upgrade-copy-srv"),
    };
    let t = Instant::now();
    while !srv.log_text().contains("tcps server listening") {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
    srv.wait_signals_handled();
    (srv, exe)
}

/// An echo through a host's connection (one round trip).
fn echo_once(c: &tcps::Client, s: u32, k: &mut TcpStream, msg: &[u8]) {
    k.write_all(msg).unwrap();
    let got = tcps_recv_exact(c, s, msg.len()).unwrap();
    c.send_all(s, &got).unwrap();
    let mut back = vec![0u8; msg.len()];
    k.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
}

/// A new binary that cannot load the state record: refused before
/// anything stops; the old server keeps its connection and serves on.
fn a_binary_that_cannot_load_the_record_is_refused(engine: &str) {
    let dir = TempDir::new("upgrade-refused");
    let (srv, exe) = server_from_copy(engine, &dir);
    let pid = srv.pid();
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let mut k = TcpStream::connect(addr).unwrap();
    k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    echo_once(&c, s, &mut k, b"before");
    // The "new binary": knows no record version.
    let new = dir.path().join("tcps.new");
    {
        let _quiet = no_forks();
        let script = "#!/bin/sh\necho \"tcps: cannot load state record version $3\" >&2\nexit 1\n";
        std::fs::write(&new, script).unwrap();
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&new, &exe).unwrap();
    }
    let (ok, text) = upgrade(&srv);
    assert!(
        !ok,
        "an upgrade to a binary that cannot load the record succeeded: {text}"
    );
    assert!(text.contains("cannot load state record version"), "{text}");
    assert!(
        srv.log_text().contains("hot upgrade refused"),
        "{}",
        srv.log_text()
    );
    echo_once(&c, s, &mut k, b"after the refusal");
    assert_eq!(srv.pid(), pid);
    let u = &srv.stat_json()["server"]["upgrade"];
    assert_eq!(
        (u["done"].as_u64(), u["refused"].as_u64()),
        (Some(0), Some(1)),
        "{u}"
    );
    new_host_served(&srv);
}

/// Sends that cannot finish (the peer does not read): the upgrade waits
/// 2 s, is refused, and the old server goes on; every byte arrives once
/// the peer reads, and then an upgrade succeeds.
fn sends_that_do_not_finish_refuse_the_upgrade(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive"]);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let k = TcpStream::connect(addr).unwrap();
    set_rcvbuf(&k, 64 << 10);
    let (s, _) = c.accept(l, 0).unwrap();
    c.setsockopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, 64 << 10)
        .unwrap();
    // Eight descriptors: within the queue's credits, far beyond what the
    // two socket buffers hold.
    let payload = Rng::new(3).bytes(2 << 20);
    let mut sent = 0;
    while sent < payload.len() {
        sent += c
            .send_async(
                s,
                &payload[sent..(sent + (256 << 10)).min(payload.len())],
                0,
            )
            .unwrap();
    }
    let t = Instant::now();
    let (ok, text) = upgrade(&srv);
    assert!(!ok, "the upgrade succeeded with sends stuck: {text}");
    assert!(text.contains("did not finish within 2 s"), "{text}");
    assert!(t.elapsed() >= Duration::from_secs(2));
    let reader = std::thread::spawn(move || {
        let mut k = k;
        k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = vec![0u8; 2 << 20];
        k.read_exact(&mut got).map(|_| got)
    });
    let got = reader.join().unwrap().expect("the peer reads every byte");
    assert_eq!(hex(&sha256(&got)), hex(&sha256(&payload)));
    upgrade_ok(&srv);
    assert_eq!(upgrades_done(&srv), 1);
    new_host_served(&srv);
}

engine_tests!(
    parked_calls_are_reissued,
    a_binary_that_cannot_load_the_record_is_refused,
    sends_that_do_not_finish_refuse_the_upgrade,
);

/// Bytes the server read ahead and the host has not taken cross the
/// upgrade: in a receive ring (push) and in a pull buffer at the server
/// (pull, carried in the record); the host then reads every byte, in
/// order, and the connection goes on.
fn read_ahead_bytes_cross_the_upgrade(engine: &str) {
    for (mode, depth) in [("push", "recv_ring_bytes"), ("pull", "pull_buffer_bytes")] {
        let srv = Server::start(engine, &["--eager-recv", mode]);
        let c = srv.attach();
        let (l, addr) = tcps_listener(&c);
        let mut k = TcpStream::connect(addr).unwrap();
        k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (s, _) = c.accept(l, 0).unwrap();
        let payload = Rng::new(11).bytes(200 << 10);
        k.write_all(&payload).unwrap();
        let t = Instant::now();
        while srv.stat_json()["total"]["depths"][depth]
            .as_u64()
            .unwrap_or(0)
            == 0
        {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{mode}: nothing read ahead"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The fewest over a few looks: a stat query's connection or a
        // /proc read by the worker is open for a moment now and then.
        let fds = (0..5)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(20));
                fd_count(srv.pid())
            })
            .min()
            .unwrap_or(0);
        upgrade_ok(&srv);
        // Nothing leaks across the exec: what was not carried was closed
        // (engine, eventfds, the record), what was is open once.
        let t = Instant::now();
        let mut now = fd_count(srv.pid());
        while now != fds && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
            now = fd_count(srv.pid());
        }
        assert_eq!(now, fds, "{mode}: the server's descriptors");
        let got = tcps_recv_exact(&c, s, payload.len()).expect("read after the upgrade");
        assert_eq!(
            hex(&sha256(&got)),
            hex(&sha256(&payload)),
            "{mode}: bytes read ahead"
        );
        echo_once(&c, s, &mut k, b"and on");
    }
}

/// Descriptors process `pid` has open.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

engine_tests!(read_ahead_bytes_cross_the_upgrade);

/// A server that serves remote hosts (`--fabric-listen`) refuses: remote
/// hosts are not carried yet. It goes on serving local hosts.
#[test]
fn a_fabric_server_refuses() {
    let dir = TempDir::new("upgrade-fabric");
    let key = dir.path().join("fabric.key");
    std::fs::write(&key, "0123456789abcdef-upgrade-test-secret\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let srv = Server::start(
        "uring",
        &[
            "--fabric-listen",
            &listen,
            "--fabric-auth",
            key.to_str().unwrap(),
        ],
    );
    let (ok, text) = upgrade(&srv);
    assert!(!ok, "an upgrade with a fabric listener succeeded: {text}");
    assert!(text.contains("remote hosts"), "{text}");
    new_host_served(&srv);
}

/// Signals that arrive while the server upgrades are neither lost nor
/// fatal (SIGUSR2's default action would kill it before the new image has
/// its handlers): a second SIGUSR2 at once leaves it serving; SIGTERM
/// right after SIGUSR2 stops it cleanly (status 0, socket file removed).
#[test]
fn signals_during_an_upgrade_are_not_lost() {
    let mut srv = Server::start("uring", &[]);
    let pid = srv.pid();
    srv.signal(libc::SIGUSR2);
    srv.signal(libc::SIGUSR2);
    let t = Instant::now();
    while upgrades_done(&srv) < 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(srv.is_alive(), "the server died: {}", srv.log_text());
    assert_eq!(srv.pid(), pid);
    new_host_served(&srv);
    srv.signal(libc::SIGUSR2);
    srv.signal(libc::SIGTERM);
    // No second SIGTERM: the first must do.
    let mut child = srv.child.take().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        srv.log_text()
    );
    assert!(!srv.socket.exists(), "the socket file was not removed");
}
