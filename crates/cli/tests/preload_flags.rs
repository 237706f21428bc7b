//! Receives and accepts under `tcps run` behave as on kernel sockets, flag
//! by flag and option by option (issue 14 item 3): the same table-driven
//! program (tests/preload/recv_flags.py: recv/recvfrom/recvmsg/read/readv
//! with every receive flag, blocking and non-blocking sockets, data, empty,
//! FIN, reset; SO_RCVTIMEO, SO_RCVLOWAT, FIONREAD, zero-length and invalid
//! calls, accept4's flags) prints the same line per case on kernel sockets
//! and through the TCP server, with receive rings (the default) and with
//! eager receive and accept off (plain requests). The few differences that
//! remain are listed below, each with its reason (docs/PRELOAD.md, "Not
//! supported").

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir};
use preload::*;
use std::time::Duration;

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/recv_flags.py");

/// Cases whose answer through the receive rings may differ from the kernel's.
const RING_DIFFS: &[&str] = &[
    // FIONREAD counts what the socket's receive ring holds (32 KiB by
    // default); more may still wait in the server's kernel socket.
    "acc fionread 100 KiB",
    "con fionread 100 KiB",
];

/// ... and through plain requests (eager receive and accept off).
const PLAIN_DIFFS: &[&str] = &[
    // The server's receive does not wait for MSG_PEEK|MSG_WAITALL's whole
    // length: it returns what is there.
    "acc peek|waitall late data",
    "con peek|waitall late data",
];

/// A server with eager receive and accept off.
const PLAIN_SERVER: &[&str] = &[
    "--poll",
    "adaptive",
    "--eager-recv",
    "off",
    "--eager-accept",
    "off",
];

/// The program's output on `net` (panics unless it ran to the end).
fn run(srv: &Server, dir: &TempDir, net: Net, tag: &str) -> (String, Vec<Summary>) {
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let mut child = command(net, srv, &stats, &log, &["python3", PROG])
        .spawn()
        .expect("spawn");
    let st = wait_timeout(&mut child, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{tag} did not finish:\n{}", read(&log))
    });
    let out = read(&log);
    assert!(
        st.success() && out.ends_with("done\n"),
        "{tag}: {st:?}\n{out}"
    );
    (out, summaries(&stats))
}

/// The case name of an output line (before ": ").
fn case(line: &str) -> &str {
    line.split_once(": ").map_or(line, |(c, _)| c)
}

/// Runs the table on kernel sockets and through a server started with
/// `extra`; every line must match but those of `allowed` cases.
fn same_as_kernel(extra: &[&str], allowed: &[&str]) {
    need("python3");
    let srv = Server::start("uring", extra);
    let dir = TempDir::new("flags");
    let (kout, _) = run(&srv, &dir, Net::Kernel, "kernel");
    let (tout, sums) = run(&srv, &dir, Net::Tcps, "tcps");
    assert!(
        sums.len() == 1 && sums[0].offloaded > 1000 && sums[0].kernel_tcp == 0,
        "not offloaded: {sums:?}"
    );
    let k: Vec<&str> = kout.lines().collect();
    let t: Vec<&str> = tout.lines().collect();
    assert!(k.len() > 2000, "only {} cases", k.len());
    assert_eq!(k.len(), t.len(), "different numbers of cases");
    let mut differ = Vec::new();
    for (a, b) in k.iter().zip(&t) {
        assert_eq!(case(a), case(b), "cases out of step");
        if a != b && !allowed.contains(&case(a)) {
            differ.push(format!("  kernel: {a}\n  tcps:   {b}"));
        }
    }
    for c in allowed {
        assert!(k.iter().any(|l| case(l) == *c), "no case {c:?}");
    }
    assert!(
        differ.is_empty(),
        "{} of {} cases differ (server {extra:?}):\n{}",
        differ.len(),
        k.len(),
        differ.join("\n")
    );
}

/// With receive and accept rings (the default): everything but FIONREAD
/// beyond the ring's size.
#[test]
fn receive_flags_match_kernel_with_rings() {
    same_as_kernel(&["--poll", "adaptive"], RING_DIFFS);
}

/// With eager receive and accept off: every call is a request to the
/// server.
#[test]
fn receive_flags_match_kernel_with_plain_requests() {
    let both: Vec<&str> = RING_DIFFS.iter().chain(PLAIN_DIFFS).copied().collect();
    same_as_kernel(PLAIN_SERVER, &both);
}
