//! Asynchronous sends of a remote host (`TCPS_REMOTE`, through its helper
//! `tcps fabric-pump`; `docs/ARCHITECTURE.md` "The channel over a
//! fabric"), on one machine over UCX's tcp transport: the staging pool is
//! a registration whose bytes the helper ships before each descriptor,
//! and the server sends from its copy. A native host queues many sends of
//! sizes up to and across the pool's wrap (several MiB through a 256 KiB
//! pool, so ranges are reused only after their `done` came back) to a
//! kernel client, which must receive exactly those bytes (SHA-256).

mod common;
mod fabric_host;

use common::*;
use fabric_host::*;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bytes of send `i` (deterministic, so both sides know them).
fn piece(i: usize) -> Vec<u8> {
    let sizes = [1usize, 700, 4096, 65_536, 65_537, 200_000, 31, 130_000];
    let len = sizes[i % sizes.len()] + i;
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const SENDS: usize = 80;

fn sha256(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(b))
}

/// The remote host (run by `remote_async_sends_reach_a_kernel_client`):
/// listens on PORT through the server, prints READY, accepts one
/// connection, queues `SENDS` asynchronous sends, waits for them and
/// closes; prints how many bytes it queued.
#[test]
#[ignore]
fn fabric_async_host_child() {
    let Ok(port) = std::env::var("ASYNC_PORT") else {
        return;
    };
    let c = tcps::Client::attach_default().expect("remote attach");
    assert!(c.is_remote());
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.bind(s, &format!("127.0.0.1:{port}").parse().unwrap())
        .unwrap();
    c.listen(s, 4).unwrap();
    println!("READY");
    let (conn, _) = c.accept(s, 0).unwrap();
    let mut total = 0;
    for i in 0..SENDS {
        let b = piece(i);
        assert_eq!(c.send_async(conn, &b, 0).unwrap(), b.len(), "send {i}");
        total += b.len();
    }
    c.flush_async(conn, Some(Duration::from_secs(60)))
        .expect("every queued send finished");
    c.close(conn).unwrap();
    println!("QUEUED {total}");
}

#[test]
fn remote_async_sends_reach_a_kernel_client() {
    let dir = TempDir::new("fabric-async");
    let key = key_file(dir.path(), "fabric.key", SECRET);
    let fport = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let faddr = format!("127.0.0.1:{fport}");
    let srv = Server::start(
        "uring",
        &[
            "--fabric-listen",
            &faddr,
            "--fabric-auth",
            key.to_str().unwrap(),
        ],
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let exe = std::env::current_exe().unwrap();
    let mut host = Command::new(exe)
        .args([
            "--exact",
            "fabric_async_host_child",
            "--ignored",
            "--nocapture",
        ])
        .env("TCPS_REMOTE", &faddr)
        .env("TCPS_FABRIC_AUTH", &key)
        .env("TCPS_BIN", TCPS)
        .env("TCPS_ASYNC_POOL_KIB", "256")
        .env("ASYNC_PORT", port.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(host.stdout.take().unwrap()).lines();
    let mut next = |want: &str| -> String {
        for l in lines.by_ref().map_while(Result::ok) {
            if l.starts_with(want) {
                return l;
            }
        }
        panic!("the host never printed {want}:\n{}", srv.log_text());
    };
    next("READY");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the stream ends with the host's close");
    let took = t.elapsed();
    let queued: usize = next("QUEUED")["QUEUED ".len()..].parse().unwrap();
    let want: Vec<u8> = (0..SENDS).flat_map(piece).collect();
    assert!(want.len() > 4 << 20, "more than a few pools' worth");
    assert_eq!(queued, want.len());
    assert_eq!(
        (got.len(), sha256(&got)),
        (want.len(), sha256(&want)),
        "the client got other bytes than the host queued"
    );
    eprintln!("{} bytes in {took:?}", got.len());
    assert!(host.wait().unwrap().success());
    // They went as asynchronous sends, not synchronous ones.
    let t = Instant::now();
    loop {
        let v = srv.stat_json();
        let n = v["total"]["counters"]["async_sends"].as_u64().unwrap_or(0);
        if n >= SENDS as u64 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "async_sends {n}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
