//! Eager accept, eager receive (pull and push) and setup with accept (the
//! thesis' process-ahead) end to end through a real `tcps server` on both engines: bytes
//! are compared by SHA-256, end of stream and resets arrive after the data,
//! the accept queue and read-ahead memory stay within their bounds, and the
//! host's critical path needs no channel round trip (counted by the host
//! library, `HostStats::round_trips`).

mod common;
mod preload;

use common::*;
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tcps::Client;
use tcps_proto::eager::{
    SOL_TCPS, TCPS_EAGER_ACCEPT, TCPS_EAGER_RECV, TCPS_EAGER_RECV_SIZE, TCPS_SETUP_WITH_ACCEPT,
};

/// Receives until end of stream; returns the bytes.
fn recv_to_eof(c: &Client, s: u32) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 7000]; // not a divisor of the ring size: reads straddle the wrap
    loop {
        let n = c.recv(s, &mut buf, 0).expect("recv");
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// Data, then FIN, then nothing: 300 KiB (many ring-fulls, so the server
/// pauses and resumes) arrive intact before end of stream, which repeats.
/// Accept and every receive are served from rings: no round trip at all.
fn data_then_fin_then_nothing(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let data = Rng::new(7).bytes(300 * 1024);
    let sent = data.clone();
    let client = std::thread::spawn(move || {
        let mut k = TcpStream::connect(addr).unwrap();
        k.write_all(&sent).unwrap();
        k.shutdown(Shutdown::Write).unwrap();
        k
    });
    let before = c.stats();
    let (s, _) = c.accept(l, 0).unwrap();
    // Let the server read ahead until the ring is full (and pause).
    std::thread::sleep(Duration::from_millis(100));
    // Operators see it: a connection accepted ahead, bytes received ahead
    // and waiting in the ring (the workers publish every 100 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = srv.stat_json();
        let (ctr, dep) = (&v["total"]["counters"], &v["total"]["depths"]);
        if ctr["accepts_eager"].as_u64() == Some(1)
            && ctr["recvs_eager"].as_u64() > Some(0)
            && dep["recv_ring_bytes"].as_u64() > Some(16 * 1024)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{engine}: tcps stat shows no process-ahead: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let got = recv_to_eof(&c, s);
    assert_eq!(got.len(), data.len(), "{engine}: byte count");
    assert_eq!(sha256(&got), sha256(&data), "{engine}: bytes differ");
    let mut b = [0u8; 16];
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 0, "EOF again");
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 0, "and again");
    let after = c.stats();
    assert_eq!(
        after.round_trips - before.round_trips,
        0,
        "{engine}: accept + recvs + EOF took channel round trips: {after:?}"
    );
    assert_eq!(after.ring_accepts - before.ring_accepts, 1, "{after:?}");
    assert!(after.ring_recvs > before.ring_recvs, "{after:?}");
    assert!(
        after.recv_kicks > 0,
        "the ring paused and was resumed: {after:?}"
    );
    drop(client.join().unwrap());
    c.close(s).unwrap();
    c.close(l).unwrap();
}

/// Data, then a reset: the data first, then ECONNRESET once, then end of
/// stream — in push mode (rings) and in pull mode (the server's buffer).
fn data_then_rst_after_the_data(engine: &str) {
    for mode in ["push", "pull"] {
        let srv = Server::start(engine, &["--poll", "adaptive", "--eager-recv", mode]);
        let c = srv.attach();
        let (l, addr) = tcps_listener(&c);
        let data = Rng::new(11).bytes(50_000);
        let sent = data.clone();
        let client = std::thread::spawn(move || {
            let k = TcpStream::connect(addr).unwrap();
            (&k).write_all(&sent).unwrap();
            // Let the server read the data ahead, then reset.
            std::thread::sleep(Duration::from_millis(200));
            reset_on_close(&k);
            drop(k);
        });
        let (s, _) = c.accept(l, 0).unwrap();
        client.join().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        let err = loop {
            match c.recv(s, &mut buf, 0) {
                Ok(0) => panic!(
                    "{engine}/{mode}: EOF instead of ECONNRESET after {} bytes",
                    got.len()
                ),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break errno_of(&e),
            }
        };
        assert_eq!(
            got.len(),
            data.len(),
            "{engine}/{mode}: data before the reset"
        );
        assert_eq!(sha256(&got), sha256(&data), "{engine}/{mode}: bytes differ");
        assert_eq!(
            err,
            libc::ECONNRESET,
            "{engine}/{mode}: {}",
            errno_name(err)
        );
        assert_eq!(
            c.recv(s, &mut buf, 0).unwrap(),
            0,
            "{engine}/{mode}: after the reset"
        );
        c.close(s).unwrap();
    }
}

/// Connections in the kernel's accept queue of the listener on `port`
/// (`ss` Recv-Q of a listening socket).
fn kernel_backlog(port: u16) -> usize {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("run ss (iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        .sum()
}

/// `--eager-accept-size 4`: the server takes 4 connections ahead and leaves
/// the others in the kernel's backlog; the host then gets every one of them
/// exactly once.
fn accept_queue_bound(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--eager-accept-size", "4"]);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    c.set_nonblocking(l, true).unwrap();
    // Nothing yet; this also tells the server the host wants connections.
    assert_errno(c.accept(l, 0), libc::EAGAIN, "empty listener");
    let clients: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while kernel_backlog(addr.port()) != 16 {
        assert!(
            Instant::now() < deadline,
            "{engine}: kernel backlog {} (want 16 = 20 - 4 taken ahead)",
            kernel_backlog(addr.port())
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(kernel_backlog(addr.port()), 16, "{engine}: the bound held");
    let mut peers = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while peers.len() < 20 {
        match c.accept(l, 0) {
            Ok((s, p)) => {
                assert!(
                    peers.insert(p.unwrap()),
                    "{engine}: a connection accepted twice"
                );
                c.close(s).unwrap();
            }
            Err(e) if errno_of(&e) == libc::EAGAIN => {
                assert!(
                    Instant::now() < deadline,
                    "{engine}: only {} accepted",
                    peers.len()
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("{engine}: accept: {e}"),
        }
    }
    let mine: BTreeSet<SocketAddr> = clients.iter().map(|k| k.local_addr().unwrap()).collect();
    assert_eq!(peers, mine, "{engine}: every client accepted exactly once");
    assert_eq!(kernel_backlog(addr.port()), 0);
    assert!(c.stats().ring_accepts >= 4, "{:?}", c.stats());
}

/// The host's critical path of a request: accept, receive the request, send
/// the reply. With everything on it takes no channel round trip; each
/// mechanism switched off costs what it saves.
fn round_trips_before_the_reply(engine: &str) {
    let cases: [(&[&str], u64, u64); 4] = [
        (&[], 0, 0),
        (&["--setup-with-accept", "off"], 2, 2), // RecvBind + AsyncBind
        (&["--eager-accept", "off"], 1, 1),      // Accept request
        (
            &[
                "--eager-accept",
                "off",
                "--eager-recv",
                "off",
                "--setup-with-accept",
                "off",
            ],
            3,
            3, // Accept, Recv, AsyncBind
        ),
    ];
    for (flags, min, max) in cases {
        let mut args = vec!["--poll", "adaptive"];
        args.extend_from_slice(flags);
        let srv = Server::start(engine, &args);
        let c = srv.attach();
        let (l, addr) = tcps_listener(&c);
        for i in 0..3 {
            let mut k = TcpStream::connect(addr).unwrap();
            k.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let before = c.stats().round_trips;
            let (s, _) = c.accept(l, 0).unwrap();
            let mut req = [0u8; 64];
            let n = c.recv(s, &mut req, 0).unwrap();
            assert_eq!(&req[..n], b"GET / HTTP/1.0\r\n\r\n");
            c.send_async(s, b"HTTP/1.0 200 OK\r\n\r\nhello", 0).unwrap();
            let rt = c.stats().round_trips - before;
            assert!(
                (min..=max).contains(&rt),
                "{engine} {flags:?} request {i}: {rt} round trips before the reply (want {min}..={max})"
            );
            c.shutdown(s, libc::SHUT_WR).unwrap();
            c.close(s).unwrap();
            // Shutdown goes unanswered only on a connection with a byte
            // ring (whose end shows a reset); close of an accepted one always.
            let shutdown_waits = u64::from(flags.windows(2).any(|w| w == ["--eager-recv", "off"]));
            assert_eq!(
                c.stats().round_trips - before,
                rt + shutdown_waits,
                "{engine} {flags:?} request {i}: shutting down or closing the connection waited"
            );
            let mut reply = Vec::new();
            k.read_to_end(&mut reply).unwrap();
            assert_eq!(reply, b"HTTP/1.0 200 OK\r\n\r\nhello");
        }
    }
}

/// `tcps_poll` on ring sockets is answered at the host: readiness of data
/// and of a waiting connection without a round trip.
fn poll_readiness_is_local(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    c.set_nonblocking(l, true).unwrap();
    assert_errno(c.accept(l, 0), libc::EAGAIN, "empty listener");
    let mut k = TcpStream::connect(addr).unwrap();
    let mut fds = [tcps::PollFd {
        sock: l,
        events: libc::POLLIN,
        revents: 0,
    }];
    assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1);
    let before = c.stats().round_trips;
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 1, "listener readable");
    let (s, _) = c.accept(l, 0).unwrap();
    let mut fds = [tcps::PollFd {
        sock: s,
        events: libc::POLLIN,
        revents: 0,
    }];
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 0, "no data yet");
    assert_eq!(c.stats().round_trips - before, 0, "local poll and accept");
    k.write_all(b"ping").unwrap();
    assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1, "data arrived");
    assert!(fds[0].revents & libc::POLLIN != 0);
    let before = c.stats().round_trips;
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 1);
    let mut b = [0u8; 8];
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 4);
    assert_eq!(&b[..4], b"ping");
    assert_eq!(c.stats().round_trips - before, 0, "readiness from the ring");
    k.shutdown(Shutdown::Write).unwrap();
    assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1, "EOF is readable");
    let before = c.stats().round_trips;
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 1, "EOF stays readable");
    assert_eq!(c.recv(s, &mut b, 0).unwrap(), 0);
    assert_eq!(
        c.stats().round_trips - before,
        0,
        "end of stream from the ring"
    );
}

/// Per-socket policy (`SOL_TCPS`): a listener with eager receive and accept
/// off serves its connections on demand, another on the same server ahead;
/// options read back; bad values and a change after setup are refused.
fn socket_level_policy(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let plain = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.setsockopt_int(plain, SOL_TCPS, TCPS_EAGER_RECV, 0)
        .unwrap();
    c.setsockopt_int(plain, SOL_TCPS, TCPS_EAGER_ACCEPT, 0)
        .unwrap();
    c.setsockopt_int(plain, SOL_TCPS, TCPS_SETUP_WITH_ACCEPT, 0)
        .unwrap();
    assert_eq!(
        c.getsockopt_int(plain, SOL_TCPS, TCPS_EAGER_RECV).unwrap(),
        0
    );
    assert_eq!(
        c.getsockopt_int(plain, SOL_TCPS, TCPS_EAGER_ACCEPT)
            .unwrap(),
        0
    );
    assert_errno(
        c.setsockopt_int(plain, SOL_TCPS, TCPS_EAGER_RECV, 7),
        libc::EINVAL,
        "eager recv mode 7",
    );
    assert_errno(
        c.setsockopt_int(plain, SOL_TCPS, 99, 1),
        libc::ENOPROTOOPT,
        "unknown SOL_TCPS option",
    );
    assert_errno(
        c.setsockopt_int(plain, SOL_TCPS, TCPS_EAGER_RECV_SIZE, 100),
        libc::EINVAL,
        "read-ahead smaller than a page",
    );
    c.bind(plain, &"127.0.0.1:0".parse().unwrap()).unwrap();
    c.listen(plain, 16).unwrap();
    let paddr = c.getsockname(plain).unwrap();
    let (eager, eaddr) = tcps_listener(&c);

    let data = Rng::new(3).bytes(100_000);
    for (l, addr, ahead) in [(plain, paddr, false), (eager, eaddr, true)] {
        let sent = data.clone();
        let t = std::thread::spawn(move || {
            let mut k = TcpStream::connect(addr).unwrap();
            k.write_all(&sent).unwrap();
            k.shutdown(Shutdown::Write).unwrap();
            k
        });
        let before = c.stats();
        let (s, _) = c.accept(l, 0).unwrap();
        let got = recv_to_eof(&c, s);
        assert_eq!(sha256(&got), sha256(&data), "{engine} ahead={ahead}: bytes");
        let after = c.stats();
        if ahead {
            assert_eq!(after.round_trips, before.round_trips, "{after:?}");
            assert!(after.ring_recvs > before.ring_recvs);
            // Its ring is bound: the mode can no longer change to pull
            // (0 is allowed: it stops the ring, `END_STOPPED`).
            assert_errno(
                c.setsockopt_int(s, SOL_TCPS, TCPS_EAGER_RECV, 1),
                libc::EBUSY,
                "eager recv pull on a ring socket",
            );
        } else {
            assert!(after.round_trips > before.round_trips + 2, "{after:?}");
            assert_eq!(after.ring_recvs, before.ring_recvs, "{after:?}");
            assert_eq!(after.ring_accepts, before.ring_accepts, "{after:?}");
        }
        drop(t.join().unwrap());
        c.close(s).unwrap();
    }
}

engine_tests!(
    data_then_fin_then_nothing,
    data_then_rst_after_the_data,
    accept_queue_bound,
    round_trips_before_the_reply,
    poll_readiness_is_local,
    socket_level_policy,
);

/// The server's count of bytes read ahead (`tcps stat --json`).
fn bytes_eager(srv: &Server) -> u64 {
    srv.stat_json()["total"]["counters"]["bytes_eager"]
        .as_u64()
        .expect("total.counters.bytes_eager")
}

/// 10,000 connections each try to send 1 MiB the host never reads: the
/// server reads at most its bound ahead per connection (a ring in push
/// mode, a buffer in pull mode for sockets beyond the rings), so its memory
/// grows by about 32 KiB per connection (measured from before the clients
/// connected: connection state included), not by what the clients sent.
#[test]
fn ten_thousand_unread_connections_stay_bounded() {
    const CONNS: usize = 10_000;
    const BOUND_KIB: u64 = 32;
    raise_nofile();
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let base = rss_kib(srv.pid());
    let acceptor = {
        let c = c.clone();
        std::thread::spawn(move || {
            (0..CONNS)
                .map(|_| c.accept(l, 0).expect("accept").0)
                .collect::<Vec<u32>>()
        })
    };
    let clients: Vec<TcpStream> = (0..CONNS)
        .map(|i| TcpStream::connect(addr).unwrap_or_else(|e| panic!("client {i}: {e}")))
        .collect();
    let accepted = acceptor.join().unwrap();
    assert_eq!(accepted.len(), CONNS);

    let chunk = vec![0x5au8; 64 * 1024];
    let mut offered = 0u64;
    for k in &clients {
        k.set_nonblocking(true).unwrap();
        let mut sent = 0usize;
        while sent < 1 << 20 {
            match (&*k).write(&chunk[..chunk.len().min((1 << 20) - sent)]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("client write: {e}"),
            }
        }
        offered += sent as u64;
    }
    // Let the server read ahead as far as it will.
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_kib(srv.pid()).saturating_sub(base);
    let per_conn = grown / CONNS as u64;
    let ahead = bytes_eager(&srv);
    eprintln!(
        "clients got {} MiB into the network; the server read {} MiB ahead; \
         its RSS grew {} MiB ({per_conn} KiB per connection)",
        offered >> 20,
        ahead >> 20,
        grown >> 10
    );
    assert!(
        ahead <= CONNS as u64 * BOUND_KIB * 1024,
        "the server read {ahead} B ahead: more than {BOUND_KIB} KiB per connection"
    );
    assert!(
        ahead >= CONNS as u64 * BOUND_KIB * 1024 / 2,
        "the server read only {ahead} B ahead: the bound was not reached, the test proves nothing"
    );
    assert!(
        offered >= CONNS as u64 * 2 * BOUND_KIB * 1024,
        "the clients could not even offer twice the read-ahead bound ({offered} B)"
    );
    assert!(
        grown <= CONNS as u64 * (BOUND_KIB + 12) + 64 * 1024,
        "server RSS grew {grown} KiB for {CONNS} connections: read-ahead is not bounded"
    );
    // The bytes are still there, in order, for a host that does read.
    let s = accepted[CONNS - 1];
    let mut b = vec![0u8; 4096];
    let n = c.recv(s, &mut b, 0).unwrap();
    assert!(n > 0 && b[..n].iter().all(|&x| x == 0x5a));
    drop(clients);
}

/// Three processes (a forked Python server through `tcps run`) accept on one
/// listener: 300 clients each get exactly one answer from exactly one
/// child, and the parent, which never accepts, takes no connection ahead.
#[test]
fn several_processes_accept_each_connection_once() {
    preload::need("python3");
    const N: usize = 300;
    let srv = start_server("uring");
    let dir = TempDir::new("multi-accept");
    let script = r#"
import os, socket, sys
out = sys.argv[1]
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(512)
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        f = open(f"{out}/got.{i}", "w")
        while True:
            c, _ = l.accept()
            d = b""
            while not d.endswith(b"\n"):
                x = c.recv(64)
                if not x:
                    break
                d += x
            f.write(d.decode()); f.flush()
            c.sendall(b"ok"); c.close()
    kids.append(pid)
print(l.getsockname()[1], flush=True)
for k in kids:
    os.waitpid(k, 0)
"#;
    let stats = dir.path().join("stats");
    let log = dir.path().join("log");
    let mut cmd = preload::command(
        preload::Net::Tcps,
        &srv,
        &stats,
        &log,
        &["python3", "-c", script, dir.path().to_str().unwrap()],
    );
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("tcps run python3");
    let pgid = child.id() as i32;
    let mut port = String::new();
    let mut out = child.stdout.take().unwrap();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        port.push(b[0] as char);
    }
    let port: u16 = port.trim().parse().unwrap_or_else(|_| {
        panic!(
            "no port from the script: {:?}\n{}",
            port,
            preload::read(&log)
        )
    });
    let workers: Vec<_> = (0..4)
        .map(|w| {
            std::thread::spawn(move || {
                for i in (w..N).step_by(4) {
                    let mut k = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    k.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    k.write_all(format!("{i}\n").as_bytes()).unwrap();
                    let mut r = Vec::new();
                    k.read_to_end(&mut r)
                        .unwrap_or_else(|e| panic!("client {i} got no answer: {e}"));
                    assert_eq!(r, b"ok", "client {i}");
                }
            })
        })
        .collect();
    let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
    // SAFETY: kill(2) on the process group we created.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    for j in joined {
        if let Err(e) = j {
            std::panic::resume_unwind(e);
        }
    }
    let mut seen = Vec::new();
    let mut per_child = Vec::new();
    for i in 0..3 {
        let t = preload::read(&dir.path().join(format!("got.{i}")));
        let v: Vec<usize> = t.lines().map(|l| l.trim().parse().unwrap()).collect();
        per_child.push(v.len());
        seen.extend(v);
    }
    seen.sort();
    assert_eq!(
        seen,
        (0..N).collect::<Vec<_>>(),
        "each connection exactly once"
    );
    eprintln!("connections per child: {per_child:?}");
    // The server's view, from each host's detach line: the four processes
    // together accepted exactly N connections (none was taken ahead into a
    // process that never accepts and lost there).
    let counter = |line: &str, key: &str| -> u64 {
        line.find(key)
            .and_then(|at| {
                line[at + key.len()..]
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let log = srv.log_text();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("host detached"))
            .map(String::from)
            .collect();
        let sum: u64 = lines
            .iter()
            .map(|l| counter(l, "accepts_eager=") + counter(l, "accepts_on_demand="))
            .sum();
        if (lines.len() >= 4 && sum >= N as u64) || Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        lines.len() >= 4,
        "parent + 3 children detached:\n{}",
        srv.log_text()
    );
    let accepted: Vec<u64> = lines
        .iter()
        .map(|l| counter(l, "accepts_eager=") + counter(l, "accepts_on_demand="))
        .collect();
    assert_eq!(accepted.iter().sum::<u64>(), N as u64, "{accepted:?}");
    assert!(
        accepted.contains(&0),
        "the parent accepted nothing: {accepted:?}"
    );
}
