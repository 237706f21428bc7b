//! Names and options answered from the host's per-socket record, with no
//! round trip: getsockname, getpeername, F_GETFL and option reads of a
//! socket with a descriptor in this process come from the kernel here;
//! TCP_NODELAY, SO_RCVTIMEO and SO_SNDTIMEO of an accepted connection are
//! asked once and kept until this library sets an option. Every answer is
//! compared with a kernel socket set up the same way.

mod common;

use common::Server;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use tcps::Client;

const NODELAY: (i32, i32) = (libc::IPPROTO_TCP, libc::TCP_NODELAY);
const RCVTIMEO: (i32, i32) = (libc::SOL_SOCKET, libc::SO_RCVTIMEO);
const SNDTIMEO: (i32, i32) = (libc::SOL_SOCKET, libc::SO_SNDTIMEO);

fn timeval(sec: i64, usec: i64) -> Vec<u8> {
    let tv = libc::timeval {
        tv_sec: sec,
        tv_usec: usec,
    };
    // SAFETY: a timeval is plain data; we copy its bytes.
    unsafe {
        std::slice::from_raw_parts(
            &tv as *const libc::timeval as *const u8,
            std::mem::size_of::<libc::timeval>(),
        )
    }
    .to_vec()
}

fn kernel_setsockopt(fd: &impl AsRawFd, (level, name): (i32, i32), v: &[u8]) {
    // SAFETY: `v` is valid for its length.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            v.as_ptr() as *const libc::c_void,
            v.len() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "kernel setsockopt {level}/{name}");
}

fn kernel_getsockopt(fd: &impl AsRawFd, (level, name): (i32, i32)) -> Vec<u8> {
    let mut b = [0u8; 64];
    let mut len = b.len() as libc::socklen_t;
    // SAFETY: `b` is writable for `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            b.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    assert_eq!(r, 0, "kernel getsockopt {level}/{name}");
    b[..len as usize].to_vec()
}

fn kernel_getfl(fd: &impl AsRawFd) -> i64 {
    // SAFETY: plain fcntl on a descriptor we own.
    i64::from(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })
}

fn tcps_getsockopt(c: &Client, s: u32, (level, name): (i32, i32)) -> Vec<u8> {
    let mut b = [0u8; 64];
    let n = c.getsockopt(s, level, name, &mut b).expect("getsockopt");
    b[..n].to_vec()
}

/// The options a test sets, on both sockets: Nagle off, odd timeouts (the
/// kernel rounds them to its clock ticks).
fn set_options(c: &Client, s: u32, k: &impl AsRawFd) {
    let one = 1i32.to_ne_bytes();
    let rcv = timeval(1, 1_501);
    let snd = timeval(0, 250_003);
    for (opt, v) in [(NODELAY, &one[..]), (RCVTIMEO, &rcv), (SNDTIMEO, &snd)] {
        c.setsockopt(s, opt.0, opt.1, v).expect("setsockopt");
        kernel_setsockopt(k, opt, v);
    }
}

fn same_options(c: &Client, s: u32, k: &impl AsRawFd, what: &str) {
    for opt in [NODELAY, RCVTIMEO, SNDTIMEO] {
        assert_eq!(
            tcps_getsockopt(c, s, opt),
            kernel_getsockopt(k, opt),
            "{what}: option {opt:?}"
        );
    }
}

fn round_trips(c: &Client) -> u64 {
    c.stats().round_trips
}

/// A socket this process made (it has a descriptor here): names, F_GETFL
/// and options, read 50 times, cost no round trip and equal the kernel's.
#[test]
fn own_socket_answers_without_round_trips() {
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let c = srv.attach();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.connect(s, &l.local_addr().unwrap()).unwrap();
    let (_peer, tcps_addr) = l.accept().unwrap();
    let k = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_kpeer, _) = l.accept().unwrap();
    set_options(&c, s, &k);
    c.set_nonblocking(s, true).unwrap();
    k.set_nonblocking(true).unwrap();
    let before = round_trips(&c);
    for _ in 0..50 {
        assert_eq!(c.getsockname(s).unwrap(), tcps_addr);
        assert_eq!(c.getpeername(s).unwrap(), l.local_addr().unwrap());
        assert_eq!(k.peer_addr().unwrap(), l.local_addr().unwrap());
        assert_eq!(
            c.fcntl(s, libc::F_GETFL, 0).unwrap(),
            kernel_getfl(&k),
            "F_GETFL"
        );
        same_options(&c, s, &k, "own socket");
    }
    assert_eq!(round_trips(&c) - before, 0, "round trips for 300 reads");
    c.set_nonblocking(s, false).unwrap();
    k.set_nonblocking(false).unwrap();
    assert_eq!(c.fcntl(s, libc::F_GETFL, 0).unwrap(), kernel_getfl(&k));
}

/// A connection the server accepted (no descriptor here): its options are
/// asked once, then answered from the record, equal to the kernel's; a
/// setsockopt makes the next read ask again.
#[test]
fn accepted_socket_options_asked_once() {
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let c = srv.attach();
    let tl = c
        .tcp_listen("127.0.0.1:0".parse::<SocketAddr>().unwrap(), 8)
        .unwrap();
    let taddr = c.getsockname(tl).unwrap();
    let tclient = TcpStream::connect(taddr).unwrap();
    let (s, peer) = c.accept(tl, 0).unwrap();
    assert_eq!(peer, Some(tclient.local_addr().unwrap()));
    let kl = TcpListener::bind("127.0.0.1:0").unwrap();
    let _kclient = TcpStream::connect(kl.local_addr().unwrap()).unwrap();
    let (k, _) = kl.accept().unwrap();

    // Inherited from the listeners (both left at the defaults).
    same_options(&c, s, &k, "accepted, defaults");
    set_options(&c, s, &k);
    same_options(&c, s, &k, "accepted, first read");
    let before = round_trips(&c);
    for _ in 0..50 {
        same_options(&c, s, &k, "accepted, kept");
    }
    assert_eq!(round_trips(&c) - before, 0, "round trips for 150 reads");

    // A set forgets what was kept: the next read is the kernel's again.
    let zero = 0i32.to_ne_bytes();
    c.setsockopt(s, NODELAY.0, NODELAY.1, &zero).unwrap();
    kernel_setsockopt(&k, NODELAY, &zero);
    let rcv = timeval(0, 0);
    c.setsockopt(s, RCVTIMEO.0, RCVTIMEO.1, &rcv).unwrap();
    kernel_setsockopt(&k, RCVTIMEO, &rcv);
    same_options(&c, s, &k, "accepted, after a set");

    // A buffer too short for the value: truncated as the kernel does.
    let mut b = [0u8; 2];
    let n = c.getsockopt(s, NODELAY.0, NODELAY.1, &mut b).unwrap();
    assert_eq!(n, 2);
}
