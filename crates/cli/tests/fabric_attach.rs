//! A remote host attaching over UCX (`tcps server --fabric-listen`,
//! `docs/ARCHITECTURE.md` "The channel over a fabric"), on one machine
//! over UCX's tcp transport: a wrong secret is refused with nothing
//! revealed; the right one gets the geometry, and a call posted in the
//! host's own copy of the region crosses to the server, runs, and its
//! completion comes back; a host that goes away is freed at the server.
//! (The namespace test with a real application is still to come.)

mod common;

use common::*;
use std::os::fd::{AsFd, FromRawFd};
use std::time::{Duration, Instant};
use tcps_fabric::auth::{Secret, NONCE_LEN};
use tcps_fabric::wire::{self, auth_context, Spans, Welcome};
use tcps_fabric::{Context, ContextOptions, Endpoint, Worker};
use tcps_proto::handshake::Hello;
use tcps_proto::layout::{Layout, VERSION};
use tcps_proto::mirror::Writer;
use tcps_proto::msg::{Op, Request};
use tcps_proto::ring::HostCursor;
use tcps_proto::Region;

const SECRET: &str = "0123456789abcdef-fabric-test-secret\n";

fn key_file(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Remote {
    worker: Worker,
    ep: Endpoint,
}

impl Remote {
    fn next(&self, deadline: Instant) -> tcps_fabric::AmMessage {
        loop {
            assert!(Instant::now() < deadline, "no message from the server");
            self.worker.wait(Some(Duration::from_millis(20)));
            if let Some(m) = self.worker.take_am() {
                return m;
            }
            self.ep.status().expect("the server endpoint failed");
        }
    }
}

/// Connects and authenticates with `secret`: the server's `Welcome`.
fn attach(port: u16, secret: &str) -> (Remote, Welcome) {
    let ctx = Context::new(&ContextOptions {
        transports: Some("tcp".into()),
        rma: false,
    })
    .expect("UCX (libucx-dev) is needed: the setup installs it");
    let worker = Worker::new(&ctx).unwrap();
    for id in [wire::AM_CHALLENGE, wire::AM_WELCOME, wire::AM_SPANS] {
        worker.set_am_handler(id).unwrap();
    }
    let ep = worker
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .unwrap();
    let pid = std::process::id();
    ep.am_send(wire::AM_HELLO, &Hello::new(pid).encode(), Vec::new(), true)
        .unwrap();
    let r = Remote { worker, ep };
    let deadline = Instant::now() + Duration::from_secs(10);
    let secret = Secret::parse(secret).unwrap();
    loop {
        let m = r.next(deadline);
        match m.id {
            wire::AM_CHALLENGE => {
                let n: [u8; NONCE_LEN] = m.header.as_slice().try_into().unwrap();
                let mac = secret.answer(&n, &auth_context(VERSION, pid));
                r.ep.am_send(wire::AM_AUTH, &mac, Vec::new(), true).unwrap();
            }
            wire::AM_WELCOME => {
                let w = Welcome::decode(&m.header).expect("a Welcome");
                return (r, w);
            }
            other => panic!("unexpected message {other} during attach"),
        }
    }
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
    let port = free_port().to_string();
    let srv = Server::start(
        "uring",
        &[
            "--fabric-listen",
            &format!("127.0.0.1:{port}"),
            "--fabric-auth",
            key.to_str().unwrap(),
        ],
    );
    let port: u16 = port.parse().unwrap();

    // A wrong secret: refused, nothing about the server revealed.
    let (_r, w) = attach(port, "0123456789abcdef-a-wrong-secret\n");
    assert_eq!(w.status, libc::EACCES, "{w:?}");
    assert_eq!(w.geometry, [0; 8]);
    assert!(w.message.contains("authentication failed"), "{}", w.message);
    assert_eq!(hosts_attached(&srv), 0);

    // The right secret: the geometry of the region.
    let (r, w) = attach(port, SECRET);
    assert_eq!(w.status, 0, "{}", w.message);
    let g = w.geometry;
    let layout = Layout {
        n_channels: g[0],
        ring_entries: g[1],
        arena_size: g[2],
        send_queues: g[3],
        sq_entries: g[4],
        recv_rings: g[5],
        rq_bytes: g[6],
    };
    layout.validate().expect("a valid geometry");

    // The host's own copy of the region.
    // SAFETY: memfd_create with a valid name; checked, then owned.
    let fd = unsafe { libc::memfd_create(c"fabric-host".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor, owned by the File.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(layout.region_size() as u64).unwrap();
    let host = Region::map(file.as_fd(), layout).unwrap();

    // A call posted as the host library posts it, shipped as its pump
    // ships it (channels_used, the slot, line 0), in one message.
    host.apply_span(Writer::Host, 128, &1u32.to_le_bytes())
        .unwrap();
    let mut hc = HostCursor::default();
    let req = Request {
        user_data: 0xfab,
        op: Op::Nop as u16,
        ..Default::default()
    };
    hc.submit(&host.channel(0).unwrap(), &req).unwrap();
    let mut spans = Spans::new();
    let slot = layout.channel_offset(0) + layout.requests_offset();
    for (off, len) in [(128, 4), (slot, 64), (layout.channel_offset(0), 8)] {
        let mut b = vec![0u8; len];
        host.read_span(off, &mut b).unwrap();
        spans.push(off as u32, &b);
    }
    let (h, d) = spans.take();
    r.ep.am_send(wire::AM_SPANS, &h, d, true).unwrap();

    // The server's answer: its pump's batch, applied to our copy.
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        let m = r.next(deadline);
        assert_eq!(m.id, wire::AM_SPANS);
        for s in wire::spans(&m.header, &m.data) {
            let (off, b) = s.expect("well-formed spans");
            host.apply_span(Writer::Server, off as usize, b)
                .expect("only server-written zones");
        }
        if let Some(c) = hc.reap(&host.channel(0).unwrap()) {
            break c;
        }
    };
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
