//! A remote host attaching over UCX (`tcps server --fabric-listen`,
//! `docs/ARCHITECTURE.md` "The channel over a fabric"), on one machine
//! over UCX's tcp transport: a wrong secret is refused with nothing
//! revealed; the right one gets the geometry, and a call posted in the
//! host's own copy of the region crosses to the server, runs, and its
//! completion comes back; a host that goes away is freed at the server.
//! (`cluster.rs` does the same across network namespaces.)

mod common;
mod fabric_host;

use common::*;
use fabric_host::*;
use std::time::{Duration, Instant};
use tcps_proto::msg::Op;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn hosts_attached(srv: &Server) -> u64 {
    srv.stat_json()["server"]["hosts_attached"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[test]
fn remote_host_attaches_calls_and_is_freed() {
    let dir = TempDir::new("fabric");
    let key = key_file(dir.path(), "fabric.key", SECRET);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let srv = Server::start(
        "uring",
        &[
            "--fabric-listen",
            &addr.to_string(),
            "--fabric-auth",
            key.to_str().unwrap(),
        ],
    );

    // A wrong secret: refused, nothing about the server revealed.
    let (_r, w) = attach(addr, "0123456789abcdef-a-wrong-secret\n");
    assert_eq!(w.status, libc::EACCES, "{w:?}");
    assert_eq!(w.geometry, [0; 8]);
    assert!(w.message.contains("authentication failed"), "{}", w.message);
    assert_eq!(hosts_attached(&srv), 0);

    // The right secret: the geometry; a call round trip through the worker.
    let (r, w) = attach(addr, SECRET);
    assert_eq!(w.status, 0, "{}", w.message);
    let layout = layout_of(&w);
    let (_file, host) = host_region(layout);
    let done = nop_round_trip(&r, &layout, &host, 0xfab);
    assert_eq!(
        (done.user_data, done.op, done.errno, done.result),
        (0xfab, Op::Nop as u16, 0, 0)
    );
    assert_eq!(hosts_attached(&srv), 1);

    // The host goes away: the server frees it.
    drop(r);
    let t = Instant::now();
    while hosts_attached(&srv) != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a departed remote host was not freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
