//! A host with several TCP servers (issue 17, items 4 and 5): network
//! namespaces as nodes (`src/cluster_nodes.rs`, `Nodes::create_two_servers`):
//! the application node `tcps-app-<pid><k>`, two TCP-server nodes
//! `tcps-srv-…` (S1) and `tcps-srv2-…` (S2), each with its own link to the
//! application node and to the client node `tcps-cli-…`; all deleted at the
//! end however the test ends. Needs root, UCX, nginx, curl and python3; it
//! skips nothing.
//!
//! Programs run unmodified under `tcps run --remote S1,S2` (`TCPS_REMOTE`
//! a comma list, one secret file for both). A listener is opened on every
//! server, so nginx (master and two forked workers) serves clients that
//! reach it through either server node; new outgoing connections are
//! spread over the servers, so their local addresses are both server
//! nodes' client-link addresses. Then the application–S1 link is cut (or
//! S1's server killed): a connection through S1 fails within about a
//! second, a cut-off S1 frees the host within seconds, and the program
//! keeps working through S2 (its listener there, every new outgoing
//! connection, a new process too), byte-identical (SHA-256) every time;
//! every wait is bounded.

mod cluster_common;
mod common;
mod fabric_host;

use cluster_common::start_server;
use cluster_common::*;
use common::*;
use fabric_host::{key_file, SECRET};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "../src/cluster_nodes.rs"]
#[allow(dead_code)] // remove_stale and the client-to-application link: the bench's
mod cluster_nodes;
use cluster_nodes::{Nodes, Server2};

/// Both TCP servers of a test, S1 on its first server node and S2 on the
/// second, their fabric listeners on their application links, one secret.
/// Fields drop in order: the servers, the directory, then the nodes.
struct Two {
    s1: InNs,
    _s2: InNs,
    sock1: PathBuf,
    sock2: PathBuf,
    log1: PathBuf,
    log2: PathBuf,
    /// `TCPS_REMOTE`: `S1:PORT,S2:PORT`.
    remote: String,
    dir: TempDir,
    n: Nodes,
}

impl Two {
    fn start(what: &str) -> Two {
        let n = two_server_nodes();
        let dir = TempDir::new(what);
        key_file(dir.path(), "fabric.key", SECRET);
        let (s1, sock1, log1, a1) = start_server(&n, dir.path());
        let s = n.srv2.as_ref().expect("a second server node");
        let (s2, sock2, log2, a2) =
            start_server_in(&s.ns, &s.srv_dev, &s.srv_app_addr, dir.path(), "2");
        Two {
            s1,
            _s2: s2,
            sock1,
            sock2,
            log1,
            log2,
            remote: format!("{a1},{a2}"),
            dir,
            n,
        }
    }

    fn srv2(&self) -> &Server2 {
        self.n.srv2.as_ref().expect("a second server node")
    }

    /// Both servers' logs and what their `tcps stat` says of their hosts.
    fn logs(&self) -> String {
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "--- S1 log:\n{}\n--- S2 log:\n{}\n--- S1 hosts: {}\n--- S2 hosts: {}",
            read(&self.log1),
            read(&self.log2),
            stat_json(&self.sock1)["hosts"],
            stat_json(&self.sock2)["hosts"]
        )
    }

    /// Cuts the application node's link to S1 (its end goes down, the
    /// other end loses its carrier).
    fn cut_s1(&self) {
        ip(&["-n", &self.n.app, "link", "set", &self.n.app_dev, "down"]);
    }

    /// Waits until `socket`'s server has `want` hosts attached.
    fn wait_hosts(&self, socket: &Path, want: u64, log: &dyn Fn() -> String) {
        let t = Instant::now();
        while hosts_attached(socket) != want {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} has {} hosts, not {want}:\n{}",
                socket.display(),
                hosts_attached(socket),
                log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Unmodified nginx (master and two workers) under `tcps run --remote
/// S1,S2`: it listens on both servers, every worker inherits the listener
/// on each, and curl on the client node gets every file byte-identical
/// through either server node. The application–S1 link is cut while
/// clients fetch through S2 (none of their requests fails): S1 frees the
/// three hosts within seconds and its address stops answering, while
/// nginx keeps serving every file through S2, round after round.
#[test]
fn multi_nginx_serves_through_both_servers_and_survives_a_cut_link() {
    need(&["nginx", "curl"]);
    let t = Two::start("multi-nginx");
    let d = t.dir.path();
    let root = d.join("www");
    let files = www(&root);
    let conf = nginx_conf(d, &root, 8081);
    let out = d.join("nginx.out");
    let (c, p) = (conf.to_str().unwrap(), d.to_str().unwrap());
    let mut nginx = run_remote(&t.n, &t.remote, d, &["nginx", "-c", c, "-p", p], &out);
    let logs = || {
        format!(
            "--- tcps run nginx:\n{}\n--- nginx error.log:\n{}\n{}",
            std::fs::read_to_string(&out).unwrap_or_default(),
            std::fs::read_to_string(d.join("error.log")).unwrap_or_default(),
            t.logs()
        )
    };
    let b1 = format!("http://{}:8081", t.n.srv_cli_addr);
    let b2 = format!("http://{}:8081", t.srv2().srv_cli_addr);
    wait_http_from(&t.n, &format!("{b1}/one.bin"), Some(&mut nginx), &logs);
    wait_http_from(&t.n, &format!("{b2}/one.bin"), Some(&mut nginx), &logs);
    // The master and its two workers are hosts of both servers; each
    // worker inherited the master's sockets on each.
    t.wait_hosts(&t.sock1, 3, &logs);
    t.wait_hosts(&t.sock2, 3, &logs);
    for log in [&t.log1, &t.log2] {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let forks = text.matches("child inherited its parent's sockets").count();
        assert!(
            forks >= 2,
            "{}: {forks} inheritances\n{}",
            log.display(),
            logs()
        );
    }
    for round in 0..2 {
        fetch_all(&t.n, &b1, &files, &format!("via S1, round {round}"), &logs);
        fetch_all(&t.n, &b2, &files, &format!("via S2, round {round}"), &logs);
    }

    // Clients keep fetching through S2 while S1 is cut off and freed:
    // not one of their requests fails.
    let cut = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let rounds = std::thread::scope(|sc| {
        let during = sc.spawn(|| {
            let mut round = 0;
            // Bounded too: a failed wait below must not leave it looping.
            while !done.load(std::sync::atomic::Ordering::Relaxed)
                && cut.elapsed() < Duration::from_secs(15)
            {
                let what = format!("via S2 during the cut, round {round}");
                fetch_all(&t.n, &b2, &files, &what, &logs);
                round += 1;
            }
            round
        });
        t.cut_s1();
        let took = wait_freed(&t.sock1, Duration::from_secs(5), &logs);
        eprintln!("cut link: S1 freed nginx's hosts after {took:?}");
        std::thread::sleep(Duration::from_millis(500));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        during.join()
    });
    let rounds = rounds.unwrap_or_else(|_| panic!("a fetch through S2 failed during the cut"));
    eprintln!("{rounds} rounds of fetches through S2 during the cut");
    assert!(rounds > 0);
    // S1 freed the listener with the hosts: its address no longer serves.
    assert!(
        curl(&t.n, &format!("{b1}/one.bin")).is_none(),
        "S1 still serves after the cut:\n{}",
        logs()
    );
    for round in 0..3 {
        let what = format!("via S2 after the cut, round {round}");
        fetch_all(&t.n, &b2, &files, &what, &logs);
    }
    assert_eq!(hosts_attached(&t.sock2), 3, "{}", logs());
    eprintln!("served through S2 for {:?} after the cut", cut.elapsed());
    stop_gracefully(nginx, libc::SIGQUIT);
    wait_freed(&t.sock2, Duration::from_secs(10), &logs);
}

/// The probe (`tests/preload/spread_echo.py`).
const SPREAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/spread_echo.py");
const ECHO_PORT: &str = "7020";
const CONNS: usize = 8;

/// A program's stdout lines, read by a thread (waits on them are bounded).
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn of(p: &mut InNs) -> Lines {
        let (tx, rx) = mpsc::channel();
        let out = p.0.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// The lines up to the one starting with `last` (included), within 60 s.
    fn until(&self, last: &str, log: &dyn Fn() -> String) -> Vec<String> {
        let t = Instant::now();
        let mut got = Vec::new();
        loop {
            let left = Duration::from_secs(60).saturating_sub(t.elapsed());
            match self.0.recv_timeout(left) {
                Ok(l) => {
                    let end = l.starts_with(last);
                    got.push(l);
                    if end {
                        return got;
                    }
                }
                Err(e) => panic!("no {last:?} ({e:?}) after {got:#?}\n{}", log()),
            }
        }
    }
}

/// One round's `CONN` lines: each connection's local IP, all echoes right.
fn local_ips(lines: &[String], log: &dyn Fn() -> String) -> Vec<String> {
    let conns: Vec<&String> = lines.iter().filter(|l| l.starts_with("CONN ")).collect();
    assert_eq!(conns.len(), CONNS, "{lines:#?}\n{}", log());
    conns
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 5 && f[4] == "OK", "{l}\n{lines:#?}\n{}", log());
            f[3].rsplit_once(':').map_or("", |(ip, _)| ip).to_string()
        })
        .collect()
}

/// How S1 is lost.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lose {
    /// The application–S1 link is cut (S1 lives on and frees the host).
    Cut,
    /// S1's server process is killed (SIGKILL).
    Kill,
}

/// Outgoing connections under `tcps run --remote S1,S2`, to an echo
/// server on kernel sockets on the client node: consecutive connections
/// leave from both server nodes (their local addresses), every echo is
/// the payload (SHA-256). The application–S1 link is cut while the
/// program runs: its open connection through S1 fails within about a
/// second, S1 frees the host, and every new connection of the same
/// process then leaves from S2 and echoes right; so do all of a new
/// process's, started with S1 unreachable.
#[test]
fn multi_outgoing_connections_spread_and_survive_a_cut_link() {
    spread_then_lose_s1(Lose::Cut);
}

/// The same with S1's server killed instead of cut off (a dead peer).
#[test]
fn multi_outgoing_connections_spread_and_survive_a_dead_server() {
    spread_then_lose_s1(Lose::Kill);
}

/// The spread client's runs: `tcps run --remote S1,S2 -- python3
/// spread_echo.py connect …` toward the client node's address on S1's link
/// (S2 reaches it by its route), its stderr in `err`.
struct Spread<'a> {
    t: &'a Two,
    target: String,
    err: PathBuf,
}

impl Spread<'_> {
    fn run(&self, rounds_hold: &[&str]) -> (InNs, Lines) {
        let argv = ["python3", SPREAD, "connect", &self.target, ECHO_PORT];
        let conns = CONNS.to_string();
        let argv = [&argv[..], &[&conns, "100000"], rounds_hold].concat();
        let mut c = remote_cmd(&self.t.n, &self.t.remote, self.t.dir.path(), &argv);
        let e = std::fs::File::create(&self.err).unwrap();
        let mut p = InNs(
            c.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(e)
                .spawn()
                .unwrap(),
        );
        let lines = Lines::of(&mut p);
        (p, lines)
    }

    fn logs(&self) -> String {
        format!(
            "--- tcps run python3 (stderr):\n{}\n{}",
            std::fs::read_to_string(&self.err).unwrap_or_default(),
            self.t.logs()
        )
    }
}

fn spread_then_lose_s1(lose: Lose) {
    need(&["python3"]);
    let t = Two::start(&format!("multi-{lose:?}"));
    let d = t.dir.path();
    let echo_out = d.join("echo.out");
    let f = std::fs::File::create(&echo_out).unwrap();
    let _echo = InNs(
        in_ns(&t.n.cli, &["python3", SPREAD, "serve", ECHO_PORT])
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap(),
    );
    wait_text(
        &echo_out,
        "LISTENING",
        Duration::from_secs(10),
        "echo server",
    );
    let (net, _) = t.n.srv_cli_addr.rsplit_once('.').unwrap();
    let s = Spread {
        t: &t,
        target: format!("{net}.2"),
        err: d.join("client.err"),
    };
    let logs = || s.logs();
    let (ip1, ip2) = (t.n.srv_cli_addr.clone(), t.srv2().srv_cli_addr.clone());
    let (mut client, lines) = s.run(&["2", &ip1]);
    let first = local_ips(&lines.until("ROUND 0 DONE", &logs), &logs);
    eprintln!("local addresses with both servers: {first:?}");
    for ip in [&ip1, &ip2] {
        assert!(
            first.contains(ip),
            "no connection from {ip}: {first:?}\n{}",
            logs()
        );
    }
    assert!(first.iter().all(|a| *a == ip1 || *a == ip2), "{first:?}");
    // The running program is a host of both servers.
    assert_eq!(
        (hosts_attached(&t.sock1), hosts_attached(&t.sock2)),
        (1, 1),
        "{}",
        logs()
    );

    lose_s1_under_a_held_connection(&t, lose, &lines, &ip1, &logs);
    // The host notices within a second too; then its next round.
    std::thread::sleep(Duration::from_millis(1000));
    let mut stdin = client.0.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let after = local_ips(&lines.until("ROUND 1 DONE", &logs), &logs);
    eprintln!("local addresses after losing S1: {after:?}");
    assert!(after.iter().all(|a| *a == ip2), "{after:?}\n{}", logs());
    let st = wait_timeout(&mut client.0, Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "{st:?}\n{}", logs());
    wait_freed(&t.sock2, Duration::from_secs(5), &logs);

    // A new process, S1 still lost: everything through S2.
    let (mut client, lines) = s.run(&["1"]);
    let fresh = local_ips(&lines.until("ROUND 0 DONE", &logs), &logs);
    eprintln!("local addresses of a new process without S1: {fresh:?}");
    assert!(fresh.iter().all(|a| *a == ip2), "{fresh:?}\n{}", logs());
    let st = wait_timeout(&mut client.0, Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "{st:?}\n{}", logs());
    if lose == Lose::Cut {
        assert_eq!(hosts_attached(&t.sock1), 0, "{}", logs());
    }
}

/// S1 is lost while the client holds a connection through it, its recv
/// blocked: the recv fails (or ends) within about a second, it does not
/// hang; a cut-off S1 frees the host within seconds.
fn lose_s1_under_a_held_connection(
    t: &Two,
    lose: Lose,
    lines: &Lines,
    ip1: &str,
    logs: &dyn Fn() -> String,
) {
    let hold = lines.until("HOLD", logs);
    let held = hold.last().unwrap();
    assert!(
        held.starts_with(&format!("HOLD {ip1}:")),
        "{held}\n{}",
        logs()
    );
    std::thread::sleep(Duration::from_millis(300)); // in recv by now
    let lost = SystemTime::now();
    match lose {
        Lose::Cut => t.cut_s1(),
        // SAFETY: kill(2) of the server this test started (`ip netns
        // exec` execs it: the same pid).
        Lose::Kill => unsafe {
            libc::kill(t.s1.0.id() as i32, libc::SIGKILL);
        },
    }
    let end = lines.until("HELD", logs);
    let f: Vec<&str> = end.last().unwrap().split_whitespace().collect();
    let at = Duration::from_secs_f64(f[2].parse().unwrap());
    let after = at.saturating_sub(lost.duration_since(UNIX_EPOCH).unwrap());
    eprintln!(
        "{lose:?}: the held connection's recv ended ({}) after {after:?}",
        f[1]
    );
    assert!(
        ["ECONNRESET", "ENOTCONN", "EOF"].contains(&f[1]),
        "{end:?}\n{}",
        logs()
    );
    // A second, and some slack for a loaded machine.
    assert!(after < Duration::from_millis(1500), "{after:?}");
    if lose == Lose::Cut {
        let took = wait_freed(&t.sock1, Duration::from_secs(5), logs);
        eprintln!("cut link: S1 freed the host after {took:?}");
    }
}

/// The probe of a plain blocking accept (`tests/preload/accept_block.py`).
const ACCEPT_BLOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/accept_block.py");

/// A program that accepts with a plain blocking accept() (no poll first)
/// on a listener of both servers: each accept sleeps on both servers'
/// accept rings at once and takes the connection from whichever server it
/// arrives at (`group_accept.rs`); the bytes of each are answered with
/// their SHA-256.
#[test]
fn multi_blocking_accept_takes_connections_from_either_server() {
    need(&["python3"]);
    let t = Two::start("multi-accept");
    let d = t.dir.path();
    let out = d.join("accept.out");
    let order = ["s1", "s2", "s2", "s1", "s1", "s2"];
    let n = order.len().to_string();
    let mut prog = run_remote(
        &t.n,
        &t.remote,
        d,
        &["python3", ACCEPT_BLOCK, "8095", &n],
        &out,
    );
    let logs = || {
        format!(
            "--- tcps run accept_block.py:\n{}\n{}",
            std::fs::read_to_string(&out).unwrap_or_default(),
            t.logs()
        )
    };
    wait_text(
        &out,
        "LISTENING",
        Duration::from_secs(20),
        "accept_block.py",
    );
    let (s1, s2) = (t.n.srv_cli_addr.clone(), t.srv2().srv_cli_addr.clone());
    for (i, which) in order.iter().enumerate() {
        // The accept is asleep by now: the connection wakes it.
        std::thread::sleep(Duration::from_millis(300));
        let to = if *which == "s1" { &s1 } else { &s2 };
        let code = format!(
            "import socket,os,hashlib\n\
             d=os.urandom(100000+{i})\n\
             s=socket.create_connection(('{to}',8095),timeout=10)\n\
             s.sendall(d); s.shutdown(socket.SHUT_WR)\n\
             r=b''\n\
             while True:\n    b=s.recv(100)\n    if not b: break\n    r+=b\n\
             print('OK' if r.decode()==hashlib.sha256(d).hexdigest() else 'BAD')"
        );
        let r = in_ns(&t.n.cli, &["timeout", "20", "python3", "-c", &code])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&r.stdout);
        assert_eq!(
            said.trim(),
            "OK",
            "connection {i} through {to}: {said}\n{}",
            logs()
        );
    }
    let st = wait_timeout(&mut prog.0, Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "{st:?}\n{}", logs());
    // Each connection came through the server it was sent to: its peer is
    // the client node's address on that server's link.
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let peers: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ACCEPTED "))
        .collect();
    let net = |a: &str| {
        a.rsplit_once('.')
            .map(|(n, _)| n.to_string())
            .unwrap_or_default()
    };
    let want: Vec<String> = order
        .iter()
        .map(|w| net(if *w == "s1" { &s1 } else { &s2 }))
        .collect();
    let got: Vec<String> = peers.iter().map(|p| net(p)).collect();
    assert_eq!(got, want, "{}", logs());
}
