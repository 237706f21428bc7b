//! The cluster deployment with network namespaces as nodes (issue 17,
//! `docs/DEPLOYMENT.md`): `tcps-app-<pid>` (the application node),
//! `tcps-srv-<pid>` (the TCP-server node) and `tcps-cli-<pid>` (clients),
//! joined by veth pairs with addresses that exist only inside them
//! (10.78.x.y, 10.79.x.y), deleted at the end however the test ends
//! (`src/cluster_nodes.rs`, shared with `tcps bench cluster`). Needs root
//! and UCX (the setup installs libucx-dev); it skips nothing.
//!
//! The server runs in the server namespace with `--fabric-listen` on its
//! link to the application node. A remote host process in the application
//! namespace is refused with a wrong secret, attaches with the right one
//! (`tcps stat` and the metrics show its link up, with traffic both ways),
//! and when its link is cut or it is killed the server frees it (the link
//! shown lost, and why). The example web server, nginx and redis serve
//! clients on the client node through the server node (files compared by
//! checksum), and a cut link fails a blocked call within a second.

mod cluster_common;
mod common;
mod fabric_host;

use cluster_common::start_server;
use cluster_common::*;
use common::*;
use fabric_host::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tcps_proto::msg::Op;

#[path = "../src/cluster_nodes.rs"]
#[allow(dead_code)] // remove_stale and the client-to-application link: the bench's
mod cluster_nodes;
use cluster_nodes::Nodes;

/// `tcps stat`'s fabric links once `ready` holds for them (they are
/// published every 100 ms), within 3 s.
fn links_when(socket: &Path, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let f = stat_json(socket)["fabric"].clone();
        if ready(&f) || t.elapsed() > Duration::from_secs(3) {
            return f;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const LINK_COUNTERS: [&str; 4] = [
    "messages_sent",
    "bytes_sent",
    "messages_received",
    "bytes_received",
];

/// The server node's Prometheus text (`--metrics-listen`, per host).
fn metrics(n: &Nodes) -> String {
    let url = format!("http://{METRICS}/metrics");
    let out = in_ns(&n.srv, &["curl", "-sf", "--max-time", "5", &url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The live remote host's link in `tcps stat`: its address on the
/// application link, up, heard from within a keepalive or two, traffic
/// both ways; the text report shows the same row.
fn assert_link_up(n: &Nodes, socket: &Path, addr: &str) -> serde_json::Value {
    let f = links_when(socket, |f| f["hosts_up"] == 1);
    assert_eq!(f["listen"], addr, "{f}");
    assert_eq!(f["hosts_up"], 1, "{f}");
    let link = f["hosts"][0].clone();
    assert_eq!(link["state"], "up", "{f}");
    let peer = link["addr"].as_str().unwrap_or("");
    assert!(peer.starts_with(&format!("{}:", n.app_addr)), "{f}");
    assert!(
        link["last_heard_ms"].as_u64().unwrap_or(u64::MAX) < 800,
        "{f}"
    );
    for k in LINK_COUNTERS {
        assert!(link["counters"][k].as_u64().unwrap_or(0) > 0, "{k}: {f}");
    }
    let text = Command::new(TCPS)
        .args(["stat", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let row = format!("host {}", link["host"]);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&row) && l.contains(peer) && l.contains(" up ")),
        "{text}"
    );
    // Its rows in the other tables name no local process.
    assert!(
        text.lines()
            .any(|l| l.starts_with(&row) && l.contains("(remote)")),
        "{text}"
    );
    f
}

/// The remote host (run by `cluster_remote_host_across_namespaces` in the
/// application namespace): attaches, prints its status, runs a call,
/// prints READY and waits to be killed.
#[test]
#[ignore]
fn cluster_host_child() {
    let (Ok(addr), Ok(secret)) = (std::env::var("FABRIC_ADDR"), std::env::var("FABRIC_SECRET"))
    else {
        return;
    };
    let (r, w) = attach(addr.parse().unwrap(), &secret);
    println!("STATUS {}", w.status);
    if w.status != 0 {
        return;
    }
    let layout = layout_of(&w);
    let (_file, host) = host_region(layout);
    let done = nop_round_trip(&r, &layout, &host, 77);
    assert_eq!(
        (done.user_data, done.op, done.errno),
        (77, Op::Nop as u16, 0)
    );
    println!("READY");
    loop {
        r.keepalive();
        r.worker.wait(Some(Duration::from_millis(100)));
        while r.worker.take_am().is_some() {}
    }
}

fn host_child(n: &Nodes, addr: &str, secret: &str) -> InNs {
    let exe = std::env::current_exe().unwrap();
    InNs(
        Command::new("ip")
            .args(["netns", "exec", &n.app])
            .arg(exe)
            .args(["--exact", "cluster_host_child", "--ignored", "--nocapture"])
            .env("FABRIC_ADDR", addr)
            .env("UCX_NET_DEVICES", &n.app_dev)
            .env("FABRIC_SECRET", secret)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// The child's stdout lines until `until` (or its end).
/// A host process on the application node, attached with the right
/// secret (it printed READY) and counted by the server node.
fn attached_host(
    n: &Nodes,
    addr: &str,
    socket: &std::path::Path,
    server_log: &dyn Fn() -> String,
) -> InNs {
    let mut host = host_child(n, addr, SECRET);
    let lines = lines_until(&mut host, "READY");
    assert!(
        lines.iter().any(|l| l == "READY"),
        "{lines:?}\n{}",
        server_log()
    );
    assert_eq!(hosts_attached(socket), 1);
    host
}

fn lines_until(c: &mut InNs, until: &str) -> Vec<String> {
    let mut lines = BufReader::new(c.0.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    for line in lines.by_ref().map_while(Result::ok) {
        let stop = line.contains(until);
        got.push(line);
        if stop {
            break;
        }
    }
    // Keep reading what it prints after (its test harness' report).
    std::thread::spawn(move || lines.for_each(drop));
    got
}

#[test]
fn cluster_remote_host_across_namespaces() {
    let n = nodes();
    // The client node's link to the server node is up.
    let out = Command::new("ip")
        .args(["-n", &n.cli, "-br", "addr", "show"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let want = n.srv_cli_addr.trim_end_matches(".1").to_string() + ".2/24";
    assert!(
        text.lines().any(|l| l.contains("UP") && l.contains(&want)),
        "{text}"
    );
    let dir = TempDir::new("cluster");
    key_file(dir.path(), "fabric.key", SECRET);
    let (server, socket, log, addr) = start_server(&n, dir.path());
    let server_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // A wrong secret from the application node: refused.
    let mut wrong = host_child(&n, &addr, "0123456789abcdef-a-wrong-secret\n");
    let lines = lines_until(&mut wrong, "STATUS");
    assert!(
        lines
            .iter()
            .any(|l| l == &format!("STATUS {}", libc::EACCES)),
        "{lines:?}\n{}",
        server_log()
    );
    assert_eq!(hosts_attached(&socket), 0);

    // The right one: attached, a call through the server node; `tcps
    // stat` shows its link up with traffic both ways.
    let host = attached_host(&n, &addr, &socket, &server_log);
    let up = assert_link_up(&n, &socket, &addr);
    // The metrics say the same: one link up, traffic, the host's series.
    let m = metrics(&n);
    assert!(m.contains("tcps_fabric_hosts_up 1\n"), "{m}");
    let labels = format!("host=\"{}\"", up["hosts"][0]["host"]);
    let link_up = format!("tcps_host_fabric_link_up{{{labels},");
    assert!(
        m.lines()
            .any(|l| l.starts_with(&link_up) && l.contains("state=\"up\"") && l.ends_with(" 1")),
        "{m}"
    );
    assert!(
        !m.contains("tcps_fabric_messages_received_total 0\n"),
        "{m}"
    );

    // The link between the nodes is cut: the host falls silent and the
    // server node frees it within its silence limit (1 s); `tcps stat`
    // shows the link lost, and why; the totals keep its traffic.
    ip(&["-n", &n.app, "link", "set", &n.app_dev, "down"]);
    let took = wait_freed(&socket, Duration::from_secs(3), &server_log);
    eprintln!("cut link: host freed after {took:?}");
    assert!(server_log().contains("silent"), "{}", server_log());
    let f = links_when(&socket, |f| f["hosts_up"] == 0);
    assert_eq!(
        (&f["hosts_up"], &f["hosts_lost"]),
        (&0.into(), &1.into()),
        "{f}"
    );
    let lost = &f["hosts"][0];
    assert_eq!(lost["host"], up["hosts"][0]["host"], "{f}");
    assert_eq!(lost["state"], "lost", "{f}");
    assert!(lost["why"].as_str().unwrap_or("").contains("silent"), "{f}");
    assert!(lost["last_heard_ms"].as_u64().unwrap_or(0) >= 800, "{f}");
    let m = metrics(&n);
    assert!(m.contains("tcps_fabric_hosts_up 0\n"), "{m}");
    assert!(m.contains("tcps_fabric_hosts_lost_total 1\n"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with(&link_up) && l.contains("state=\"lost\"") && l.ends_with(" 0")),
        "{m}"
    );
    for k in LINK_COUNTERS {
        let (a, b) = (&up["total"][k], &f["total"][k]);
        assert!(
            b.as_u64() >= a.as_u64() && b.as_u64() > Some(0),
            "{k}: {up} {f}"
        );
    }
    drop(host);
    ip(&["-n", &n.app, "link", "set", &n.app_dev, "up"]);

    // Another host, killed: the server node frees it.
    let host = attached_host(&n, &addr, &socket, &server_log);
    drop(host);
    wait_freed(&socket, Duration::from_secs(5), &server_log);
    assert!(
        server_log().contains("remote host gone"),
        "{}",
        server_log()
    );
    let f = links_when(&socket, |f| f["hosts_lost"] == 2);
    assert_eq!(f["hosts_lost"], 2, "{f}");
    assert_eq!(f["hosts"][0]["state"], "lost", "{f}");
    let why = f["hosts"][0]["why"].as_str().unwrap_or("");
    assert!(
        why.contains("endpoint failed") || why.contains("send failed"),
        "{f}"
    );
    drop(server);
}

// Programs on the application node served through the TCP-server node;
// clients on the client node reach them only through it (the client node
// has no route to the application node).

fn webserver() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let web = repo.join("examples/build/webserver");
    if !web.is_file() {
        let ok = Command::new("make")
            .arg("-C")
            .arg(&repo)
            .arg("examples")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "make examples failed");
    }
    web
}

/// The example web server, a native host attached with `TCPS_REMOTE` on
/// the application node, serves files byte-identical to the disk to curl
/// on the client node — with copied asynchronous sends (`async`: the
/// staging pool crosses as a registration), queued sends from its
/// registered file cache (`async-registered`) and synchronous `SendReg`
/// from it (`sync`); when it exits the server node frees it and its port.
#[test]
fn cluster_web_server_serves_curl_across_namespaces() {
    let n = nodes();
    let dir = TempDir::new("cluster-web");
    key_file(dir.path(), "fabric.key", SECRET);
    let (server, socket, log, addr) = start_server(&n, dir.path());
    let root = dir.path().join("www");
    let files = www(&root);
    for (mode, port) in [("async", 8080), ("async-registered", 8086), ("sync", 8087)] {
        let web_log = dir.path().join(format!("web-{mode}.log"));
        let web = webserver();
        let p = port.to_string();
        let mut cmd = in_ns(
            &n.app,
            &[web.to_str().unwrap(), "--net", "tcps", "--port", &p],
        );
        cmd.args(["--root", root.to_str().unwrap(), "--mode", mode]);
        let out = std::fs::File::create(&web_log).unwrap();
        let web = InNs(
            remote_env(&mut cmd, &n, &addr, dir.path())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap(),
        );
        let logs = || {
            std::fs::read_to_string(&web_log).unwrap_or_default()
                + &std::fs::read_to_string(&log).unwrap_or_default()
        };
        let base = format!("http://{}:{port}", n.srv_cli_addr);
        wait_http(&n, &format!("{base}/one.bin"), &logs);
        fetch_all(
            &n,
            &base,
            &files,
            &format!("webserver --mode {mode}"),
            &logs,
        );
        let dynamic = curl(&n, &format!("{base}/dynamic/300000")).expect("GET /dynamic");
        assert_eq!(dynamic.len(), 300_000);
        assert!(dynamic.iter().all(u8::is_ascii_lowercase));
        assert_eq!(hosts_attached(&socket), 1, "{}", logs());
        drop(web);
        wait_freed(&socket, Duration::from_secs(5), &logs);
        assert!(
            curl(&n, &format!("{base}/one.bin")).is_none(),
            "the departed host's listener still answers"
        );
    }
    drop(server);
}

/// Unmodified nginx, then redis, under `tcps run --remote` on the
/// application node, their clients on the client node: nginx serves the
/// files byte-identical (with sendfile: read on the application node and
/// sent through the server); redis-benchmark runs without errors and a
/// redis-cli script gets the answers redis gives.
#[test]
fn cluster_nginx_and_redis_unmodified_across_namespaces() {
    need(&[
        "nginx",
        "redis-server",
        "redis-benchmark",
        "redis-cli",
        "curl",
    ]);
    let n = nodes();
    let dir = TempDir::new("cluster-apps");
    key_file(dir.path(), "fabric.key", SECRET);
    let (server, socket, log, addr) = start_server(&n, dir.path());
    let d = dir.path();
    let root = d.join("www");
    let files = www(&root);
    // The default master process and two workers: each worker, forked by
    // the master, attaches through its own helper and claims the master's
    // sockets (the listener) from the server node.
    let c = nginx_conf(d, &root, 8081);
    let out = d.join("nginx.out");
    let nginx = run_remote(
        &n,
        &addr,
        d,
        &[
            "nginx",
            "-c",
            c.to_str().unwrap(),
            "-p",
            d.to_str().unwrap(),
        ],
        &out,
    );
    let logs = || {
        std::fs::read_to_string(&out).unwrap_or_default()
            + &std::fs::read_to_string(d.join("error.log")).unwrap_or_default()
            + &std::fs::read_to_string(&log).unwrap_or_default()
            + &format!("\ntcps stat: {}", stat_json(&socket)["hosts"])
    };
    let base = format!("http://{}:8081", n.srv_cli_addr);
    wait_http(&n, &format!("{base}/one.bin"), &logs);
    // The master and its two workers are hosts of the server node; the
    // workers serve (the master only listened).
    let t = Instant::now();
    while hosts_attached(&socket) != 3 {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    for round in 0..3 {
        fetch_all(&n, &base, &files, &format!("nginx, round {round}"), &logs);
    }
    assert!(
        logs().contains("child inherited its parent's sockets"),
        "{}",
        logs()
    );
    // Stopped as an operator would (the workers go with the master).
    stop_gracefully(nginx, libc::SIGQUIT);
    wait_freed(&socket, Duration::from_secs(10), &logs);

    let out = d.join("redis.out");
    let redis = run_remote(
        &n,
        &addr,
        d,
        // Clients come from another node: not loopback-only.
        &[
            "redis-server",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        &out,
    );
    let logs = || {
        std::fs::read_to_string(&out).unwrap_or_default()
            + &std::fs::read_to_string(&log).unwrap_or_default()
    };
    let h = n.srv_cli_addr.as_str();
    let t = Instant::now();
    while in_ns(&n.cli, &["redis-cli", "-h", h, "ping"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() != "PONG")
        .unwrap_or(true)
    {
        if t.elapsed() > Duration::from_secs(15) {
            let ss = in_ns(&n.srv, &["ss", "-tanp"]).output().unwrap();
            let stat = Command::new(TCPS)
                .args(["stat", "--socket"])
                .arg(&socket)
                .output()
                .unwrap();
            panic!(
                "redis: {}\n{}\n{}",
                logs(),
                String::from_utf8_lossy(&ss.stdout),
                String::from_utf8_lossy(&stat.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let bench = in_ns(
        &n.cli,
        &[
            "timeout",
            "120",
            "redis-benchmark",
            "-h",
            h,
            "-t",
            "get,set,lpush,lrange",
            "-n",
            "2000",
            "-c",
            "10",
            "-q",
            "--csv",
        ],
    )
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&bench.stdout).to_string()
        + &String::from_utf8_lossy(&bench.stderr);
    assert!(
        bench.status.success(),
        "redis-benchmark:\n{text}\n{}",
        logs()
    );
    assert!(!text.to_lowercase().contains("error"), "{text}");
    for t in ["SET", "GET", "LPUSH", "LRANGE_100"] {
        assert!(text.contains(&format!("\"{t}")), "no {t} result:\n{text}");
    }
    eprintln!("redis-benchmark across the fabric:\n{text}");
    let script = "SET k1 v1\nGET k1\nLPUSH l a b c\nLRANGE l 0 -1\nINCR n\nINCRBY n 41\nGET n\nDEL k1\nEXISTS k1\n";
    let mut cli = in_ns(&n.cli, &["redis-cli", "-h", h, "-n", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    cli.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let answers = cli.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&answers.stdout),
        "OK\nv1\n3\nc\nb\na\n1\n42\n42\n1\n0\n",
        "redis answers"
    );
    drop(redis);
    wait_freed(&socket, Duration::from_secs(5), &logs);
    drop(server);
}

/// Fork over the fabric: a Python prefork server under `tcps run
/// --remote` on the application node (the parent listens and forks two
/// children, which accept and serve; the parent never accepts) echoes
/// payloads of up to 1 MiB to clients on the client node, byte for byte
/// with their SHA-256; every answer comes from a child.
#[test]
fn cluster_forked_children_serve_the_parents_listener() {
    let n = nodes();
    let dir = TempDir::new("cluster-fork");
    key_file(dir.path(), "fabric.key", SECRET);
    let (server, socket, log, addr) = start_server(&n, dir.path());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fabric_host/prefork_echo.py"
    );
    let out = dir.path().join("prefork.out");
    let argv = ["python3", script, "serve", "8083", "2"];
    let parent = run_remote(&n, &addr, dir.path(), &argv, &out);
    let logs = || {
        std::fs::read_to_string(&out).unwrap_or_default()
            + &std::fs::read_to_string(&log).unwrap_or_default()
    };
    let t = Instant::now();
    let pids: Vec<i32> = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with("LISTENING ")) {
            break l
                .split_whitespace()
                .skip(1)
                .map(|p| p.parse().unwrap())
                .collect();
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    };
    // The parent and its two children are hosts of the server node.
    while hosts_attached(&socket) != 3 {
        assert!(t.elapsed() < Duration::from_secs(15), "{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let host = n.srv_cli_addr.clone();
    let mut served_by = std::collections::BTreeSet::new();
    for (i, size) in [
        1usize,
        1000,
        65_536,
        300_001,
        (1 << 20) + 3,
        17,
        4096,
        200_000,
    ]
    .into_iter()
    .enumerate()
    {
        let get = in_ns(
            &n.cli,
            &[
                "python3",
                script,
                "get",
                &host,
                "8083",
                &size.to_string(),
                &i.to_string(),
            ],
        )
        .output()
        .unwrap();
        let said = String::from_utf8_lossy(&get.stdout).trim().to_string();
        let pid: i32 = said
            .strip_prefix("OK ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "{size} bytes: {said} {}\n{}",
                    String::from_utf8_lossy(&get.stderr),
                    logs()
                )
            });
        assert!(
            pids[1..].contains(&pid),
            "served by {pid}, not a child of {pids:?}"
        );
        served_by.insert(pid);
    }
    eprintln!("served by the children {served_by:?} of {}", pids[0]);
    assert!(
        logs()
            .matches("child inherited its parent's sockets")
            .count()
            >= 2,
        "{}",
        logs()
    );
    for &pid in &pids[1..] {
        // SAFETY: kill(2) of the children this test's program forked.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    drop(parent);
    wait_freed(&socket, Duration::from_secs(5), &logs);
    drop(server);
}

/// A native host blocked in `accept` (run by
/// `cluster_cut_link_fails_calls_within_a_second` on the application
/// node): prints READY, then how its accept and a later call failed.
#[test]
#[ignore]
fn cluster_blocked_host_child() {
    if std::env::var_os("TCPS_REMOTE").is_none() {
        return;
    }
    let c = tcps::Client::attach_default().expect("remote attach");
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.bind(s, &"0.0.0.0:8082".parse().unwrap()).unwrap();
    c.listen(s, 16).unwrap();
    println!("READY");
    let e = c.accept(s, 0).err().and_then(|e| e.raw_os_error());
    println!("ACCEPT {}", e.unwrap_or(0));
    let e = c
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .err()
        .and_then(|e| e.raw_os_error());
    println!("SOCKET {}", e.unwrap_or(0));
}

/// The application node's link cut while a host is blocked in `accept`:
/// the call fails with ECONNRESET/ENOTCONN within a second (no hang),
/// later calls fail too, and the server node frees the host.
#[test]
fn cluster_cut_link_fails_calls_within_a_second() {
    let n = nodes();
    let dir = TempDir::new("cluster-cut");
    key_file(dir.path(), "fabric.key", SECRET);
    let (server, socket, log, addr) = start_server(&n, dir.path());
    let server_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = in_ns(&n.app, &[exe.to_str().unwrap()]);
    cmd.args([
        "--exact",
        "cluster_blocked_host_child",
        "--ignored",
        "--nocapture",
    ]);
    let mut host = InNs(
        remote_env(&mut cmd, &n, &addr, dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(host.0.stdout.take().unwrap()).lines();
    let mut next = |want: &str| -> String {
        for l in lines.by_ref().map_while(Result::ok) {
            if l.starts_with(want) {
                return l;
            }
        }
        panic!("the host never printed {want}:\n{}", server_log());
    };
    next("READY");
    assert_eq!(hosts_attached(&socket), 1);
    std::thread::sleep(Duration::from_millis(300)); // in accept by now
    let t = Instant::now();
    ip(&["-n", &n.app, "link", "set", &n.app_dev, "down"]);
    let accept = next("ACCEPT");
    let took = t.elapsed();
    let errno: i32 = accept["ACCEPT ".len()..].parse().unwrap();
    eprintln!("cut link: accept failed with errno {errno} after {took:?}");
    assert!(
        errno == libc::ECONNRESET || errno == libc::ENOTCONN,
        "{accept}"
    );
    assert!(took < Duration::from_millis(1200), "took {took:?}");
    let later = next("SOCKET");
    let errno: i32 = later["SOCKET ".len()..].parse().unwrap();
    assert!(
        errno == libc::ECONNRESET || errno == libc::ENOTCONN,
        "{later}"
    );
    wait_freed(&socket, Duration::from_secs(3), &server_log);
    drop(host);
    drop(server);
}
