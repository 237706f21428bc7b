//! A forked worker's epoll reports its listeners in the order their
//! connections arrived, as the kernel's ready list does, also when one of
//! them has no accept ring yet (inherited through fork, never accepted
//! on: its readiness is the server's poll answer, with no arrival number).
//!
//! nginx-tests' `stream_limit_conn_dry_run.t` failed on this: a client
//! connected to port 8080 and then to 8081 (`limit_conn` of 1 shared by
//! both), and the worker, told of 8081 first, let that one pass and
//! rejected the earlier one. `tests/preload/listener_order.py` is that
//! worker: it accepts one connection on listener A (which gets an accept
//! ring), then, with a second connection to A and then one to B both
//! established, accepts what its level-triggered epoll reports in the
//! order reported. The server ranked a ready socket it had no arrival
//! time for (a listener without a ring) before every timed one.

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir};
use preload::*;
use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

const PROG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/preload/listener_order.py"
);

/// Everything `port` answers, to its EOF.
fn answer(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .expect("read the worker's answer");
    out
}

/// One run on `net`: what the second connection to A and the one to B
/// were answered (their places in the worker's accept order).
fn run(srv: &Server, dir: &TempDir, net: Net, tag: &str) -> (String, String) {
    let fifo = dir.path().join(format!("{tag}.fifo"));
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let log = dir.path().join(format!("{tag}.log"));
    let stats = dir.path().join(format!("{tag}.stats"));
    let mut child = command(
        net,
        srv,
        &stats,
        &log,
        &["python3", PROG, fifo.to_str().unwrap()],
    )
    .spawn()
    .expect("spawn the worker");
    let ports = wait_line(&log, "ports ");
    let p: Vec<u16> = ports
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let conn = |port: u16| TcpStream::connect(("127.0.0.1", port)).expect("connect");
    assert_eq!(answer(&mut conn(p[0])), "1", "{tag}: the first connection");
    // Both established (the kernel queued them) before the worker looks.
    let (mut a2, mut b) = (conn(p[0]), conn(p[1]));
    std::fs::write(&fifo, "go\n").expect("write the fifo");
    let got = (answer(&mut a2), answer(&mut b));
    let st = wait_timeout(&mut child, Duration::from_secs(20)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{tag}: the worker did not finish:\n{}", read(&log))
    });
    assert!(st.success(), "{tag}: the worker failed:\n{}", read(&log));
    if net == Net::Tcps {
        offloaded(&stats);
    }
    got
}

/// The worker (the forked child) took all three connections from the server.
fn offloaded(stats: &Path) {
    let sums = wait_summaries(stats, 2);
    assert!(
        sums.iter().any(|s| s.accepted == 3) && sums.iter().all(|s| s.kernel_tcp == 0),
        "not offloaded: {sums:?}"
    );
}

#[test]
fn a_listener_without_a_ring_is_reported_in_arrival_order() {
    need("python3");
    let dir = TempDir::new("listener-order");
    let srv = Server::start("uring", &[]);
    let kernel = run(&srv, &dir, Net::Kernel, "kernel");
    assert_eq!(kernel, ("2".into(), "3".into()), "kernel sockets");
    for round in 0..5 {
        let tag = format!("tcps{round}");
        let got = run(&srv, &dir, Net::Tcps, &tag);
        assert_eq!(got, kernel, "{tag}: accept order differs from the kernel's");
    }
}
