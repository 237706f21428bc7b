//! Eager receive and accept on the host (PROTOCOL §10) against the fake server in ring
//! mode: accept rings, byte rings, kicks, local poll, tracked O_NONBLOCK and
//! SO_RCVTIMEO.

mod common;

use common::{Fake, RESET_HOW, RING_BYTES, SLOW_HOW};
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};
use tcps_proto::Op;

fn raw(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// A listener with an accept ring and one accepted connection (with a byte ring).
fn listener_and_conn(fake: &Fake, c: &Client, flags: i32) -> (u32, u32) {
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    fake.offer(1);
    let (s, peer) = c.accept(l, flags).unwrap();
    assert_eq!(peer, Some("127.0.0.1:4343".parse().unwrap()));
    (l, s)
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn accept_from_the_ring_asks_once_and_then_needs_no_round_trip() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    c.set_nonblocking(l, true).unwrap();
    // Empty, no demand yet, non-blocking: the server is asked to accept
    // ahead before the host looks again (a RecvBind, one round trip: the
    // kernel's accept would see connections already in the backlog), then EAGAIN.
    let e = c.accept(l, 0).unwrap_err();
    assert_eq!(raw(&e), libc::EAGAIN);
    let binds = || {
        fake.requests()
            .iter()
            .filter(|&&(op, _)| op == Op::RecvBind as u16)
            .count()
    };
    assert_eq!(binds(), 1);
    // Still empty: no second request nor kick (demand was signalled).
    assert_eq!(raw(&c.accept(l, 0).unwrap_err()), libc::EAGAIN);
    assert_eq!(binds(), 1);
    assert_eq!(fake.recv_kicks(), 0);
    fake.offer(3);
    let before = c.stats();
    let mut got = Vec::new();
    while got.len() < 3 {
        match c.accept(l, 0) {
            Ok((s, _)) => got.push(s),
            Err(e) => assert_eq!(raw(&e), libc::EAGAIN),
        }
    }
    let after = c.stats();
    assert_eq!(after.ring_accepts - before.ring_accepts, 3);
    assert_eq!(after.round_trips, before.round_trips, "{after:?}");
    assert_eq!(fake.recv_kicks(), 0);
    assert!(fake
        .requests()
        .iter()
        .all(|&(op, _)| op != Op::Accept as u16));
    got.dedup();
    assert_eq!(got.len(), 3);
}

#[test]
fn blocking_accept_waits_for_a_connection() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let c2 = c.clone();
    let t = std::thread::spawn(move || {
        let mut addr = [0u8; 128];
        c2.accept_raw(l, 0, &mut addr).unwrap()
    });
    std::thread::sleep(Duration::from_millis(30));
    fake.offer(1);
    let (s, len) = t.join().unwrap();
    assert_eq!(len, 16); // a sockaddr_in
    assert!(s > l);
    // SO_RCVTIMEO bounds a blocking accept.
    let tv = [1i64.to_ne_bytes(), 0i64.to_ne_bytes()].concat();
    c.setsockopt(l, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv[..])
        .unwrap();
    let t = Instant::now();
    assert_eq!(raw(&c.accept(l, 0).unwrap_err()), libc::EAGAIN);
    assert!(t.elapsed() >= Duration::from_millis(900));
}

#[test]
fn recv_from_the_byte_ring_peek_waitall_and_wrap() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let (_l, s) = listener_and_conn(&fake, &c, 0);
    // The fake loops sends back into the socket's own ring.
    let data: Vec<u8> = (0..3 * RING_BYTES + 123).map(|i| i as u8).collect();
    c.send_all(s, &data[..100]).unwrap();
    let mut b = [0u8; 10];
    let before = c.stats();
    // Blocking recv waits for the fake to publish.
    assert_eq!(c.recv(s, &mut b, libc::MSG_PEEK).unwrap(), 10);
    assert_eq!(&b[..], &data[..10]);
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 10);
    assert_eq!(&b[..], &data[..10]);
    let mut big = vec![0u8; 90];
    assert_eq!(c.recv(s, &mut big, libc::MSG_WAITALL).unwrap(), 90);
    assert_eq!(&big[..], &data[10..100]);
    let after = c.stats();
    assert_eq!(after.round_trips, before.round_trips, "{after:?}");
    assert_eq!(after.ring_recvs - before.ring_recvs, 3);
    assert_eq!(after.bytes_received - before.bytes_received, 100);
    // More than the ring holds: the fake pauses, the host's consumption
    // kicks it on; MSG_WAITALL gathers across the wrap.
    let rest = &data[100..];
    let c2 = c.clone();
    let rest2 = rest.to_vec();
    let sender = std::thread::spawn(move || c2.send_all(s, &rest2).unwrap());
    let mut out = vec![0u8; rest.len()];
    assert_eq!(c.recv(s, &mut out, libc::MSG_WAITALL).unwrap(), rest.len());
    assert!(out == rest, "bytes differ");
    sender.join().unwrap();
    assert!(c.stats().recv_kicks >= 1, "{:?}", c.stats());
    // MSG_TRUNC discards. (MSG_OOB on a ring socket is a request to the
    // server's kernel socket, which holds the urgent byte: tested against
    // the real server in crates/cli/tests/preload_flags.rs.)
    c.send_all(s, b"xyz").unwrap();
    let mut b3 = [0u8; 3];
    assert_eq!(
        c.recv(s, &mut b3, libc::MSG_TRUNC | libc::MSG_WAITALL)
            .unwrap(),
        3
    );
    assert_eq!(&b3, &[0, 0, 0]);
}

#[test]
fn end_of_stream_and_errors_after_the_data() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let (l, s) = listener_and_conn(&fake, &c, 0);
    c.send_all(s, b"bye").unwrap();
    c.shutdown(s, libc::SHUT_WR).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 3);
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 0);
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 0);
    // An error is reported once, then end of file.
    fake.offer(1);
    let (s2, _) = c.accept(l, 0).unwrap();
    c.send_all(s2, b"ab").unwrap();
    c.shutdown(s2, RESET_HOW).unwrap();
    assert_eq!(c.recv(s2, &mut b, libc::MSG_WAITALL).unwrap(), 2);
    assert_eq!(raw(&c.recv(s2, &mut b, 0).unwrap_err()), libc::ECONNRESET);
    assert_eq!(c.recv(s2, &mut b, 0).unwrap(), 0);
}

#[test]
fn accept4_nonblock_is_tracked_by_the_host() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let (_l, s) = listener_and_conn(&fake, &c, libc::SOCK_NONBLOCK);
    // Empty ring, non-blocking here: EAGAIN without a round trip.
    let before = c.stats().round_trips;
    let mut b = [0u8; 8];
    assert_eq!(raw(&c.recv(s, &mut b, 0).unwrap_err()), libc::EAGAIN);
    assert_eq!(c.stats().round_trips, before);
    // F_GETFL reports the host's O_NONBLOCK; requests carry MSG_DONTWAIT.
    let fl = c.fcntl(s, libc::F_GETFL, 0).unwrap();
    assert_ne!(fl & i64::from(libc::O_NONBLOCK), 0);
    c.send(s, b"x", 0).unwrap();
    let sends: Vec<i64> = fake
        .requests()
        .iter()
        .filter(|&&(op, _)| op == Op::Send as u16)
        .map(|&(_, f)| f)
        .collect();
    assert!(sends.iter().all(|f| f & i64::from(libc::MSG_DONTWAIT) != 0));
    // Made blocking again: recv waits for the byte.
    c.set_nonblocking(s, false).unwrap();
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 1);
    // SO_RCVTIMEO bounds a blocking ring recv.
    let tv = [0i64.to_ne_bytes(), 200_000i64.to_ne_bytes()].concat();
    c.setsockopt(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv[..])
        .unwrap();
    let t = Instant::now();
    assert_eq!(raw(&c.recv(s, &mut b, 0).unwrap_err()), libc::EAGAIN);
    assert!(t.elapsed() >= Duration::from_millis(180));
}

#[test]
fn connected_socket_binds_its_ring_on_first_recv() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let s = c.tcp_connect("127.0.0.1:80".parse().unwrap()).unwrap();
    c.send_all(s, b"hello").unwrap();
    let mut b = [0u8; 5];
    assert_eq!(c.recv(s, &mut b, libc::MSG_WAITALL).unwrap(), 5);
    assert_eq!(&b, b"hello");
    let binds = |f: &Fake| {
        f.requests()
            .iter()
            .filter(|&&(op, _)| op == Op::RecvBind as u16)
            .count()
    };
    assert_eq!(binds(&fake), 1);
    c.send_all(s, b"again").unwrap();
    assert_eq!(c.recv(s, &mut b, libc::MSG_WAITALL).unwrap(), 5);
    assert_eq!(binds(&fake), 1);
    assert!(fake.requests().iter().all(|&(op, _)| op != Op::Recv as u16));
}

#[test]
fn poll_on_rings_is_answered_locally() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let (l, s) = listener_and_conn(&fake, &c, 0);
    let mut fds = [
        PollFd {
            sock: l,
            events: libc::POLLIN,
            revents: 0,
        },
        PollFd {
            sock: s,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let before = c.stats().round_trips;
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 0);
    assert_eq!(c.stats().round_trips, before);
    c.send_all(s, b"q").unwrap();
    wait_until(|| c.poll(&mut fds, 0).unwrap() == 1);
    assert_eq!(fds[1].revents, libc::POLLIN);
    // It is in the ring: answered with no round trip, even when blocking.
    let mid = c.stats().round_trips;
    assert_eq!(c.poll(&mut fds, -1).unwrap(), 1);
    assert_eq!(c.stats().round_trips, mid);
    // A connection waiting on the listener.
    fake.offer(1);
    wait_until(|| {
        c.poll(&mut fds, 0).unwrap();
        fds[0].revents == libc::POLLIN
    });
    // Mixed interest (POLLOUT) goes to the server.
    fds[1].events = libc::POLLIN | libc::POLLOUT;
    let before = c.stats().round_trips;
    c.poll(&mut fds, 0).unwrap();
    assert_eq!(c.stats().round_trips, before + 1);
}

#[test]
fn close_and_reuse_forget_ring_state() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let (_l, s) = listener_and_conn(&fake, &c, 0);
    c.send_all(s, b"abc").unwrap();
    c.close(s).unwrap();
    let mut b = [0u8; 4];
    // Closed: no ring any more; the server says EBADF.
    assert_eq!(raw(&c.recv(s, &mut b, 0).unwrap_err()), libc::EBADF);
}

#[test]
fn zero_copy_view_and_consume() {
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let (_l, s) = listener_and_conn(&fake, &c, 0);
    c.send_all(s, b"0123456789").unwrap();
    let before = c.stats();
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let (p, n) = c.recv_view(s, 4, 0).unwrap();
        assert!(n > 0 && n <= 4);
        // SAFETY: the view is valid until consumed.
        seen.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        c.recv_consume(s, n).unwrap();
    }
    assert_eq!(&seen, b"0123456789");
    assert_eq!(raw(&c.recv_consume(s, 1).unwrap_err()), libc::EINVAL);
    let after = c.stats();
    assert_eq!(after.bytes_copied, before.bytes_copied);
    assert_eq!(after.bytes_received - before.bytes_received, 10);
    assert_eq!(after.round_trips, before.round_trips);
    c.shutdown(s, libc::SHUT_WR).unwrap();
    assert_eq!(c.recv_view(s, 4, 0).unwrap().1, 0);
    // A socket without a ring.
    let plain = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.listen(plain, 1).unwrap(); // an accept ring, not a byte ring
    assert_eq!(
        raw(&c.recv_view(plain, 4, 0).unwrap_err()),
        libc::EOPNOTSUPP
    );
}

/// "A thread that cannot post should park, not spin": eight threads close
/// 48 accepted connections (each close is posted, no answer) while the
/// fake is stuck in slow calls, so their request ring fills up. They park
/// on the ring until the fake takes requests and wakes them; every close
/// arrives.
#[test]
fn posting_into_a_full_request_ring_parks_and_every_post_arrives() {
    const CONNS: usize = 48;
    let fake = Fake::with_rings();
    let c = Client::attach(&fake.path).unwrap();
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 64).unwrap();
    fake.offer(CONNS as u32);
    let socks: Vec<u32> = (0..CONNS).map(|_| c.accept(l, 0).unwrap().0).collect();
    let closes = || {
        fake.requests()
            .iter()
            .filter(|&&(op, _)| op == Op::Close as u16)
            .count()
    };
    let before = closes();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Keeps the fake busy: each such shutdown takes it 5 ms.
    let slow = {
        let (c, done) = (c.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                c.shutdown(l, SLOW_HOW).unwrap();
            }
        })
    };
    // The posters start once the fake is inside a slow call (it logs a
    // request when it takes it): a fixed pause lost that race on a loaded
    // machine, the fake then drained every close at once, and no post
    // waited.
    let shutdowns = || {
        fake.requests()
            .iter()
            .filter(|&&(op, _)| op == Op::Shutdown as u16)
            .count()
    };
    wait_until(|| shutdowns() > 0);
    let posters: Vec<_> = socks
        .chunks(CONNS / 8)
        .map(|chunk| {
            let (c, chunk) = (c.clone(), chunk.to_vec());
            std::thread::spawn(move || {
                for s in chunk {
                    c.close(s).unwrap();
                }
            })
        })
        .collect();
    for p in posters {
        p.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    slow.join().unwrap();
    wait_until(|| closes() - before == CONNS);
    assert!(c.stats().room_waits > 0, "no post waited: {:?}", c.stats());
}
