//! Readiness in arrival order (issue 14 item 7): redis under `tcps run`
//! reads bytes that reached the server's kernel sockets earlier before
//! bytes that arrived later on another connection, as on kernel sockets.
//!
//! `tests/preload/causality.py` drives three RESP connections (the pusher
//! connected first, so redis gives it the lowest fd): two clients send a
//! blocking `BRPOPLPUSH` (timeout 1 s), then the pusher pushes and pops. A
//! redis that reads the pusher's bytes before an earlier blocking command
//! answers the pop with the element and leaves that client to time out: a
//! counted failure, not a hang. Before the fix nearly every round failed
//! (readiness was reported in fd order, and the pusher's fd is lowest).

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir};
use preload::*;
use std::time::Duration;

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/causality.py");
const ROUNDS: u32 = 3000;

/// Failures tolerated per run of `ROUNDS`: kernel sockets themselves show
/// about one in 5,000-10,000 rounds on a loaded 2-core machine (a packet
/// delivered late by the kernel, before it reaches any socket: the same
/// pattern with redis on kernel sockets, printed below for comparison),
/// while the fault this guards against fails nearly every round.
const TOLERATED: u32 = 2;

/// Runs redis on `net` (through `srv` for tcps), the driver against it;
/// returns the driver's failure count.
fn failures(srv: &Server, dir: &TempDir, net: Net, tag: &str) -> u32 {
    let port = free_port();
    let p = port.to_string();
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.log"));
    let mut redis = redis_server(net, srv, &stats, &log, port, dir.path());
    let out = dir.path().join(format!("{tag}.out"));
    let f = std::fs::File::create(&out).expect("driver output");
    let mut driver = std::process::Command::new("python3")
        .args([PROG, &p, &ROUNDS.to_string()])
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .expect("spawn the driver");
    let st = wait_timeout(&mut driver, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = driver.kill();
        panic!("{tag}: the driver did not finish:\n{}", read(&out))
    });
    stop(&mut redis, libc::SIGTERM);
    let text = read(&out);
    assert!(st.success(), "{tag}: the driver failed:\n{text}");
    eprintln!("{tag}: {text}");
    if net == Net::Tcps {
        let sums = wait_summaries(&stats, 1);
        assert!(
            sums.len() == 1 && sums[0].accepted >= 3 && sums[0].kernel_tcp == 0,
            "{tag}: not offloaded: {sums:?}"
        );
    }
    text.lines()
        .find_map(|l| l.split("failures=").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{tag}: no count in the driver's output:\n{text}"))
}

/// Both receive modes: rings (push, the default; hosts answer readiness
/// from their rings) and eager receive off (the server answers from the
/// kernel sockets, ordered by the kernel's arrival times).
#[test]
fn redis_reads_blocking_commands_before_a_later_push() {
    for p in ["python3", "redis-server"] {
        need(p);
    }
    let dir = TempDir::new("causality");
    let push = Server::start("uring", &["--poll", "adaptive"]);
    let kernel = failures(&push, &dir, Net::Kernel, "kernel");
    let rings = failures(&push, &dir, Net::Tcps, "push");
    drop(push);
    let off = Server::start("uring", &["--poll", "adaptive", "--eager-recv", "off"]);
    let plain = failures(&off, &dir, Net::Tcps, "off");
    eprintln!(
        "failures in {ROUNDS} rounds: kernel {kernel}, push {rings}, eager receive off {plain}"
    );
    assert!(
        rings <= TOLERATED && plain <= TOLERATED,
        "redis read a later push before an earlier blocking command: push {rings}, off {plain} \
         of {ROUNDS} rounds (kernel sockets: {kernel})"
    );
}
