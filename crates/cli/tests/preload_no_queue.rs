//! Sockets without a send queue (ids beyond the host's `--send-queues`,
//! as most connections of a server with thousands of them) send
//! synchronously: every byte a send reports as sent reaches the peer. A
//! program under `tcps run` writes 4 MiB on each of 8 blocking
//! connections (`sendall`) to kernel sinks that start reading late, so
//! the kernel buffers fill and the server's sends take less than asked;
//! each sink's SHA-256 must be the sender's. (The synchronous fallback of
//! an asynchronous send counted a short send as whole: the rest was lost.)
//! The sender closes only after the sink has every byte.

mod common;
mod preload;

use common::{sha256, wait_timeout, Server, TempDir, TCPS};
use preload::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

const CONNS: usize = 8;
const SIZE: usize = 4 << 20;

/// Connects CONNS times to argv[1]; on connection i, sendall of SIZE
/// bytes of pattern i (in pieces of up to 1 MiB), then waits for the
/// sink's byte saying it has them all, then close. (The wait keeps this
/// test to the sends: a close right after them is another matter.)
const SENDER: &str = r#"
import socket, sys, threading
port, size, conns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def data(i):
    return bytes((i * 31 + k * 7) & 0xff for k in range(251)) * (size // 251) + b"x" * (size % 251)
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
def send(i, s):
    d = data(i)
    s.sendall(i.to_bytes(1, "big"))
    for off in range(0, size, 1 << 20):
        s.sendall(d[off:off + (1 << 20)])
    s.settimeout(30)
    s.recv(1)
    s.close()
ts = [threading.Thread(target=send, args=(i, s)) for i, s in enumerate(socks)]
for t in ts: t.start()
for t in ts: t.join()
print("done", flush=True)
"#;

fn pattern(i: usize) -> Vec<u8> {
    let unit: Vec<u8> = (0..251).map(|k| ((i * 31 + k * 7) & 0xff) as u8).collect();
    let mut d = unit.repeat(SIZE / 251);
    d.resize(SIZE, b'x');
    d
}

fn no_bytes_lost(engine: &str) {
    need("python3");
    let srv = Server::start(engine, &["--send-queues", "2"]);
    let dir = TempDir::new("noqueue");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let log = dir.path().join("sender.log");
    let stats = dir.path().join("sender.stats");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(TCPS)
        .arg("run")
        .arg("--socket")
        .arg(&srv.socket)
        .args(["--fallback", "fail", "--", "python3", "-c", SENDER])
        .args([port.to_string(), SIZE.to_string(), CONNS.to_string()])
        .env("TCPS_PRELOAD_LIB", preload_lib())
        .env("TCPS_PRELOAD_STATS", &stats)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn the sender");
    let conns: Vec<_> = (0..CONNS).map(|_| l.accept().unwrap().0).collect();
    // Late readers: the kernel buffers fill first.
    std::thread::sleep(Duration::from_millis(300));
    let sinks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut got = Vec::new();
                let mut b = vec![0u8; 1 << 20];
                while got.len() < SIZE + 1 {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&b[..n]),
                    }
                }
                let _ = s.write_all(b"k");
                let _ = s.read_to_end(&mut got);
                got
            })
        })
        .collect();
    let got: Vec<Vec<u8>> = sinks.into_iter().map(|t| t.join().unwrap()).collect();
    let st = wait_timeout(&mut child, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the sender did not finish:\n{}", read(&log))
    });
    assert!(
        st.success() && read(&log).ends_with("done\n"),
        "{st:?}\n{}",
        read(&log)
    );
    let sums = summaries(&stats);
    assert!(
        sums.len() == 1 && sums[0].offloaded >= CONNS as u64 && sums[0].kernel_tcp == 0,
        "not offloaded: {sums:?}"
    );
    let mut bad = Vec::new();
    for g in &got {
        let i = *g.first().expect("a connection sent nothing") as usize;
        let body = &g[1..];
        let want = pattern(i);
        if sha256(body) != sha256(&want) {
            let at = body.iter().zip(&want).position(|(a, b)| a != b);
            bad.push(format!(
                "connection {i}: {} of {SIZE} bytes, digest differs (first difference at {at:?})",
                body.len()
            ));
        }
    }
    assert!(bad.is_empty(), "{engine}: {}", bad.join("; "));
}

#[test]
fn sockets_without_send_queue_lose_no_bytes_uring() {
    no_bytes_lost("uring");
}

#[test]
fn sockets_without_send_queue_lose_no_bytes_epoll() {
    no_bytes_lost("epoll");
}
