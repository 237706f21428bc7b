//! tcps poll: readiness over many sockets, timeouts, wake-up by data that
//! arrives later (from the kernel side or another host thread), POLLNVAL.
//! Rust API in-process; the C ABI (`tcps_poll`) in a child process, since
//! its attachment is process-global.

mod common;

use common::*;
use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};

const N: usize = 64;

/// N tcps sockets connected to kernel streams; `kernel[i]` is the peer of `socks[i]`.
fn connections(c: &Client) -> (Vec<u32>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut socks = Vec::new();
    let mut by_port = HashMap::new();
    for i in 0..N {
        let s = c.tcp_connect(addr).unwrap();
        by_port.insert(c.getsockname(s).unwrap().port(), i);
        socks.push(s);
    }
    let mut kernel: Vec<Option<TcpStream>> = (0..N).map(|_| None).collect();
    for _ in 0..N {
        let (k, peer) = l.accept().unwrap();
        kernel[by_port[&peer.port()]] = Some(k);
    }
    (socks, kernel.into_iter().map(Option::unwrap).collect())
}

fn set(socks: &[u32], events: i16) -> Vec<PollFd> {
    socks
        .iter()
        .map(|&sock| PollFd {
            sock,
            events,
            revents: 0,
        })
        .collect()
}

fn ready(fds: &[PollFd], bit: i16) -> Vec<usize> {
    (0..fds.len())
        .filter(|&i| fds[i].revents & bit != 0)
        .collect()
}

fn poll_many(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (socks, mut kernel) = connections(&c);

    // Nothing readable yet; everything writable.
    let mut fds = set(&socks, libc::POLLIN);
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 0);
    assert!(fds.iter().all(|f| f.revents == 0), "{fds:?}");
    let mut fds = set(&socks, libc::POLLOUT);
    assert_eq!(c.poll(&mut fds, 0).unwrap(), N);
    assert_eq!(ready(&fds, libc::POLLOUT).len(), N);

    // Timeout honoured.
    let mut fds = set(&socks, libc::POLLIN);
    let t = Instant::now();
    assert_eq!(c.poll(&mut fds, 300).unwrap(), 0);
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(280) && el < Duration::from_secs(3),
        "poll(timeout 300 ms) returned after {el:?}"
    );

    // Data written later by another thread wakes a waiting poll; exactly
    // the sockets that got data are reported.
    let (a, b) = (10usize, 41usize);
    let mut ka = kernel[a].try_clone().unwrap();
    let mut kb = kernel[b].try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        ka.write_all(b"to-a").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        kb.write_all(b"to-b").unwrap();
    });
    let t = Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "poll missed data: {seen:?}"
        );
        let mut fds = set(&socks, libc::POLLIN);
        let n = c.poll(&mut fds, 10_000).unwrap();
        let r = ready(&fds, libc::POLLIN);
        assert_eq!(n, r.len(), "count matches revents: {fds:?}");
        assert!(n >= 1, "poll(timeout 10 s) returned 0 before its timeout");
        assert!(
            r.iter().all(|i| *i == a || *i == b),
            "unexpected POLLIN on {r:?}"
        );
        seen.extend(r);
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "poll woke late: {:?}",
        t.elapsed()
    );
    writer.join().unwrap();
    let mut buf = [0u8; 16];
    let n = c.recv(socks[a], &mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"to-a");
    let n = c.recv(socks[b], &mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"to-b");

    // Peer closes: readable (EOF), recv returns 0.
    drop(kernel.remove(20));
    let mut fds = set(&socks[20..21], libc::POLLIN);
    assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1);
    assert_ne!(fds[0].revents & libc::POLLIN, 0);
    assert_eq!(c.recv(socks[20], &mut buf, 0).unwrap(), 0);

    // POLLNVAL for a closed id, alongside live ones.
    c.close(socks[5]).unwrap();
    let mut fds = set(&[socks[5], socks[6], 999_999], libc::POLLIN);
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 2, "{fds:?}");
    assert_eq!(fds[0].revents, libc::POLLNVAL);
    assert_eq!(fds[1].revents, 0);
    assert_eq!(fds[2].revents, libc::POLLNVAL);
    drop(kernel);
}

/// A poll waiting in one host thread is woken by a send from another host
/// thread (tcps socket to tcps socket), and a poll with an infinite timeout
/// wakes too.
fn poll_woken_by_other_thread(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
    let addr = c.getsockname(l).unwrap();
    // Listener readiness: POLLIN when a connection is pending.
    let mut fds = set(&[l], libc::POLLIN);
    assert_eq!(c.poll(&mut fds, 0).unwrap(), 0);
    let a = c.tcp_connect(addr).unwrap();
    let mut fds = set(&[l], libc::POLLIN);
    assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1, "listener readable");
    let (b, _) = c.accept(l, 0).unwrap();

    let sender = {
        let c = c.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            c.send_all(a, b"wake up").unwrap();
        })
    };
    let t = Instant::now();
    let mut fds = set(&[b], libc::POLLIN);
    let n = within(
        Duration::from_secs(10),
        "poll(-1) woken by a send",
        move || {
            let n = c.poll(&mut fds, -1).unwrap();
            (n, fds, c)
        },
    );
    let (n, fds, c) = n;
    assert_eq!(n, 1);
    assert_ne!(fds[0].revents & libc::POLLIN, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(90),
        "returned before the send"
    );
    sender.join().unwrap();
    let mut buf = [0u8; 16];
    let k = c.recv(b, &mut buf, 0).unwrap();
    assert_eq!(&buf[..k], b"wake up");

    // Closing a socket another thread polls on ends that poll (POLLNVAL or
    // an error), rather than leaving it parked forever.
    let c2 = c.clone();
    let poller = std::thread::spawn(move || {
        let mut fds = set(&[b], libc::POLLIN);
        let r = c2.poll(&mut fds, 20_000);
        (r.map_err(|e| errno_of(&e)), fds)
    });
    std::thread::sleep(Duration::from_millis(100));
    c.close(b).unwrap();
    let t = Instant::now();
    let (r, fds) = within(
        Duration::from_secs(10),
        "poll on a socket closed meanwhile",
        move || poller.join().unwrap(),
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "poll on a closed socket waited for its timeout"
    );
    match r {
        Ok(n) => {
            assert_eq!(n, 1);
            assert_eq!(fds[0].revents, libc::POLLNVAL);
        }
        Err(e) => assert_eq!(e, libc::EBADF, "{}", errno_name(e)),
    }
}

/// Polls on different sockets in different threads are independent: one
/// long poll does not delay another's result.
fn concurrent_polls(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (socks, mut kernel) = connections(&c);
    let long = {
        let c = c.clone();
        let s = socks[0];
        std::thread::spawn(move || {
            let mut fds = set(&[s], libc::POLLIN);
            let t = Instant::now();
            let n = c.poll(&mut fds, 1500).unwrap();
            (n, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    kernel[1].write_all(b"x").unwrap();
    let t = Instant::now();
    let mut fds = set(&socks[1..2], libc::POLLIN);
    assert_eq!(c.poll(&mut fds, 5000).unwrap(), 1);
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "blocked behind another poll"
    );
    let (n, el) = long.join().unwrap();
    assert_eq!(n, 0);
    assert!(
        el >= Duration::from_millis(1400),
        "long poll ended early: {el:?}"
    );
}

fn capi_poll(engine: &str) {
    let srv = start_server(engine);
    let mut cmd = child_command("child_capi_poll", "capi-poll");
    cmd.env("TCPS_IT_SOCKET", &srv.socket);
    let (st, out, err) = run_child(cmd, Duration::from_secs(30));
    assert!(st.success(), "C ABI child failed: {st}\n{out}\n{err}");
    assert_eq!(marks(&out, "capi"), vec!["ok".to_string()], "{out}");
}

/// Child: exercises tcps_attach/tcps_socket/.../tcps_poll through the C ABI.
#[test]
fn child_capi_poll() {
    use std::ffi::CString;
    use tcps::capi::*;
    let Some(()) = child_role("capi-poll") else {
        return;
    };
    let last = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let path = CString::new(env("TCPS_IT_SOCKET")).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { tcps_attach(path.as_ptr()) }, 0);
    let l = tcps_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
    assert!(l >= 0);
    let sa = tcps_proto::addr::encode(&"127.0.0.1:0".parse().unwrap());
    // SAFETY: sa is a sockaddr of its length.
    assert_eq!(
        unsafe { tcps_bind(l, sa.as_ptr() as *const libc::sockaddr, sa.len() as u32) },
        0
    );
    assert_eq!(tcps_listen(l, 4), 0);
    let mut out = [0u8; 128];
    let mut len = out.len() as libc::socklen_t;
    // SAFETY: out holds len bytes.
    assert_eq!(
        unsafe { tcps_getsockname(l, out.as_mut_ptr() as *mut libc::sockaddr, &mut len) },
        0
    );
    let addr = tcps_proto::addr::parse(&out[..len as usize]).unwrap();

    // A negative fd is ignored (revents 0); timeout honoured.
    let mut p = [
        libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 7,
        },
        libc::pollfd {
            fd: l,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let t = Instant::now();
    // SAFETY: p holds 2 entries.
    assert_eq!(unsafe { tcps_poll(p.as_mut_ptr(), 2, 200) }, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(180),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(p[0].revents, 0);

    // A connection makes the listener readable.
    let k = TcpStream::connect(addr).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { tcps_poll(p.as_mut_ptr(), 2, 5000) }, 1);
    assert_ne!(p[1].revents & libc::POLLIN, 0);
    // SAFETY: NULL address out-parameters are allowed.
    let a = unsafe { tcps_accept(l, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(a >= 0, "accept errno {}", last());

    // POLLNVAL after close; errno EBADF from calls on it.
    assert_eq!(tcps_close(a), 0);
    let mut q = [libc::pollfd {
        fd: a,
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: q holds 1 entry.
    assert_eq!(unsafe { tcps_poll(q.as_mut_ptr(), 1, 0) }, 1);
    assert_eq!(q[0].revents, libc::POLLNVAL);
    assert_eq!(tcps_close(a), -1);
    assert_eq!(last(), libc::EBADF);
    drop(k);
    tcps_detach();
    mark("capi", "ok");
}

engine_tests!(
    poll_many,
    poll_woken_by_other_thread,
    concurrent_polls,
    capi_poll
);
