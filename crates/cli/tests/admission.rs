//! Admission control: `--max-hosts` refuses extra hosts with EUSERS and a
//! message; `--max-sockets-per-host` refuses extra sockets with EMFILE,
//! per host.

mod common;

use common::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tcps::Client;

fn max_hosts(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--max-hosts", "1"]);
    let echo = kernel_echo_server("127.0.0.1:0");
    let first = srv.attach();
    let e = Client::attach(&srv.socket).expect_err("a second host was admitted past --max-hosts 1");
    assert_eq!(
        errno_of(&e),
        libc::EUSERS,
        "refused attach: expected EUSERS, got {e}"
    );
    let msg = tcps::last_attach_error();
    assert!(
        msg.contains("max-hosts") || msg.contains("full"),
        "the refusal should say why: {msg:?}"
    );
    // The first host is unaffected.
    echo_roundtrip(&first, echo, &Rng::new(1).bytes(100_000));
    // A raw attach is refused the same way (the server answers, with status).
    match RawHost::attach(&srv.socket) {
        Ok(_) => panic!("raw attach admitted past --max-hosts 1"),
        Err(e) => assert!(e.to_string().contains(&libc::EUSERS.to_string()), "{e}"),
    }
    // After the first detaches, a new host gets in (the server notices the
    // hang-up asynchronously: allow it a moment).
    first.detach();
    assert!(!first.is_attached());
    assert_errno(first.nop(), libc::ENOTCONN, "call after detach");
    drop(first);
    let t = Instant::now();
    let second = loop {
        match Client::attach(&srv.socket) {
            Ok(c) => break c,
            Err(e) if errno_of(&e) == libc::EUSERS && t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("attach after the first host detached: {e}"),
        }
    };
    eprintln!("{engine}: slot freed {:?} after detach", t.elapsed());
    echo_roundtrip(&second, echo, &Rng::new(2).bytes(70_000));
    assert!(
        srv.log_text().contains("server full"),
        "refusals are logged:\n{}",
        srv.log_text()
    );
}

fn max_sockets_per_host(engine: &str) {
    let srv = Server::start(
        engine,
        &["--poll", "adaptive", "--max-sockets-per-host", "4"],
    );
    let a = srv.attach();
    let b = srv.attach();
    let socks: Vec<u32> = (0..4)
        .map(|i| {
            a.socket(libc::AF_INET, libc::SOCK_STREAM, 0)
                .unwrap_or_else(|e| panic!("socket #{i} within the quota: {e}"))
        })
        .collect();
    assert_errno(
        a.socket(libc::AF_INET, libc::SOCK_STREAM, 0),
        libc::EMFILE,
        "5th socket with --max-sockets-per-host 4",
    );
    // The other host has its own quota.
    let bs: Vec<u32> = (0..4)
        .map(|_| b.socket(libc::AF_INET6, libc::SOCK_STREAM, 0).unwrap())
        .collect();
    assert_errno(
        b.socket(libc::AF_INET, libc::SOCK_STREAM, 0),
        libc::EMFILE,
        "other host's 5th socket",
    );
    // Closing one frees a slot.
    a.close(socks[3]).unwrap();
    let s = a
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .expect("socket after a close");
    assert_errno(
        a.socket(libc::AF_INET, libc::SOCK_STREAM, 0),
        libc::EMFILE,
        "quota full again",
    );

    // Accepted connections count too: a listener at the quota refuses to
    // accept (EMFILE); the connection waits in the backlog until a slot frees.
    for &x in &socks[..3] {
        a.close(x).unwrap();
    }
    a.close(s).unwrap();
    let l = a.tcp_listen("127.0.0.1:0".parse().unwrap(), 8).unwrap();
    let addr = a.getsockname(l).unwrap();
    let fillers: Vec<u32> = (0..3)
        .map(|_| a.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap())
        .collect();
    let k = TcpStream::connect(addr).unwrap();
    assert_errno(a.accept(l, 0), libc::EMFILE, "accept at the quota");
    a.close(fillers[0]).unwrap();
    let (acc, peer) = a.accept(l, 0).expect("accept after a slot freed");
    assert_eq!(
        peer.unwrap(),
        k.local_addr().unwrap(),
        "the waiting connection"
    );
    a.close(acc).unwrap();
    // Host b never noticed any of this.
    for s in bs {
        b.close(s).unwrap();
    }
    let echo = kernel_echo_server("127.0.0.1:0");
    echo_roundtrip(&b, echo, b"unaffected");
}

engine_tests!(max_hosts, max_sockets_per_host);
