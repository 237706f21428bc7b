//! Connection admission (thesis §7.2): `--max-conns-per-addr` and
//! `--max-conns-per-listener` reset surplus connections at the server, so
//! the host never accepts them; closing an accepted connection frees its
//! slot; refusals are counted (`refused_conns` in the detach log line).

mod common;

use common::*;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tcps::Client;

/// Accepts on non-blocking listener `l` until EAGAIN (allowing the server a
/// moment for connections still arriving); returns (socket, peer).
fn accept_all(c: &Client, l: u32) -> Vec<(u32, SocketAddr)> {
    let mut got = Vec::new();
    loop {
        match c.accept(l, 0) {
            Ok((s, peer)) => got.push((s, peer.expect("accept reports the peer"))),
            Err(e) if errno_of(&e) == libc::EAGAIN => return got,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Accepts one connection, retrying EAGAIN for up to 5 s.
fn accept_one(c: &Client, l: u32) -> (u32, SocketAddr) {
    let t = Instant::now();
    loop {
        match c.accept(l, 0) {
            Ok((s, peer)) => return (s, peer.unwrap()),
            Err(e) if errno_of(&e) == libc::EAGAIN && t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("accept after a slot freed: {e}"),
        }
    }
}

fn connect_n(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| TcpStream::connect(addr).unwrap_or_else(|e| panic!("client #{i}: {e}")))
        .collect()
}

/// Closes accepted connection `a` and waits until its client sees the end
/// of stream: a close of an accepted connection does not wait for the
/// server, so only the FIN proves the server released its slot.
fn close_and_see_eof(c: &Client, a: (u32, SocketAddr), clients: &mut [TcpStream]) {
    c.close(a.0).unwrap();
    let k = clients
        .iter_mut()
        .find(|k| k.local_addr().ok() == Some(a.1))
        .expect("the accepted connection's client");
    k.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(k.read(&mut b).unwrap(), 0, "EOF after close");
}

/// The client side of a refused connection sees a reset or an end of stream.
fn assert_refused(k: &mut TcpStream, what: &str) {
    k.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 16];
    match k.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected a reset or EOF, got {other:?}"),
    }
}

/// The accepted ones (by peer) are the admitted clients; every other client
/// must have been refused.
fn check_split(
    clients: &mut [TcpStream],
    accepted: &[(u32, SocketAddr)],
    what: &str,
) -> Vec<usize> {
    let mut admitted = Vec::new();
    for (i, k) in clients.iter_mut().enumerate() {
        let me = k.local_addr().unwrap();
        if accepted.iter().any(|&(_, p)| p == me) {
            admitted.push(i);
        } else {
            assert_refused(k, &format!("{what}: surplus client #{i}"));
        }
    }
    assert_eq!(
        admitted.len(),
        accepted.len(),
        "{what}: accepted peers are our clients"
    );
    admitted
}

/// Waits for the detach log line of a host and returns its refused_conns.
fn refused_in_log(srv: &Server) -> Vec<u64> {
    let t = Instant::now();
    loop {
        let log = srv.log_text();
        let v: Vec<u64> = log
            .lines()
            .filter(|l| l.contains("host detached"))
            .filter_map(|l| {
                let at = l.find("refused_conns=")? + "refused_conns=".len();
                l[at..]
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        if !v.is_empty() || t.elapsed() > Duration::from_secs(5) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A non-blocking tcps listener on 127.0.0.1 and its address.
fn listener(c: &Client) -> (u32, SocketAddr) {
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    c.set_nonblocking(l, true).unwrap();
    (l, c.getsockname(l).unwrap())
}

/// Connects 5 kernel clients to `l` (limit 3): the host accepts exactly 3,
/// and a 4th accept finds nothing.
fn five_clients(
    c: &Client,
    l: u32,
    addr: SocketAddr,
    engine: &str,
) -> (Vec<TcpStream>, Vec<(u32, SocketAddr)>) {
    let clients = connect_n(addr, 5);
    let accepted = accept_all(c, l);
    assert_eq!(accepted.len(), 3, "{engine}: 3 of 5 connections accepted");
    assert_errno(c.accept(l, 0), libc::EAGAIN, "4th accept (non-blocking)");
    (clients, accepted)
}

/// Closes `open`, detaches, and checks the host's refused_conns count.
fn detach_and_check(srv: &Server, c: Client, open: &[u32], refused: u64, engine: &str) {
    for &s in open {
        c.close(s).unwrap();
    }
    c.detach();
    drop(c);
    assert_eq!(
        refused_in_log(srv),
        vec![refused],
        "{engine}: refused_conns in the detach log line"
    );
}

fn per_addr(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--max-conns-per-addr", "3"]);
    let c = srv.attach();
    let (l, addr) = listener(&c);
    let (l2, addr2) = listener(&c);
    let (mut clients, accepted) = five_clients(&c, l, addr, engine);
    let admitted = check_split(&mut clients, &accepted, engine);

    // The limit is per address, not per listener: another listener refuses
    // 127.0.0.1 too while it holds 3.
    let mut other = connect_n(addr2, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_errno(
        c.accept(l2, 0),
        libc::EAGAIN,
        "accept on another listener at the address limit",
    );
    assert_refused(&mut other[0], "other listener, address at its limit");

    // Closing one accepted connection frees a slot.
    close_and_see_eof(&c, accepted[0], &mut clients);
    let mut late = connect_n(addr, 1);
    let (s, peer) = accept_one(&c, l);
    assert_eq!(
        peer,
        late[0].local_addr().unwrap(),
        "the new client is admitted"
    );
    // It works end to end.
    let k = &mut clients[admitted[1]];
    assert!(c.send(accepted[1].0, b"hi", 0).unwrap() == 2);
    let mut b = [0u8; 2];
    k.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hi");
    late[0]
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(
        matches!(late[0].read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut),
        "the admitted late client stays connected"
    );
    // And the limit is full again.
    let mut more = connect_n(addr, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_errno(c.accept(l, 0), libc::EAGAIN, "accept at the limit again");
    assert_refused(&mut more[0], "surplus after refill");

    let open: Vec<u32> = accepted[1..].iter().map(|a| a.0).chain([s]).collect();
    detach_and_check(&srv, c, &open, 4, engine);
}

fn per_listener(engine: &str) {
    let srv = Server::start(
        engine,
        &["--poll", "adaptive", "--max-conns-per-listener", "3"],
    );
    let c = srv.attach();
    let (l, addr) = listener(&c);
    let (l2, addr2) = listener(&c);
    let (mut clients, accepted) = five_clients(&c, l, addr, engine);
    check_split(&mut clients, &accepted, engine);

    // Another listener has its own limit (same client address).
    let mut clients2 = connect_n(addr2, 3);
    let accepted2 = accept_all(&c, l2);
    assert_eq!(
        accepted2.len(),
        3,
        "{engine}: the other listener accepts its own 3"
    );
    check_split(&mut clients2, &accepted2, engine);

    // Closing one accepted connection frees a slot on its listener.
    close_and_see_eof(&c, accepted[0], &mut clients);
    let late = connect_n(addr, 1);
    let (s, peer) = accept_one(&c, l);
    assert_eq!(
        peer,
        late[0].local_addr().unwrap(),
        "the new client is admitted"
    );
    let mut more = connect_n(addr, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_errno(c.accept(l, 0), libc::EAGAIN, "accept at the limit again");
    assert_refused(&mut more[0], "surplus after refill");

    // A listener closed before its connections: closing them later is fine.
    c.close(l).unwrap();
    let open: Vec<u32> = accepted[1..]
        .iter()
        .chain(&accepted2)
        .map(|a| a.0)
        .chain([s])
        .collect();
    detach_and_check(&srv, c, &open, 3, engine);
}

engine_tests!(per_addr, per_listener);
