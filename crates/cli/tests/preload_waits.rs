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
use serde_json::Value;
use std::io::{Read, Write};
use std::time::Duration;

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/waits.py");
const ROUNDS: usize = 200;

/// The host's counters after `ROUNDS` blocking waits in `mode`, each
/// answered after a pause by the peer here; the program's echo of every
/// message checked.
fn waits(srv: &Server, dir: &TempDir, mode: &str, env: &[(&str, &str)]) -> Value {
    let rounds = ROUNDS.to_string();
    host_counters(srv, dir, PROG, &[mode, "{port}", &rounds], env, |k, tag| {
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
        let c = waits(&srv, &dir, mode, &[]);
        let n = |k: &str| c[k].as_u64().unwrap_or(u64::MAX);
        let bell = n("round_trips");
        let parked = waits(&srv, &dir, mode, &[("TCPS_HOST_DOORBELL", "0")])["round_trips"]
            .as_u64()
            .unwrap_or(0);
        eprintln!("{mode}: {bell} round trips with the host doorbell, {parked} without");
        // Set-up only (socket, connect, the first wait before the ring is
        // bound): none per round.
        assert!(
            bell <= (ROUNDS / 10) as u64,
            "{mode}: {bell} round trips for {ROUNDS} blocking waits (doorbell)"
        );
        // Each wait ended by the doorbell, none by a futex wake (the
        // sleeper is on no ring's futex; the few futex wakes are the
        // set-up calls' completions and a ring's binding): one wake-up
        // per wait at most.
        assert!(
            n("doorbell_rings") >= (ROUNDS / 2) as u64 && n("doorbell_rings") <= ROUNDS as u64 + 10,
            "{mode}: {} doorbell rings for {ROUNDS} waits",
            n("doorbell_rings")
        );
        assert!(
            n("wakes") <= bell + 5,
            "{mode}: {} futex wakes, {bell} round trips",
            n("wakes")
        );
        assert!(
            parked >= (ROUNDS / 2) as u64,
            "{mode}: only {parked} round trips without the doorbell: the test does not wait"
        );
    }
}

const OUT_BLOCKS: usize = 40;

/// The host's counters after `waits.py out`: a non-blocking writer that
/// waits in epoll for EPOLLOUT whenever its send queue is full, against a
/// slow reader here that checks every byte.
fn pollout_waits(srv: &Server, dir: &TempDir, env: &[(&str, &str)]) -> Value {
    let blocks = OUT_BLOCKS.to_string();
    host_counters(
        srv,
        dir,
        PROG,
        &["out", "{port}", &blocks],
        env,
        |k, tag| {
            let total = OUT_BLOCKS * 65536;
            let mut got = 0usize;
            let mut b = vec![0u8; 16 * 1024];
            while got < total {
                // Slower than the writer: its queue fills and it waits.
                std::thread::sleep(Duration::from_micros(500));
                let n = k.read(&mut b).unwrap_or_else(|e| panic!("{tag}: {e}"));
                assert!(n > 0, "{tag}: EOF after {got} bytes");
                for (j, &x) in b[..n].iter().enumerate() {
                    assert_eq!(x as usize, ((got + j) * 7) % 251, "{tag}: byte {}", got + j);
                }
                got += n;
            }
            total as u64
        },
    )
}

/// Waiting for room (EPOLLOUT with a full send queue) costs no round trip
/// either: the thread sleeps on the doorbell, registered on the socket's
/// send queue, and the server rings it when sends finish. Without the
/// doorbell the wait is sliced server polls.
#[test]
fn pollout_waits_make_no_round_trips() {
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let dir = TempDir::new("preload-pollout");
    let c = pollout_waits(&srv, &dir, &[]);
    let n = |c: &Value, k: &str| c[k].as_u64().unwrap_or(u64::MAX);
    let off = pollout_waits(&srv, &dir, &[("TCPS_HOST_DOORBELL", "0")]);
    eprintln!(
        "EPOLLOUT waits: {} round trips and {} doorbell rings with the doorbell, {} round trips without",
        n(&c, "round_trips"),
        n(&c, "doorbell_rings"),
        n(&off, "round_trips")
    );
    assert!(n(&c, "doorbell_rings") > 0, "the writer never waited: {c}");
    assert!(n(&c, "round_trips") <= 20, "{c}");
    assert!(n(&off, "round_trips") > n(&c, "round_trips") + 20, "{off}");
}

const THREADS: usize = 4;
const THREAD_ROUNDS: usize = 50;

/// The host's counters after `threads_wait.py`: `THREADS` threads each
/// waiting in poll(2) for its own connection, answered here in turn (each
/// message compared end to end).
fn thread_waits(srv: &Server, dir: &TempDir, env: &[(&str, &str)]) -> Value {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let tag = format!("threads-{}", env.len());
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let prog = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/threads_wait.py");
    let (t, r) = (THREADS.to_string(), THREAD_ROUNDS.to_string());
    let mut cmd = command(
        Net::Tcps,
        srv,
        &stats,
        &log,
        &["python3", prog, &port, &t, &r],
    );
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn");
    let mut peers: Vec<_> = (0..THREADS).map(|_| l.accept().unwrap().0).collect();
    for i in 0..THREAD_ROUNDS {
        for (j, k) in peers.iter_mut().enumerate() {
            // Long enough that every thread is asleep in its wait.
            std::thread::sleep(Duration::from_millis(1));
            k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let msg: Vec<u8> = (0..100).map(|x| (i * 7 + j * 3 + x) as u8).collect();
            k.write_all(&msg).unwrap();
            let mut back = vec![0u8; 100];
            k.read_exact(&mut back)
                .unwrap_or_else(|e| panic!("{tag}: round {i} thread {j}: {e}\n{}", read(&log)));
            let want: Vec<u8> = msg.iter().rev().copied().collect();
            assert_eq!(back, want, "{tag}: round {i} thread {j}: echo differs");
        }
    }
    let want = (THREADS * THREAD_ROUNDS * 100) as u64;
    let h = counters_once_sent(srv, child.id(), want);
    drop(peers);
    let st = common::wait_timeout(&mut child, Duration::from_secs(20));
    assert!(
        st.is_some_and(|s| s.success()),
        "{tag}: {st:?}\n{}",
        read(&log)
    );
    let h = h.unwrap_or_else(|| panic!("{tag}: host not in tcps stat\n{}", read(&log)));
    eprintln!("{tag}: {h}");
    h
}

/// Several threads of one process sleep on the host doorbell at once, each
/// on a doorbell of its own: none of their waits parks a call at the
/// server. Without the doorbell every wait is a round trip.
#[test]
fn several_threads_sleep_on_doorbells_at_once() {
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let dir = TempDir::new("preload-threads");
    let n = |c: &Value, k: &str| c[k].as_u64().unwrap_or(u64::MAX);
    let on = thread_waits(&srv, &dir, &[]);
    let off = thread_waits(&srv, &dir, &[("TCPS_HOST_DOORBELL", "0")]);
    let waits = (THREADS * THREAD_ROUNDS) as u64;
    let polls = |c: &Value| c["calls"]["Poll"].as_u64().unwrap_or(u64::MAX);
    // Parked polls: only a thread's first wait, before its ring is bound.
    assert!(polls(&on) <= 4 * THREADS as u64, "{on}");
    assert!(polls(&off) >= waits / 2, "{off}");
    // Each wait woken by its own doorbell, once: no thread is rung for
    // another thread's socket.
    assert!(n(&on, "doorbell_rings") >= waits / 2, "{on}");
    assert!(
        n(&on, "doorbell_rings") <= waits + 2 * THREADS as u64,
        "{on}"
    );
    assert!(
        n(&on, "round_trips") * 4 < n(&off, "round_trips"),
        "{on}\n{off}"
    );
}
