//! `tcps stat`: a host makes a known set of calls through a real server, and
//! the `tcps stat` binary reports them — calls by type, bytes, round trips,
//! a parked recv as a queue depth, the host's pid in the human table, the
//! counters kept after the host detaches — and fails clearly without a server.

mod common;

use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `tcps stat --socket <socket> <extra...>`; returns (exit code, stdout, stderr).
fn stat(socket: &OsStr, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(TCPS)
        .arg("stat")
        .arg("--socket")
        .arg(socket)
        .args(extra)
        .output()
        .expect("run tcps stat");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn stat_json(srv: &Server) -> Value {
    let (code, out, err) = stat(srv.socket.as_os_str(), &["--json"]);
    assert_eq!(code, Some(0), "tcps stat --json failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("tcps stat --json: {e}:\n{out}"))
}

/// This process's host in an answer.
fn me(v: &Value) -> Option<&Value> {
    let pid = std::process::id() as u64;
    v["hosts"]
        .as_array()?
        .iter()
        .find(|h| h["pid"].as_u64() == Some(pid))
}

/// Asks until `ok` holds for an answer (the workers publish every 100 ms);
/// panics with the last answer after 5 s.
fn wait_stat(srv: &Server, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = stat_json(srv);
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reported within 5 s; last answer:\n{}",
            serde_json::to_string_pretty(&v).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn calls(h: &Value, op: &str) -> u64 {
    h["counters"]["calls"][op].as_u64().unwrap_or(0)
}

fn counter(h: &Value, name: &str) -> u64 {
    h["counters"][name].as_u64().unwrap_or(0)
}

fn parked(h: &Value) -> u64 {
    h["depths"]["parked_calls"].as_u64().unwrap_or(u64::MAX)
}

fn recv_exact(c: &tcps::Client, s: u32, n: usize, recvs: &mut u64) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; n];
    while got.len() < n {
        let k = c.recv(s, &mut buf[..n - got.len()], 0).expect("recv");
        *recvs += 1;
        assert!(k > 0, "unexpected end of stream");
        got.extend_from_slice(&buf[..k]);
    }
    got
}

fn send_exact(c: &tcps::Client, s: u32, data: &[u8], sends: &mut u64) {
    let mut off = 0;
    while off < data.len() {
        off += c.send(s, &data[off..], 0).expect("send");
        *sends += 1;
    }
}

fn stat_reports_a_host(engine: &str) {
    // Eager receive and accept off: every recv and accept is a request to
    // the server, so the counts below are exact. One host slot: a stat
    // query is no attach.
    let srv = Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--eager-recv",
            "off",
            "--eager-accept",
            "off",
            "--max-hosts",
            "1",
        ],
    );
    let c = srv.attach();
    let (mut sends, mut recvs) = (0u64, 0u64);
    let l = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let k = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let spare = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.bind(l, &"127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    c.listen(l, 16).unwrap();
    let addr = c.getsockname(l).unwrap();
    c.connect(k, &addr).unwrap();
    let (a, _) = c.accept(l, 0).unwrap();
    let ping = Rng::new(1).bytes(1000);
    let pong = Rng::new(2).bytes(500);
    send_exact(&c, k, &ping, &mut sends);
    assert_eq!(recv_exact(&c, a, ping.len(), &mut recvs), ping);
    send_exact(&c, a, &pong, &mut sends);
    assert_eq!(recv_exact(&c, k, pong.len(), &mut recvs), pong);
    // socket (counted as the server adopts the host's own socket), listen,
    // connect, accept, the data; bind and getsockname run in the host
    // (protocol v5: the server binds nothing for a local host).
    let made = 3 + 1 + 1 + 1 + sends + recvs;

    let v = wait_stat(&srv, "the host's calls", |v| {
        me(v).is_some_and(|h| calls(h, "Recv") == recvs && parked(h) == 0)
    });
    let h = me(&v).unwrap();
    let ctx = serde_json::to_string_pretty(h).unwrap();
    assert_eq!(calls(h, "Socket"), 3, "{ctx}");
    assert_eq!(calls(h, "Bind"), 0, "{ctx}");
    assert_eq!(calls(h, "Listen"), 1, "{ctx}");
    assert_eq!(calls(h, "GetSockName"), 0, "{ctx}");
    assert_eq!(calls(h, "Connect"), 1, "{ctx}");
    assert_eq!(calls(h, "Accept"), 1, "{ctx}");
    assert_eq!(calls(h, "Send"), sends, "{ctx}");
    assert_eq!(calls(h, "Recv"), recvs, "{ctx}");
    assert!(counter(h, "calls_total") >= made, "{ctx}");
    // The sockets were adopted over the control socket, not the channel.
    assert!(counter(h, "round_trips") >= made - 3, "{ctx}");
    assert_eq!(counter(h, "bytes_sent"), 1500, "{ctx}");
    assert_eq!(counter(h, "bytes_received"), 1500, "{ctx}");
    // With process-ahead off everything was on demand.
    assert_eq!(counter(h, "accepts_on_demand"), 1, "{ctx}");
    assert_eq!(counter(h, "accepts_eager"), 0, "{ctx}");
    assert_eq!(counter(h, "recvs_on_demand"), recvs, "{ctx}");
    assert_eq!(counter(h, "recvs_eager"), 0, "{ctx}");
    assert_eq!(counter(h, "bytes_eager"), 0, "{ctx}");
    assert!(h["counters"]["recv_kicks"].is_u64(), "{ctx}");
    assert_eq!(h["uid"].as_u64(), Some(unsafe { libc::getuid() } as u64));
    assert_eq!(h["depths"]["sockets"].as_u64(), Some(4), "{ctx}");
    assert_eq!(v["server"]["hosts_attached"].as_u64(), Some(1));
    assert_eq!(v["server"]["pid"].as_u64(), Some(srv.pid() as u64));
    assert!(v["total"]["counters"]["calls_total"].as_u64().unwrap() >= made);

    // A recv parked at the server shows as a queue depth while it waits.
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        c2.recv(a, &mut b, 0).expect("parked recv")
    });
    wait_stat(&srv, "one parked recv", |v| {
        me(v).is_some_and(|h| parked(h) == 1)
    });
    let mut more = 0;
    send_exact(&c, k, b"wake", &mut more);
    assert_eq!(waiter.join().unwrap(), 4);
    wait_stat(&srv, "no parked call once the recv completed", |v| {
        me(v).is_some_and(|h| parked(h) == 0 && counter(h, "bytes_received") == 1504)
    });

    // The human tables: this process's pid in a row, a TOTAL row.
    let (code, out, err) = stat(srv.socket.as_os_str(), &[]);
    assert_eq!(code, Some(0), "tcps stat: {err}");
    let pid = std::process::id().to_string();
    assert!(
        out.lines()
            .any(|l| l.starts_with("host ") && l.split_whitespace().any(|w| w == pid)),
        "no row with pid {pid}:\n{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("TOTAL")),
        "no TOTAL row:\n{out}"
    );
    assert!(out.contains("Socket=3"), "calls by type:\n{out}");

    // Detached: the host's row goes, its counters stay in the totals.
    let _ = c.close(spare);
    c.detach();
    let v = wait_stat(&srv, "the host detached", |v| {
        me(v).is_none() && v["server"]["hosts_detached"].as_u64() == Some(1)
    });
    assert_eq!(
        v["detached"]["counters"]["calls"]["Socket"].as_u64(),
        Some(3)
    );
    assert_eq!(v["total"]["counters"]["calls"]["Socket"].as_u64(), Some(3));
    assert_eq!(
        v["total"]["counters"]["bytes_received"].as_u64(),
        Some(1504)
    );
    assert_eq!(v["total"]["depths"]["parked_calls"].as_u64(), Some(0));
}

engine_tests!(stat_reports_a_host);

/// `wakes`: 0 while no host thread slept; a recv that sleeps at the host
/// until data arrives later costs (at least) one futex wake.
fn stat_counts_wakes(engine: &str) {
    let srv = Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--eager-recv",
            "off",
            "--eager-accept",
            "off",
        ],
    );
    let c = srv.attach();
    // Sockets are adopted over the control socket, bind and getsockname run
    // in the host: no completion, nobody waits.
    let l = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.bind(l, &"127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    let addr = c.getsockname(l).unwrap();
    let v = wait_stat(&srv, "the host", |v| {
        me(v).is_some_and(|h| calls(h, "Socket") == 1)
    });
    let h = me(&v).unwrap();
    assert_eq!(h["counters"]["wakes"].as_u64(), Some(0), "{h:#}");
    assert_eq!(c.stats().sleeps, 0);

    c.listen(l, 16).unwrap();
    let peer = std::net::TcpStream::connect(addr).unwrap();
    let (a, _) = c.accept(l, 0).unwrap();
    let v = wait_stat(&srv, "accepted", |v| {
        me(v).is_some_and(|h| calls(h, "Accept") == 1 && parked(h) == 0)
    });
    let before = counter(me(&v).unwrap(), "wakes");
    let sleeps = c.stats().sleeps;
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        c2.recv(a, &mut b, 0).expect("recv")
    });
    // Parked for a stat round (milliseconds): far past the host's spin.
    wait_stat(&srv, "one parked recv", |v| {
        me(v).is_some_and(|h| parked(h) == 1)
    });
    std::thread::sleep(Duration::from_millis(50));
    std::io::Write::write_all(&mut &peer, b"wake").unwrap();
    assert_eq!(waiter.join().unwrap(), 4);
    assert!(c.stats().sleeps > sleeps, "the host never slept");
    let v = wait_stat(&srv, "a wake counted", |v| {
        me(v).is_some_and(|h| counter(h, "wakes") > before)
    });
    assert!(v["total"]["counters"]["wakes"].as_u64().unwrap() > before);
    let (code, out, err) = stat(srv.socket.as_os_str(), &[]);
    assert_eq!(code, Some(0), "tcps stat: {err}");
    assert!(out.contains("WAKES"), "no WAKES column:\n{out}");
}

engine_tests!(stat_counts_wakes);

#[test]
fn stat_without_a_server() {
    let dir = TempDir::new("stat-none");
    let path = dir.path().join("tcps.sock");
    let (code, out, err) = stat(path.as_os_str(), &[]);
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains(&format!(
            "no tcps server at {} (is `tcps server` running?)",
            path.display()
        )),
        "stderr: {err}"
    );
    let (code, _, err) = stat(OsStr::new("/nonexistent"), &["--json"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("no tcps server at /nonexistent (is `tcps server` running?)"),
        "stderr: {err}"
    );
}

/// `--watch`: per-interval deltas; the second report shows no calls when
/// nothing happened in between.
#[test]
fn stat_watch_prints_deltas() {
    // Every local user may reach the socket (the default, 660, keeps uid 65534 out).
    let srv = Server::start("epoll", &["--poll", "adaptive", "--socket-mode", "666"]);
    let c = srv.attach();
    c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    wait_stat(&srv, "the socket call", |v| {
        me(v).is_some_and(|h| calls(h, "Socket") == 1)
    });
    let mut child = Command::new(TCPS)
        .arg("stat")
        .arg("--socket")
        .arg(&srv.socket)
        .args(["--watch", "0.2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run tcps stat --watch");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        let mut b = [0u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(5);
        while s.matches("calls by type").count() < 2 && Instant::now() < deadline {
            match out.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => s.push_str(&String::from_utf8_lossy(&b[..n])),
            }
        }
        s
    });
    let text = within(Duration::from_secs(10), "tcps stat --watch", move || {
        reader.join().unwrap()
    });
    let _ = child.kill();
    let _ = child.wait();
    let reports: Vec<&str> = text.split("tcps server pid").skip(1).collect();
    assert!(reports.len() >= 2, "two reports expected:\n{text}");
    assert!(reports[0].contains("Socket=1"), "first report:\n{text}");
    assert!(
        reports[1].contains("COUNTERS (last") && !reports[1].contains("Socket=1"),
        "second report shows the interval's deltas:\n{text}"
    );
}

/// Another user's `tcps stat` sees no detail of root's host, only totals
/// (root and the server's own user see every host).
#[test]
fn stat_hides_other_users_hosts() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!(
            "stat_hides_other_users_hosts: needs root to run tcps stat as another uid; skipped"
        );
        return;
    }
    // Every local user may reach the socket (the default, 660, keeps uid 65534 out).
    let srv = Server::start("epoll", &["--poll", "adaptive", "--socket-mode", "666"]);
    let c = srv.attach();
    c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    wait_stat(&srv, "the socket call", |v| {
        me(v).is_some_and(|h| calls(h, "Socket") == 1)
    });
    // A copy of tcps that uid 65534 can surely execute (srv.dir is 0755).
    let exe = srv.dir.path().join("tcps-stat-copy");
    std::fs::copy(TCPS, &exe).expect("copy tcps");
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&exe)
        .arg("stat")
        .arg("--socket")
        .arg(&srv.socket)
        .arg("--json")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run tcps stat as uid 65534");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tcps stat as uid 65534: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["viewer"]["uid"].as_u64(), Some(65534), "{text}");
    assert_eq!(
        v["viewer"]["sees_all_hosts"].as_bool(),
        Some(false),
        "{text}"
    );
    assert_eq!(v["hosts"].as_array().map(Vec::len), Some(0), "{text}");
    assert_eq!(v["hidden_hosts"].as_u64(), Some(1), "{text}");
    assert_eq!(
        v["total"]["counters"]["calls"]["Socket"].as_u64(),
        Some(1),
        "totals cover hidden hosts: {text}"
    );
}

/// `curl -s -w '\n%{http_code}' URL`: (status, body).
fn curl(url: &str) -> (String, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-w", "\n%{http_code}", url])
        .output()
        .expect("run curl (apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}

/// The value of the sample `series` (name and labels exactly as printed).
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// `--metrics-listen`: curl scrapes the same counters `tcps stat` reports,
/// in the Prometheus text format, per host and in total; a detached host's
/// series go and its counters stay in the totals. (Per-host series only
/// with `--metrics-per-host`, since security issue 12 finding 6; without it
/// see `security_budgets::metrics_totals_only_without_the_flag`.)
#[test]
fn metrics_endpoint_for_prometheus() {
    let srv = Server::start(
        "uring",
        &[
            "--poll",
            "adaptive",
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-per-host",
        ],
    );
    let addr = srv.metrics_addr();
    let url = format!("http://{addr}/metrics");
    let c = srv.attach();
    for _ in 0..3 {
        let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        c.close(s).unwrap();
    }
    let v = wait_stat(&srv, "the host's sockets", |v| {
        me(v).is_some_and(|h| calls(h, "Socket") == 3 && calls(h, "Close") == 3)
    });
    let h = me(&v).unwrap();
    let labels = format!(
        "host=\"{}\",pid=\"{}\",uid=\"{}\"",
        h["id"],
        std::process::id(),
        h["uid"]
    );
    let (code, text) = curl(&url);
    assert_eq!(code, "200", "{text}");
    assert_eq!(
        sample(
            &text,
            &format!("tcps_host_calls_total{{{labels},op=\"Socket\"}}")
        ),
        Some(3),
        "{text}"
    );
    assert_eq!(
        sample(&text, "tcps_calls_total{op=\"Close\"}"),
        Some(3),
        "{text}"
    );
    assert_eq!(
        sample(&text, "tcps_round_trips_total"),
        v["total"]["counters"]["round_trips"].as_u64(),
        "{text}"
    );
    assert_eq!(sample(&text, "tcps_hosts_attached"), Some(1), "{text}");
    assert_eq!(
        sample(&text, &format!("tcps_host_sockets{{{labels}}}")),
        Some(0),
        "{text}"
    );
    // The exposition format: every sample after its family's TYPE line,
    // a metric name, optional labels, an integer.
    let mut typed = std::collections::HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(kind == "counter" || kind == "gauge", "{line}");
            typed.insert(name.to_string());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("series value");
        assert!(value.parse::<u64>().is_ok(), "{line}");
        let name = series.split('{').next().unwrap_or("");
        assert!(typed.contains(name), "sample before its TYPE: {line}");
        assert!(
            name.starts_with("tcps_")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
    }
    let (code, _) = curl(&format!("http://{addr}/other"));
    assert_eq!(code, "404");

    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = curl(&url);
        if sample(&text, "tcps_hosts_detached_total") == Some(1) {
            assert_eq!(sample(&text, "tcps_hosts_attached"), Some(0), "{text}");
            assert!(!text.contains(&labels), "{text}");
            assert_eq!(
                sample(&text, "tcps_calls_total{op=\"Socket\"}"),
                Some(3),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "detach not seen:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
