//! The host library against an in-process fake server (tests/common).

mod common;

use common::{Fake, Mode, FAILING_BACKLOG, NONBLOCK_SEND_LIMIT, SLOW_HOW};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};

fn raw(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn nop_round_trips_and_counts() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    for _ in 0..1000 {
        c.nop().unwrap();
    }
    let s = c.stats();
    assert_eq!(s.calls, 1000);
}

#[test]
fn sleeping_host_is_woken_by_the_futex() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let mut took: Vec<Duration> = (0..10)
        .map(|_| {
            let t = Instant::now();
            c.shutdown(s, SLOW_HOW).unwrap();
            t.elapsed()
        })
        .collect();
    took.sort();
    // Well under the 100 ms futex timeout: the wakes got through (the
    // median, so one call delayed by a loaded machine does not decide).
    assert!(took[5] < Duration::from_millis(60), "took {took:?}");
    assert!(c.stats().sleeps >= 10, "{:?}", c.stats());
}

#[test]
fn idle_server_is_rung() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    c.nop().unwrap();
    // Let the fake fall asleep behind the doorbell, then call: the host must
    // see the sleeping flag and ring. (Retried: on a loaded machine the fake
    // may not have been scheduled to fall asleep yet.)
    let t = Instant::now();
    while c.stats().doorbells == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "never rang: {:?}",
            c.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
        c.nop().unwrap();
    }
    // The fake read the ring.
    let t = Instant::now();
    while fake.doorbells() == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the fake never saw the ring"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn socket_calls_encode_as_the_server_expects() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let l = c.tcp_listen(addr, 128).unwrap();
    assert_eq!(c.getsockname(l).unwrap(), addr);
    let (a, peer) = c
        .accept(l, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        .unwrap();
    assert_eq!(peer, Some("127.0.0.1:4242".parse().unwrap()));
    assert_ne!(a, l);

    // accept_raw with a short buffer: truncated copy, full length reported.
    let mut small = [0u8; 4];
    let (_, len) = c.accept_raw(l, 0, &mut small).unwrap();
    assert_eq!(len, 16);
    assert_eq!(
        u16::from_ne_bytes([small[0], small[1]]),
        libc::AF_INET as u16
    );

    assert_eq!(
        c.getsockopt_int(a, libc::SOL_SOCKET, libc::SO_ERROR)
            .unwrap(),
        7
    );
    c.setsockopt_int(a, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
        .unwrap();
    c.shutdown(a, libc::SHUT_WR).unwrap();
    c.close(a).unwrap();
    assert_eq!(raw(&c.close(a).unwrap_err()), libc::EBADF);
}

#[test]
fn errors_carry_the_server_errno() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    assert_eq!(
        raw(&c.listen(s, FAILING_BACKLOG).unwrap_err()),
        libc::EADDRINUSE
    );
    assert_eq!(
        raw(&c.socket(12345, libc::SOCK_STREAM, 0).unwrap_err()),
        libc::EAFNOSUPPORT
    );
    let refused: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert_eq!(
        raw(&c.tcp_connect(refused).unwrap_err()),
        libc::ECONNREFUSED
    );
    assert_eq!(raw(&c.listen(4000, 1).unwrap_err()), libc::EBADF);
    assert_eq!(raw(&c.bind_raw(s, &[0u8; 129]).unwrap_err()), libc::EINVAL);
}

#[test]
fn large_sends_are_split_into_arena_chunks_and_echo_back() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    assert_eq!(c.arena_size(), 16384);
    let s = c.tcp_connect("127.0.0.1:80".parse().unwrap()).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let before = c.stats().calls;
    assert_eq!(c.send(s, &data, 0).unwrap(), data.len());
    assert_eq!(c.stats().calls - before, 100_000u64.div_ceil(16384));
    assert_eq!(c.send(s, &[], 0).unwrap(), 0);

    let mut got = Vec::new();
    let mut buf = vec![0u8; 50_000];
    while got.len() < data.len() {
        let n = c.recv(s, &mut buf, 0).unwrap();
        assert!(n > 0 && n <= 16384);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, data);
}

#[test]
fn nonblocking_send_is_short_then_eagain() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.set_nonblocking(s, true).unwrap();
    assert_eq!(
        c.fcntl(s, libc::F_GETFL, 0).unwrap() & libc::O_NONBLOCK as i64,
        libc::O_NONBLOCK as i64
    );
    let data = vec![1u8; 40_000];
    assert_eq!(c.send(s, &data, 0).unwrap(), NONBLOCK_SEND_LIMIT);
    assert_eq!(raw(&c.send(s, &data, 0).unwrap_err()), libc::EAGAIN);
    assert!(c.send_all(s, &data).is_err());
    c.set_nonblocking(s, false).unwrap();
    assert_eq!(
        c.fcntl(s, libc::F_GETFL, 0).unwrap() & libc::O_NONBLOCK as i64,
        0
    );
}

#[test]
fn poll_sets_revents() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let a = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let b = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.send_all(b, b"x").unwrap();
    let mut fds = [
        PollFd {
            sock: a,
            events: libc::POLLIN,
            revents: 0,
        },
        PollFd {
            sock: b,
            events: libc::POLLIN | libc::POLLOUT,
            revents: 0,
        },
        PollFd {
            sock: 9999,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 2);
    assert_eq!(fds[0].revents, 0);
    assert_eq!(fds[1].revents, libc::POLLIN | libc::POLLOUT);
    assert_eq!(fds[2].revents, libc::POLLNVAL);
    let mut too_many = vec![PollFd::default(); 4097];
    assert_eq!(raw(&c.poll(&mut too_many, 0).unwrap_err()), libc::EINVAL);
}

#[test]
fn many_threads_share_the_channel_pool() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    // More threads than the fake's 8 channels: some must wait for a channel.
    let threads: Vec<_> = (0..12)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || {
                let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
                let msg = format!("thread {i}");
                for _ in 0..200 {
                    c.nop().unwrap();
                    c.send_all(s, msg.as_bytes()).unwrap();
                    let mut b = [0u8; 64];
                    let n = c.recv(s, &mut b, 0).unwrap();
                    assert_eq!(&b[..n], msg.as_bytes());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Each socket's first recv asks how it receives (RecvBind, answered
    // "plain requests" by the fake), then 200 × (nop, send, recv). (socket
    // is no channel call: the host makes its kernel socket and hands it over
    // on the control socket, protocol v5.)
    let st = c.stats();
    assert_eq!(st.calls, 12 * (1 + 600));
    assert_eq!(st.round_trips, st.calls);
    assert_eq!((st.ring_recvs, st.ring_accepts, st.recv_kicks), (0, 0, 0));
}

#[test]
fn a_blocked_call_fails_with_econnreset_when_the_server_dies() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let c2 = c.clone();
    let blocked = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        c2.recv(s, &mut b, 0) // parked by the fake forever
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    fake.kill();
    let r = blocked.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(raw(&r.unwrap_err()), libc::ECONNRESET);
    assert!(!c.is_attached());
    assert_eq!(raw(&c.nop().unwrap_err()), libc::ENOTCONN);
    assert_eq!(raw(&c.send(s, b"x", 0).unwrap_err()), libc::EPIPE);
}

#[test]
fn cleared_alive_flag_means_dead() {
    let mut fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    c.nop().unwrap();
    fake.clear_alive_flag();
    let t = Instant::now();
    assert_eq!(raw(&c.nop().unwrap_err()), libc::ECONNRESET);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(raw(&c.nop().unwrap_err()), libc::ENOTCONN);
}

#[test]
fn detach_and_drop_hang_up_the_control_socket() {
    let fake = Fake::start(Mode::Accept);
    let c = Client::attach(&fake.path).unwrap();
    let c2 = c.clone();
    c.detach();
    assert_eq!(raw(&c2.nop().unwrap_err()), libc::ENOTCONN);
    let d = Client::attach(&fake.path).unwrap();
    d.nop().unwrap();
    drop(d);
    let t = Instant::now();
    while fake.hosts_gone() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "server never saw the hang-ups"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Attach failures are process-global state (last_attach_error): one test.
#[test]
fn refusals_and_version_mismatch_are_explained() {
    let fake = Fake::start(Mode::Refuse(libc::EAGAIN, "too many hosts"));
    let e = Client::attach(&fake.path).unwrap_err();
    assert_eq!(raw(&e), libc::EAGAIN);
    assert!(
        tcps::last_attach_error().contains("too many hosts"),
        "{}",
        tcps::last_attach_error()
    );

    let fake = Fake::start(Mode::Version(tcps_proto::VERSION + 1));
    let e = Client::attach(&fake.path).unwrap_err();
    assert_eq!(raw(&e), libc::EPROTO);
    assert_eq!(
        tcps::last_attach_error(),
        format!(
            "tcps: protocol version mismatch: server v{}, library v{}",
            tcps_proto::VERSION + 1,
            tcps_proto::VERSION
        )
    );

    let e = Client::attach("/nonexistent/dir/tcps.sock").unwrap_err();
    assert_eq!(raw(&e), libc::ECONNREFUSED);
    assert!(tcps::last_attach_error().contains("/nonexistent/dir/tcps.sock"));
}
