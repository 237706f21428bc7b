//! Concurrency: 1000 connections with a blocked recv that delays nobody,
//! many host threads at once, and two host processes on one server.

mod common;

use common::*;
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tcps::Client;

const CONNS: usize = 1000;
const WORKERS: usize = 4;

/// Request: u32 length + payload. Response: SHA-256(payload) + payload reversed.
fn serve_one(c: &Client, s: u32) {
    let len = tcps_recv_exact(c, s, 4).expect("request length");
    let n = u32::from_le_bytes(len.try_into().unwrap()) as usize;
    let payload = tcps_recv_exact(c, s, n).expect("request payload");
    let mut resp = sha256(&payload).to_vec();
    resp.extend(payload.iter().rev());
    c.send_all(s, &resp).expect("response");
}

fn thousand_connections_one_blocked(engine: &str) {
    let limit = raise_nofile();
    assert!(
        limit >= 3 * CONNS as u64,
        "RLIMIT_NOFILE hard limit {limit} too low for {CONNS} connections"
    );
    // The server starts with a soft fd limit of 256 (as under a default
    // `ulimit -n`): it must raise its own limit to hold 1000 connections.
    let srv = Server::start_limited(engine, &["--poll", "adaptive"], Some(256));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", srv.pid())).unwrap();
    let soft: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .expect("Max open files in /proc/pid/limits");
    assert!(
        soft >= 2 * CONNS as u64,
        "the server kept a soft fd limit of {soft}: it cannot hold {CONNS} connections"
    );
    let c = srv.attach();
    let l = c
        .tcp_listen("127.0.0.1:0".parse().unwrap(), 1024)
        .expect("tcps listen");
    let addr = c.getsockname(l).unwrap();

    // Accept on the host while the kernel side connects.
    let acceptor = {
        let c = c.clone();
        std::thread::spawn(move || {
            let mut v = Vec::with_capacity(CONNS);
            for i in 0..CONNS {
                let (s, peer) = c
                    .accept(l, 0)
                    .unwrap_or_else(|e| panic!("tcps accept #{i}: {e}"));
                v.push((s, peer.expect("peer address").port()));
            }
            v
        })
    };
    let mut streams: Vec<TcpStream> = Vec::with_capacity(CONNS);
    let mut by_port = HashMap::new();
    for i in 0..CONNS {
        let k = TcpStream::connect(addr).unwrap_or_else(|e| panic!("kernel connect #{i}: {e}"));
        k.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        by_port.insert(k.local_addr().unwrap().port(), i);
        streams.push(k);
    }
    let accepted = within(
        Duration::from_secs(30),
        "accepting 1000 connections",
        move || acceptor.join().expect("acceptor"),
    );
    // host socket for kernel stream i
    let mut host_sock = vec![u32::MAX; CONNS];
    for (s, port) in accepted {
        let i = *by_port
            .get(&port)
            .unwrap_or_else(|| panic!("accepted a connection from unknown port {port}"));
        host_sock[i] = s;
    }
    assert!(
        host_sock.iter().all(|&s| s != u32::MAX),
        "every connection accepted once"
    );

    // Connection 0: a host thread blocks in recv; nobody sends to it yet.
    let blocked_done = Arc::new(AtomicBool::new(false));
    let (btx, brx) = mpsc::channel();
    {
        let (c, s, done) = (c.clone(), host_sock[0], blocked_done.clone());
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            let r = c.recv(s, &mut b, 0).map(|n| b[..n].to_vec());
            done.store(true, Ordering::SeqCst);
            let _ = btx.send(r);
        });
    }

    let start = Instant::now();
    // Kernel side writes every request first (they fit in socket buffers),
    // so no ordering between host workers and kernel side can deadlock.
    let mut rng = Rng::new(0x1000);
    let mut sent = vec![Vec::new(); CONNS];
    for i in 1..CONNS {
        let n = 1 + rng.below(8192) as usize;
        let p = rng.bytes(n);
        let mut msg = (n as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(&p);
        streams[i].write_all(&msg).unwrap();
        sent[i] = p;
    }
    // Host workers, each its own thread (and so its own channel).
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let c = c.clone();
        let socks: Vec<u32> = (1..CONNS)
            .filter(|i| i % WORKERS == w)
            .map(|i| host_sock[i])
            .collect();
        workers.push(std::thread::spawn(move || {
            for s in socks {
                serve_one(&c, s);
            }
        }));
    }
    // Kernel side checks every response.
    for i in 1..CONNS {
        let mut digest = [0u8; 32];
        streams[i]
            .read_exact(&mut digest)
            .unwrap_or_else(|e| panic!("response digest on connection {i}: {e}"));
        let mut body = vec![0u8; sent[i].len()];
        streams[i]
            .read_exact(&mut body)
            .unwrap_or_else(|e| panic!("response body on connection {i}: {e}"));
        assert_eq!(
            digest,
            sha256(&sent[i]),
            "host saw corrupted request on {i}"
        );
        body.reverse();
        assert_eq!(body, sent[i], "response corrupted on {i}");
    }
    for w in workers {
        w.join().expect("host worker");
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "999 request/responses took {took:?} with one recv blocked"
    );
    assert!(
        !blocked_done.load(Ordering::SeqCst),
        "the recv on the idle connection returned without data: {:?}",
        brx.try_recv()
    );
    // One poll over all 1000: nothing readable (every request was consumed),
    // everything writable.
    let mk = |ev: i16| -> Vec<tcps::PollFd> {
        host_sock
            .iter()
            .map(|&sock| tcps::PollFd {
                sock,
                events: ev,
                revents: 0,
            })
            .collect()
    };
    let mut fds = mk(libc::POLLIN);
    assert_eq!(
        c.poll(&mut fds, 0).unwrap(),
        0,
        "POLLIN over 1000 idle sockets"
    );
    let mut fds = mk(libc::POLLOUT);
    assert_eq!(
        c.poll(&mut fds, 0).unwrap(),
        CONNS,
        "POLLOUT over 1000 sockets"
    );
    assert!(fds.iter().all(|f| f.revents & libc::POLLOUT != 0));
    // Now give the blocked recv its data: it returns it.
    streams[0].write_all(b"finally").unwrap();
    let got = brx
        .recv_timeout(Duration::from_secs(5))
        .expect("blocked recv did not return after data arrived")
        .expect("blocked recv failed");
    assert_eq!(got, b"finally");
    eprintln!("{engine}: 999 exchanges in {took:?} beside a blocked recv");
}

/// Many host threads at once on one attachment, more threads than the
/// server has workers: all checksummed echoes succeed.
fn many_threads_one_host(engine: &str) {
    let srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let c = srv.attach();
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                for _ in 0..5 {
                    let n = 1 + rng.below(300_000) as usize;
                    echo_roundtrip(&c, echo, &rng.bytes(n));
                }
            })
        })
        .collect();
    within(Duration::from_secs(60), "16 echo threads", move || {
        for t in threads {
            t.join().expect("echo thread");
        }
    });
}

fn two_host_processes(engine: &str) {
    let srv = start_server(engine);
    let echo = kernel_echo_server("127.0.0.1:0");
    let mut kids: Vec<ChildProc> = (0..2)
        .map(|i| {
            let mut cmd = child_command("child_echo_host", "echo-host");
            cmd.env("TCPS_IT_SOCKET", &srv.socket)
                .env("TCPS_IT_ECHO", echo.to_string())
                .env("TCPS_IT_SEED", (7 + i).to_string())
                .stdin(Stdio::piped());
            ChildProc::spawn(cmd)
        })
        .collect();
    // Both attached before either starts: they run at the same time.
    let pids: Vec<String> = kids
        .iter_mut()
        .map(|k| k.read_mark("attached", Duration::from_secs(20)))
        .collect();
    assert_ne!(pids[0], pids[1]);
    for k in kids.iter_mut() {
        writeln!(k.child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    for (i, k) in kids.iter_mut().enumerate() {
        let v = k.read_mark("done", Duration::from_secs(60));
        assert_eq!(v, "ok", "host process {i}:\n{}", k.seen);
        let st = wait_timeout(&mut k.child, Duration::from_secs(20)).expect("child exits");
        assert!(st.success(), "host process {i} failed: {st}\n{}", k.seen);
    }
    assert!(
        srv.log_text().matches("host attached").count() >= 2,
        "{}",
        srv.log_text()
    );
}

/// Child: one host process doing checksummed echoes.
#[test]
fn child_echo_host() {
    let Some(()) = child_role("echo-host") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    mark("attached", std::process::id());
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "go");
    let echo: SocketAddr = env("TCPS_IT_ECHO").parse().unwrap();
    let mut rng = Rng::new(env("TCPS_IT_SEED").parse().unwrap());
    for n in [1usize, 65536, (1 << 20) + 3, 100, 300_000] {
        for _ in 0..3 {
            echo_roundtrip(&c, echo, &rng.bytes(n));
        }
    }
    mark("done", "ok");
}

/// A thread-per-connection server with more idle connections than the host
/// has channels: every channel is held by a recv that waits for data. A call
/// on another socket (here: the send that would wake one of them, and a
/// plain echo) must still run: "a blocking call on one socket never delays
/// another".
fn more_blocked_calls_than_channels(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let n = c.n_channels() + 2;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut kernel = Vec::new();
    let mut socks = Vec::new();
    for _ in 0..n {
        socks.push(c.tcp_connect(l.local_addr().unwrap()).unwrap());
        kernel.push(l.accept().unwrap().0);
    }
    let (tx, rx) = mpsc::channel();
    for &s in &socks {
        let (c, tx) = (c.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut b = [0u8; 8];
            let _ = tx.send((s, c.recv(s, &mut b, 0).map(|k| b[..k].to_vec())));
        });
    }
    std::thread::sleep(Duration::from_millis(200));
    let echo = kernel_echo_server("127.0.0.1:0");
    let c2 = c.clone();
    let r = std::thread::spawn(move || {
        echo_roundtrip(&c2, echo, b"am I delayed?");
    });
    let t = Instant::now();
    while !r.is_finished() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let finished = r.is_finished();
    // Release the blocked recvs either way, so the test ends.
    for k in kernel.iter_mut() {
        k.write_all(b"bye").unwrap();
    }
    for _ in 0..n {
        let (_, got) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("recv released");
        assert_eq!(got.unwrap(), b"bye");
    }
    assert!(
        finished,
        "{} recvs blocked on idle connections ({} channels) stalled an unrelated echo for 5 s",
        n,
        c.n_channels()
    );
    r.join().unwrap();
}

engine_tests!(
    more_blocked_calls_than_channels,
    thousand_connections_one_blocked,
    many_threads_one_host,
    two_host_processes
);
