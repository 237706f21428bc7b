//! A connection published in a listener's accept ring wakes one of the
//! threads blocked in `accept` on it, not all of them — as the kernel's
//! exclusive wake-up does for a listening socket. Sixteen threads block in
//! accept; each of four connections, one after another, is taken by one
//! thread, and the threads still blocked are counted as they switch in
//! (`voluntary_ctxt_switches`): waking all of them would cost 15, 14, 13,
//! 12 switches; one per connection none (beyond the sleeps' own 100 ms
//! slices).

mod common;

use common::*;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tcps::Client;

const THREADS: usize = 16;
const CONNECTIONS: usize = 4;

fn switches(tid: i32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A server, a client, and a listener whose accept ring was asked for
/// once (its first accept, done).
fn primed_listener(engine: &str) -> (Server, Arc<Client>, u32, std::net::SocketAddr) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--balance", "off"]);
    let c = Arc::new(srv.attach());
    let (l, addr) = tcps_listener(&c);
    let k = std::net::TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    c.close(s).unwrap();
    drop(k);
    (srv, c, l, addr)
}

fn one_thread_woken_per_connection(engine: &str) {
    let (_srv, c, l, addr) = primed_listener(engine);

    let (tid_tx, tid_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (c, tid_tx, done_tx) = (c.clone(), tid_tx.clone(), done_tx.clone());
            std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                tid_tx.send(tid).unwrap();
                let (s, _) = c.accept(l, 0).unwrap();
                c.close(s).unwrap();
                done_tx.send(tid).unwrap();
            })
        })
        .collect();
    let mut blocked: Vec<i32> = (0..THREADS).map(|_| tid_rx.recv().unwrap()).collect();
    // Past their spinning, asleep on the ring.
    std::thread::sleep(Duration::from_millis(300));

    // Threads woken for nothing, per connection.
    let mut woken = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let before: Vec<u64> = blocked.iter().map(|&t| switches(t)).collect();
        clients.push(std::net::TcpStream::connect(addr).unwrap());
        let took = done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("no thread took the connection");
        // Time for every woken thread to run and go back to sleep.
        std::thread::sleep(Duration::from_millis(20));
        let mut n = 0;
        for (i, &t) in blocked.iter().enumerate() {
            if t != took {
                n += switches(t) - before[i];
            }
        }
        woken.push(n);
        blocked.retain(|&t| t != took);
    }
    eprintln!("{engine}: threads that stayed blocked woke {woken:?} times per connection");
    // All of them: 15, 14, 13, 12. The sleeps' 100 ms slices end for all
    // at once (they began together), in one window at most: the fewest.
    let fewest = woken.iter().min().copied().unwrap_or(0);
    assert!(
        fewest <= 3,
        "{woken:?} wake-ups of threads that got nothing"
    );

    // The rest are served too.
    let t = Instant::now();
    for _ in CONNECTIONS..THREADS {
        clients.push(std::net::TcpStream::connect(addr).unwrap());
    }
    for th in threads {
        th.join().unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(10));
}

engine_tests!(one_thread_woken_per_connection);

/// This process's host `wakes` counter (`tcps stat`).
fn wakes(srv: &Server) -> u64 {
    let v = srv.stat_json();
    v["total"]["counters"]["wakes"].as_u64().unwrap_or(0)
}

/// A thread asleep in accept is woken once its connection's request is in
/// the connection's receive ring, not at the accept and then again for the
/// request: one wake-up per request-carrying connection, not two
/// (`calls::eager::acceptwake`). A connection without data still wakes it
/// (200 µs later at most).
fn acceptor_woken_once_with_the_request(engine: &str) {
    const N: u64 = 40;
    let (srv, c, l, addr) = primed_listener(engine);
    let acceptor = {
        let c = c.clone();
        std::thread::spawn(move || {
            for i in 0..N {
                let (s, _) = c.accept(l, 0).unwrap();
                let got = tcps_recv_exact(&c, s, 8).unwrap();
                assert_eq!(got, i.to_le_bytes());
                c.close(s).unwrap();
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let before = wakes(&srv);
    for i in 0..N {
        use std::io::Write;
        // The acceptor is asleep again before each connection.
        std::thread::sleep(Duration::from_millis(20));
        let mut k = std::net::TcpStream::connect(addr).unwrap();
        k.write_all(&i.to_le_bytes()).unwrap();
    }
    acceptor.join().unwrap();
    std::thread::sleep(Duration::from_millis(250)); // the counters published
    let woke = wakes(&srv) - before;
    eprintln!("{engine}: {N} connections with a request: {woke} wake-ups");
    assert!(woke >= N / 2, "the acceptor never slept? {woke}");
    assert!(woke <= N + N / 4, "{woke} wake-ups for {N} connections");

    // Without data: woken anyway.
    let t = Instant::now();
    let k = std::net::TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    c.close(s).unwrap();
    drop(k);
}

engine_tests!(acceptor_woken_once_with_the_request);
