//! epoll under `tcps run` looks at what moved, not at everything it holds
//! (issue 14 item 4: O(ready), not O(interest)): an echo server with 200
//! connections in one epoll set, few of them active at a time, looks at a
//! handful of entries per wait, because the server announces every ring it
//! publishes into in the host's ready log and each set keeps a ready list
//! fed by it. The preload counts the entries its waits looked at
//! (`epoll_looks`, `epoll_passes` in the exit summary). Every echo is
//! compared byte for byte; level- and edge-triggered sets both.

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir};
use preload::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/epoll_many.py");
const CONNS: usize = 200;
const ROUNDS: usize = 600;

/// Connects to the program, retrying until it listens.
fn connect(port: u16, log: &std::path::Path) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if Instant::now() > deadline => panic!("connect: {e}\n{}", read(log)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Runs the echo server in `mode` under `tcps run`; returns its summary.
fn run(srv: &Server, dir: &TempDir, mode: &str) -> Summary {
    let port = free_port();
    let stats = dir.path().join(format!("{mode}.stats"));
    let log = dir.path().join(format!("{mode}.out"));
    let (p, n) = (port.to_string(), CONNS.to_string());
    let mut child = command(
        Net::Tcps,
        srv,
        &stats,
        &log,
        &["python3", PROG, &p, &n, mode],
    )
    .spawn()
    .expect("spawn python3");
    let mut conns: Vec<TcpStream> = (0..CONNS).map(|_| connect(port, &log)).collect();
    for (r, i) in (0..ROUNDS).map(|r| (r, (r * 37) % CONNS)) {
        let k = &mut conns[i];
        k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let msg: Vec<u8> = (0..100).map(|j| (r * 13 + j) as u8).collect();
        k.write_all(&msg).unwrap();
        let mut back = [0u8; 100];
        k.read_exact(&mut back)
            .unwrap_or_else(|e| panic!("{mode}: round {r}: {e}\n{}", read(&log)));
        let want: Vec<u8> = msg.iter().rev().copied().collect();
        assert_eq!(&back[..], &want[..], "{mode}: round {r}: echo differs");
    }
    drop(conns);
    let st = wait_timeout(&mut child, Duration::from_secs(20));
    assert!(
        st.is_some_and(|s| s.success()),
        "{mode}: {st:?}\n{}",
        read(&log)
    );
    let s = wait_summaries(&stats, 1);
    s.into_iter()
        .find(|s| s.exe.starts_with("python3"))
        .unwrap_or_else(|| panic!("{mode}: no summary\n{}", read(&log)))
}

#[test]
fn epoll_looks_at_what_moved() {
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let dir = TempDir::new("epoll-ready");
    for mode in ["lt", "et"] {
        let s = run(&srv, &dir, mode);
        let per = s.epoll_looks as f64 / s.epoll_passes.max(1) as f64;
        eprintln!(
            "{mode}: {} passes looked at {} entries ({per:.1} per pass) in a set of {CONNS}",
            s.epoll_passes, s.epoll_looks
        );
        assert!(
            s.epoll_passes >= ROUNDS as u64,
            "{mode}: {} passes for {ROUNDS} rounds: the waits were not counted",
            s.epoll_passes
        );
        // The first pass and the final closes look at everything (200 +
        // 200 entries); each round's pass looks at the one socket that
        // moved and whatever is still listed from the last.
        assert!(
            per < 8.0,
            "{mode}: {per:.1} entries looked at per pass in a set of {CONNS}"
        );
    }
}
