//! Accept, shutdown and close as io_uring operations at the server (issue
//! 15 item 1), on both engines: with io_uring the server's accept ring is
//! filled by IORING_OP_ACCEPT operations and a connection's shutdown and
//! close go out as IORING_OP_SHUTDOWN / IORING_OP_CLOSE in the pass's one
//! `io_uring_enter`; with epoll the worker makes the same calls as system
//! calls. Both keep the semantics: every client connection is served,
//! shutdown and close follow the bytes queued before them (checked by
//! SHA-256 at the peer), a listener closed or a host killed with accepts
//! armed leaves nothing behind. And the point of it: an HTTP/1.0-style
//! request costs the io_uring server fewer system calls than the epoll one.

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tcps::Client;

/// The server's system calls so far (`tcps stat`), once its workers
/// published them.
fn syscalls(srv: &Server) -> u64 {
    std::thread::sleep(Duration::from_millis(300));
    srv.stat_json()["server"]["syscalls"]
        .as_u64()
        .expect("server.syscalls")
}

/// The response to request `n`: a header and a body that depends on `n`.
fn response(n: u64) -> Vec<u8> {
    let body = Rng::new(n).bytes(64 + (n % 5000) as usize);
    let mut r = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    r.extend_from_slice(&body);
    r
}

/// One client connection: sends request `n`, reads the response to the
/// end of the stream; whether it is `response(n)`.
fn client_request(addr: SocketAddr, n: u64) -> bool {
    let mut k = TcpStream::connect(addr).expect("connect");
    k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    k.write_all(format!("GET /{n} HTTP/1.0\r\n\r\n").as_bytes())
        .unwrap();
    let mut got = Vec::new();
    if k.read_to_end(&mut got).is_err() {
        return false;
    }
    got == response(n)
}

/// Host side: serves `count` HTTP/1.0 requests on listener `l`: accept,
/// receive the request, an asynchronous registered send of the response,
/// shutdown, close (the web server's sequence). Returns the connections
/// served.
fn serve(c: &Client, l: u32, count: u64) -> u64 {
    let (p, mem) = c.alloc_registered(1 << 20).expect("alloc_registered");
    // SAFETY: 1 MiB of fresh registered memory, ours alone.
    let pool = unsafe { std::slice::from_raw_parts_mut(p, 1 << 20) };
    let mut off = 0usize;
    for _ in 0..count {
        let (s, _) = c.accept(l, 0).expect("accept");
        let mut req = Vec::new();
        let mut buf = [0u8; 512];
        while !req.ends_with(b"\r\n\r\n") {
            let n = c.recv(s, &mut buf, 0).expect("recv");
            assert!(n > 0, "request cut short");
            req.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&req).to_string();
        let n: u64 = text
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.trim_start_matches('/').parse().ok())
            .expect("request number");
        let r = response(n);
        if off + r.len() > pool.len() {
            off = 0;
        }
        // Each response in its own part of the pool: the sends before it
        // may still be in flight (a part is reused only much later).
        pool[off..off + r.len()].copy_from_slice(&r);
        c.send_async_registered(s, pool[off..].as_ptr(), r.len(), 0, mem)
            .expect("send_async_registered");
        off += r.len().next_multiple_of(64);
        c.shutdown(s, libc::SHUT_WR).expect("shutdown");
        c.close(s).expect("close");
    }
    count
}

/// `conns` HTTP/1.0 connections from `clients` kernel client threads; the
/// server's system calls per connection. Every response is checked.
fn http10_run(srv: &Server, c: &Client, conns: u64, clients: u64) -> f64 {
    let (l, addr) = tcps_listener(c);
    let before = syscalls(srv);
    let per = conns / clients;
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            std::thread::spawn(move || {
                (0..per)
                    .filter(|i| client_request(addr, t * per + i))
                    .count() as u64
            })
        })
        .collect();
    serve(c, l, per * clients);
    let ok: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(ok, per * clients, "connections answered with their bytes");
    let used = syscalls(srv) - before;
    c.close(l).unwrap();
    used as f64 / (per * clients) as f64
}

/// Descriptors the server process has open, but for memfds: a live
/// registration keeps its memfd open (a hot upgrade carries it), and
/// `serve` registers a pool each time.
fn fd_count(pid: u32) -> usize {
    let memfd = |e: &std::fs::DirEntry| {
        std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"))
    };
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter(|e| !memfd(e)).count())
        .unwrap_or(0)
}

/// Waits (bounded) until the server holds `want` descriptors again.
fn settle_fds(srv: &Server, want: usize) -> usize {
    let t = Instant::now();
    loop {
        let n = fd_count(srv.pid());
        if n <= want || t.elapsed() > Duration::from_secs(5) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Many short HTTP/1.0 connections (accept → recv → asynchronous send →
/// shutdown → close), every response byte-checked; prints the server's
/// system calls per connection. Every connection's descriptor is closed
/// again (the closes went out as operations): the server holds as many
/// descriptors after as before.
fn many_short_connections(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    // One connection first: what stays open for the host is open now.
    std::thread::spawn(move || client_request(addr, 0));
    serve(&c, l, 1);
    c.close(l).unwrap();
    let fds = settle_fds(&srv, 0);
    let per = http10_run(&srv, &c, 2000, 8);
    eprintln!("{engine}: {per:.2} server system calls per connection");
    assert_eq!(settle_fds(&srv, fds), fds, "descriptors left open");
}

/// A 16 MiB registered send on socket `s` (its peer `k`), then
/// shutdown(SHUT_WR): on a connection the host accepted twice (the first
/// goes unanswered, the second waits for its answer), else once (waited
/// for). The shutdowns wait behind the bytes queued before them, so the
/// peer reads all of them (SHA-256) and then the end of the stream, while
/// the socket stays open for reading: the peer's reply after its end
/// still arrives.
fn send_then_shutdown(c: &Client, s: u32, mut k: TcpStream, accepted: bool) {
    const LEN: usize = 16 << 20;
    k.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (p, mem) = c.alloc_registered(LEN).expect("alloc_registered");
    // SAFETY: fresh registered memory, ours alone, unchanged while sent.
    let src = unsafe { std::slice::from_raw_parts_mut(p, LEN) };
    Rng::new(71).fill(src);
    let want = sha256(src);
    for part in src.chunks(LEN / 4) {
        c.send_async_registered(s, part.as_ptr(), part.len(), 0, mem)
            .expect("queued");
    }
    let reader = std::thread::spawn(move || {
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0usize;
        loop {
            let n = k.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            total += n;
            if total % (1 << 20) < n {
                std::thread::sleep(Duration::from_millis(2)); // a slow reader
            }
        }
        k.write_all(b"reply after the end").unwrap();
        (total, <[u8; 32]>::from(h.finalize()), k)
    });
    if accepted {
        c.shutdown(s, libc::SHUT_WR).expect("unanswered shutdown");
    }
    c.shutdown(s, libc::SHUT_WR)
        .expect("shutdown behind the sends");
    let (got, digest, _k) = reader.join().unwrap();
    assert_eq!(got, LEN, "bytes before the end of the stream");
    assert_eq!(hex(&digest), hex(&want), "SHA-256 of what preceded the FIN");
    let mut buf = [0u8; 64];
    let n = c.recv(s, &mut buf, 0).expect("recv after shutdown");
    assert_eq!(&buf[..n], b"reply after the end");
    // A shutdown of both directions is fine; the socket then closes.
    c.shutdown(s, libc::SHUT_RDWR).expect("last shutdown");
    c.close(s).unwrap();
}

/// `send_then_shutdown` on a connection the host made (its close may
/// linger, so its shutdown is a system call on both engines).
fn shutdown_behind_a_large_send(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    set_rcvbuf(&l, 64 * 1024);
    let s = c.tcp_connect(l.local_addr().unwrap()).expect("connect");
    let (k, _) = l.accept().unwrap();
    send_then_shutdown(&c, s, k, false);
}

/// `send_then_shutdown` on a connection the host accepted (io_uring: the
/// shutdowns are operations, the second answered from its completion).
fn accepted_shutdown_behind_a_large_send(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let k = TcpStream::connect(addr).unwrap();
    set_rcvbuf(&k, 64 * 1024);
    let (s, _) = c.accept(l, 0).expect("accept");
    send_then_shutdown(&c, s, k, true);
}

/// Asks for connections on listener `l` without taking one (a
/// non-blocking accept that finds none): the server accepts ahead from
/// now on (with io_uring: accepts in flight).
fn demand(c: &Client, l: u32) {
    c.set_nonblocking(l, true).unwrap();
    assert_errno(c.accept(l, 0), libc::EAGAIN, "accept on an idle listener");
    c.set_nonblocking(l, false).unwrap();
    std::thread::sleep(Duration::from_millis(100));
}

/// A connection that arrives while the host is at its socket quota (with
/// io_uring: accepted by an accept in flight since before the quota was
/// reached) is not lost: the host's next accept sees EMFILE once, and
/// after it closed a socket, its accept gets that connection (as the
/// kernel's backlog keeps it, which is what the epoll engine shows).
fn connection_at_the_quota_is_kept(engine: &str) {
    let srv = Server::start(
        engine,
        &["--poll", "adaptive", "--max-sockets-per-host", "4"],
    );
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    demand(&c, l);
    let others: Vec<u32> = (0..3)
        .map(|_| {
            c.socket(libc::AF_INET, libc::SOCK_STREAM, 0)
                .expect("socket")
        })
        .collect();
    let mut k = TcpStream::connect(addr).unwrap();
    k.write_all(b"the kept one").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_errno(c.accept(l, 0), libc::EMFILE, "accept at the quota");
    c.close(others[0]).unwrap();
    let (s, peer) = c.accept(l, 0).expect("accept after a close");
    assert_eq!(peer, Some(k.local_addr().unwrap()), "the same connection");
    assert_eq!(tcps_recv_exact(&c, s, 12).unwrap(), b"the kept one");
    c.send(s, b"ok", 0).unwrap();
    let mut b = [0u8; 2];
    k.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ok");
}

/// An accept ring of 4 records, and 40 clients that connect at once while
/// the host takes none: the ring fills and pauses, the rest wait in the
/// kernel's backlog; then the host takes them all and serves each. Every
/// client gets its own answer, and the address `accept` reports for each
/// connection is its client's.
fn accept_ring_full_then_drained(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--eager-accept-size", "4"]);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    demand(&c, l);
    let clients: Vec<_> = (0..40u64)
        .map(|n| {
            std::thread::spawn(move || {
                let mut k = TcpStream::connect(addr).expect("connect");
                k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let me = k.local_addr().unwrap();
                k.write_all(&n.to_le_bytes()).unwrap();
                let mut got = Vec::new();
                k.read_to_end(&mut got).unwrap();
                (me, got == format!("answer {n}").into_bytes())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut peers = Vec::new();
    for _ in 0..40 {
        let (s, peer) = c.accept(l, 0).expect("accept");
        peers.push(peer.expect("peer address"));
        let n = u64::from_le_bytes(tcps_recv_exact(&c, s, 8).unwrap().try_into().unwrap());
        c.send(s, format!("answer {n}").as_bytes(), 0).unwrap();
        c.close(s).unwrap();
    }
    let mut mine = Vec::new();
    for t in clients {
        let (me, ok) = t.join().unwrap();
        assert!(ok, "client {me} was not answered");
        mine.push(me);
    }
    peers.sort();
    mine.sort();
    assert_eq!(peers, mine, "the addresses accept reported");
    c.close(l).unwrap();
}

/// A listener closed while the server accepts ahead on it (io_uring:
/// accepts in flight): its port is free at once (nothing holds the
/// socket), a connection attempt is refused, and the server holds no
/// descriptor more than before the listener.
fn listener_closed_with_accepts_armed(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let before = settle_fds(&srv, 0);
    let (l, addr) = tcps_listener(&c);
    demand(&c, l);
    // One connection in the ring, never taken: closed with the listener.
    let mut k = TcpStream::connect(addr).unwrap();
    k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    c.close(l).unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(k.read(&mut b), Ok(0) | Err(_)),
        "the untaken connection was closed"
    );
    let e = TcpStream::connect(addr).expect_err("connect after the close");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    let again = std::net::TcpListener::bind(addr).expect("the port is free");
    drop(again);
    assert_eq!(settle_fds(&srv, before), before, "descriptors left open");
}

/// A host killed while the server accepts ahead on its listener, with a
/// connection in the ring it never took: the server frees everything (its
/// descriptors as before the host; the client sees the end; the port is
/// free) and serves others.
fn host_killed_with_accepts_armed(engine: &str) {
    let mut srv = start_server(engine);
    let before = settle_fds(&srv, 0);
    let mut cmd = child_command("child_listen_and_wait", "listen-and-wait");
    cmd.env("TCPS_IT_SOCKET", &srv.socket);
    let mut kid = ChildProc::spawn(cmd);
    let addr: SocketAddr = kid
        .read_mark("listening", Duration::from_secs(20))
        .parse()
        .unwrap();
    let mut k = TcpStream::connect(addr).unwrap();
    k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    kid.child.kill().unwrap();
    kid.child.wait().unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(k.read(&mut b), Ok(0) | Err(_)),
        "the untaken connection was closed"
    );
    assert_eq!(settle_fds(&srv, before), before, "descriptors left open");
    drop(std::net::TcpListener::bind(addr).expect("the port is free"));
    assert!(srv.is_alive(), "server died with its host");
    let c = srv.attach();
    echo_roundtrip(&c, kernel_echo_server("127.0.0.1:0"), b"after the host");
}

/// Child: a listener the server accepts ahead on; prints its address and
/// waits to be killed.
#[test]
fn child_listen_and_wait() {
    let Some(()) = child_role("listen-and-wait") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    let (l, addr) = tcps_listener(&c);
    demand(&c, l);
    mark("listening", addr);
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Blocking connects (io_uring: an `IORING_OP_CONNECT` the host's call
/// waits on): each connects and carries bytes both ways; one to a closed
/// port fails with ECONNREFUSED from the kernel, as a system call's would.
fn blocking_connects(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        for _ in 0..100 {
            let (mut k, _) = l.accept().unwrap();
            let mut b = [0u8; 8];
            k.read_exact(&mut b).unwrap();
            k.write_all(&b).unwrap();
        }
    });
    let before = syscalls(&srv);
    for n in 0..100u64 {
        let s = c.tcp_connect(addr).expect("connect");
        assert_eq!(tcps_echo_exchange(&c, s, &n.to_le_bytes()), n.to_le_bytes());
        c.close(s).unwrap();
    }
    let used = syscalls(&srv) - before;
    eprintln!(
        "{engine}: {:.2} server system calls per connection",
        used as f64 / 100.0
    );
    echo.join().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    assert_errno(
        c.tcp_connect(closed),
        libc::ECONNREFUSED,
        "connect to a closed port",
    );
}

engine_tests!(
    blocking_connects,
    many_short_connections,
    shutdown_behind_a_large_send,
    accepted_shutdown_behind_a_large_send,
    accept_ring_full_then_drained,
    connection_at_the_quota_is_kept,
    listener_closed_with_accepts_armed,
    host_killed_with_accepts_armed,
);

/// What the operations are for: an HTTP/1.0 request (accept, receive,
/// send, shutdown, close) costs the io_uring server fewer than 3 system
/// calls (its accepts, shutdowns and closes are operations in the pass's
/// one `io_uring_enter`; what remains is that enter and the host's
/// wake-ups: about 1.9 here, with one host thread that sleeps between
/// connections), and less than 40% of the epoll server's (a system call
/// for each: about 9). With the operations back as system calls (about 4
/// more per request) this fails.
#[test]
fn syscalls_per_request() {
    let mut per = Vec::new();
    for engine in ["uring", "epoll"] {
        let srv = start_server(engine);
        let c = srv.attach();
        per.push(http10_run(&srv, &c, 2000, 8));
    }
    let (uring, epoll) = (per[0], per[1]);
    eprintln!("server system calls per request: io_uring {uring:.2}, epoll {epoll:.2}");
    assert!(uring < 3.0, "io_uring: {uring:.2} system calls per request");
    assert!(
        uring * 2.5 < epoll,
        "io_uring {uring:.2} vs epoll {epoll:.2} per request"
    );
}
