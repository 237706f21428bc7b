//! `--metrics-listen` against clients that connect and say nothing
//! (slowloris): a scraper is answered within a second while they do.
//!
//! The listener used to serve one connection at a time, giving each a
//! second to send its request, so 20 silent connections every 0.5 s queued
//! a scrape behind tens of seconds of them. Each connection now has its own
//! deadline and all are served together, with a cap on how many are open
//! (the oldest is dropped for a new one).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a scrape may take while an attack is on.
const BOUND: Duration = Duration::from_secs(1);

fn metrics_server() -> Server {
    Server::start("uring", &["--metrics-listen", "127.0.0.1:0"])
}

/// One `GET /metrics`: how long it took, or why it failed (the read gives
/// up after 5 s so that a starved scrape fails the test, not hangs it).
fn scrape(addr: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut k = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    k.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    k.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut text = String::new();
    k.read_to_string(&mut text)
        .map_err(|e| format!("{e} after {:?}", t.elapsed()))?;
    let took = t.elapsed();
    if !text.starts_with("HTTP/1.1 200") || !text.contains("tcps_hosts_attached ") {
        return Err(format!("not the metrics: {text:?}"));
    }
    Ok(took)
}

/// Scrapes `n` times and fails if one takes longer than [`BOUND`].
fn assert_scrapes(addr: &str, n: usize, what: &str) {
    for i in 0..n {
        match scrape(addr) {
            Ok(took) => {
                println!("{what}: scrape {i} answered in {took:?}");
                assert!(took < BOUND, "{what}: scrape {i} took {took:?}");
            }
            Err(e) => panic!("{what}: scrape {i} failed: {e}"),
        }
    }
}

/// The review's pattern: 20 new silent connections every 0.5 s, each kept
/// about 3 s, until `stop`. `opened` counts the connections made.
fn slowloris(addr: String, stop: Arc<AtomicBool>, opened: Arc<AtomicUsize>) {
    let mut batches: Vec<Vec<TcpStream>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let batch: Vec<TcpStream> = (0..20)
            .filter_map(|_| TcpStream::connect(&addr).ok())
            .collect();
        opened.fetch_add(batch.len(), Ordering::Relaxed);
        batches.push(batch);
        if batches.len() > 6 {
            batches.remove(0);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Scrapes during the slowloris attack answer within a second.
#[test]
fn scrapes_answered_during_slowloris() {
    let srv = metrics_server();
    let addr = srv.metrics_addr();
    assert_scrapes(&addr, 1, "baseline");
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let attacker = {
        let (addr, stop, opened) = (addr.clone(), stop.clone(), opened.clone());
        std::thread::spawn(move || slowloris(addr, stop, opened))
    };
    // Under way: two batches open (bounded wait).
    let t = Instant::now();
    while opened.load(Ordering::Relaxed) < 40 {
        assert!(t.elapsed() < Duration::from_secs(10), "attacker stuck");
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = std::panic::catch_unwind(|| {
        for round in 0..4 {
            assert_scrapes(&addr, 1, &format!("during the attack, round {round}"));
            std::thread::sleep(Duration::from_millis(400));
        }
    });
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    assert!(opened.load(Ordering::Relaxed) >= 80, "the attack ran");
    assert_scrapes(&addr, 1, "after");
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// More silent connections than the listener keeps open: the oldest are
/// dropped, so the newest (the scraper) is still answered at once, and the
/// server holds no more than the cap of them.
#[test]
fn scrape_answered_past_the_connection_cap() {
    let srv = metrics_server();
    let addr = srv.metrics_addr();
    let before = open_fds(srv.pid());
    let silent: Vec<TcpStream> = (0..300)
        .map(|i| TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect {i}: {e}")))
        .collect();
    let held = open_fds(srv.pid()).saturating_sub(before);
    println!(
        "the server holds {held} of {} silent connections",
        silent.len()
    );
    assert!(held <= 64, "the server holds {held} connections");
    assert_scrapes(&addr, 3, "300 silent connections open");
}
