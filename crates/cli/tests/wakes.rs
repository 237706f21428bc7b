//! Wake-ups batched (issue 14 item 5): the server wakes a sleeping host
//! thread at most once per pass for the completions it publishes on that
//! thread's channel, not once per completion (`tcps stat` WAKES).

mod common;

use common::*;
use serde_json::Value;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use tcps_proto::Call;

/// This process's `wakes` counter once `tcps stat` shows `calls` calls.
fn wakes_after(srv: &Server, calls: u64) -> u64 {
    let pid = u64::from(std::process::id());
    let t = Instant::now();
    loop {
        let v: Value = srv.stat_json();
        let me = v["hosts"]
            .as_array()
            .and_then(|hs| hs.iter().find(|h| h["pid"].as_u64() == Some(pid)).cloned());
        if let Some(h) = me {
            if h["counters"]["calls_total"].as_u64().unwrap_or(0) >= calls {
                return h["counters"]["wakes"].as_u64().unwrap_or(u64::MAX);
            }
        }
        assert!(t.elapsed() < Duration::from_secs(5), "tcps stat: {v:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A burst of N requests published with one store (the server takes them
/// in one pass: up to 32 per channel) while a host thread is marked asleep
/// on the channel: N completions, one wake. Then again: one more wake.
#[test]
fn a_burst_of_completions_costs_one_wake() {
    const N: u32 = 20;
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let raw = RawCalls::new(RawHost::attach(&srv.socket).unwrap());
    let ch = raw.h.region.channel(0).unwrap();
    // A sleeper as the host library registers one (`host_waiting` set,
    // then a futex wait on `cq_tail`; the server wakes what it finds set).
    ch.ctl().host_waiting.store(1, Ordering::Release);
    for round in 1..=2u64 {
        let first = (round as u32 - 1) * N;
        for i in 0..N {
            let mut r = Call::Nop.encode();
            r.user_data = u64::from(first + i) + 1;
            ch.write_request(first + i, &r);
        }
        // One store publishes the whole burst.
        ch.ctl().req_tail.store(first + N, Ordering::Release);
        fence(Ordering::SeqCst);
        raw.h.ring();
        let t = Instant::now();
        while ch.ctl().cq_tail.load(Ordering::Acquire) < first + N {
            assert!(t.elapsed() < Duration::from_secs(5), "completions missing");
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..N {
            let c = ch.read_completion(first + i);
            assert_eq!((c.user_data, c.result), (u64::from(first + i) + 1, 0));
        }
        ch.ctl().cq_head.store(first + N, Ordering::Release);
        let wakes = wakes_after(&srv, round * u64::from(N));
        eprintln!("after burst {round} of {N} completions: {wakes} wakes");
        assert_eq!(wakes, round, "a burst of {N} completions to one sleeper");
    }
}

/// `perf stat -e syscalls:sys_enter_futex` on process `pid` while `work`
/// runs: the futex system calls it made.
fn futex_calls(pid: u32, work: impl FnOnce()) -> u64 {
    let perf = std::process::Command::new("perf")
        .args(["stat", "-x,", "-e", "syscalls:sys_enter_futex", "-p"])
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("perf (linux-perf)");
    std::thread::sleep(Duration::from_millis(500)); // attached
    work();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let out = perf.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .find(|l| l.contains("sys_enter_futex"))
        .and_then(|l| l.split(',').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("perf stat said: {text}"))
}

/// A host thread asleep on a receive ring is woken by the server for each
/// message; on io_uring the wake is a `FUTEX_WAKE` operation submitted with
/// the worker's pass (no futex system call), with epoll one `futex(2)`.
fn ring_wakes_without_futex_calls(engine: &str) {
    const MESSAGES: usize = 200;
    let srv = Server::start(engine, &["--poll", "adaptive", "--balance", "off"]);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let mut k = std::net::TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    let woke0 = wakes_after(&srv, 0);
    let calls = futex_calls(srv.pid(), || {
        let sender = std::thread::spawn(move || {
            use std::io::Write;
            for i in 0..MESSAGES {
                // Long enough for the receiver to stop spinning and sleep.
                std::thread::sleep(Duration::from_millis(2));
                k.write_all(&[i as u8]).unwrap();
            }
            k
        });
        for i in 0..MESSAGES {
            let got = tcps_recv_exact(&c, s, 1).unwrap();
            assert_eq!(got, [i as u8]);
        }
        drop(sender.join().unwrap());
    });
    let woke = wakes_after(&srv, 0) - woke0;
    eprintln!("{engine}: {MESSAGES} messages, {woke} wakes, {calls} futex system calls");
    // The receiver slept for most of them (else this tests nothing).
    assert!(woke as usize >= MESSAGES / 2, "{woke} wakes");
    if engine == "uring" {
        assert!(calls < 10, "{calls} futex system calls for {woke} wakes");
    } else {
        assert!(calls >= woke / 2, "{calls} futex calls for {woke} wakes");
    }
}

engine_tests!(ring_wakes_without_futex_calls);
