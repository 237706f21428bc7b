//! Asynchronous sends of a remote host (`TCPS_REMOTE`, through its helper
//! `tcps fabric-pump`; `docs/ARCHITECTURE.md` "The channel over a
//! fabric"), on one machine over UCX's tcp transport: the staging pool is
//! a registration whose bytes the helper ships before each descriptor,
//! and the server sends from its copy. A native host queues many sends of
//! sizes up to and across the pool's wrap (several MiB through a 256 KiB
//! pool, so ranges are reused only after their `done` came back) to a
//! kernel client, which must receive exactly those bytes (SHA-256).
//! Registered memory over the fabric: a host receives into a
//! registration (`RecvReg`: the bytes come back from the server's copy)
//! and sends from registrations synchronously (`SendReg`) and queued
//! without a copy (`send_async_registered`), each checked byte for byte.

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
    bytes(i, sizes[i % sizes.len()] + i)
}

/// `len` pseudo-random bytes from `seed`.
fn bytes(seed: usize, len: usize) -> Vec<u8> {
    let mut x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
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

/// Sizes of the registered-memory exchange: the client's upload (received
/// into a registration), then a synchronous and a queued registered send.
const UPLOAD: usize = 600_001;
const SYNC_REG: usize = 300_007;
const ASYNC_REG: usize = 900_000;

/// The remote host of `remote_registered_memory_both_ways`: receives the
/// upload into registered memory (`RecvReg`) and checks it, then sends
/// from registrations, synchronously and queued.
#[test]
#[ignore]
fn fabric_registered_host_child() {
    let Ok(port) = std::env::var("REG_PORT") else {
        return;
    };
    let c = tcps::Client::attach_default().expect("remote attach");
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.bind(s, &format!("127.0.0.1:{port}").parse().unwrap())
        .unwrap();
    c.listen(s, 4).unwrap();
    println!("READY");
    let (conn, _) = c.accept(s, 0).unwrap();
    let (inbox, in_mem) = c.alloc_registered(1 << 20).unwrap();
    let mut got = 0;
    while got < UPLOAD {
        // SAFETY: `inbox` holds 1 MiB > UPLOAD.
        let at = unsafe { inbox.add(got) };
        let n = c
            .recv_registered(conn, at, UPLOAD - got, 0, in_mem)
            .unwrap();
        assert!(n > 0, "the upload ended early at {got}");
        got += n;
    }
    // SAFETY: UPLOAD bytes of the registration were received into.
    let upload = unsafe { std::slice::from_raw_parts(inbox, UPLOAD) };
    println!("UPLOAD {}", sha256(upload));
    let (out, out_mem) = c.alloc_registered(2 << 20).unwrap();
    let want = bytes(7, SYNC_REG + ASYNC_REG);
    // SAFETY: `out` holds 2 MiB > both sends.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), out, want.len()) };
    let mut sent = 0;
    while sent < SYNC_REG {
        // SAFETY: inside the registration filled above.
        let at = unsafe { out.add(sent) };
        sent += c
            .send_registered(conn, at, SYNC_REG - sent, 0, out_mem)
            .unwrap();
    }
    // SAFETY: as above.
    let at = unsafe { out.add(SYNC_REG) };
    c.send_async_registered(conn, at, ASYNC_REG, 0, out_mem)
        .unwrap();
    c.flush_async(conn, Some(Duration::from_secs(60)))
        .expect("the queued registered send finished");
    c.close(conn).unwrap();
    c.deregister_memory(out_mem).unwrap();
    c.deregister_memory(in_mem).unwrap();
    println!("DONE");
}

/// A remote host's registered memory both ways across the fabric.
#[test]
fn remote_registered_memory_both_ways() {
    let (srv, faddr, dir) = fabric_server();
    let key = dir.path().join("fabric.key");
    let port = free_port();
    let (mut host, mut next) = host_child(
        "fabric_registered_host_child",
        &[("REG_PORT", port.to_string()), ("TCPS_REMOTE", faddr)],
        &key,
        &srv,
    );
    next("READY");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let upload = bytes(3, UPLOAD);
    std::io::Write::write_all(&mut s, &upload).unwrap();
    let said = next("UPLOAD");
    assert_eq!(said, format!("UPLOAD {}", sha256(&upload)), "RecvReg");
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the stream ends with the host's close");
    let want = bytes(7, SYNC_REG + ASYNC_REG);
    assert_eq!(
        (got.len(), sha256(&got)),
        (want.len(), sha256(&want)),
        "SendReg, then the queued registered send"
    );
    next("DONE");
    assert!(host.wait().unwrap().success());
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server with a fabric listener on loopback: it, its fabric address and
/// the directory of its secret (`fabric.key`).
fn fabric_server() -> (Server, String, TempDir) {
    let dir = TempDir::new("fabric-async");
    let key = key_file(dir.path(), "fabric.key", SECRET);
    let faddr = format!("127.0.0.1:{}", free_port());
    let srv = Server::start(
        "uring",
        &[
            "--fabric-listen",
            &faddr,
            "--fabric-auth",
            key.to_str().unwrap(),
        ],
    );
    (srv, faddr, dir)
}

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// This test binary's `test` (an ignored one) as a remote host with `env`;
/// the child and a reader of its lines (`next(prefix)`: the first line
/// starting so, or a panic with the server's log).
fn host_child<'a>(
    test: &str,
    env: &[(&str, String)],
    key: &std::path::Path,
    srv: &'a Server,
) -> (std::process::Child, impl FnMut(&str) -> String + 'a) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--ignored", "--nocapture"])
        .env("TCPS_FABRIC_AUTH", key)
        .env("TCPS_BIN", TCPS)
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut host = cmd.spawn().unwrap();
    let mut lines: Lines = BufReader::new(host.stdout.take().unwrap()).lines();
    let next = move |want: &str| -> String {
        for l in lines.by_ref().map_while(Result::ok) {
            if l.starts_with(want) {
                return l;
            }
        }
        panic!("the host never printed {want}:\n{}", srv.log_text());
    };
    (host, next)
}

#[test]
fn remote_async_sends_reach_a_kernel_client() {
    let (srv, faddr, dir) = fabric_server();
    let key = dir.path().join("fabric.key");
    let port = free_port();
    let env = [
        ("TCPS_REMOTE", faddr),
        ("TCPS_ASYNC_POOL_KIB", "256".to_string()),
        ("ASYNC_PORT", port.to_string()),
    ];
    let (mut host, mut next) = host_child("fabric_async_host_child", &env, &key, &srv);
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
