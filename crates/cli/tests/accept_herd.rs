//! A connection published in a listener's accept ring wakes one of the
//! threads blocked in `accept` on it, not all of them — as the kernel's
//! exclusive wake-up does for a listening socket. Sixteen threads block in
//! accept; each of four connections, one after another, is taken by one
//! thread, and the threads still blocked are counted as they switch in
//! (`voluntary_ctxt_switches`): waking all of them would cost about
//! 15 + 14 + 13 + 12 switches; one per connection costs about nothing
//! beyond the sleeps' own 100 ms slices.

mod common;

use common::*;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

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

fn one_thread_woken_per_connection(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--balance", "off"]);
    let c = Arc::new(srv.attach());
    let (l, addr) = tcps_listener(&c);
    // The ring is asked for once (its first accept), before the threads.
    let k = std::net::TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    c.close(s).unwrap();
    drop(k);

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

    let mut woken = 0;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let before: Vec<u64> = blocked.iter().map(|&t| switches(t)).collect();
        clients.push(std::net::TcpStream::connect(addr).unwrap());
        let took = done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("no thread took the connection");
        // Time for every woken thread to run and go back to sleep.
        std::thread::sleep(Duration::from_millis(20));
        for (i, &t) in blocked.iter().enumerate() {
            if t != took {
                woken += switches(t) - before[i];
            }
        }
        blocked.retain(|&t| t != took);
    }
    eprintln!(
        "{engine}: {CONNECTIONS} connections woke threads that stayed blocked \
         {woken} times"
    );
    // All of them: 15 + 14 + 13 + 12 = 54. The sleeps' 100 ms slices end
    // for about a fifth of them in each 20 ms window: ~11.
    assert!(woken <= 24, "{woken} wake-ups of threads that got nothing");

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
