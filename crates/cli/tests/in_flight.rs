//! The data path's operations while they are in flight at the server, on
//! both engines: with io_uring the kernel executes each asynchronous send
//! and each receive into a receive ring after the worker submitted it (one
//! of each per socket in flight, the next from its completion); with epoll
//! the worker sends and receives on readiness. Both must keep the stream
//! in order, continue short sends where they stopped, report errors to the
//! host, finish what was queued before a close, and survive a host that is
//! killed with sends in flight. Bytes are compared by SHA-256.

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tcps::{Client, IoHandle};

/// A tcps socket connected to a kernel listener whose accepted side has a
/// fixed receive buffer of `rcvbuf` bytes (0: the kernel's default).
fn connected(c: &Client, rcvbuf: i32) -> (u32, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    if rcvbuf > 0 {
        set_rcvbuf(&l, rcvbuf);
    }
    let addr: SocketAddr = l.local_addr().unwrap();
    let s = c.tcp_connect(addr).expect("tcps connect");
    let (k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    (s, k)
}

/// Reads until EOF (or an error, returned), hashing; sleeps `pause` after
/// every read of `every` reads (a slow reader).
fn hash_to_eof(mut k: TcpStream, every: u64, pause: Duration) -> (u64, [u8; 32], Option<i32>) {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 16 * 1024];
    let (mut total, mut reads) = (0u64, 0u64);
    loop {
        let n = match k.read(&mut buf) {
            Ok(0) => return (total, h.finalize().into(), None),
            Ok(n) => n,
            Err(e) => return (total, h.finalize().into(), Some(errno_of(&e))),
        };
        h.update(&buf[..n]);
        total += n as u64;
        reads += 1;
        if reads.is_multiple_of(every) {
            std::thread::sleep(pause);
        }
    }
}

/// The server's system calls so far (`tcps stat`), once its workers
/// published them.
fn syscalls(srv: &Server) -> u64 {
    std::thread::sleep(Duration::from_millis(250));
    srv.stat_json()["server"]["syscalls"]
        .as_u64()
        .expect("server.syscalls")
}

/// Registered memory of `len` random bytes.
fn registered_random(c: &Client, len: usize, seed: u64) -> (&[u8], u32) {
    let (p, mem) = c.alloc_registered(len).expect("alloc_registered");
    // SAFETY: `len` bytes of fresh registered memory, ours alone, never
    // written again while sends from it are in flight.
    let src = unsafe { std::slice::from_raw_parts_mut(p, len) };
    Rng::new(seed).fill(src);
    (src, mem)
}

/// 30,000 small registered sends (1 B .. 3 KiB, each a different piece of
/// the source) arrive whole and in order: the sends of one socket never
/// overtake each other while each waits for the one before to complete.
fn many_small_sends_in_order(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c, 0);
    let (src, mem) = registered_random(&c, 1 << 20, 11);
    let reader = std::thread::spawn(move || hash_to_eof(k, 64, Duration::from_micros(200)));
    let mut rng = Rng::new(12);
    let mut h = Sha256::new();
    let (mut sent, mut last) = (0u64, IoHandle::DONE);
    for _ in 0..30_000 {
        let len = 1 + rng.below(3072) as usize;
        let off = rng.below((src.len() - len) as u64) as usize;
        let piece = &src[off..off + len];
        last = c
            .send_async_registered(s, piece.as_ptr(), len, 0, mem)
            .expect("send_async_registered");
        h.update(piece);
        sent += len as u64;
    }
    c.io_wait(last, Some(Duration::from_secs(60)))
        .expect("the last send completes");
    c.close(s).unwrap();
    let (got, digest, err) = reader.join().unwrap();
    assert_eq!(err, None);
    assert_eq!(got, sent, "bytes at the receiver");
    let want: [u8; 32] = h.finalize().into();
    assert_eq!(hex(&digest), hex(&want), "SHA-256 of the stream");
}

/// One 48 MiB registered send to a reader with a 64 KiB receive buffer
/// that reads slowly: the kernel takes it in many short sends, each
/// continued where it stopped; all of it arrives, in order. With io_uring
/// the server makes few system calls for it (`server.syscalls`).
fn large_send_to_slow_reader(engine: &str) {
    const LEN: usize = 48 << 20;
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c, 64 * 1024);
    let (src, mem) = registered_random(&c, LEN, 21);
    let want = sha256(src);
    let before = syscalls(&srv);
    let io = c
        .send_async_registered(s, src.as_ptr(), LEN, 0, mem)
        .expect("send_async_registered");
    let reader = std::thread::spawn(move || hash_to_eof(k, 256, Duration::from_millis(1)));
    c.io_wait(io, Some(Duration::from_secs(120)))
        .expect("the send completes");
    c.close(s).unwrap();
    let (got, digest, err) = reader.join().unwrap();
    assert_eq!(err, None);
    assert_eq!(got, LEN as u64);
    assert_eq!(hex(&digest), hex(&want), "SHA-256 of 48 MiB");
    let used = syscalls(&srv) - before;
    eprintln!("{engine}: {used} server system calls for one 48 MiB send");
    if engine == "uring" {
        // The kernel continues the short sends by itself (here: about 12
        // system calls; epoll's send-on-readiness takes about 130).
        assert!(
            used <= 64,
            "{used} system calls: sends not executed by io_uring?"
        );
    }
}

/// The peer resets while a send waits in the kernel for room (the reader
/// never reads) with more queued behind it: the host sees the errno on the
/// send's handle and on the sends queued after it, and nothing hangs.
fn reset_while_a_send_waits(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c, 32 * 1024);
    let (src, mem) = registered_random(&c, 4 << 20, 31);
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(
            c.send_async_registered(s, src.as_ptr(), src.len(), 0, mem)
                .expect("queued"),
        );
    }
    std::thread::sleep(Duration::from_millis(200)); // the first one waits for room
    reset_on_close(&k);
    drop(k);
    let t = Instant::now();
    for h in handles {
        let r = c.io_wait(h, Some(Duration::from_secs(10)));
        let e = errno_of(&r.expect_err("a send after the reset fails"));
        assert!(
            e == libc::ECONNRESET || e == libc::EPIPE,
            "{}",
            errno_name(e)
        );
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let e = c
        .send_async(s, b"later", 0)
        .map(|_| 0)
        .or_else(|e| Ok::<i32, ()>(errno_of(&e)))
        .unwrap();
    if e == 0 {
        // Queued: the failure is sticky and shows on the next call.
        let mut b = [0u8; 1];
        let e = errno_of(&c.recv(s, &mut b, libc::MSG_DONTWAIT).unwrap_err());
        assert!(
            e == libc::ECONNRESET || e == libc::EPIPE,
            "{}",
            errno_name(e)
        );
    } else {
        assert!(
            e == libc::ECONNRESET || e == libc::EPIPE,
            "{}",
            errno_name(e)
        );
    }
    c.close(s).unwrap();
}

/// The host closes the socket while a send is in flight (the reader has
/// not started): close returns at once, and every byte queued before it
/// still arrives, then the end of the stream.
fn close_while_in_flight(engine: &str) {
    const LEN: usize = 16 << 20;
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c, 64 * 1024);
    let (src, mem) = registered_random(&c, LEN, 41);
    let mut h = Sha256::new();
    for part in src.chunks(LEN / 4) {
        c.send_async_registered(s, part.as_ptr(), part.len(), 0, mem)
            .expect("queued");
        h.update(part);
    }
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    c.close(s).expect("close with sends in flight");
    assert!(t.elapsed() < Duration::from_secs(1), "close waited");
    let (got, digest, err) = hash_to_eof(k, 256, Duration::from_millis(1));
    assert_eq!(err, None);
    assert_eq!(got, LEN as u64, "bytes before the close");
    let want: [u8; 32] = h.finalize().into();
    assert_eq!(hex(&digest), hex(&want));
    // The server is fine and serves on.
    echo_roundtrip(&c, kernel_echo_server("127.0.0.1:0"), b"after the close");
}

/// A host killed while its sends are in flight (a reader that does not
/// read): as a kernel socket at exit, its queued sends may still go out,
/// but only for a bounded time (10 s, `worker/reap.rs`): then the server
/// cancels them, frees the host and closes its socket (the reader gets the
/// end of the stream, far short of what was queued), and serves others.
fn host_killed_with_sends_in_flight(engine: &str) {
    let mut srv = start_server(engine);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_rcvbuf(&l, 32 * 1024);
    let mut cmd = child_command("child_send_and_wait", "send-and-wait");
    cmd.env("TCPS_IT_SOCKET", &srv.socket);
    cmd.env("TCPS_IT_PEER", l.local_addr().unwrap().to_string());
    let mut kid = ChildProc::spawn(cmd);
    let (k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let queued: u64 = kid
        .read_mark("queued", Duration::from_secs(20))
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = kid.pid();
    kid.child.kill().unwrap();
    kid.child.wait().unwrap();
    // Until the host is gone, the reader must not drain it: let the
    // server see the hang-up first.
    let t = Instant::now();
    let gone = |v: &serde_json::Value| {
        v["hosts"]
            .as_array()
            .is_some_and(|a| a.iter().all(|h| h["pid"].as_u64() != Some(u64::from(pid))))
    };
    while !gone(&srv.stat_json()) {
        assert!(t.elapsed() < Duration::from_secs(20), "host never detached");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (got, _, _) = hash_to_eof(k, 1 << 20, Duration::ZERO);
    assert!(
        got < queued / 2,
        "the sends were cut off with their host: {got} of {queued} bytes arrived"
    );
    assert!(srv.is_alive(), "server died with its host");
    let log = srv.log_text();
    assert!(!log.contains("panic"), "{log}");
    let c = srv.attach();
    echo_roundtrip(&c, kernel_echo_server("127.0.0.1:0"), b"after a host crash");
}

/// Child: connects to `TCPS_IT_PEER`, queues 64 MiB of registered sends,
/// prints how much, waits to be killed.
#[test]
fn child_send_and_wait() {
    let Some(()) = child_role("send-and-wait") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    let peer: SocketAddr = env("TCPS_IT_PEER").parse().unwrap();
    let s = c.tcp_connect(peer).expect("connect");
    let (src, mem) = registered_random(&c, 16 << 20, 51);
    let mut queued = 0u64;
    for _ in 0..4 {
        c.send_async_registered(s, src.as_ptr(), src.len(), 0, mem)
            .expect("queued");
        queued += src.len() as u64;
    }
    mark("queued", queued);
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// 32 MiB from a kernel client into a tcps socket's receive ring (accepted
/// ahead, set up with its ring) whose host reads in odd sizes: intact, in
/// order, then end of stream. With io_uring the server receives with few
/// system calls (one receive per ring span, no readiness round).
fn ring_receives_a_stream(engine: &str) {
    const LEN: usize = 32 << 20;
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let data = Rng::new(61).bytes(LEN);
    let want = sha256(&data);
    let before = syscalls(&srv);
    let writer = std::thread::spawn(move || {
        let mut k = TcpStream::connect(addr).unwrap();
        std::io::Write::write_all(&mut k, &data).unwrap();
        k.shutdown(std::net::Shutdown::Write).unwrap();
        k
    });
    let (s, _) = c.accept(l, 0).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 7000];
    let mut got = 0usize;
    loop {
        let n = c.recv(s, &mut buf, 0).expect("recv");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        got += n;
    }
    let _k = writer.join().unwrap();
    assert_eq!(got, LEN);
    let digest: [u8; 32] = h.finalize().into();
    assert_eq!(hex(&digest), hex(&want), "SHA-256 of 32 MiB");
    assert!(
        c.stats().round_trips < 16,
        "received from the ring: {:?}",
        c.stats()
    );
    c.close(s).unwrap();
    let used = syscalls(&srv) - before;
    eprintln!("{engine}: {used} server system calls to receive 32 MiB");
}

engine_tests!(
    ring_receives_a_stream,
    many_small_sends_in_order,
    large_send_to_slow_reader,
    reset_while_a_send_waits,
    close_while_in_flight,
    host_killed_with_sends_in_flight,
);
