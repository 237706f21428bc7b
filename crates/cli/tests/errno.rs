//! errno propagation: the errno a host sees is the errno the call got at the
//! TCP server (or the one the server's own checks chose), on both engines.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};

fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

fn econnrefused(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let a = closed_port();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    assert_errno(
        c.connect(s, &a),
        libc::ECONNREFUSED,
        "connect to a closed port",
    );
    c.close(s).unwrap();
    assert_errno(
        c.tcp_connect(a),
        libc::ECONNREFUSED,
        "tcp_connect to a closed port",
    );
}

fn eaddrinuse(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let a = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.bind(a, &"127.0.0.1:0".parse().unwrap()).unwrap();
    c.listen(a, 4).unwrap();
    let addr = c.getsockname(a).unwrap();
    let b = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    assert_errno(c.bind(b, &addr), libc::EADDRINUSE, "second bind of a port");
    // Also against a port a kernel socket holds.
    let k = TcpListener::bind("127.0.0.1:0").unwrap();
    assert_errno(
        c.bind(b, &k.local_addr().unwrap()),
        libc::EADDRINUSE,
        "bind of a port a kernel listener holds",
    );
    c.close(a).unwrap();
    c.close(b).unwrap();
}

fn ebadf(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let mut buf = [0u8; 8];
    assert_errno(c.close(12345), libc::EBADF, "close of an unknown id");
    assert_errno(c.send(777, b"x", 0), libc::EBADF, "send on an unknown id");
    assert_errno(
        c.recv(777, &mut buf, 0),
        libc::EBADF,
        "recv on an unknown id",
    );
    assert_errno(c.listen(777, 1), libc::EBADF, "listen on an unknown id");
    assert_errno(
        c.getsockname(777),
        libc::EBADF,
        "getsockname on an unknown id",
    );
    assert_errno(
        c.setsockopt_int(777, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1),
        libc::EBADF,
        "setsockopt on an unknown id",
    );
    assert_errno(
        c.fcntl(777, libc::F_GETFL, 0),
        libc::EBADF,
        "fcntl on an unknown id",
    );
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.close(s).unwrap();
    assert_errno(c.close(s), libc::EBADF, "double close");
    assert_errno(c.send(s, b"x", 0), libc::EBADF, "send after close");
    assert_errno(c.recv(s, &mut buf, 0), libc::EBADF, "recv after close");
    assert_errno(
        c.bind(s, &"127.0.0.1:0".parse().unwrap()),
        libc::EBADF,
        "bind after close",
    );
    assert_errno(
        c.connect(s, &closed_port()),
        libc::EBADF,
        "connect after close",
    );
}

/// A connected (tcps client, kernel peer) pair.
fn connected_pair(c: &Client) -> (u32, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (k, _) = l.accept().unwrap();
    (s, k)
}

fn epipe_after_reset(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected_pair(&c);
    // Peer resets: closing with SO_LINGER {on, 0} sends an RST.
    reset_on_close(&k);
    drop(k);
    let chunk = vec![0x5au8; 1000];
    let mut err = None;
    for _ in 0..2000 {
        match c.send(s, &chunk, 0) {
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let e = err.expect("send kept succeeding after the peer reset the connection");
    let en = errno_of(&e);
    assert!(
        en == libc::EPIPE || en == libc::ECONNRESET,
        "send after reset: expected EPIPE or ECONNRESET, got {} ({e})",
        errno_name(en)
    );
    // The error is sticky: the socket stays unusable, the attachment fine.
    assert!(c.send(s, &chunk, 0).is_err());
    c.nop().unwrap();
    c.close(s).unwrap();
}

fn eagain_nonblocking_recv(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, mut k) = connected_pair(&c);
    let mut buf = [0u8; 64];
    // MSG_DONTWAIT on a blocking socket.
    assert_errno(
        c.recv(s, &mut buf, libc::MSG_DONTWAIT),
        libc::EAGAIN,
        "recv(MSG_DONTWAIT) with no data",
    );
    c.set_nonblocking(s, true).unwrap();
    let fl = c.fcntl(s, libc::F_GETFL, 0).unwrap();
    assert_ne!(
        fl & i64::from(libc::O_NONBLOCK),
        0,
        "F_GETFL shows O_NONBLOCK"
    );
    let t = Instant::now();
    assert_errno(
        c.recv(s, &mut buf, 0),
        libc::EAGAIN,
        "non-blocking recv with no data",
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a non-blocking recv must not wait"
    );
    // With data it returns the data.
    k.write_all(b"hello").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let n = loop {
        match c.recv(s, &mut buf, 0) {
            Ok(n) => break n,
            Err(e) if errno_of(&e) == libc::EAGAIN && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("recv after data arrived: {e}"),
        }
    };
    assert_eq!(&buf[..n], b"hello");
    // Back to blocking: the recv now waits for data instead of failing.
    c.set_nonblocking(s, false).unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        k.write_all(b"later").unwrap();
        k
    });
    let n = c.recv(s, &mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"later");
    drop(writer.join().unwrap());
    c.close(s).unwrap();
}

/// Non-blocking send to a peer that does not read: a short count or
/// EAGAIN once the buffers are full, never a hang. Non-blocking accept with
/// nothing pending: EAGAIN.
fn eagain_nonblocking_send_and_accept(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected_pair(&c);
    c.set_nonblocking(s, true).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut total = 0usize;
    let mut short = false;
    let t = Instant::now();
    let e = loop {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "non-blocking send never reported EAGAIN"
        );
        assert!(total < 1 << 30, "sent 1 GiB to a peer that does not read");
        match c.send(s, &chunk, 0) {
            Ok(n) => {
                short |= n < chunk.len();
                total += n
            }
            Err(e) => break e,
        }
    };
    assert_eq!(errno_of(&e), libc::EAGAIN, "{e}");
    assert!(total > 0, "nothing was sent before EAGAIN");
    eprintln!("{engine}: {total} bytes queued before EAGAIN (short write seen: {short})");
    // MSG_DONTWAIT on a blocking socket behaves the same.
    c.set_nonblocking(s, false).unwrap();
    assert_errno(
        c.send(s, &chunk, libc::MSG_DONTWAIT),
        libc::EAGAIN,
        "send(MSG_DONTWAIT) with full buffers",
    );
    // The bytes that were accepted all arrive, in order.
    let reader = std::thread::spawn(move || {
        let mut k = k;
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        while got < total {
            let n = k.read(&mut buf).unwrap();
            assert!(n > 0, "EOF after {got} of {total}");
            assert!(buf[..n].iter().all(|&b| b == 7));
            got += n;
        }
        got
    });
    assert_eq!(
        within(
            Duration::from_secs(20),
            "reading what was queued",
            move || reader.join().unwrap()
        ),
        total
    );

    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
    c.set_nonblocking(l, true).unwrap();
    assert_errno(
        c.accept(l, 0),
        libc::EAGAIN,
        "non-blocking accept, nothing pending",
    );
    let _k = TcpStream::connect(c.getsockname(l).unwrap()).unwrap();
    let t = Instant::now();
    let (a, _) = loop {
        match c.accept(l, libc::SOCK_NONBLOCK) {
            Ok(v) => break v,
            Err(e) if errno_of(&e) == libc::EAGAIN && t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("non-blocking accept with a pending connection: {e}"),
        }
    };
    // SOCK_NONBLOCK on accept gives a non-blocking socket.
    let mut b = [0u8; 4];
    assert_errno(
        c.recv(a, &mut b, 0),
        libc::EAGAIN,
        "recv on an accept4(SOCK_NONBLOCK) socket",
    );
}

fn einprogress_connect(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c
        .socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        .unwrap();
    assert_errno(
        c.connect(s, &l.local_addr().unwrap()),
        libc::EINPROGRESS,
        "non-blocking connect",
    );
    let mut fds = [PollFd {
        sock: s,
        events: libc::POLLOUT,
        revents: 0,
    }];
    let n = c.poll(&mut fds, 5000).unwrap();
    assert_eq!(n, 1, "poll for POLLOUT after EINPROGRESS");
    assert_ne!(
        fds[0].revents & libc::POLLOUT,
        0,
        "revents {:#x}",
        fds[0].revents
    );
    assert_eq!(
        c.getsockopt_int(s, libc::SOL_SOCKET, libc::SO_ERROR)
            .unwrap(),
        0,
        "SO_ERROR after the connect completed"
    );
    // The connection works.
    let (mut k, _) = l.accept().unwrap();
    assert_eq!(c.getpeername(s).unwrap(), l.local_addr().unwrap());
    c.send_all(s, b"ping").unwrap();
    let mut b = [0u8; 4];
    k.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");

    // A non-blocking connect to a closed port: EINPROGRESS then
    // SO_ERROR = ECONNREFUSED (or ECONNREFUSED at once).
    let s2 = c
        .socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        .unwrap();
    match c.connect(s2, &closed_port()) {
        Err(e) if errno_of(&e) == libc::EINPROGRESS => {
            let mut fds = [PollFd {
                sock: s2,
                events: libc::POLLOUT,
                revents: 0,
            }];
            assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1);
            assert_eq!(
                c.getsockopt_int(s2, libc::SOL_SOCKET, libc::SO_ERROR)
                    .unwrap(),
                libc::ECONNREFUSED
            );
        }
        r => assert_errno(
            r,
            libc::ECONNREFUSED,
            "non-blocking connect to a closed port",
        ),
    }
    c.close(s).unwrap();
    c.close(s2).unwrap();
}

/// A port in 600..1000 that nothing listens on now.
fn free_low_port(rng: &mut Rng) -> u16 {
    for _ in 0..200 {
        let p = 600 + rng.below(400) as u16;
        if plain_kernel_bind(SocketAddr::from(([127, 0, 0, 1], p))).is_ok() {
            return p;
        }
    }
    panic!("no free port in 600..1000");
}

fn eacces_unprivileged_low_port(engine: &str) {
    // SAFETY: getuid has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: needs root to start an unprivileged child");
        return;
    }
    // Every local user may attach (the default, 660, keeps uid 65534 out).
    let srv = Server::start(engine, &["--poll", "adaptive", "--socket-mode", "666"]);
    let mut rng = Rng::new(std::process::id() as u64 ^ 0xacce55);
    // Root (this process) may bind a low port through tcps.
    let c = srv.attach();
    let mut bound = None;
    for _ in 0..20 {
        let p = free_low_port(&mut rng);
        let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        match c.bind(s, &SocketAddr::from(([127, 0, 0, 1], p))) {
            Ok(()) => {
                bound = Some((s, p));
                break;
            }
            Err(e) if errno_of(&e) == libc::EADDRINUSE => c.close(s).unwrap(),
            Err(e) => panic!("root host could not bind port {p} through tcps: {e}"),
        }
    }
    let (s, p) = bound.expect("root bound a port < 1024");
    c.listen(s, 1).unwrap();
    assert_eq!(c.getsockname(s).unwrap().port(), p);
    c.close(s).unwrap();

    // uid/gid 65534 may not.
    let port = free_low_port(&mut rng);
    let exe = world_executable_self(srv.dir.path());
    let mut cmd = child_command_exe(&exe, "child_unprivileged_bind", "unprivileged-bind");
    cmd.env("TCPS_IT_SOCKET", &srv.socket)
        .env("TCPS_IT_PORT", port.to_string())
        .uid(65534)
        .gid(65534); // std drops supplementary groups when root sets a uid
    let (st, out, err) = run_child(cmd, Duration::from_secs(30));
    assert!(
        st.success(),
        "unprivileged child failed: {st}\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert_eq!(marks(&out, "uid"), vec!["65534".to_string()], "{out}");
    assert_eq!(
        marks(&out, "low-bind"),
        vec!["EACCES".to_string()],
        "bind of port {port} as uid 65534\n{out}\n{err}"
    );
    assert_eq!(marks(&out, "high-bind"), vec!["ok".to_string()], "{out}");
    // The refusal is the kernel's: the host binds its own socket
    // (docs/PROTOCOL.md §6), so the server never saw the bind.
}

/// Child: runs as uid 65534 and reports what binding a low port gives.
#[test]
fn child_unprivileged_bind() {
    let Some(()) = child_role("unprivileged-bind") else {
        return;
    };
    // SAFETY: no side effects.
    mark("uid", unsafe { libc::geteuid() });
    let c = Client::attach(env("TCPS_IT_SOCKET")).unwrap_or_else(|e| {
        panic!(
            "nobody could not attach: {e}: {}",
            tcps::last_attach_error()
        )
    });
    let port: u16 = env("TCPS_IT_PORT").parse().unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let r = c.bind(s, &SocketAddr::from(([127, 0, 0, 1], port)));
    mark(
        "low-bind",
        match &r {
            Ok(()) => "ok".to_string(),
            Err(e) => errno_name(errno_of(e)),
        },
    );
    let s2 = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let r2 = c.bind(s2, &"127.0.0.1:0".parse().unwrap());
    mark(
        "high-bind",
        if r2.is_ok() {
            "ok".into()
        } else {
            format!("{r2:?}")
        },
    );
}

/// Calls with bad arguments get the kernel's errno or EINVAL/EAFNOSUPPORT,
/// and never hurt the attachment.
fn bad_arguments(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    assert_errno(
        c.socket(libc::AF_UNIX, libc::SOCK_STREAM, 0),
        libc::EAFNOSUPPORT,
        "socket(AF_UNIX) is not offloaded",
    );
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let af_inet = (libc::AF_INET as u16).to_ne_bytes();
    assert_errno(
        c.bind_raw(s, &[af_inet[0], af_inet[1], 0]),
        libc::EINVAL,
        "bind with a 3-byte AF_INET sockaddr",
    );
    assert_errno(
        c.bind_raw(s, &[0xff, 0x7f, 0, 0]),
        libc::EAFNOSUPPORT,
        "bind with an unknown address family",
    );
    let mut buf = [0u8; 4];
    assert_errno(
        c.recv(s, &mut buf, 0),
        libc::ENOTCONN,
        "recv on an unconnected socket",
    );
    c.listen(s, 1).unwrap();
    assert_errno(
        c.connect(s, &closed_port()),
        libc::EISCONN,
        "connect on a listener",
    );
    c.nop().unwrap();
}

/// SO_RCVTIMEO bounds a blocking recv and accept parked at the server: they
/// return EAGAIN after the timeout (the server's kernel socket is
/// non-blocking, so the server times them out itself), and a timeout of
/// zero means wait forever again.
fn rcvtimeo_bounds_parked_calls(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let mut tv = [0u8; 16];
    tv[8..16].copy_from_slice(&200_000i64.to_ne_bytes()); // 200 ms
    let quiet = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.tcp_connect(quiet.local_addr().unwrap()).unwrap();
    let (mut peer, _) = quiet.accept().unwrap();
    c.setsockopt(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
        .unwrap();
    let mut buf = [0u8; 16];
    let t = Instant::now();
    let e = c.recv(s, &mut buf, 0).unwrap_err();
    let took = t.elapsed();
    assert_eq!(errno_of(&e), libc::EAGAIN, "{e}");
    assert!(
        took >= Duration::from_millis(150),
        "timed out early: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "timed out late: {took:?}");
    // The socket still works, and data that arrives in time is received.
    peer.write_all(b"late").unwrap();
    assert_eq!(c.recv(s, &mut buf, 0).unwrap(), 4);
    assert_eq!(&buf[..4], b"late");

    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
    c.setsockopt(l, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
        .unwrap();
    let t = Instant::now();
    let e = c.accept(l, 0).unwrap_err();
    assert_eq!(errno_of(&e), libc::EAGAIN, "{e}");
    assert!(t.elapsed() >= Duration::from_millis(150));

    // Zero: blocking without a bound again — the recv waits for data.
    c.setsockopt(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &[0u8; 16])
        .unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        peer.write_all(b"x").unwrap();
        peer
    });
    assert_eq!(c.recv(s, &mut buf, 0).unwrap(), 1);
    drop(writer.join().unwrap());
}

engine_tests!(
    rcvtimeo_bounds_parked_calls,
    econnrefused,
    eaddrinuse,
    ebadf,
    epipe_after_reset,
    eagain_nonblocking_recv,
    eagain_nonblocking_send_and_accept,
    einprogress_connect,
    eacces_unprivileged_low_port,
    bad_arguments,
);
