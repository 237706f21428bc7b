//! A host can write anything anywhere in its shared region. Garbage from a
//! rogue host must never hurt the server or other hosts: the rogue gets
//! EINVAL completions or is cut off, while a well-behaved host keeps doing
//! checksummed echoes and the server stays up.
//!
//! The rogue speaks the raw protocol (tcps_proto): SEQPACKET control socket,
//! Hello, Welcome + SCM_RIGHTS, `Region::map_from_header`.

mod common;

use common::*;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps_proto::layout::{ChannelCtl, Layout, HEADER_SIZE};
use tcps_proto::{Call, Completion, Op, Request};

/// Waits (bounded) until the rogue is cut off or `cq_tail` of channel 0
/// reaches `want`; returns "cut off" or the completions.
fn outcome(h: &RawHost, want: u32, limit: Duration) -> Result<Vec<Completion>, &'static str> {
    let t = Instant::now();
    let ch = h.region.channel(0).unwrap();
    loop {
        if h.cut_off() {
            return Err("cut off");
        }
        let tail = ch.ctl().cq_tail.load(Ordering::Acquire);
        if tail >= want {
            return Ok((0..tail).map(|i| ch.read_completion(i)).collect());
        }
        if t.elapsed() > limit {
            return Err("neither");
        }
        h.ring();
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn forged_indices(engine: &str) {
    let mut srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let good = srv.attach();

    // 1. Three zeroed requests, published (op 0: no such call): EINVAL.
    let h = RawHost::attach(&srv.socket).unwrap();
    h.region.header().channels_used.store(1, Ordering::Release);
    let ch = h.region.channel(0).unwrap();
    for i in 0..3 {
        ch.write_request(i, &Request::default());
    }
    ch.ctl().req_tail.store(3, Ordering::Release);
    h.ring();
    match outcome(&h, 3, Duration::from_secs(3)) {
        Ok(cs) => {
            assert_eq!(cs.len(), 3);
            for c in cs {
                assert_eq!(c.errno, libc::EINVAL, "garbage request answered with {c:?}");
                assert_eq!(c.result, -1);
            }
        }
        Err("cut off") => {}
        Err(e) => panic!("zeroed requests: {e} (no EINVAL completions, not cut off)"),
    }
    echo_roundtrip(&good, echo, &Rng::new(1).bytes(50_000));

    // 2. req_tail forged far past the ring is ignored (the server reads
    //    slots by their stamps): a valid request afterwards is served.
    let h2 = RawHost::attach(&srv.socket).unwrap();
    h2.region.header().channels_used.store(1, Ordering::Release);
    let ch2 = h2.region.channel(0).unwrap();
    ch2.ctl().req_tail.store(1000, Ordering::Release);
    h2.ring();
    ch2.write_request(
        0,
        &Request {
            user_data: 5,
            ..Call::Nop.encode()
        },
    );
    h2.ring();
    let r = outcome(&h2, 1, Duration::from_secs(3));
    match &r {
        Ok(cs) => assert_eq!((cs[0].user_data, cs[0].errno, cs[0].result), (5, 0, 0)),
        other => panic!("forged req_tail 1000, then a Nop: {other:?}"),
    }
    echo_roundtrip(&good, echo, &Rng::new(2).bytes(50_000));

    // 3. cq_head forged ahead of anything the server published: once the
    //    server has to look at it (its completion ring looks full) the rogue
    //    is cut off.
    let h3 = RawHost::attach(&srv.socket).unwrap();
    h3.region.header().channels_used.store(1, Ordering::Release);
    let ch3 = h3.region.channel(0).unwrap();
    ch3.ctl().cq_head.store(1000, Ordering::Release);
    let entries = h3.region.layout().ring_entries;
    let t = Instant::now();
    let mut published = 0u32;
    while !h3.cut_off() && t.elapsed() < Duration::from_secs(3) {
        let head = ch3.ctl().req_head.load(Ordering::Acquire);
        if published < 2 * entries && published.wrapping_sub(head) < entries {
            ch3.write_request(
                published,
                &Request {
                    user_data: published as u64,
                    ..Call::Nop.encode()
                },
            );
            published += 1;
            ch3.ctl().req_tail.store(published, Ordering::Release);
        }
        h3.ring();
        std::thread::sleep(Duration::from_millis(1));
    }
    let r3: Result<Vec<Completion>, &str> = if h3.cut_off() {
        Err("cut off")
    } else {
        Ok(Vec::new())
    };
    assert_eq!(
        r3,
        Err("cut off"),
        "forged cq_head 1000: the rogue was not cut off"
    );

    // 4. A valid request on a channel beyond channels_used + a huge
    //    channels_used: clamped, and the request is served (Nop → 0).
    let h4 = RawHost::attach(&srv.socket).unwrap();
    let n = h4.region.layout().n_channels;
    h4.region
        .header()
        .channels_used
        .store(u32::MAX, Ordering::Release);
    let last = h4.region.channel(n - 1).unwrap();
    last.write_request(
        0,
        &Request {
            user_data: 77,
            ..Call::Nop.encode()
        },
    );
    last.ctl().req_tail.store(1, Ordering::Release);
    h4.ring();
    let t = Instant::now();
    while last.ctl().cq_tail.load(Ordering::Acquire) == 0 {
        assert!(
            !h4.cut_off(),
            "a huge channels_used alone got the host cut off"
        );
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "Nop on the last channel never completed"
        );
        h4.ring();
        std::thread::sleep(Duration::from_millis(2));
    }
    let c = last.read_completion(0);
    assert_eq!((c.user_data, c.errno, c.result), (77, 0, 0), "{c:?}");

    assert!(srv.is_alive(), "server died:\n{}", srv.log_text());
    echo_roundtrip(&good, echo, &Rng::new(3).bytes(300_000));
    eprintln!(
        "{engine}: forged req_tail 1000 → {:?}; forged cq_head → {:?}",
        r.map(|v| v.len()),
        r3.map(|v| v.len())
    );
}

/// Writes `len` random bytes at a random offset inside `[lo, hi)`.
fn scribble_in(h: &RawHost, rng: &mut Rng, lo: usize, hi: usize, max_len: usize) {
    let off = lo + rng.below((hi - lo) as u64) as usize;
    let len = 1 + rng.below(max_len as u64) as usize;
    let len = len.min(hi - off);
    h.scribble(off, &rng.bytes(len));
}

/// One random act of vandalism. Returns its name. With `keep_rings`, the
/// ring indices stay valid (the rogue even consumes its completions), so
/// the garbage reaches the server's request handling instead of getting the
/// rogue cut off at once.
fn vandalize(h: &RawHost, rng: &mut Rng, keep_rings: bool) -> &'static str {
    let layout: Layout = *h.region.layout();
    let n = layout.n_channels;
    let span = if keep_rings { n.min(16) } else { n.min(4) }; // mostly the first few channels
    let chi = rng.below(u64::from(span)) as u32;
    let ch = h.region.channel(chi).unwrap();
    let ctl = ch.ctl();
    if keep_rings {
        for i in 0..span {
            let c = h.region.channel(i).unwrap().ctl();
            c.cq_head
                .store(c.cq_tail.load(Ordering::Acquire), Ordering::Release);
        }
        if ctl
            .req_tail
            .load(Ordering::Relaxed)
            .wrapping_sub(ctl.req_head.load(Ordering::Acquire))
            >= layout.ring_entries
        {
            return "ring full (skipped)";
        }
    }
    let pick = if keep_rings {
        [0, 1, 2, 3, 7][rng.below(5) as usize]
    } else {
        rng.below(11)
    };
    match pick {
        0 | 1 => {
            // Random bytes as a request, published properly.
            let tail = ctl.req_tail.load(Ordering::Relaxed);
            let mut b = [0u8; 64];
            rng.fill(&mut b);
            let r = Request {
                user_data: u64::from_le_bytes(b[0..8].try_into().unwrap()),
                op: u16::from_le_bytes([b[8], b[9]]),
                stamp: u16::from_le_bytes([b[10], b[11]]),
                sock: u32::from_le_bytes(b[12..16].try_into().unwrap()),
                buf_off: u32::from_le_bytes(b[16..20].try_into().unwrap()),
                buf_len: u32::from_le_bytes(b[20..24].try_into().unwrap()),
                args: [0, 1, 2, 3, 4]
                    .map(|i| u64::from_le_bytes(b[24 + i * 8..32 + i * 8].try_into().unwrap())),
            };
            ch.write_request(tail, &r);
            ctl.req_tail.store(tail.wrapping_add(1), Ordering::Release);
            "random request"
        }
        2 | 3 => {
            // A real op with random (but small-ish) arguments.
            let tail = ctl.req_tail.load(Ordering::Relaxed);
            let op = Op::ALL[rng.below(Op::ALL.len() as u64) as usize];
            let small = |rng: &mut Rng| rng.below(300);
            let r = Request {
                user_data: rng.next_u64(),
                op: op as u16,
                stamp: 0,
                sock: rng.below(8) as u32,
                buf_off: (small(rng) as u32) * 8,
                buf_len: small(rng) as u32,
                args: [
                    // socket(AF_INET, SOCK_STREAM) half the time
                    if rng.below(2) == 0 {
                        libc::AF_INET as u64
                    } else {
                        rng.next_u64()
                    },
                    if rng.below(2) == 0 {
                        libc::SOCK_STREAM as u64
                    } else {
                        small(rng)
                    },
                    0,
                    rng.next_u64(),
                    rng.next_u64(),
                ],
            };
            // Parked polls/recvs with long timeouts are fine: they are the
            // rogue's own problem.
            ch.write_request(tail, &r);
            ctl.req_tail.store(tail.wrapping_add(1), Ordering::Release);
            "random op"
        }
        4 => {
            ctl.req_tail.store(rng.next_u64() as u32, Ordering::Release);
            "req_tail"
        }
        5 => {
            ctl.cq_head.store(rng.next_u64() as u32, Ordering::Release);
            "cq_head"
        }
        6 => {
            let v = match rng.below(3) {
                0 => rng.next_u64() as u32,
                1 => n + 1 + rng.below(10) as u32,
                _ => rng.below(u64::from(n) + 1) as u32,
            };
            h.region.header().channels_used.store(v, Ordering::Release);
            "channels_used"
        }
        7 => {
            let base = layout.channel_offset(chi) + layout.arena_offset();
            scribble_in(h, rng, base, base + layout.arena_size as usize, 4096);
            "arena"
        }
        8 => {
            scribble_in(h, rng, 0, HEADER_SIZE, 64);
            "header"
        }
        9 => {
            let base = layout.channel_offset(chi);
            scribble_in(h, rng, base, base + std::mem::size_of::<ChannelCtl>(), 16);
            "channel control block"
        }
        _ => {
            scribble_in(h, rng, 0, h.region_size, 256);
            "anywhere"
        }
    }
}

/// The region's memfd is sealed: a host cannot shrink (or grow) it under
/// the server's mapping, which would make the server fault.
fn region_cannot_be_resized(engine: &str) {
    let mut srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let good = srv.attach();
    let h = RawHost::attach(&srv.socket).unwrap();
    for size in [0i64, 4096, (h.region_size as i64) * 2] {
        // SAFETY: ftruncate on a descriptor we own.
        let r = unsafe { libc::ftruncate(h.memfd.as_raw_fd(), size) };
        let e = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(
            (r, e),
            (-1, Some(libc::EPERM)),
            "ftruncate to {size} was not refused"
        );
    }
    // The server still serves everybody, the rogue included.
    h.region.header().channels_used.store(1, Ordering::Release);
    let ch = h.region.channel(0).unwrap();
    ch.write_request(
        0,
        &Request {
            user_data: 3,
            ..Call::Nop.encode()
        },
    );
    h.ring();
    let cs = outcome(&h, 1, Duration::from_secs(3)).expect("Nop after the resize attempts");
    assert_eq!((cs[0].user_data, cs[0].errno), (3, 0));
    echo_roundtrip(&good, echo, &Rng::new(4).bytes(100_000));
    assert!(srv.is_alive());
}

fn garbage_never_hurts(engine: &str) {
    garbage(engine, false)
}

fn garbage_requests_only(engine: &str) {
    garbage(engine, true)
}

fn garbage(engine: &str, keep_rings: bool) {
    let seed: u64 = std::env::var("TCPS_IT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0bad);
    eprintln!("{engine}: rogue seed {seed} (set TCPS_IT_SEED to replay), keep_rings {keep_rings}");
    let mut srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let good = srv.attach();
    let stop = Arc::new(AtomicBool::new(false));
    let echoes = Arc::new(AtomicU64::new(0));
    let worker = {
        let (good, stop, echoes) = (good.clone(), stop.clone(), echoes.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0x600d);
            while !stop.load(Ordering::Relaxed) {
                let n = 1 + rng.below(200_000) as usize;
                echo_roundtrip(&good, echo, &rng.bytes(n));
                echoes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut rng = Rng::new(seed);
    let mut rogue = RawHost::attach(&srv.socket).expect("rogue attach");
    let (mut attaches, mut cutoffs) = (1u32, 0u32);
    let mut acts = std::collections::BTreeMap::<&str, u32>::new();
    let rounds = if keep_rings { 300 } else { 200 };
    for round in 0..rounds {
        if rogue.cut_off() {
            cutoffs += 1;
            rogue = RawHost::attach(&srv.socket)
                .unwrap_or_else(|e| panic!("round {round}: re-attach after a cut-off: {e}"));
            attaches += 1;
        }
        for _ in 0..1 + rng.below(3) {
            *acts
                .entry(vandalize(&rogue, &mut rng, keep_rings))
                .or_default() += 1;
        }
        if rng.below(4) != 0 {
            rogue.ring();
        }
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            srv.is_alive(),
            "server died at round {round} (seed {seed}):\n{}",
            srv.log_text()
        );
    }
    // Let the good host finish a few more echoes after the storm.
    let before = echoes.load(Ordering::Relaxed);
    let t = Instant::now();
    while echoes.load(Ordering::Relaxed) < before + 3 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the well-behaved host stalled (seed {seed})"
        );
        assert!(
            !worker.is_finished(),
            "the well-behaved host failed (seed {seed})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    within(Duration::from_secs(30), "well-behaved host", move || {
        worker.join()
    })
    .unwrap_or_else(|_| panic!("the well-behaved host failed during the garbage (seed {seed})"));
    assert!(
        srv.is_alive(),
        "server died (seed {seed}):\n{}",
        srv.log_text()
    );
    // A brand-new host works too.
    let fresh = srv.attach();
    echo_roundtrip(&fresh, echo, &Rng::new(seed).bytes(1 << 20));
    eprintln!(
        "{engine}: {} good echoes; rogue attached {attaches}x, cut off {cutoffs}x; acts {acts:?}",
        echoes.load(Ordering::Relaxed)
    );
    assert!(echoes.load(Ordering::Relaxed) >= 3);
    // Clean exit still works after all that.
    let st = srv.terminate(Duration::from_secs(5));
    assert!(
        st.is_some_and(|s| s.success()),
        "exit after garbage: {st:?}"
    );
}

engine_tests!(
    forged_indices,
    region_cannot_be_resized,
    garbage_never_hurts,
    garbage_requests_only
);
