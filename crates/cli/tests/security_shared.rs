//! A host shares each socket it adopted (`ControlMsg::SocketAdopt`) with
//! the server: the same open file description, so the same O_NONBLOCK.
//! These tests check that a host cannot use that to block a worker
//! (clearing O_NONBLOCK on its own copy, then making the server accept or
//! connect on it), and that connections the server accepts on a host's
//! listener belong to the host, not to the server (docs/SECURITY.md, "The
//! design rule").

mod common;

use common::*;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};
use tcps::Client;

/// The longest another host may wait for an answer while an attack runs.
const BOUND: Duration = Duration::from_millis(500);

/// This host's own descriptor of its socket `s`.
fn own_fd(c: &Client, s: u32) -> RawFd {
    c.kernel_fds()
        .into_iter()
        .find(|&(id, _)| id == s)
        .map(|(_, fd)| fd)
        .expect("the host holds a descriptor of a socket it created")
}

/// Clears O_NONBLOCK on the open file description behind `fd`: what a
/// malicious host does to its copy of an adopted socket.
fn clear_nonblock(fd: RawFd) {
    // SAFETY: fcntl on a descriptor of this process.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert!(fl >= 0);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK), 0);
    }
}

/// A second, well-behaved host is answered within [`BOUND`] for `span`;
/// fails (without hanging) if the worker is blocked.
fn victim_is_answered(srv: &Server, span: Duration, what: &str) {
    let victim = srv.attach();
    let what = what.to_string();
    let worst = within(span + Duration::from_secs(5), &what.clone(), move || {
        let end = Instant::now() + span;
        let mut worst = Duration::ZERO;
        while Instant::now() < end {
            let t = Instant::now();
            victim.nop().expect("victim's nop");
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        worst
    });
    assert!(
        worst < BOUND,
        "{what}: another host waited {worst:?} for a nop"
    );
}

fn start(engine: &str, eager_accept: &str) -> Server {
    Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--socket-mode",
            "666",
            "--eager-accept",
            eager_accept,
        ],
    )
}

/// The host makes its listener blocking and accepts on it while no
/// connection is pending: the server's accept4 must not sleep. The accept
/// still completes once a connection arrives.
fn blocking_accept(engine: &str, eager_accept: &str) {
    let srv = start(engine, eager_accept);
    let attacker = srv.attach();
    let (l, addr) = tcps_listener(&attacker);
    clear_nonblock(own_fd(&attacker, l));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = attacker.accept(l, 0).map(|(id, _)| id);
        let _ = tx.send(r);
        std::thread::sleep(Duration::from_secs(30)); // keeps the host
    });
    std::thread::sleep(Duration::from_millis(100)); // the accept is at the server
    victim_is_answered(
        &srv,
        Duration::from_secs(1),
        &format!("blocking accept (eager accept {eager_accept})"),
    );
    // The parked accept is answered when a connection comes.
    let _k = TcpStream::connect(addr).unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the host's accept completed once a connection came");
    assert!(got.is_ok(), "accept: {got:?}");
    victim_is_answered(&srv, Duration::from_millis(200), "after the accept");
}

fn blocking_accept_ahead(engine: &str) {
    blocking_accept(engine, "on");
}

fn blocking_accept_on_demand(engine: &str) {
    blocking_accept(engine, "off");
}

/// The host clears O_NONBLOCK again before each of many non-blocking
/// accepts on an empty listener: each costs the worker at most a tick, and
/// after a few such strikes the host is detached; another host is answered
/// throughout.
fn repeated_blocking_accepts_detach(engine: &str) {
    let srv = start(engine, "off");
    let attacker = srv.attach();
    let (l, _) = tcps_listener(&attacker);
    attacker.set_nonblocking(l, true).unwrap();
    let fd = own_fd(&attacker, l);
    let outcome = within(
        Duration::from_secs(10),
        "repeated blocking accepts",
        move || {
            let t0 = Instant::now();
            for i in 0..100 {
                clear_nonblock(fd);
                match attacker.accept(l, 0) {
                    Err(e) if errno_of(&e) == libc::EAGAIN => {}
                    other => return (i, format!("{other:?}"), t0.elapsed()),
                }
            }
            (100, "still EAGAIN".to_string(), t0.elapsed())
        },
    );
    let (tries, last, took) = outcome;
    assert!(
        tries <= 12,
        "the host was not detached after {tries} blocking accepts (last: {last})"
    );
    assert!(
        took < Duration::from_secs(2),
        "{tries} accepts took {took:?}"
    );
    victim_is_answered(&srv, Duration::from_millis(300), "after the detach");
    assert!(
        srv.log_text().contains("keeps clearing O_NONBLOCK"),
        "{}",
        srv.log_text()
    );
}

/// The host makes its socket blocking and connects it to a listener whose
/// accept queue is full (the SYN is dropped, a blocking connect would wait
/// for minutes): the server's connect must not sleep.
fn blocking_connect(engine: &str) {
    let srv = start(engine, "on");
    // A kernel listener with a backlog of 0: one connection fills it.
    let full = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = full.local_addr().unwrap();
    // SAFETY: listen(2) again on our own listener lowers its backlog.
    assert_eq!(
        unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&full), 0) },
        0
    );
    let _filler = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));

    let attacker = srv.attach();
    let s = attacker
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .unwrap();
    clear_nonblock(own_fd(&attacker, s));
    std::thread::spawn(move || {
        let _ = attacker.connect(s, &addr);
        std::thread::sleep(Duration::from_secs(30)); // keeps the host
    });
    std::thread::sleep(Duration::from_millis(100)); // the connect is at the server
    victim_is_answered(&srv, Duration::from_secs(1), "blocking connect");
}

/// The host fills its connection's send buffer (the peer never reads),
/// makes the socket blocking and asks the server to sendfile on it: the
/// server's sendfile must not sleep (the host gets EAGAIN, as for a
/// non-blocking socket).
fn blocking_sendfile(engine: &str) {
    let srv = start(engine, "on");
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let attacker = srv.attach();
    let s = attacker
        .tcp_connect(sink.local_addr().unwrap())
        .expect("connect");
    let (peer, _) = sink.accept().unwrap();
    set_rcvbuf(&peer, 4096);
    attacker
        .setsockopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, 4096)
        .unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut full = false;
    for _ in 0..1000 {
        match attacker.send(s, &chunk, libc::MSG_DONTWAIT) {
            Ok(_) => {}
            Err(e) if errno_of(&e) == libc::EAGAIN => {
                full = true;
                break;
            }
            Err(e) => panic!("filling the send buffer: {e}"),
        }
    }
    assert!(full, "the send buffer never filled");
    let dir = TempDir::new("sendfile");
    let path = dir.path().join("data");
    std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    attacker
        .file_open(1, std::os::fd::AsRawFd::as_raw_fd(&file))
        .unwrap();
    clear_nonblock(own_fd(&attacker, s));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = attacker.sendfile(s, 1, 0, 1 << 20);
        let _ = tx.send(r.map_err(|e| errno_of(&e)));
        std::thread::sleep(Duration::from_secs(30)); // keeps the host
    });
    std::thread::sleep(Duration::from_millis(100)); // the sendfile is at the server
    victim_is_answered(&srv, Duration::from_secs(1), "blocking sendfile");
    let got = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("the host's sendfile was answered");
    assert_eq!(got, Err(libc::EAGAIN), "sendfile on a full socket");
    drop(peer);
}

/// A listener of uid 65534 accepts a connection from a kernel client: the
/// accepted socket is 65534's (`/proc/net/tcp`), as with a kernel accept.
fn accepted_connection_is_the_hosts(engine: &str, eager_accept: &str) {
    require_root("it starts an unprivileged child");
    let srv = start(engine, eager_accept);
    let exe = world_executable_self(srv.dir.path());
    let mut cmd = child_command_exe(&exe, "child_nobody_listener", "nobody-listener");
    cmd.env("TCPS_IT_SOCKET", &srv.socket).uid(65534).gid(65534);
    let mut child = ChildProc::spawn(cmd);
    let port: u16 = child
        .read_mark("port", Duration::from_secs(10))
        .parse()
        .unwrap();
    let k = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    assert_eq!(child.read_mark("accepted", Duration::from_secs(10)), "ok");
    let peer_port = k.local_addr().unwrap().port();
    assert_eq!(tcp_uid(port, 0), Some(65534), "the listener is the host's");
    assert_eq!(
        tcp_uid(port, peer_port),
        Some(65534),
        "the connection the server accepted on the host's listener \
         (eager accept {eager_accept}) belongs to the host"
    );
    // The server itself still works as itself: another host attaches
    // and is answered.
    victim_is_answered(&srv, Duration::from_millis(200), "after the accept");
}

fn accepted_connection_is_the_hosts_ahead(engine: &str) {
    accepted_connection_is_the_hosts(engine, "on");
}

fn accepted_connection_is_the_hosts_on_demand(engine: &str) {
    accepted_connection_is_the_hosts(engine, "off");
}

/// The uid column of the /proc/net/tcp entry with local port `local` on
/// 127.0.0.1 and remote port `remote` (0: a listener).
fn tcp_uid(local: u16, remote: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let want_local = format!("0100007F:{local:04X}");
    let want_remote = format!(":{remote:04X}");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 7 && f[1] == want_local && f[2].ends_with(&want_remote))
            .then(|| f[7].parse().ok())
            .flatten()
    })
}

/// Child: as uid 65534, listens through tcps, accepts one connection and
/// keeps it open until killed.
#[test]
fn child_nobody_listener() {
    let Some(()) = child_role("nobody-listener") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).unwrap_or_else(|e| {
        panic!(
            "nobody could not attach: {e}: {}",
            tcps::last_attach_error()
        )
    });
    let (l, addr) = tcps_listener(&c);
    mark("port", addr.port());
    let r = c.accept(l, 0);
    mark(
        "accepted",
        if r.is_ok() {
            "ok".to_string()
        } else {
            format!("{r:?}")
        },
    );
    std::thread::sleep(Duration::from_secs(30));
}

engine_tests!(
    blocking_accept_ahead,
    blocking_accept_on_demand,
    repeated_blocking_accepts_detach,
    blocking_connect,
    blocking_sendfile,
    accepted_connection_is_the_hosts_ahead,
    accepted_connection_is_the_hosts_on_demand,
);
