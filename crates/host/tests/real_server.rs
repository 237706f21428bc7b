//! Smoke tests against the real `tcps server` binary, if it has been built
//! (target/release/tcps or target/debug/tcps; `cargo test --workspace`
//! builds it). A missing binary fails the test rather than skipping it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};

struct Server {
    child: Child,
    path: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn binary() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("tcps"))
        .find(|p| p.exists())
}

/// Starts a server with `args`; panics if there is no binary.
fn start(name: &str, args: &[&str]) -> (Server, Client) {
    let Some(bin) = binary() else {
        panic!("no tcps binary: run `cargo build --release` (or `cargo test --workspace`) first");
    };
    let path =
        std::env::temp_dir().join(format!("tcps-host-real-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let child = Command::new(bin)
        .arg("server")
        .arg("--socket")
        .arg(&path)
        .args(args)
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("TCPS_TEST_VERBOSE").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("spawn tcps server");
    let server = Server { child, path };
    let t = Instant::now();
    loop {
        match Client::attach(&server.path) {
            Ok(c) => return (server, c),
            Err(e) if t.elapsed() > Duration::from_secs(5) => {
                panic!(
                    "cannot attach to the server: {e}: {}",
                    tcps::last_attach_error()
                )
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn raw(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn tcp_data_path() {
    let (_server, c) = start("data", &[]);
    for _ in 0..1000 {
        c.nop().unwrap();
    }
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let addr: SocketAddr = c.getsockname(l).unwrap();
    assert_ne!(addr.port(), 0);
    let cl = c.tcp_connect(addr).unwrap();
    let (sv, peer) = c.accept(l, 0).unwrap();
    assert_eq!(peer, Some(c.getsockname(cl).unwrap()));
    assert_eq!(c.getpeername(sv).unwrap(), c.getsockname(cl).unwrap());

    // 3 MB through the kernel, sent from one thread, received on another.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let (c2, d2) = (c.clone(), data.clone());
    let sender = std::thread::spawn(move || c2.send_all(cl, &d2));
    let mut got = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 1 << 20];
    while got.len() < data.len() {
        let n = c.recv(sv, &mut buf, 0).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    sender.join().unwrap().unwrap();
    assert!(got == data, "data corrupted");

    // poll, non-blocking recv, setsockopt/getsockopt.
    let mut fds = [PollFd {
        sock: sv,
        events: libc::POLLIN | libc::POLLOUT,
        revents: 0,
    }];
    assert_eq!(c.poll(&mut fds, 100).unwrap(), 1);
    assert_eq!(fds[0].revents & libc::POLLOUT, libc::POLLOUT);
    c.set_nonblocking(sv, true).unwrap();
    assert_eq!(raw(&c.recv(sv, &mut buf, 0).unwrap_err()), libc::EAGAIN);
    c.setsockopt_int(sv, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
        .unwrap();
    assert_ne!(
        c.getsockopt_int(sv, libc::IPPROTO_TCP, libc::TCP_NODELAY)
            .unwrap(),
        0
    );

    // Orderly close: EOF on the other side.
    c.shutdown(cl, libc::SHUT_WR).unwrap();
    c.set_nonblocking(sv, false).unwrap();
    assert_eq!(c.recv(sv, &mut buf, 0).unwrap(), 0);
    for s in [cl, sv, l] {
        c.close(s).unwrap();
    }
    assert_eq!(raw(&c.close(sv).unwrap_err()), libc::EBADF);
    eprintln!("{:?}", c.stats());
}

#[test]
fn blocking_server_is_rung() {
    let (_server, c) = start("block", &["--poll", "block"]);
    for _ in 0..10 {
        // Idle long enough for the server to be asleep: the call must ring.
        std::thread::sleep(Duration::from_millis(20));
        c.nop().unwrap();
    }
    let s = c.stats();
    assert!(s.doorbells > 0, "{s:?}");
}

#[test]
fn server_death_fails_calls_promptly() {
    let (mut server, c) = start("death", &[]);
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let c2 = c.clone();
    let blocked = std::thread::spawn(move || c2.accept(l, 0).map(|_| ()));
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    server.child.kill().unwrap();
    let r = blocked.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(raw(&r.unwrap_err()), libc::ECONNRESET);
    assert_eq!(raw(&c.nop().unwrap_err()), libc::ENOTCONN);
    assert_eq!(raw(&c.send(l, b"x", 0).unwrap_err()), libc::EPIPE);
}

/// A kernel echo server on loopback: echoes every connection until EOF.
fn kernel_echo() -> SocketAddr {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut b = vec![0u8; 65536];
                loop {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&b[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

fn recv_exact(c: &Client, s: u32, n: usize) -> Vec<u8> {
    let mut got = Vec::with_capacity(n);
    let mut buf = vec![0u8; n.max(1)];
    while got.len() < n {
        let k = c.recv(s, &mut buf[..n - got.len()], 0).unwrap();
        assert!(k > 0, "EOF after {} of {n} bytes", got.len());
        got.extend_from_slice(&buf[..k]);
    }
    got
}

/// One channel carries a recv parked at the server and another thread's
/// echoes: the echoes are not delayed, completions are handed between the
/// two threads through the channel's mailbox, and both get their own bytes.
#[test]
fn one_channel_carries_a_blocked_recv_and_echoes() {
    // Eager receive off: a blocked recv must be a call parked at the
    // server, holding its channel (with rings it waits on the ring).
    let (_server, c) = start("share1", &["--channels", "1", "--eager-recv", "off"]);
    assert_eq!(c.n_channels(), 1);
    let c1 = c.clone();
    let s = within(Duration::from_secs(60), "30 rounds", move || {
        use std::io::Write;
        let c = c1;
        let e = c.tcp_connect(kernel_echo()).unwrap();
        let quiet = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = c.tcp_connect(quiet.local_addr().unwrap()).unwrap();
        let (mut peer, _) = quiet.accept().unwrap();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..30u32 {
            // Thread A blocks in recv on a quiet connection (parked at the
            // server).
            let (c2, want) = (c.clone(), format!("round {round}: wake up").into_bytes());
            let n = want.len();
            let blocked = std::thread::spawn(move || recv_exact(&c2, a, n));
            std::thread::sleep(Duration::from_millis(20));
            assert!(!blocked.is_finished(), "recv returned with nothing sent");
            // Thread B (this one) echoes on the same channel; half way the
            // peer of A writes, so A's completion lands while B is busy.
            let t = Instant::now();
            for i in 0..40 {
                if i == 20 {
                    peer.write_all(&want).unwrap();
                }
                let len = 1 + (next() % 40_000) as usize;
                let msg: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                c.send_all(e, &msg).unwrap();
                assert!(
                    recv_exact(&c, e, len) == msg,
                    "echo corrupted (round {round}, {len} B)"
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "echoes took {:?} next to a blocked recv",
                t.elapsed()
            );
            assert_eq!(blocked.join().unwrap(), want);
        }
        c.stats()
    });
    eprintln!("{s:?}");
    assert!(s.shared > 0, "the echoes never shared the channel: {s:?}");
    assert!(s.handed_off > 0, "no completion was handed over: {s:?}");
    assert_eq!(s.stray_completions, 0, "{s:?}");
}

/// Runs `f` on a thread of its own; fails the test if it takes longer than
/// `limit` (a deadlock), instead of hanging it.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: not done after {limit:?}"))
}

/// Many blocked calls on few channels: each channel carries up to
/// ring_entries - 1 calls, and calls still go through — also when every
/// channel is held by a recv whose buffer is larger than the arena.
#[test]
fn many_blocked_recvs_share_two_channels() {
    let (_server, c) = start("share2", &["--channels", "2", "--eager-recv", "off"]);
    let c2 = c.clone();
    let s = within(
        Duration::from_secs(30),
        "40 blocked recvs and an echo",
        move || {
            use std::io::Write;
            let c = c2;
            let quiet = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peers = Vec::new();
            let mut threads = Vec::new();
            for i in 0..40u32 {
                let s = c.tcp_connect(quiet.local_addr().unwrap()).unwrap();
                peers.push(quiet.accept().unwrap().0);
                let c = c.clone();
                // Big buffers: the first recv of a channel gets most of its
                // arena, sharers a part; recv returns what fits.
                threads.push(std::thread::spawn(move || {
                    let mut b = vec![0u8; 1 << 20];
                    let n = c.recv(s, &mut b, 0).unwrap();
                    assert_eq!(&b[..n], format!("conn {i}").as_bytes());
                }));
            }
            std::thread::sleep(Duration::from_millis(100));
            c.nop().unwrap();
            let e = c.tcp_connect(kernel_echo()).unwrap();
            let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            c.send_all(e, &big).unwrap();
            assert!(recv_exact(&c, e, big.len()) == big);
            for (i, p) in peers.iter_mut().enumerate() {
                p.write_all(format!("conn {i}").as_bytes()).unwrap();
            }
            for t in threads {
                t.join().unwrap();
            }
            c.stats()
        },
    );
    assert!(s.shared >= 38, "{s:?}");
    assert_eq!(s.stray_completions, 0, "{s:?}");
}
