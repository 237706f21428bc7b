//! Connection events for native programs (`Client::events_wait`,
//! `tcps_events_*`): a listener reports EV_ACCEPT, connections EV_DATA,
//! EV_ROOM and EV_CLOSED, many events come in one call, every byte arrives
//! (SHA-256 compared), and the event loop makes no round trip: readiness
//! comes from the rings and send queues in host memory, and a wait with
//! nothing ready sleeps on the host doorbell.

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tcps::{ConnEvent, EventQueue, EV_ACCEPT, EV_CLOSED, EV_DATA, EV_ROOM};

const CLIENTS: usize = 16;
const PER_CLIENT: usize = 64 * 1024;

/// An echo server as an event loop over `CLIENTS` connections: each client
/// sends `PER_CLIENT` random bytes and half-closes; the loop echoes until
/// every client is closed. Returns the largest batch one wait returned.
fn echo_loop(engine: &str) -> usize {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let q = EventQueue::new();
    q.add(l, EV_ACCEPT, u64::MAX).unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            std::thread::spawn(move || {
                let data = Rng::new(i as u64 + 1).bytes(PER_CLIENT);
                let mut k = TcpStream::connect(addr).unwrap();
                k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut w = k.try_clone().unwrap();
                let sent = data.clone();
                let writer = std::thread::spawn(move || {
                    w.write_all(&sent).unwrap();
                    w.shutdown(std::net::Shutdown::Write).unwrap();
                });
                let mut back = Vec::new();
                k.read_to_end(&mut back).unwrap();
                writer.join().unwrap();
                (Sha256::digest(&data), Sha256::digest(&back), back.len())
            })
        })
        .collect();
    let mut open = 0usize;
    let mut closed = 0usize;
    let mut biggest = 0usize;
    let mut pending: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut ev = [ConnEvent::default(); 64];
    let start = c.stats().round_trips;
    let mut accepts_rt = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while closed < CLIENTS {
        assert!(Instant::now() < deadline, "{engine}: event loop stuck");
        let n = c.events_wait(&q, &mut ev, 1000).unwrap();
        biggest = biggest.max(n);
        for e in &ev[..n] {
            if e.user == u64::MAX {
                assert_eq!(e.events & EV_ACCEPT, EV_ACCEPT, "{e:?}");
                let before = c.stats().round_trips;
                let (s, _) = c.accept(l, libc::SOCK_NONBLOCK).unwrap();
                accepts_rt += c.stats().round_trips - before;
                q.add(s, EV_DATA, u64::from(s)).unwrap();
                open += 1;
                continue;
            }
            let s = e.sock;
            assert_eq!(e.user, u64::from(s));
            if e.events & EV_ROOM != 0 {
                let buf = pending.remove(&s).unwrap_or_default();
                let n = send_some(&c, s, &buf);
                if n < buf.len() {
                    pending.insert(s, buf[n..].to_vec());
                } else {
                    q.add(s, EV_DATA, u64::from(s)).unwrap();
                }
            }
            if e.events & EV_DATA != 0 && !pending.contains_key(&s) {
                let mut b = vec![0u8; 16 * 1024];
                match c.recv(s, &mut b, libc::MSG_DONTWAIT) {
                    Ok(0) => {
                        c.close(s).unwrap();
                        q.remove(s).unwrap();
                        closed += 1;
                    }
                    Ok(k) => {
                        let sent = send_some(&c, s, &b[..k]);
                        if sent < k {
                            pending.insert(s, b[sent..k].to_vec());
                            q.add(s, EV_ROOM, u64::from(s)).unwrap();
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                    Err(e) => panic!("{engine}: recv: {e}"),
                }
            } else if e.events & EV_CLOSED != 0 && e.events & EV_DATA == 0 {
                panic!("{engine}: EV_CLOSED without EV_DATA on {s}: {e:?}");
            }
        }
    }
    let loop_rt = c.stats().round_trips - start - accepts_rt;
    eprintln!(
        "{engine}: event loop round trips {loop_rt}, accepts {accepts_rt}, largest batch {biggest}"
    );
    assert_eq!(open, CLIENTS);
    for t in clients {
        let (want, got, len) = t.join().unwrap();
        assert_eq!(len, PER_CLIENT, "{engine}: echo length");
        assert_eq!(want, got, "{engine}: echoed bytes differ");
    }
    // Receives come from the rings and waits from the doorbell; sends are
    // asynchronous: the loop itself makes (next to) no round trip.
    assert!(
        loop_rt <= 4,
        "{engine}: the event loop made {loop_rt} round trips"
    );
    biggest
}

/// Sends what the socket takes now (asynchronously); how much.
fn send_some(c: &tcps::Client, s: u32, b: &[u8]) -> usize {
    if b.is_empty() {
        return 0;
    }
    match c.send_async(s, b, libc::MSG_DONTWAIT) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => 0,
        Err(e) => panic!("send: {e}"),
    }
}

fn echo_event_loop(engine: &str) {
    let biggest = echo_loop(engine);
    assert!(biggest > 1, "{engine}: never more than one event per wait");
}

/// A wait with nothing ready sleeps (no round trip) until its timeout, and
/// wakes when data arrives later.
fn idle_wait_then_data(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let mut k = TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    let q = EventQueue::new();
    q.add(s, EV_DATA, 7).unwrap();
    let mut ev = [ConnEvent::default(); 4];
    // Binds the receive ring (the first look may ask the server).
    assert_eq!(c.events_wait(&q, &mut ev, 0).unwrap(), 0);
    let before = c.stats().round_trips;
    let t = Instant::now();
    assert_eq!(c.events_wait(&q, &mut ev, 100).unwrap(), 0);
    assert!(
        t.elapsed() >= Duration::from_millis(95),
        "{engine}: woke early"
    );
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        k.write_all(b"hello").unwrap();
        k
    });
    let n = c.events_wait(&q, &mut ev, 5000).unwrap();
    assert_eq!(n, 1, "{engine}");
    assert_eq!((ev[0].sock, ev[0].events, ev[0].user), (s, EV_DATA, 7));
    assert_eq!(
        c.stats().round_trips,
        before,
        "{engine}: waiting cost round trips"
    );
    let mut b = [0u8; 8];
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 5);
    assert_eq!(&b[..5], b"hello");
    drop(writer.join().unwrap());
    // The peer closed: EOF is reported as EV_CLOSED (with EV_DATA: read 0).
    let n = c.events_wait(&q, &mut ev, 5000).unwrap();
    assert_eq!(n, 1, "{engine}");
    assert_eq!(ev[0].events & EV_CLOSED, EV_CLOSED, "{engine}: {:?}", ev[0]);
}

engine_tests!(echo_event_loop, idle_wait_then_data);

/// The C ABI (`include/tcps.h`): a C program waits with
/// `tcps_events_wait` for a connection and its bytes, echoes them, and
/// checks its own mistakes get errnos (a bad queue EBADF, unknown bits
/// EINVAL, removing an unwatched socket ENOENT).
#[test]
fn c_api_event_loop() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = std::path::Path::new(TCPS).parent().unwrap();
    let dir = TempDir::new("events-c");
    let src = dir.path().join("ev.c");
    std::fs::write(&src, C_PROGRAM).unwrap();
    let exe = dir.path().join("ev");
    let out = std::process::Command::new("cc")
        .arg("-O1")
        .arg("-I")
        .arg(root.join("include"))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(lib)
        .arg("-ltcps")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let srv = start_server("uring");
    let port = 20_000 + (std::process::id() % 10_000) as u16;
    let child = std::process::Command::new(&exe)
        .arg(port.to_string())
        .env("TCPS_SOCKET", &srv.socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut k = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(k) => break k,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connect: {e}"),
        }
    };
    k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    k.write_all(b"ping over events").unwrap();
    let mut back = [0u8; 16];
    k.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping over events");
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("accept 1 data 1 round trips 0"), "{text}");
}

const C_PROGRAM: &str = r#"
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tcps.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s (errno %d)\n", #c, errno); return 1; } } while (0)
int main(int argc, char **argv) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int l = tcps_socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    CHECK(tcps_bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(tcps_listen(l, 16) == 0);
    int q = tcps_events_create();
    CHECK(q >= 0);
    CHECK(tcps_events_ctl(q + 1000, TCPS_EV_ADD, l, TCPS_EV_ACCEPT, 1) == -1 && errno == EBADF);
    CHECK(tcps_events_ctl(q, TCPS_EV_ADD, l, 1u << 20, 1) == -1 && errno == EINVAL);
    CHECK(tcps_events_ctl(q, TCPS_EV_DEL, l, 0, 0) == -1 && errno == ENOENT);
    CHECK(tcps_events_ctl(q, TCPS_EV_ADD, l, TCPS_EV_ACCEPT, 1) == 0);
    struct tcps_event ev[8];
    int accepts = 0, datas = 0, s = -1;
    char buf[16];
    size_t got = 0;
    struct tcps_stats st0, st1;
    while (got < sizeof buf) {
        int n = tcps_events_wait(q, ev, 8, 10000);
        CHECK(n > 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].user == 1) {
                CHECK(ev[i].events & TCPS_EV_ACCEPT);
                s = tcps_accept(l, NULL, NULL);
                CHECK(s >= 0);
                CHECK(tcps_events_ctl(q, TCPS_EV_ADD, s, TCPS_EV_DATA, 2) == 0);
                accepts++;
                tcps_stats(&st0);
            } else {
                CHECK(ev[i].user == 2 && (ev[i].events & TCPS_EV_DATA));
                ssize_t k = tcps_recv(s, buf + got, sizeof buf - got, 0);
                CHECK(k > 0);
                got += k;
                datas = 1;
            }
        }
    }
    tcps_stats(&st1);
    CHECK(tcps_send(s, buf, sizeof buf, 0) == (ssize_t)sizeof buf);
    CHECK(tcps_events_close(q) == 0);
    CHECK(tcps_events_close(q) == -1 && errno == EBADF);
    tcps_close(s);
    printf("accept %d data %d round trips %llu\n", accepts, datas,
           (unsigned long long)(st1.round_trips - st0.round_trips));
    return 0;
}
"#;

/// A wait looks at the sockets that moved, not at all it watches: 100
/// idle connections and one busy one, 300 echoes on the busy one, and the
/// waits examine a handful of sockets each (the ready list fed by the
/// host's ready log).
fn idle_sockets_are_not_looked_at(engine: &str) {
    const IDLE: usize = 100;
    const ROUNDS: usize = 300;
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let peers: Vec<TcpStream> = (0..=IDLE)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let q = EventQueue::new();
    for _ in 0..=IDLE {
        let (s, _) = c.accept(l, libc::SOCK_NONBLOCK).unwrap();
        q.add(s, EV_DATA, u64::from(s)).unwrap();
    }
    // The last peer is the busy one; the events say which socket is its.
    let mut busy = &peers[IDLE];
    busy.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut ev = [ConnEvent::default(); 8];
    for r in 0..ROUNDS {
        let msg: Vec<u8> = (0..64).map(|j| (r * 3 + j) as u8).collect();
        busy.write_all(&msg).unwrap();
        let mut got = Vec::new();
        while got.len() < msg.len() {
            let n = c.events_wait(&q, &mut ev, 5000).unwrap();
            assert!(n > 0, "{engine}: round {r}: no event");
            for e in &ev[..n] {
                assert_eq!(e.events & EV_DATA, EV_DATA, "{e:?}");
                let mut b = [0u8; 256];
                match c.recv(e.sock, &mut b, libc::MSG_DONTWAIT) {
                    Ok(k) => {
                        got.extend_from_slice(&b[..k]);
                        c.send(e.sock, &b[..k], 0).unwrap();
                    }
                    Err(x) if x.raw_os_error() == Some(libc::EAGAIN) => {}
                    Err(x) => panic!("{engine}: recv: {x}"),
                }
            }
        }
        assert_eq!(got, msg, "{engine}: round {r}");
        let mut back = vec![0u8; 64];
        busy.read_exact(&mut back).unwrap();
        assert_eq!(back, msg, "{engine}: round {r}: echo");
    }
    let (passes, looks) = q.looked();
    let per = looks as f64 / passes.max(1) as f64;
    eprintln!(
        "{engine}: {passes} passes looked at {looks} sockets ({per:.1} each) of {}",
        IDLE + 1
    );
    assert!(passes >= ROUNDS as u64, "{engine}: {passes} passes");
    assert!(
        per < 8.0,
        "{engine}: {per:.1} sockets looked at per pass of {}",
        IDLE + 1
    );
    drop(peers);
}

engine_tests!(idle_sockets_are_not_looked_at);
