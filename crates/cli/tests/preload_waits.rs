//! Blocking waits under `tcps run` cost no round trip (issue 14 item 4):
//! a program that waits in epoll, poll or select for an offloaded socket
//! beside a kernel fd sleeps in one real poll(2) on the kernel fd and its
//! host doorbell, which the server rings when the socket's receive ring
//! moves. Without the doorbell (`TCPS_HOST_DOORBELL=0`) each such wait is a
//! call parked at the server (plus a helper thread): the comparison shows
//! the test measures the feature. Every message is compared end to end.

mod common;
mod preload;

use common::{Server, TempDir};
use preload::*;
use std::io::{Read, Write};
use std::time::Duration;

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/waits.py");
const ROUNDS: usize = 200;

/// Round trips of `ROUNDS` blocking waits in `mode`, each answered after a
/// pause by the peer here; the program's echo of every message checked.
fn wait_round_trips(srv: &Server, dir: &TempDir, mode: &str, env: &[(&str, &str)]) -> u64 {
    let rounds = ROUNDS.to_string();
    round_trips(srv, dir, PROG, &[mode, "{port}", &rounds], env, |k, tag| {
        for i in 0..ROUNDS {
            // Long enough that the program is asleep in its wait.
            std::thread::sleep(Duration::from_millis(1));
            let msg: Vec<u8> = (0..100).map(|j| (i * 7 + j) as u8).collect();
            k.write_all(&msg).unwrap();
            let mut back = vec![0u8; 100];
            k.read_exact(&mut back)
                .unwrap_or_else(|e| panic!("{tag}: round {i}: {e}"));
            let want: Vec<u8> = msg.iter().rev().copied().collect();
            assert_eq!(back, want, "{tag}: round {i}: echo differs");
        }
        (ROUNDS * 100) as u64
    })
}

#[test]
fn blocking_waits_make_no_round_trips() {
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let dir = TempDir::new("preload-waits");
    for mode in ["epoll", "poll", "select"] {
        let bell = wait_round_trips(&srv, &dir, mode, &[]);
        let parked = wait_round_trips(&srv, &dir, mode, &[("TCPS_HOST_DOORBELL", "0")]);
        eprintln!("{mode}: {bell} round trips with the host doorbell, {parked} without");
        // Set-up only (socket, connect, the first wait before the ring is
        // bound): none per round.
        assert!(
            bell <= (ROUNDS / 10) as u64,
            "{mode}: {bell} round trips for {ROUNDS} blocking waits (doorbell)"
        );
        assert!(
            parked >= (ROUNDS / 2) as u64,
            "{mode}: only {parked} round trips without the doorbell: the test does not wait"
        );
    }
}
