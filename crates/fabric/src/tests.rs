//! Two workers in one process (and, for peer death, a child process that
//! is killed) over UCX's tcp and shared-memory transports.

use crate::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn ctx(tls: &str) -> Context {
    let opts = ContextOptions {
        transports: Some(tls.into()),
        rma: true,
        reuse_addr: false,
    };
    Context::new(&opts).expect("UCX context (libucx-dev installed?)")
}

/// Flushes `ep` (on `a`), progressing both workers.
fn flush(a: &Worker, b: &Worker, ep: &Endpoint) {
    let mut f = ep.flush_begin().unwrap();
    let mut res = None;
    drive(a, b, || {
        res = f.poll();
        res.is_some()
    });
    res.unwrap().unwrap();
}

/// Progresses both workers until `f` says done, at most 10 s.
fn drive(a: &Worker, b: &Worker, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out");
        a.progress();
        b.progress();
    }
}

struct Pair {
    server: Worker,
    client: Worker,
    _listener: Listener,
    s_ep: Endpoint,
    c_ep: Endpoint,
}

fn pair(tls: &str) -> Pair {
    let c = ctx(tls);
    let server = Worker::new(&c).unwrap();
    let client = Worker::new(&c).unwrap();
    for w in [&server, &client] {
        for id in [1, 2, 3] {
            w.set_am_handler(id).unwrap();
        }
    }
    let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let c_ep = client.connect(addr).unwrap();
    let mut req = None;
    drive(&server, &client, || {
        req = listener.take_request();
        req.is_some()
    });
    let req = req.unwrap();
    assert_eq!(
        req.peer_addr().map(|a| a.ip()),
        Some("127.0.0.1".parse().unwrap())
    );
    let s_ep = req.accept().unwrap();
    Pair {
        server,
        client,
        _listener: listener,
        s_ep,
        c_ep,
    }
}

fn recv(p: &Pair, on_server: bool) -> AmMessage {
    let mut got = None;
    drive(&p.server, &p.client, || {
        got = if on_server {
            p.server.take_am()
        } else {
            p.client.take_am()
        };
        got.is_some()
    });
    got.unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn am_round_trip(tls: &str) {
    let p = pair(tls);
    p.c_ep.am_send(1, b"hello", pattern(100, 1), true).unwrap();
    let m = recv(&p, true);
    assert_eq!(
        (m.id, m.header.as_slice(), m.data),
        (1, &b"hello"[..], pattern(100, 1))
    );
    assert_eq!(
        m.from,
        Some(p.s_ep.tag()),
        "the reply endpoint names the server's endpoint"
    );
    // A large reply goes by rendezvous; it must arrive whole.
    let big = pattern(4 << 20, 7);
    p.s_ep.am_send(2, &[9; 8], big.clone(), false).unwrap();
    let m = recv(&p, false);
    assert_eq!(m.id, 2);
    assert_eq!(m.header, vec![9; 8]);
    assert!(m.data == big, "rendezvous data differs");
    // A large message then small ones: taken in the order sent (the
    // eager ones arrive first but wait behind the rendezvous one).
    for i in 0..3u32 {
        let data = if i == 0 { big.clone() } else { Vec::new() };
        p.c_ep.am_send(2, &i.to_le_bytes(), data, true).unwrap();
    }
    for i in 0..3u32 {
        let m = recv(&p, true);
        assert_eq!(m.header, i.to_le_bytes().to_vec(), "out of order");
        assert_eq!(m.data.len(), if i == 0 { big.len() } else { 0 });
    }
    // A burst keeps its order.
    for i in 0..100u32 {
        p.c_ep
            .am_send(3, &i.to_le_bytes(), Vec::new(), false)
            .unwrap();
    }
    for i in 0..100u32 {
        let m = recv(&p, true);
        assert_eq!((m.id, m.header), (3, i.to_le_bytes().to_vec()));
    }
    flush(&p.client, &p.server, &p.c_ep);
    drive(&p.server, &p.client, || p.client.in_flight() == 0);
}

#[test]
fn am_round_trip_tcp() {
    am_round_trip("tcp");
}

#[test]
fn am_round_trip_shm() {
    am_round_trip("shm,tcp");
}

fn put_get(tls: &str) {
    let p = pair(tls);
    let c = ctx(tls);
    const LEN: usize = 1 << 20;
    let smem = Memory::alloc(&c, LEN).unwrap();
    let mut hdr = smem.addr().to_le_bytes().to_vec();
    hdr.extend_from_slice(&(LEN as u64).to_le_bytes());
    p.s_ep
        .am_send(1, &hdr, smem.pack_rkey().unwrap(), false)
        .unwrap();
    let m = recv(&p, false);
    let base = u64::from_le_bytes(m.header[..8].try_into().unwrap());
    let len = u64::from_le_bytes(m.header[8..16].try_into().unwrap()) as usize;
    let remote = p.c_ep.remote_region(&m.data, base, len).unwrap();

    let cmem = Memory::alloc(&c, LEN).unwrap();
    let data = pattern(LEN, 3);
    cmem.write(0, &data).unwrap();
    // Entries, a fence, then the "index": the index never lands first.
    p.c_ep.put(&cmem, 0, LEN - 8, &remote, 0).unwrap();
    p.client.rma_fence().unwrap();
    p.c_ep
        .put_bytes(data[LEN - 8..].to_vec(), &remote, LEN - 8)
        .unwrap();
    flush(&p.client, &p.server, &p.c_ep);
    let mut got = vec![0u8; LEN];
    smem.read(0, &mut got).unwrap();
    assert!(got == data, "put: bytes differ at the target");

    // Out of bounds is refused before anything is issued.
    assert!(p.c_ep.put(&cmem, 0, 16, &remote, LEN - 8).is_err());
    assert!(p.c_ep.put_bytes(vec![0; 1], &remote, LEN).is_err());
    assert!(p.c_ep.get(&cmem, LEN - 4, 8, &remote, 0).is_err());

    let back = pattern(LEN, 200);
    smem.write(0, &back).unwrap();
    p.c_ep.get(&cmem, 0, LEN, &remote, 0).unwrap();
    flush(&p.client, &p.server, &p.c_ep);
    drive(&p.server, &p.client, || p.client.in_flight() == 0);
    cmem.read(0, &mut got).unwrap();
    assert!(got == back, "get: bytes differ");
}

#[test]
fn put_get_rkeys_tcp() {
    put_get("tcp");
}

#[test]
fn put_get_rkeys_shm() {
    put_get("shm,tcp");
}

#[test]
fn shared_file_mapping_is_shared() {
    let c = ctx("tcp");
    let name = std::ffi::CString::new("fabric-test").unwrap();
    // SAFETY: memfd_create with a valid name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: fd was just returned by memfd_create and is owned here.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    assert!(
        Memory::map_shared(&c, &file, 8192).is_err(),
        "a file shorter than asked is refused"
    );
    file.set_len(8192).unwrap();
    let a = Memory::map_shared(&c, &file, 8192).unwrap();
    let b = Memory::map_shared(&c, &file, 8192).unwrap();
    a.write(100, b"shared").unwrap();
    let mut out = [0u8; 6];
    b.read(100, &mut out).unwrap();
    assert_eq!(&out, b"shared");
}

#[test]
fn closed_peer_is_reported() {
    let p = pair("tcp");
    let c_tag = p.c_ep.tag();
    drop(p.s_ep);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        p.client.progress();
        p.server.progress();
        if p.c_ep.status().is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "a closed peer was not reported");
    }
    let failures = p.client.take_failures();
    assert_eq!(failures.first().map(|f| f.0), Some(c_tag));
    assert!(p.c_ep.am_send(1, b"x", Vec::new(), false).is_err());
}

/// The child half of `peer_process_sleeps_wakes_and_dies` (run by it, not alone).
#[test]
#[ignore]
fn peer_child() {
    let Ok(addr) = std::env::var("FABRIC_TEST_PEER") else {
        return;
    };
    let addr: SocketAddr = addr.parse().unwrap();
    let c = ctx("tcp");
    let w = Worker::new(&c).unwrap();
    let ep = w.connect(addr).unwrap();
    w.set_am_handler(1).unwrap();
    ep.am_send(1, b"child", Vec::new(), false).unwrap();
    loop {
        w.wait(Some(Duration::from_millis(100)));
        if ep.status().is_err() {
            return; // the parent is gone
        }
        while let Some(m) = w.take_am() {
            ep.am_send(1, b"pong", m.data, false).unwrap();
        }
    }
}

/// Kills the child process when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This thread's CPU time (the other tests run beside it).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage into a local struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn peer_process_sleeps_wakes_and_dies() {
    let c = ctx("tcp");
    let server = Worker::new(&c).unwrap();
    server.set_am_handler(1).unwrap();
    let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut child = Child(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::peer_child", "--ignored", "--nocapture"])
            .env("FABRIC_TEST_PEER", addr.to_string())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ep = None;
    let mut hello = None;
    while hello.is_none() {
        assert!(Instant::now() < deadline, "the child never connected");
        server.wait(Some(Duration::from_millis(50)));
        if let Some(r) = listener.take_request() {
            ep = Some(r.accept().unwrap());
        }
        hello = server.take_am();
    }
    assert_eq!(hello.unwrap().header, b"child");
    let ep = ep.unwrap();
    // Idle with a live peer: the waiter sleeps on the event fd, it does
    // not spin (a spin is 10^5+ passes; right after connecting UCX 1.13's
    // tcp connection manager wakes the fd every ms or so for a while,
    // then it stays quiet: 2-400 wake-ups seen, no measurable CPU).
    let c0 = cpu_seconds();
    let t = Instant::now();
    let mut wakeups = 0;
    while t.elapsed() < Duration::from_secs(1) {
        server.wait(Some(Duration::from_secs(1).saturating_sub(t.elapsed())));
        wakeups += 1;
    }
    let cpu = cpu_seconds() - c0;
    eprintln!("idle second with a live peer: {wakeups} wake-ups, {cpu:.3} s CPU");
    assert!(
        wakeups <= 5000 && cpu < 0.2,
        "idle waiter spun: {wakeups} wake-ups, {cpu:.3} s CPU"
    );
    // A message wakes a sleeping waiter at once (through the event fd).
    ep.am_send(1, b"ping", vec![5; 64], false).unwrap();
    let t = Instant::now();
    let pong = loop {
        server.wait(Some(Duration::from_secs(5)));
        if let Some(m) = server.take_am() {
            break m;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no pong");
    };
    assert_eq!(
        (pong.header.as_slice(), pong.data),
        (&b"pong"[..], vec![5; 64])
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the event fd did not wake the waiter: {:?}",
        t.elapsed()
    );
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let killed = Instant::now();
    while ep.status().is_ok() {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "a killed peer was not reported"
        );
        server.wait(Some(Duration::from_millis(50)));
    }
    let err = ep.status().unwrap_err();
    assert!(err.is_peer_failure(), "{err}");
    assert_eq!(err.errno(), libc::ECONNRESET);
    assert_eq!(server.take_failures().first().map(|f| f.0), Some(ep.tag()));
    eprintln!("killed peer reported after {:?}: {err}", killed.elapsed());
}
