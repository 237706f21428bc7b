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

fn hosts_attached(srv: &Server) -> u64 {
    srv.stat_json()["server"]["hosts_attached"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

/// A server with a fabric listener on loopback (and `extra` options): it,
/// its fabric address, and the directory holding its secret file.
fn fabric_server(extra: &[&str]) -> (Server, std::net::SocketAddr, TempDir) {
    let dir = TempDir::new("fabric");
    let key = key_file(dir.path(), "fabric.key", SECRET);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let listen = addr.to_string();
    let mut args = vec![
        "--fabric-listen",
        &listen,
        "--fabric-auth",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (Server::start("uring", &args), addr, dir)
}

#[test]
fn remote_host_attaches_calls_and_is_freed() {
    let (srv, addr, _dir) = fabric_server(&[]);

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

fn sockaddr_in(addr: std::net::SocketAddrV4) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    b[2..4].copy_from_slice(&addr.port().to_be_bytes());
    b[4..8].copy_from_slice(&addr.ip().octets());
    b
}

/// The synchronous calls of a server program, from a remote host: socket,
/// bind, listen, accept, recv, send, close — against a kernel client,
/// bytes compared; a privileged port refused; the port free again once
/// the host is gone.
#[test]
fn remote_host_serves_a_connection_with_synchronous_calls() {
    use std::io::{Read, Write};
    // Plain synchronous calls: no process-ahead.
    let off = [
        "--eager-accept",
        "off",
        "--eager-recv",
        "off",
        "--setup-with-accept",
        "off",
    ];
    let (srv, addr, _dir) = fabric_server(&off);
    let (r, w) = attach(addr, SECRET);
    assert_eq!(w.status, 0, "{}", w.message);
    let layout = layout_of(&w);
    let (_file, host) = host_region(layout);
    let mut ch = Chan::new(&r, layout, &host);
    let ok = |c: &tcps_proto::msg::Completion| assert_eq!(c.errno, 0, "{c:?}");

    let (c, _) = ch.call(
        Op::Socket,
        0,
        [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0],
        &[],
        0,
    );
    ok(&c);
    let s = c.result as u32;
    // A privileged port: refused for the mapped uid (65534).
    let low = sockaddr_in("127.0.0.1:80".parse().unwrap());
    let (c, _) = ch.call(Op::Bind, s, [0; 5], &low, 0);
    assert_eq!(c.errno, libc::EACCES);
    let port = free_port();
    let (c, _) = ch.call(
        Op::Bind,
        s,
        [0; 5],
        &sockaddr_in(format!("127.0.0.1:{port}").parse().unwrap()),
        0,
    );
    ok(&c);
    let (c, _) = ch.call(Op::Listen, s, [16, 0, 0, 0, 0], &[], 0);
    ok(&c);

    let client = std::thread::spawn(move || {
        let mut k = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        k.write_all(b"hello over the fabric").unwrap();
        let mut reply = [0u8; 11];
        k.read_exact(&mut reply).unwrap();
        reply
    });
    let (c, _) = ch.call(Op::Accept, s, [0; 5], &[], 0);
    ok(&c);
    let conn = c.result as u32;
    let mut got = Vec::new();
    while got.len() < 21 {
        let (c, data) = ch.call(Op::Recv, conn, [0; 5], &[], 64);
        ok(&c);
        assert!(c.result > 0, "early end of stream");
        got.extend_from_slice(&data[..c.result as usize]);
    }
    assert_eq!(got, b"hello over the fabric");
    let (c, _) = ch.call(Op::Send, conn, [0; 5], b"from remote", 0);
    assert_eq!((c.errno, c.result), (0, 11));
    assert_eq!(&client.join().unwrap(), b"from remote");
    for sock in [conn, s] {
        let (c, _) = ch.call(Op::Close, sock, [0; 5], &[], 0);
        ok(&c);
    }

    // A listener left open by a host that goes away is closed with it.
    let (c, _) = ch.call(
        Op::Socket,
        0,
        [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0],
        &[],
        0,
    );
    let s2 = c.result as u32;
    let (c, _) = ch.call(
        Op::Bind,
        s2,
        [0; 5],
        &sockaddr_in(format!("127.0.0.1:{port}").parse().unwrap()),
        0,
    );
    ok(&c);
    let (c, _) = ch.call(Op::Listen, s2, [16, 0, 0, 0, 0], &[], 0);
    ok(&c);
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_err(),
        "the remote listener holds the port"
    );
    drop(r);
    let t = Instant::now();
    while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the departed host's port stayed bound"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(hosts_attached(&srv), 0);
}

/// The host libraries do not load UCX: a program that only uses a local
/// server never initialises libucs (remote attach runs UCX in the helper
/// process, `tcps fabric-pump`); the `tcps` binary does link it.
#[test]
fn host_libraries_do_not_link_ucx() {
    let dir = std::path::Path::new(TCPS).parent().unwrap();
    let needed = |f: &std::path::Path| {
        let out = std::process::Command::new("readelf")
            .arg("-d")
            .arg(f)
            .output()
            .expect("readelf (binutils)");
        assert!(out.status.success(), "readelf -d {}", f.display());
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for lib in ["libtcps.so", "libtcps_preload.so"] {
        let d = needed(&dir.join(lib));
        assert!(d.contains("libc.so"), "{lib}: {d}");
        assert!(
            !d.contains("libucp") && !d.contains("libucs"),
            "{lib} links UCX:\n{d}"
        );
    }
    assert!(needed(std::path::Path::new(TCPS)).contains("libucp"));
}

/// A remote host's fork snapshot (`Fork` over `AM_CONTROL`) is bound to
/// its authenticated peer: a local host cannot claim it, nor a remote host
/// that is not the child the parent named (and a host claims only once);
/// the named child, a host of the same node and credential, takes it.
#[test]
fn a_remote_snapshot_is_claimed_only_by_its_named_child_of_the_same_peer() {
    use tcps_proto::handshake::ControlMsg;
    let (srv, addr, _dir) = fabric_server(&[]);
    let (parent, w) = attach_as(addr, SECRET, 4001);
    assert_eq!(w.status, 0, "{}", w.message);
    assert_eq!(control(&parent, ControlMsg::Fork { handle: 77 }), 0);
    let named = ControlMsg::Forked {
        handle: 77,
        child: 4002,
    };
    assert_eq!(control(&parent, named), 0);
    // Descriptors do not cross nodes.
    let dup = ControlMsg::SocketDup { handle: 1 };
    assert_eq!(control(&parent, dup), libc::EOPNOTSUPP);

    // A local host with the nonce: not its snapshot.
    let local = tcps::Client::attach(&srv.socket).unwrap();
    let (reply, _) = local
        .control_exchange(&ControlMsg::Inherit { handle: 77 }, &[])
        .unwrap();
    assert_eq!(
        reply,
        ControlMsg::Reply {
            handle: 77,
            errno: libc::ENOENT
        }
    );
    // A remote host of the same node, not the named child: refused, and
    // it does not get to try again.
    let (other, _) = attach_as(addr, SECRET, 4003);
    assert_eq!(
        control(&other, ControlMsg::Inherit { handle: 77 }),
        libc::ENOENT
    );
    assert_eq!(
        control(&other, ControlMsg::Inherit { handle: 77 }),
        libc::EPERM
    );
    // The named child takes it.
    let (child, _) = attach_as(addr, SECRET, 4002);
    assert_eq!(control(&child, ControlMsg::Inherit { handle: 77 }), 0);
    assert!(
        srv.log_text()
            .contains("child inherited its parent's sockets"),
        "{}",
        srv.log_text()
    );
}

/// Sockets of the machine in TIME_WAIT whose local address is `addr`.
fn time_wait_at(addr: std::net::SocketAddr) -> usize {
    let out = std::process::Command::new("ss")
        .args(["-Htan", "state", "time-wait"])
        .output()
        .expect("ss (iproute2)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some(addr.to_string().as_str()))
        .count()
}

#[test]
fn a_restarted_server_binds_its_fabric_port_at_once() {
    // A server that stops while a host is attached closes the host's
    // connections first: they wait in TIME_WAIT on its fabric port.
    let (mut srv, addr, dir) = fabric_server(&[]);
    let (r, w) = attach(addr, SECRET);
    assert_eq!(w.status, 0, "{}", w.message);
    let layout = layout_of(&w);
    let (_file, host) = host_region(layout);
    nop_round_trip(&r, &layout, &host, 1);
    srv.terminate(Duration::from_secs(5));
    // The host closes its side after the server: the server's side of each
    // connection is left in TIME_WAIT on the fabric port.
    drop(r);
    let t = Instant::now();
    while time_wait_at(addr) == 0 && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ss = std::process::Command::new("ss")
        .args(["-Htan"])
        .output()
        .unwrap();
    assert!(
        time_wait_at(addr) > 0,
        "no connection of {addr} in TIME_WAIT: the case is not made\n{}",
        String::from_utf8_lossy(&ss.stdout)
    );
    // A new server on the same address binds at once (SO_REUSEADDR on the
    // UCX listener), where it used to fail with EADDRINUSE for a minute.
    let key = dir.path().join("fabric.key");
    let listen = addr.to_string();
    let again = Server::start(
        "uring",
        &[
            "--fabric-listen",
            &listen,
            "--fabric-auth",
            key.to_str().unwrap(),
        ],
    );
    let (_r2, w2) = attach(addr, SECRET);
    assert_eq!(w2.status, 0, "{}", w2.message);
    assert_eq!(hosts_attached(&again), 1);
}
