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
