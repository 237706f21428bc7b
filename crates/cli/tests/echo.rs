//! Data path end to end: checksummed echo through a real `tcps server`, in
//! both directions (tcps client ↔ kernel echo server; kernel client ↔ tcps
//! listener), over IPv4 and IPv6, on both engines.

mod common;

use common::*;
use std::net::SocketAddr;

/// 1 B .. 1 MiB, plus 3 MiB + 7 (bigger than the 256 KiB channel arena and
/// not a multiple of anything).
const SIZES: [usize; 7] = [
    1,
    100,
    4096,
    65536,
    1 << 20,
    3 * (1 << 20) + 7,
    256 * 1024 + 1,
];

fn echo_sizes(engine: &str) {
    let srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let c = srv.attach();
    assert!(
        SIZES.iter().any(|&n| n > c.arena_size()),
        "a payload must exceed the arena ({} B)",
        c.arena_size()
    );
    let mut rng = Rng::new(1);
    for &n in &SIZES {
        let payload = rng.bytes(n);
        echo_roundtrip(&c, echo, &payload);
    }
}

fn reverse_echo(engine: &str, bind: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let l = c
        .tcp_listen(bind.parse().unwrap(), 16)
        .expect("tcps listen");
    let addr: SocketAddr = c.getsockname(l).expect("getsockname of the tcps listener");
    assert_ne!(addr.port(), 0, "bound to an ephemeral port");
    let mut rng = Rng::new(2);
    for &n in &SIZES {
        let payload = rng.bytes(n);
        let got = std::thread::scope(|sc| {
            let host = sc.spawn(|| {
                let (s, peer) = c.accept(l, 0).expect("tcps accept");
                let peer = peer.expect("accept returns the peer address");
                assert!(peer.ip().is_loopback(), "peer {peer}");
                assert_eq!(c.getpeername(s).unwrap(), peer);
                let n = tcps_serve_echo(&c, s);
                c.close(s).unwrap();
                n
            });
            let got = kernel_echo_client(addr, &payload);
            assert_eq!(host.join().unwrap(), n, "bytes the tcps echo saw");
            got
        });
        assert_eq!(got.len(), n, "reverse echo length for {n} bytes");
        assert_eq!(
            hex(&sha256(&got)),
            hex(&sha256(&payload)),
            "reverse echo of {n} bytes corrupted"
        );
    }
    c.close(l).unwrap();
}

fn reverse_echo_v4(engine: &str) {
    reverse_echo(engine, "127.0.0.1:0")
}

fn echo_ipv6(engine: &str) {
    let srv = start_server(engine);
    let echo = kernel_echo_server("[::1]:0");
    assert!(echo.is_ipv6());
    let c = srv.attach();
    let mut rng = Rng::new(3);
    for n in [1usize, 4096, 1 << 20] {
        echo_roundtrip(&c, echo, &rng.bytes(n));
    }
    // The tcps socket really is an IPv6 one.
    let s = c.tcp_connect(echo).unwrap();
    let local = c.getsockname(s).unwrap();
    assert!(local.is_ipv6() && local.ip().is_loopback(), "local {local}");
    assert_eq!(c.getpeername(s).unwrap(), echo);
    c.close(s).unwrap();
}

fn reverse_echo_v6(engine: &str) {
    reverse_echo(engine, "[::1]:0")
}

/// Many small sends on one connection arrive in order (a stream, not a set
/// of messages), and recv with a small buffer drains a large send.
fn ordered_small_sends(engine: &str) {
    let srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let c = srv.attach();
    let s = c.tcp_connect(echo).unwrap();
    let mut rng = Rng::new(4);
    let pieces: Vec<Vec<u8>> = (0..2000)
        .map(|_| {
            let n = 1 + rng.below(300) as usize;
            rng.bytes(n)
        })
        .collect();
    let all: Vec<u8> = pieces.concat();
    let got = std::thread::scope(|sc| {
        sc.spawn(|| {
            for p in &pieces {
                c.send_all(s, p).unwrap();
            }
            c.shutdown(s, libc::SHUT_WR).unwrap();
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 77];
        loop {
            let n = c.recv(s, &mut buf, 0).unwrap();
            if n == 0 {
                break got;
            }
            got.extend_from_slice(&buf[..n]);
        }
    });
    assert_eq!(got.len(), all.len());
    assert_eq!(sha256(&got), sha256(&all), "stream reordered or corrupted");
    c.close(s).unwrap();
}

/// recv flags: MSG_PEEK leaves the data, MSG_WAITALL waits for all of it
/// (across several sends), MSG_DONTWAIT does not wait.
fn recv_flags(engine: &str) {
    use std::io::Write;
    let srv = start_server(engine);
    let c = srv.attach();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (mut k, _) = l.accept().unwrap();
    k.write_all(b"peekaboo").unwrap();
    let mut b = [0u8; 8];
    let t = std::time::Instant::now();
    let n = loop {
        let n = c.recv(s, &mut b, libc::MSG_PEEK).unwrap();
        if n == 8 || t.elapsed() > std::time::Duration::from_secs(5) {
            break n;
        }
    };
    assert_eq!(&b[..n], b"peekaboo");
    let mut b2 = [0u8; 8];
    assert_eq!(
        c.recv(s, &mut b2, 0).unwrap(),
        8,
        "peeked data is still there"
    );
    assert_eq!(&b2, b"peekaboo");

    let mut rng = Rng::new(9);
    let payload = rng.bytes(200_000); // < arena: one request
    let p2 = payload.clone();
    let writer = std::thread::spawn(move || {
        for piece in p2.chunks(10_000) {
            k.write_all(piece).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        k
    });
    let mut got = vec![0u8; payload.len()];
    let n = c.recv(s, &mut got, libc::MSG_WAITALL).unwrap();
    assert_eq!(n, payload.len(), "MSG_WAITALL returned early");
    assert_eq!(sha256(&got), sha256(&payload));
    let _k = writer.join().unwrap();
    assert_errno(
        c.recv(s, &mut b, libc::MSG_DONTWAIT),
        libc::EAGAIN,
        "MSG_DONTWAIT with nothing to read",
    );
}

/// Socket options travel both ways.
fn socket_options(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    assert_eq!(
        c.getsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_NODELAY)
            .unwrap(),
        0
    );
    c.setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
        .unwrap();
    assert_eq!(
        c.getsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_NODELAY)
            .unwrap(),
        1
    );
    c.setsockopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF, 65536)
        .unwrap();
    // Linux doubles the value.
    assert_eq!(
        c.getsockopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF)
            .unwrap(),
        131072
    );
    assert_eq!(
        c.getsockopt_int(s, libc::SOL_SOCKET, libc::SO_TYPE)
            .unwrap(),
        libc::SOCK_STREAM
    );
    assert_errno(
        c.setsockopt_int(s, libc::SOL_SOCKET, 9999, 1),
        libc::ENOPROTOOPT,
        "unknown option",
    );
    c.close(s).unwrap();
}

/// The options the foundation must carry, each set through the server and
/// read back, and the ones with visible behaviour exercised.
fn required_socket_options(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    for (level, name) in [
        (libc::SOL_SOCKET, libc::SO_REUSEADDR),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    ] {
        assert_eq!(
            c.getsockopt_int(s, level, name).unwrap(),
            0,
            "({level}, {name}) default"
        );
        c.setsockopt_int(s, level, name, 1).unwrap();
        assert_eq!(
            c.getsockopt_int(s, level, name).unwrap(),
            1,
            "({level}, {name}) after set"
        );
    }
    c.setsockopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, 100_000)
        .unwrap();
    // Linux doubles the value it is given.
    assert_eq!(
        c.getsockopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF)
            .unwrap(),
        200_000
    );
    assert_eq!(
        c.getsockopt_int(s, libc::SOL_SOCKET, libc::SO_ERROR)
            .unwrap(),
        0
    );

    // SO_REUSEPORT: a second listener on the same port.
    c.bind(s, &"127.0.0.1:0".parse().unwrap()).unwrap();
    c.listen(s, 4).unwrap();
    let port = c.getsockname(s).unwrap().port();
    let s2 = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.setsockopt_int(s2, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
        .unwrap();
    c.bind(s2, &SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap();
    c.listen(s2, 4).unwrap();

    // SO_LINGER {on, 0}: close resets the connection; the peer sees ECONNRESET.
    let peer_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let t = c.tcp_connect(peer_l.local_addr().unwrap()).unwrap();
    let (mut peer, _) = peer_l.accept().unwrap();
    let mut linger = [0u8; 8];
    linger[0..4].copy_from_slice(&1i32.to_ne_bytes());
    c.setsockopt(t, libc::SOL_SOCKET, libc::SO_LINGER, &linger)
        .unwrap();
    let mut back = [0u8; 8];
    assert_eq!(
        c.getsockopt(t, libc::SOL_SOCKET, libc::SO_LINGER, &mut back)
            .unwrap(),
        8
    );
    assert_eq!(back, linger);
    c.close(t).unwrap();
    let mut b = [0u8; 4];
    let e = std::io::Read::read(&mut peer, &mut b).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

/// The host counts what it copies and what the server moved: with the
/// copying API every network byte was copied once between the application
/// and the arena (seed 004's "bytes copied per network byte" is about 1).
fn copy_accounting(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let before = c.stats();
    let payload = Rng::new(21).bytes(1 << 20);
    echo_roundtrip(&c, kernel_echo_server("127.0.0.1:0"), &payload);
    let s = c.stats();
    let (sent, received) = (
        s.bytes_sent - before.bytes_sent,
        s.bytes_received - before.bytes_received,
    );
    assert_eq!(sent, 1 << 20, "{s:?}");
    assert_eq!(received, 1 << 20, "{s:?}");
    let copied = s.bytes_copied - before.bytes_copied;
    // Data copies plus the few bytes of addresses and options.
    assert!(
        (2 << 20..(2 << 20) + 4096).contains(&copied),
        "copied {copied}: {s:?}"
    );
    assert!((s.copies_per_network_byte() - 1.0).abs() < 0.01, "{s:?}");
}

engine_tests!(
    recv_flags,
    socket_options,
    required_socket_options,
    copy_accounting,
);

engine_tests!(
    echo_sizes,
    reverse_echo_v4,
    echo_ipv6,
    reverse_echo_v6,
    ordered_small_sends
);
