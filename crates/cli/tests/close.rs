//! close and shutdown: an accepted connection is shut down (its first
//! SHUT_WR) and closed without a round trip (the host posts the requests
//! with `SHUTDOWN_NO_REPLY` / `CLOSE_NO_REPLY`), and yet everything a
//! program can observe is as with the kernel: the peer gets the data, then
//! its FIN, the read side stays open after SHUT_WR, a shutdown after a
//! reset still reports ENOTCONN, the id is dead at once after close
//! (EBADF), a listener's port is free when close returns, and a recv
//! blocked in another thread ends.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Reads until EOF; everything read.
fn read_to_eof(k: &mut TcpStream) -> Vec<u8> {
    k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    k.read_to_end(&mut got)
        .expect("EOF from the closed connection");
    got
}

/// Closing an accepted connection costs no round trip; the peer still
/// gets the reply and then EOF, and the id is dead at once.
fn accepted_close_needs_no_round_trip(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    for round in 0..50 {
        let mut k = TcpStream::connect(addr).unwrap();
        k.write_all(b"ping").unwrap();
        let (s, _) = c.accept(l, 0).unwrap();
        assert_eq!(tcps_recv_exact(&c, s, 4).unwrap(), b"ping");
        c.send(s, b"pong", 0).unwrap();
        let before = c.stats().round_trips;
        c.close(s).unwrap();
        assert_eq!(
            c.stats().round_trips,
            before,
            "{engine} round {round}: close waited for the server"
        );
        // The id is dead at once, whatever the server has done so far.
        assert_errno(c.send(s, b"x", 0), libc::EBADF, "send after close");
        let mut b = [0u8; 4];
        assert_errno(c.recv(s, &mut b, 0), libc::EBADF, "recv after close");
        assert_errno(
            c.getsockopt_int(s, libc::SOL_SOCKET, libc::SO_ERROR),
            libc::EBADF,
            "getsockopt after close",
        );
        assert_errno(c.close(s), libc::EBADF, "double close");
        // And the server did close it: the reply, then EOF.
        assert_eq!(read_to_eof(&mut k), b"pong", "{engine} round {round}");
    }
    // Ids are handed out again and work.
    let mut k = TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    c.send(s, b"again", 0).unwrap();
    c.close(s).unwrap();
    assert_eq!(read_to_eof(&mut k), b"again");
    c.close(l).unwrap();
}

/// A listener (a socket from `socket`) is closed with a round trip: its
/// port can be bound again as soon as close returns. The port is taken
/// below the ephemeral range (`ip_local_port_range` starts at 32768), so a
/// connection another test opens meanwhile cannot take it as its local
/// port, and no other test of this process forks meanwhile (a forked child
/// holds every descriptor until its exec): the second bind fails only if
/// tcps kept the port.
fn listener_close_frees_the_port_at_once(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    // Each engine's test (they run at once, in one process) in a range of
    // its own: two listeners on one port would make the rebind fail.
    let base: u16 = if engine == "uring" { 20_000 } else { 26_000 };
    let mut port = base + (std::process::id() % 5_000) as u16;
    for _ in 0..20 {
        let (l, addr) = loop {
            let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            port = if port >= base + 5_999 { base } else { port + 1 };
            match c.tcp_listen(addr, 1024) {
                Ok(l) => break (l, addr),
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
                Err(e) => panic!("{engine}: listen on {addr}: {e}"),
            }
        };
        // A child forked by another test meanwhile would hold the listener
        // until its exec (the kernel's behaviour, not ours).
        let _quiet = no_forks();
        let before = c.stats().round_trips;
        c.close(l).unwrap();
        assert_eq!(c.stats().round_trips, before + 1, "listener close waits");
        let again = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        c.bind(again, &addr)
            .unwrap_or_else(|e| panic!("{engine}: bind {addr} after close: {e}"));
        c.listen(again, 1).unwrap();
        c.close(again).unwrap();
    }
}

/// A recv blocked in another thread ends when the connection is closed.
fn close_ends_a_blocked_recv(engine: &str) {
    for eager in ["push", "off"] {
        let srv = Server::start(engine, &["--poll", "adaptive", "--eager-recv", eager]);
        let c = std::sync::Arc::new(srv.attach());
        let (l, addr) = tcps_listener(&c);
        let _k = TcpStream::connect(addr).unwrap();
        let (s, _) = c.accept(l, 0).unwrap();
        let c2 = c.clone();
        let blocked = std::thread::spawn(move || {
            let mut b = [0u8; 8];
            c2.recv(s, &mut b, 0)
        });
        std::thread::sleep(Duration::from_millis(100));
        c.close(s).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(blocked.join()));
        let r = rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{engine} eager-recv {eager}: recv still blocked"))
            .unwrap();
        match r {
            Ok(0) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
            other => panic!("{engine} eager-recv {eager}: recv ended with {other:?}"),
        }
    }
}

/// The first SHUT_WR of an accepted connection costs no round trip: the
/// peer reads the reply and then EOF, and can still send to the host.
fn shutdown_write_needs_no_round_trip(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    for round in 0..20 {
        let mut k = TcpStream::connect(addr).unwrap();
        let (s, _) = c.accept(l, 0).unwrap();
        // Queued asynchronous sends go out before the FIN.
        let reply = Rng::new(round).bytes(100_000);
        c.send_async(s, &reply, 0).unwrap();
        let before = c.stats().round_trips;
        c.shutdown(s, libc::SHUT_WR).unwrap();
        assert_eq!(
            c.stats().round_trips,
            before,
            "{engine} round {round}: shutdown waited"
        );
        let mut got = Vec::new();
        k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        k.read_to_end(&mut got).unwrap();
        assert_eq!(
            hex(&sha256(&got)),
            hex(&sha256(&reply)),
            "{engine} round {round}"
        );
        // Half-closed: the host still receives.
        k.write_all(b"more").unwrap();
        assert_eq!(tcps_recv_exact(&c, s, 4).unwrap(), b"more");
        // A second shutdown asks the server (it may fail as the kernel's would).
        let before = c.stats().round_trips;
        let _ = c.shutdown(s, libc::SHUT_WR);
        assert_eq!(
            c.stats().round_trips,
            before + 1,
            "the second shutdown waits"
        );
        c.close(s).unwrap();
    }
}

/// After the host saw the peer's reset, shutdown asks the server and gets
/// the kernel's ENOTCONN.
fn shutdown_after_a_reset_is_enotconn(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let k = TcpStream::connect(addr).unwrap();
    let (s, _) = c.accept(l, 0).unwrap();
    reset_on_close(&k);
    drop(k);
    let mut b = [0u8; 8];
    assert_errno(
        c.recv(s, &mut b, 0),
        libc::ECONNRESET,
        "recv after the reset",
    );
    assert_errno(
        c.shutdown(s, libc::SHUT_WR),
        libc::ENOTCONN,
        "shutdown after the reset",
    );
    c.close(s).unwrap();
}

engine_tests!(
    shutdown_write_needs_no_round_trip,
    shutdown_after_a_reset_is_enotconn,
    accepted_close_needs_no_round_trip,
    listener_close_frees_the_port_at_once,
    close_ends_a_blocked_recv,
);
