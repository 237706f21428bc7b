//! Helpers of the preload end-to-end tests: the preload library, programs
//! run through `tcps run` or on kernel sockets, free ports, and the
//! per-process summary lines the library writes (TCPS_PRELOAD_STATS).
#![allow(dead_code)]

use crate::common::{die_with_parent, wait_timeout, Server, TempDir, TCPS};
use serde_json::Value;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `libtcps_preload.so`, built once per test binary (`cargo test` does not
/// build cdylib-only crates for an integration test).
pub fn preload_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(TCPS).parent().expect("target dir").to_path_buf();
        let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let st = Command::new(env!("CARGO"))
            .args(["build", "--release", "-p", "tcps-preload"])
            .current_dir(&ws)
            .stdout(Stdio::null())
            .status()
            .expect("run cargo build -p tcps-preload");
        assert!(st.success(), "cargo build -p tcps-preload failed");
        let lib = dir.join("libtcps_preload.so");
        assert!(lib.is_file(), "{} missing after the build", lib.display());
        lib
    })
    .clone()
}

/// Panics (the test fails, it is not skipped) if `prog` is not installed.
pub fn need(prog: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{prog} is not installed (scripts/test.sh installs it from Debian packages)"
    );
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

/// Waits until something accepts on 127.0.0.1:`port`.
pub fn wait_port(port: u16, child: &mut Child, what: &str, log: &Path) {
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited ({st}) before listening:\n{}", read(log));
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what} never listened on {port}:\n{}",
            read(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client of an echo server on 127.0.0.1:`port`: sends `data` (then
/// shuts down its writing side) while it reads the echo to EOF; whether
/// every byte came back in order.
pub fn echo_client(port: u16, data: Vec<u8>) -> bool {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut w = s.try_clone().expect("clone");
    let want = crate::common::sha256(&data);
    let writer = std::thread::spawn(move || {
        w.write_all(&data).expect("write");
        w.shutdown(std::net::Shutdown::Write).expect("shutdown");
    });
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("read");
    writer.join().expect("writer");
    crate::common::sha256(&got) == want
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// How a program's sockets are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    Kernel,
    Tcps,
}

/// A command run on kernel sockets, or through `tcps run --socket` with a
/// stats file; output to `log`.
pub fn command(net: Net, server: &Server, stats: &Path, log: &Path, argv: &[&str]) -> Command {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open log");
    let mut c = match net {
        Net::Kernel => Command::new(argv[0]),
        Net::Tcps => {
            let mut c = Command::new(TCPS);
            c.arg("run").arg("--socket").arg(&server.socket).arg("--");
            c.arg(argv[0]);
            c
        }
    };
    c.args(&argv[1..])
        .env("TCPS_PRELOAD_LIB", preload_lib())
        .env("TCPS_PRELOAD_STATS", stats)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("dup log"))
        .stderr(f);
    die_with_parent(&mut c);
    c
}

/// redis-server on 127.0.0.1:`port` (no persistence, files in `dir`) on
/// `net`, listening when this returns.
pub fn redis_server(
    net: Net,
    server: &Server,
    stats: &Path,
    log: &Path,
    port: u16,
    dir: &Path,
) -> Child {
    let p = port.to_string();
    let argv = [
        "redis-server",
        "--port",
        &p,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir.to_str().expect("a UTF-8 path"),
    ];
    let mut child = command(net, server, stats, log, &argv)
        .spawn()
        .expect("spawn redis-server");
    wait_port(port, &mut child, "redis-server", log);
    child
}

/// One process's summary line from the stats file.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub pid: u32,
    pub exe: String,
    pub offloaded: u64,
    pub accepted: u64,
    pub kernel_tcp: u64,
    pub sendfile_bytes: u64,
    pub epoll_passes: u64,
    pub epoll_looks: u64,
    /// Connections handed over as kernel sockets (balancing).
    pub direct: u64,
}

pub fn summaries(stats: &Path) -> Vec<Summary> {
    read(stats)
        .lines()
        .map(|l| {
            let mut s = Summary::default();
            for kv in l.split_whitespace() {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                let n = v.parse().unwrap_or(0);
                match k {
                    "pid" => s.pid = n as u32,
                    "exe" => s.exe = v.to_string(),
                    "offloaded" => s.offloaded = n,
                    "accepted" => s.accepted = n,
                    "kernel_tcp" => s.kernel_tcp = n,
                    "sendfile_bytes" => s.sendfile_bytes = n,
                    "epoll_passes" => s.epoll_passes = n,
                    "epoll_looks" => s.epoll_looks = n,
                    "direct" => s.direct = n,
                    _ => {}
                }
            }
            s
        })
        .collect()
}

/// Stops `child` with `sig` and waits (bounded) for it to exit.
pub fn stop(child: &mut Child, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    if wait_timeout(child, Duration::from_secs(10)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Runs `argv` to completion (bounded), returning (success, stdout+stderr).
pub fn run_to_end(mut c: Command, log: &Path, limit: Duration) -> bool {
    let mut child = c.spawn().expect("spawn");
    match wait_timeout(&mut child, limit) {
        Some(st) => st.success(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{:?} did not finish within {limit:?}:\n{}",
                c.get_program(),
                read(log)
            );
        }
    }
}

/// Waits (bounded) until the stats file has `n` lines.
pub fn wait_summaries(stats: &Path, n: usize) -> Vec<Summary> {
    let t = Instant::now();
    loop {
        let s = summaries(stats);
        if s.len() >= n || t.elapsed() > Duration::from_secs(10) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon with worker processes (nginx): SIGTERMed on drop, so a failing
/// test does not leave workers behind (its master alone would get the
/// PDEATHSIG).
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            stop(&mut self.0, libc::SIGTERM);
        }
    }
}

/// The host of process `pid` in `tcps stat --json`.
pub fn stat_host(srv: &Server, pid: u32) -> Option<Value> {
    let out = Command::new(TCPS)
        .args(["stat", "--socket"])
        .arg(&srv.socket)
        .arg("--json")
        .output()
        .expect("run tcps stat");
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["hosts"]
        .as_array()?
        .iter()
        .find(|h| h["pid"].as_u64() == Some(u64::from(pid)))
        .cloned()
}

/// Runs `prog args...` with `env` added (`{port}` in `args`: a kernel listener's port here)
/// through the server, lets `peer` talk to it over the accepted connection
/// (returning the bytes the host was to send), then returns the host's
/// round trips once the server sent that many bytes.
pub fn host_counters(
    srv: &Server,
    dir: &TempDir,
    prog: &str,
    args: &[&str],
    env: &[(&str, &str)],
    peer: impl FnOnce(&mut TcpStream, &str) -> u64,
) -> Value {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let tag = format!("{}-{}", args[0], env.len());
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let mut argv = vec!["python3", prog];
    argv.extend(
        args.iter()
            .map(|&a| if a == "{port}" { &port[..] } else { a }),
    );
    let mut cmd = command(Net::Tcps, srv, &stats, &log, &argv);
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn");
    let (mut k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let want = peer(&mut k, &format!("{tag}: {}", log.display()));
    let h = counters_once_sent(srv, child.id(), want);
    let _ = child.kill();
    let _ = child.wait();
    let h = h.unwrap_or_else(|| panic!("{tag}: host not in tcps stat\n{}", read(&log)));
    eprintln!("{tag}: {}", serde_json::to_string(&h).unwrap());
    h
}

/// The counters of the host `pid` in `tcps stat` once they show `want`
/// bytes sent (the server publishes them every 100 ms; at most 5 s):
/// the last seen, None if the host never showed.
pub fn counters_once_sent(srv: &Server, pid: u32, want: u64) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(h) = stat_host(srv, pid) {
            let sent = h["counters"]["bytes_sent"].as_u64().unwrap_or(0);
            last = Some(h["counters"].clone());
            if sent >= want {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    last
}

/// An nginx configuration: master + 2 workers, static files from `www`.
pub fn nginx_conf(
    dir: &std::path::Path,
    www: &std::path::Path,
    port: u16,
    sendfile: bool,
) -> String {
    let d = dir.display();
    format!(
        "worker_processes 2;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log notice;\nevents {{ worker_connections 512; }}\n\
         http {{\n access_log off;\n sendfile {};\n keepalive_requests 100000;\n\
         client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n\
         uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
         server {{ listen 127.0.0.1:{port}; root {}; }}\n}}\n",
        if sendfile { "on" } else { "off" },
        www.display()
    )
}

/// nginx (`nginx_conf`: master + 2 workers serving `www` on `port`) on
/// `net`, its summaries in `DIR/TAG.stats` (writable by the workers, which
/// run as nobody) and its output in `DIR/TAG.log`; listening when this
/// returns. Returns the daemon and those two paths.
pub fn start_nginx(
    net: Net,
    srv: &Server,
    dir: &Path,
    www: &Path,
    port: u16,
    sendfile: bool,
    tag: &str,
) -> (Daemon, PathBuf, PathBuf) {
    start_nginx_with(
        net,
        srv,
        dir,
        &nginx_conf(dir, www, port, sendfile),
        port,
        tag,
    )
}

/// nginx with configuration `text` (written to `DIR/TAG.conf`) on `net`,
/// as [`start_nginx`]; listening on `port` when this returns.
pub fn start_nginx_with(
    net: Net,
    srv: &Server,
    dir: &Path,
    text: &str,
    port: u16,
    tag: &str,
) -> (Daemon, PathBuf, PathBuf) {
    let conf = dir.join(format!("{tag}.conf"));
    std::fs::write(&conf, text).unwrap();
    let stats = dir.join(format!("{tag}.stats"));
    std::fs::write(&stats, b"").unwrap();
    std::fs::set_permissions(&stats, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let log = dir.join(format!("{tag}.log"));
    let argv = [
        "nginx",
        "-c",
        conf.to_str().unwrap(),
        "-p",
        dir.to_str().unwrap(),
    ];
    let mut nginx = Daemon(
        command(net, srv, &stats, &log, &argv)
            .spawn()
            .expect("spawn nginx"),
    );
    wait_port(port, &mut nginx.0, "nginx", &log);
    (nginx, stats, log)
}

/// wrk's request count, failing on non-2xx answers or errors other than
/// the connections it tears down at the end.
pub fn wrk_requests(port: u16, path: &str) -> u64 {
    let out = Command::new("wrk")
        .args([
            "-t2",
            "-c16",
            "-d2s",
            &format!("http://127.0.0.1:{port}/{path}"),
        ])
        .output()
        .expect("wrk");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "wrk failed:\n{text}");
    assert!(!text.contains("Non-2xx"), "wrk saw errors:\n{text}");
    assert!(
        !text.contains("Socket errors"),
        "wrk saw socket errors:\n{text}"
    );
    text.lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .map(|(n, _)| n.trim().parse().unwrap_or(0))
        })
        .unwrap_or_else(|| panic!("no request count in wrk output:\n{text}"))
}

/// Waits (at most 10 s) until `log` has a line starting with `prefix`;
/// returns that line.
pub fn wait_line(log: &Path, prefix: &str) -> String {
    let t = Instant::now();
    loop {
        if let Some(l) = read(log).lines().find(|l| l.starts_with(prefix)) {
            return l.to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no {prefix:?} line:\n{}",
            read(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `msg` and reads back exactly as many bytes: the same bytes.
pub fn echo(s: &mut TcpStream, msg: &[u8]) {
    use std::io::{Read, Write};
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
}

/// nginx's master and its workers (from /proc), in pid order.
pub fn nginx_pids(master: u32) -> Vec<u32> {
    let kids = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
        .unwrap_or_default();
    let mut pids: Vec<u32> = kids
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    pids.push(master);
    pids.sort();
    pids
}
