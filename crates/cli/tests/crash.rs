//! Crashes: a host killed with SIGKILL loses its sockets at once (its ports
//! are free again); a server killed with SIGKILL makes blocked and later
//! host calls fail promptly instead of hanging.

mod common;

use common::*;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};
use tcps::Client;

fn host_sigkill_frees_ports(engine: &str) {
    let mut srv = start_server(engine);
    let mut cmd = child_command("child_listen_and_wait", "listen-and-wait");
    cmd.env("TCPS_IT_SOCKET", &srv.socket);
    let mut kid = ChildProc::spawn(cmd);
    let port: u16 = kid
        .read_mark("port", Duration::from_secs(20))
        .parse()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // The port really is held (by the server, for the host).
    assert!(
        plain_kernel_bind(addr).is_err(),
        "port {port} should be in use while the host lives"
    );
    let other = std::net::TcpStream::connect(addr).expect("the host's listener accepts");
    drop(other);
    kid.child.kill().unwrap();
    kid.child.wait().unwrap();
    let t = Instant::now();
    loop {
        match plain_kernel_bind(addr) {
            Ok(fd) => {
                drop(fd);
                break;
            }
            Err(e) if t.elapsed() < Duration::from_secs(1) => {
                assert_eq!(errno_of(&e), libc::EADDRINUSE, "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!(
                "port {port} still in use {:?} after the host was SIGKILLed: {e}\n{}",
                t.elapsed(),
                srv.log_text()
            ),
        }
    }
    eprintln!("{engine}: port free {:?} after SIGKILL", t.elapsed());
    assert!(srv.is_alive(), "server died with its host");
    // Still serving others.
    let c = srv.attach();
    echo_roundtrip(&c, kernel_echo_server("127.0.0.1:0"), b"after a host crash");
}

/// Child: listens through tcps, prints the port, waits to be killed.
#[test]
fn child_listen_and_wait() {
    let Some(()) = child_role("listen-and-wait") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    // A listener with a pending (not accepted) connection would be fine too,
    // but the port check needs no connection: plain listen.
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 8).unwrap();
    mark("port", c.getsockname(l).unwrap().port());
    // Block in a call the way a real server would (accept), then forever.
    let _ = c.accept(l, 0);
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn server_sigkill_fails_calls(engine: &str) {
    let mut srv = start_server(engine);
    let c = srv.attach();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (_k, _) = l.accept().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let c = c.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 16];
            let r = c.recv(s, &mut b, 0);
            let _ = tx.send(r.map_err(|e| errno_of(&e)));
        });
    }
    // The recv is parked at the server (nothing to read): give it time to get there.
    std::thread::sleep(Duration::from_millis(100));
    assert!(rx.try_recv().is_err(), "recv returned without data");
    srv.kill9();
    let t = Instant::now();
    let r = rx.recv_timeout(Duration::from_secs(1)).unwrap_or_else(|_| {
        panic!("recv blocked in the host still hangs 1 s after the server died")
    });
    let blocked_took = t.elapsed();
    let e = r.expect_err("recv succeeded with a dead server");
    assert!(
        [libc::ECONNRESET, libc::ENOTCONN, libc::EPIPE].contains(&e),
        "blocked recv: {}",
        errno_name(e)
    );
    // Later calls fail at once.
    let c2 = c.clone();
    let later = within(
        Duration::from_secs(1),
        "a call after the server died",
        move || {
            let mut b = [0u8; 4];
            (
                c2.send(s, b"x", 0).map_err(|e| errno_of(&e)),
                c2.recv(s, &mut b, 0).map_err(|e| errno_of(&e)),
                c2.socket(libc::AF_INET, libc::SOCK_STREAM, 0)
                    .map_err(|e| errno_of(&e)),
                c2.nop().map_err(|e| errno_of(&e)),
            )
        },
    );
    for (what, r) in [
        ("send", later.0.map(|_| ())),
        ("recv", later.1.map(|_| ())),
        ("socket", later.2.map(|_| ())),
        ("nop", later.3),
    ] {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what} succeeded with a dead server"));
        assert!(
            [libc::ECONNRESET, libc::ENOTCONN, libc::EPIPE].contains(&e),
            "{what} after the server died: {}",
            errno_name(e)
        );
    }
    assert!(!c.is_attached());
    eprintln!("{engine}: blocked recv failed {blocked_took:?} after SIGKILL");
}

/// A call made while the server is already gone (no call in flight when it
/// died) fails within 1 s too.
fn server_sigkill_idle_host(engine: &str) {
    let mut srv = start_server(engine);
    let c = srv.attach();
    c.nop().unwrap();
    srv.kill9();
    let e = within(
        Duration::from_secs(1),
        "nop after the server died",
        move || c.nop().map_err(|e| errno_of(&e)),
    )
    .expect_err("nop succeeded with a dead server");
    assert!(
        [libc::ECONNRESET, libc::ENOTCONN, libc::EPIPE].contains(&e),
        "{}",
        errno_name(e)
    );
}

/// SIGTERM (clean shutdown) wakes blocked host calls too.
fn server_sigterm_fails_blocked_calls(engine: &str) {
    let mut srv = start_server(engine);
    let c = srv.attach();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (_k, _) = l.accept().unwrap();
    let c2 = c.clone();
    let h = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        c2.recv(s, &mut b, 0).map_err(|e| errno_of(&e))
    });
    std::thread::sleep(Duration::from_millis(100));
    let st = srv.terminate(Duration::from_secs(5));
    assert!(
        st.is_some_and(|s| s.success()),
        "server exit after SIGTERM: {st:?}"
    );
    let r = within(Duration::from_secs(2), "recv after SIGTERM", move || {
        h.join().unwrap()
    });
    let e = r.expect_err("recv succeeded after the server stopped");
    assert!(
        [libc::ECONNRESET, libc::ENOTCONN, libc::EPIPE].contains(&e),
        "{}",
        errno_name(e)
    );
}

/// A recv blocked in one host thread is ended, not left hanging, when
/// another thread closes its socket, shuts it down, or the host detaches.
fn blocked_recv_is_released(engine: &str) {
    let srv = start_server(engine);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    for how in ["shutdown", "close", "detach"] {
        let c = srv.attach();
        let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
        let (_k, _) = l.accept().unwrap();
        let c2 = c.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut b = [0u8; 16];
            let _ = tx.send(c2.recv(s, &mut b, 0).map_err(|e| errno_of(&e)));
        });
        std::thread::sleep(Duration::from_millis(50));
        match how {
            "shutdown" => c.shutdown(s, libc::SHUT_RDWR).unwrap(),
            "close" => c.close(s).unwrap(),
            _ => c.detach(),
        }
        let r = rx
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_else(|_| panic!("{how}: the blocked recv still hangs 2 s later"));
        match (how, r) {
            ("shutdown", Ok(0)) => {}
            ("close", Err(e)) if e == libc::EBADF => {}
            ("detach", Err(e)) if [libc::ECONNRESET, libc::ENOTCONN].contains(&e) => {}
            (how, r) => panic!("{how}: blocked recv ended with {:?}", r.map_err(errno_name)),
        }
    }
}

engine_tests!(
    blocked_recv_is_released,
    host_sigkill_frees_ports,
    server_sigkill_fails_calls,
    server_sigkill_idle_host,
    server_sigterm_fails_blocked_calls
);
