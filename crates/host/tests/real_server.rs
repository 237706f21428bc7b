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
    for _ in 0..100 {
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
