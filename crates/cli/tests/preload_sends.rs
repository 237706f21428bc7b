//! Sends under `tcps run` are asynchronous (issue 14 item 1): the same
//! Python program (tests/preload/async_send.py) on kernel sockets and
//! through the TCP server prints the same, ends the same way (SIGPIPE
//! included), and through the server its writes cost no round trip.

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir, TCPS};
use preload::*;
use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/async_send.py");

fn server() -> Server {
    Server::start("uring", &["--poll", "adaptive"])
}

/// Runs the program with `args` on `net`: its exit status, output and
/// summary lines.
fn run(srv: &Server, dir: &TempDir, net: Net, args: &[&str]) -> (ExitStatus, String, Vec<Summary>) {
    let tag = format!("{net:?}-{}", args.join("-"));
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let mut argv = vec!["python3", PROG];
    argv.extend_from_slice(args);
    let mut child = command(net, srv, &stats, &log, &argv)
        .spawn()
        .expect("spawn");
    let st = wait_timeout(&mut child, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{argv:?} on {net:?} did not finish:\n{}", read(&log))
    });
    (st, read(&log), summaries(&stats))
}

/// The program prints the same on both, succeeds on both, and was
/// offloaded through the server.
fn same_as_kernel(args: &[&str], must: &[&str]) {
    need("python3");
    let srv = server();
    let dir = TempDir::new("sends");
    let (kst, kout, _) = run(&srv, &dir, Net::Kernel, args);
    let (tst, tout, sums) = run(&srv, &dir, Net::Tcps, args);
    assert!(kst.success(), "{args:?} failed on kernel sockets:\n{kout}");
    assert!(tst.success(), "{args:?} failed through tcps:\n{tout}");
    assert_eq!(
        kout, tout,
        "{args:?}: output differs (left: kernel, right: tcps)"
    );
    for m in must {
        assert!(tout.contains(m), "{args:?}: {m:?} missing:\n{tout}");
    }
    assert!(
        sums.len() == 1 && sums[0].offloaded >= 2 && sums[0].kernel_tcp == 0,
        "not offloaded: {sums:?}"
    );
}

/// Many small writes of a checksummed stream, then close at once: the peer
/// gets every byte (close stays behind the queued sends).
#[test]
fn small_writes_then_close_arrive_whole() {
    same_as_kernel(&["stream"], &["match True"]);
}

/// A non-blocking writer fills the queue (EAGAIN), sees no POLLOUT while
/// nobody reads, POLLOUT once the peer reads, writes again; all arrives.
#[test]
fn nonblocking_writer_eagain_then_pollout() {
    same_as_kernel(
        &["nonblock"],
        &[
            "pollout while nobody reads: False",
            "pollout once the peer reads: True",
            "EAGAIN right after POLLOUT: 0",
            "total intact: True",
        ],
    );
}

/// Writes after the peer reset fail within a few calls (the error of an
/// asynchronous send comes on a later call), as on kernel sockets.
#[test]
fn write_after_reset_fails_within_a_few_calls() {
    same_as_kernel(
        &["reset", "ignore"],
        &["broken: True within a few calls: True"],
    );
}

/// ... and a program that does not ignore SIGPIPE dies of it, as on kernel
/// sockets.
#[test]
fn write_after_reset_raises_sigpipe() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("sigpipe");
    for net in [Net::Kernel, Net::Tcps] {
        let (st, out, _) = run(&srv, &dir, net, &["reset", "dfl"]);
        assert_eq!(st.signal(), Some(libc::SIGPIPE), "{net:?}: {st:?}\n{out}");
    }
}

fn stat_host(srv: &Server, pid: u32) -> Option<Value> {
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

/// `writes` writes of 100 bytes to a kernel listener here: the host's
/// round trips once the peer got every byte.
fn round_trips(srv: &Server, dir: &TempDir, writes: u32, async_send: bool) -> u64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let n = writes.to_string();
    let tag = if async_send { "async" } else { "sync" };
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let mut cmd = command(
        Net::Tcps,
        srv,
        &stats,
        &log,
        &["python3", PROG, "writes", &port, &n],
    );
    if !async_send {
        cmd.env("TCPS_ASYNC_SEND", "0");
    }
    let mut child = cmd.spawn().expect("spawn");
    let (mut k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = vec![0u8; writes as usize * 100];
    k.read_exact(&mut got)
        .unwrap_or_else(|e| panic!("{tag}: {e}\n{}", read(&log)));
    assert!(got.iter().all(|&b| b == b'y'));
    // The server publishes its counters every 100 ms.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(h) = stat_host(srv, child.id()) {
            let sent = h["counters"]["bytes_sent"].as_u64().unwrap_or(0);
            last = Some(h);
            if sent >= u64::from(writes) * 100 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let h = last.unwrap_or_else(|| panic!("{tag}: host not in tcps stat\n{}", read(&log)));
    eprintln!("{tag}: {}", serde_json::to_string(&h["counters"]).unwrap());
    h["counters"]["round_trips"].as_u64().unwrap_or(u64::MAX)
}

/// Through the server the writes cost ~0 round trips (TCPS_ASYNC_SEND=0: one
/// each, for comparison).
#[test]
fn writes_make_no_round_trips() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("roundtrips");
    let writes = 2000;
    let sync = round_trips(&srv, &dir, writes, false);
    let asyn = round_trips(&srv, &dir, writes, true);
    eprintln!("round trips for {writes} writes: synchronous {sync}, asynchronous {asyn}");
    assert!(sync >= u64::from(writes), "synchronous: {sync} round trips");
    assert!(
        asyn * 20 <= u64::from(writes),
        "asynchronous: {asyn} round trips for {writes} writes"
    );
}
