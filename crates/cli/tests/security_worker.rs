//! The worker never blocks, spins or dies on what a host sends (issue 12,
//! findings 7–12 and 17). Each test mounts one attack and checks that a
//! well-behaved host's calls are still answered within 500 ms while it is
//! in force, and that the attacker gets an errno or is cut off.

mod common;

use common::*;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps::{Client, PollFd};
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};

/// How long a well-behaved host's call may take while an attack is on.
const BOUND: Duration = Duration::from_millis(500);

/// Runs a few Nops of `good` and fails if one takes longer than [`BOUND`]
/// (or hangs).
fn assert_served(good: &Arc<Client>, what: &str) {
    let g = good.clone();
    let worst = within(Duration::from_secs(5), what, move || {
        let mut worst = Duration::ZERO;
        for _ in 0..5 {
            let t = Instant::now();
            g.nop().expect("nop");
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        worst
    });
    assert!(
        worst < BOUND,
        "{what}: another host's Nop took {worst:?} (bound {BOUND:?})"
    );
}

/// A server with process-ahead reads off (calls park at the server, as
/// the attacks need) and a world-writable control socket.
fn server(engine: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--poll",
        "adaptive",
        "--eager-recv",
        "off",
        "--socket-mode",
        "666",
    ];
    args.extend_from_slice(extra);
    Server::start(engine, &args)
}

// ---- raw control messages ---------------------------------------------------------

/// Descriptors of this process that are SEQPACKET sockets connected to `path`.
/// The server binds its socket as `PATH.new` and renames it once it accepts,
/// so the peer's bound name is that one.
fn control_sockets(path: &Path) -> HashSet<RawFd> {
    let mut bound = path.as_os_str().to_owned();
    bound.push(".new");
    let want = bound.as_encoded_bytes();
    let mut out = HashSet::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else {
            continue;
        };
        let mut ty = 0i32;
        let mut len = 4 as libc::socklen_t;
        // SAFETY: getsockopt into a local int.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                &mut ty as *mut i32 as *mut libc::c_void,
                &mut len,
            )
        };
        if r != 0 || ty != libc::SOCK_SEQPACKET {
            continue;
        }
        // SAFETY: sockaddr_un is plain data.
        let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        let mut slen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: getpeername into a local sockaddr_un of its size.
        let r =
            unsafe { libc::getpeername(fd, &mut sa as *mut _ as *mut libc::sockaddr, &mut slen) };
        if r != 0 {
            continue;
        }
        let p: Vec<u8> = sa
            .sun_path
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        if p == want {
            out.insert(fd);
        }
    }
    out
}

/// Attaches a `tcps::Client` and finds its control socket.
fn client_with_control(srv: &Server) -> (Arc<Client>, RawFd) {
    let before = control_sockets(&srv.socket);
    let c = Arc::new(srv.attach());
    let after = control_sockets(&srv.socket);
    let new: Vec<RawFd> = after.difference(&before).copied().collect();
    assert_eq!(
        new.len(),
        1,
        "cannot tell the client's control socket: {new:?}"
    );
    (c, new[0])
}

fn send_ctl(fd: RawFd, m: ControlMsg, fds: &[RawFd]) -> std::io::Result<()> {
    fdpass::send_with_fds(fd, &m.encode(), fds)
}

/// The next control reply within `limit` (`None`: none came).
fn recv_ctl(fd: RawFd, limit: Duration) -> Option<(ControlMsg, Vec<OwnedFd>)> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) };
    if n != 1 {
        return None;
    }
    let mut b = [0u8; CONTROL_MSG_LEN + 1];
    let (n, fds) = fdpass::recv_with_fds(fd, &mut b, libc::MSG_DONTWAIT).ok()?;
    ControlMsg::decode(&b[..n]).map(|m| (m, fds))
}

/// Whether the server hung up `fd` (POLLHUP), waiting at most `limit`.
fn hung_up(fd: RawFd, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        let mut p = libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) };
        if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn linger(on: i32, secs: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&on.to_ne_bytes());
    b[4..].copy_from_slice(&secs.to_ne_bytes());
    b
}

// ---- 7. control replies never block the worker ----------------------------------------

/// A host floods its control socket and never reads the replies: it is
/// cut off once its bounded outbox overflows; another host's calls go on.
fn control_flood_unread_replies_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let good = Arc::new(srv.attach());
    let rogue = RawHost::attach(&srv.socket).unwrap();
    let ctl = rogue.ctl.as_raw_fd();
    // The flood, from a thread: its sends block once the server stops
    // reading (base: the worker itself is blocked in sendmsg).
    std::thread::spawn(move || {
        for i in 0..3000u32 {
            if send_ctl(
                ctl,
                ControlMsg::Deregister {
                    handle: 1_000_000 + i,
                },
                &[],
            )
            .is_err()
            {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_served(&good, "control flood");
    assert!(
        hung_up(ctl, Duration::from_secs(3)),
        "a host that never reads its control replies was not cut off"
    );
    assert!(
        srv.log_text().contains("control replies unread"),
        "the cut-off is logged:\n{}",
        srv.log_text()
    );
    assert_served(&good, "after the control flood");
    drop(rogue);
}

// ---- 8. a lingering close never blocks the worker ---------------------------------------

/// SO_LINGER {1, 3} on a socket with unsent data and a silent peer, then
/// Close: the close does not hold the worker for 3 s.
fn lingering_close_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let good = Arc::new(srv.attach());
    // A peer that accepts and never reads, with a small receive buffer.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_rcvbuf(&l, 4096);
    // Both kinds of socket: one the host made (it holds a descriptor of its
    // own, and its own close lingers, as under the kernel) and one the
    // server accepted (SO_LINGER set through the server; the server's close
    // is the last one).
    for made_by_host in [true, false] {
        let what = if made_by_host {
            "host-made"
        } else {
            "accepted"
        };
        // 1. Close of the lingering socket.
        let rogue = Arc::new(srv.attach());
        let (s, _peer) = lingering_socket(&rogue, &l, made_by_host);
        let r = rogue.clone();
        let closer = std::thread::spawn(move || r.close(s));
        std::thread::sleep(Duration::from_millis(100));
        assert_served(&good, &format!("lingering close of a {what} socket"));
        // The host's close is answered too (the wait happens elsewhere, or
        // in the host's own close of its descriptor: at most the linger).
        let res = within(Duration::from_secs(5), "the lingering close", move || {
            closer.join().unwrap()
        });
        res.expect("close");
        assert_served(&good, "after the lingering close");

        // 2. A host that detaches with a lingering socket: its sockets are
        //    closed by the worker too.
        let rogue2 = srv.attach();
        let (_s2, _peer2) = lingering_socket(&rogue2, &l, made_by_host);
        rogue2.detach();
        std::thread::sleep(Duration::from_millis(100));
        assert_served(&good, &format!("detach with a lingering {what} socket"));
    }
}

/// A connection of `c` whose peer never reads, with its send buffer full
/// and SO_LINGER {1, 3}: closing it would wait 3 s. Made by the host and
/// connected to `l`, or accepted by the server on a tcps listener from a
/// kernel client with a small receive buffer.
/// A kernel client with a 4 KiB receive buffer (set before connecting, so
/// the window stays small), connected to `addr`.
fn socket2_small_rcvbuf_connect(addr: std::net::SocketAddr) -> TcpStream {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket");
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { TcpStream::from_raw_fd(fd) };
    set_rcvbuf(&sock, 4096);
    let b = tcps_proto::addr::encode(&addr);
    // SAFETY: b holds a sockaddr of its length.
    let r = unsafe {
        libc::connect(
            fd,
            b.as_ptr() as *const libc::sockaddr,
            b.len() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    sock
}

fn lingering_socket(c: &Client, l: &TcpListener, made_by_host: bool) -> (u32, TcpStream) {
    let (s, peer) = if made_by_host {
        let s = c.tcp_connect(l.local_addr().unwrap()).unwrap();
        (s, l.accept().unwrap().0)
    } else {
        let tl = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
        let sock = socket2_small_rcvbuf_connect(c.getsockname(tl).unwrap());
        let (s, _) = c.accept(tl, 0).unwrap();
        (s, sock)
    };
    let chunk = vec![7u8; 65536];
    let mut sent = 0usize;
    loop {
        match c.send(s, &chunk, libc::MSG_DONTWAIT) {
            Ok(n) => sent += n,
            Err(e) if errno_of(&e) == libc::EAGAIN => break,
            Err(e) => panic!("send: {e}"),
        }
        assert!(sent < 64 << 20, "the send buffer never filled");
    }
    // A short linger: the host closes its own copy of a socket it made,
    // and that close lingers in the host as under the kernel.
    c.setsockopt(s, libc::SOL_SOCKET, libc::SO_LINGER, &linger(1, 3))
        .unwrap();
    (s, peer)
}

// ---- 9. host-chosen deadlines never overflow; a panic dooms one host ------------------

/// SO_RCVTIMEO and SO_SNDTIMEO of {INT64_MAX s}, then a blocking Recv
/// that parks: the deadline saturates (waits forever, like the kernel)
/// instead of overflowing and panicking the worker.
fn huge_socket_timeouts_body(engine: &'static str) {
    let mut srv = server(engine, &[]);
    let good = Arc::new(srv.attach());
    let rogue = Arc::new(srv.attach());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = rogue.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (mut peer, _) = l.accept().unwrap();
    let mut tv = [0u8; 16];
    tv[..8].copy_from_slice(&i64::MAX.to_ne_bytes());
    tv[8..].copy_from_slice(&999_999i64.to_ne_bytes());
    for name in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        rogue.setsockopt(s, libc::SOL_SOCKET, name, &tv).unwrap();
    }
    let r = rogue.clone();
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        r.recv(s, &mut b, 0)
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_served(&good, "recv with a huge SO_RCVTIMEO");
    assert!(srv.is_alive(), "server died:\n{}", srv.log_text());
    assert!(
        !reader.is_finished(),
        "the recv should still wait (no data)"
    );
    // The parked recv is still served when data comes.
    peer.write_all(b"hi").unwrap();
    let got = within(Duration::from_secs(3), "the parked recv", move || {
        reader.join().unwrap()
    });
    assert_eq!(got.expect("recv"), 2);
}

// ---- 10. a poll re-arms only for what would answer it -----------------------------------

/// A parked Poll of 4096 entries naming one readable socket with POLLPRI:
/// it must not re-fire on the socket's readability (one poller per socket
/// and poll; the socket armed for POLLPRI only), and it still completes
/// when urgent data arrives.
fn poll_pri_same_socket_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let good = Arc::new(srv.attach());
    let rogue = Arc::new(srv.attach());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = rogue.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (mut peer, _) = l.accept().unwrap();
    peer.write_all(b"readable").unwrap();
    let r = rogue.clone();
    let poller = std::thread::spawn(move || {
        let mut fds = vec![
            PollFd {
                sock: s,
                events: libc::POLLPRI,
                revents: 0,
            };
            4096
        ];
        let n = r.poll(&mut fds, -1);
        let pri = fds
            .iter()
            .filter(|f| f.revents & libc::POLLPRI != 0)
            .count();
        (n, pri)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !poller.is_finished(),
        "POLLPRI on a readable socket answered"
    );
    assert_served(&good, "parked POLLPRI poll of 4096 entries");
    // And the worker is not kept busy meanwhile (it was at 100%; the bound
    // is 20%: a spinning thread on a loaded machine still gets more, and
    // io_uring looks again every 10 ms, see `Engine::urgent_needs_pollin`).
    let before = cpu_ticks(srv.pid());
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(srv.pid()) - before;
    assert!(
        used < clock_ticks_per_sec() / 5,
        "the server used {used} ticks of CPU in 1 s with one parked poll"
    );
    // Urgent data: the poll completes with POLLPRI.
    // SAFETY: one byte from a valid buffer.
    unsafe {
        libc::send(
            peer.as_raw_fd(),
            b"!".as_ptr() as *const libc::c_void,
            1,
            libc::MSG_OOB,
        )
    };
    let (n, pri) = within(Duration::from_secs(3), "the POLLPRI poll", move || {
        poller.join().unwrap()
    });
    // Every entry names the same socket, but the server reads ahead on it,
    // and reading past the urgent mark ends the kernel's POLLPRI: entries
    // looked at after that may not show it (seen: 2502 of 4096). What
    // matters is that the urgent data completes the poll, with POLLPRI.
    let n = n.expect("poll");
    assert!(
        n >= 1 && pri == n,
        "poll returned {n}, {pri} entries with POLLPRI"
    );
}

// ---- 11. export forgets the socket; per-host doorbells --------------------------------

/// A socket armed once (a recv parked and answered) is exported: the
/// engine forgets it, so the descriptor number the server reuses next (a
/// new host's control socket) can be watched, and that host is answered.
fn export_then_new_host_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let (a, a_ctl) = client_with_control(&srv);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = a.tcp_connect(l.local_addr().unwrap()).unwrap();
    let (mut peer, _) = l.accept().unwrap();
    let r = a.clone();
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 4];
        r.recv(s, &mut b, 0)
    });
    std::thread::sleep(Duration::from_millis(100)); // parked: armed
    peer.write_all(b"x").unwrap();
    within(Duration::from_secs(3), "the parked recv", move || {
        reader.join().unwrap()
    })
    .expect("recv");
    send_ctl(a_ctl, ControlMsg::Export { handle: s }, &[]).unwrap();
    let (reply, fds) = recv_ctl(a_ctl, Duration::from_secs(2)).expect("an Export reply");
    assert_eq!(
        reply,
        ControlMsg::Reply {
            handle: s,
            errno: 0
        }
    );
    assert_eq!(fds.len(), 1, "the kernel socket comes with the reply");
    // The exported socket works as a plain kernel socket.
    let mut k = TcpStream::from(fds.into_iter().next().unwrap());
    k.write_all(b"y").unwrap();
    let mut b = [0u8; 1];
    peer.read_exact(&mut b).unwrap();
    // A new host: its control messages are answered.
    for i in 0..3 {
        let b = RawHost::attach(&srv.socket).unwrap();
        send_ctl(
            b.ctl.as_raw_fd(),
            ControlMsg::Deregister { handle: 77 },
            &[],
        )
        .unwrap();
        let got = recv_ctl(b.ctl.as_raw_fd(), BOUND);
        assert!(
            matches!(got, Some((ControlMsg::Reply { handle: 77, .. }, _))),
            "host {i} attached after an export got no control reply: {got:?}\n{}",
            srv.log_text()
        );
    }
}

/// A host that keeps draining its doorbell: with one doorbell per worker
/// it would swallow the adoption of new hosts; each host now has its own.
fn doorbell_drainer_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let rogue = RawHost::attach(&srv.socket).unwrap();
    let bell = rogue.doorbell.as_raw_fd();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let drainer = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        let until = Instant::now() + Duration::from_secs(20);
        while !st.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
            // SAFETY: 8 bytes into a valid buffer (non-blocking eventfd).
            unsafe { libc::read(bell, b.as_mut_ptr() as *mut libc::c_void, 8) };
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..3 {
        let path = srv.socket.clone();
        let t = Instant::now();
        within(
            Duration::from_secs(5),
            "attach while a host drains its doorbell",
            move || {
                let c = Client::attach(&path).unwrap();
                c.nop().unwrap();
            },
        );
        assert!(
            t.elapsed() < BOUND * 2,
            "attach + Nop {i} took {:?} while another host drained its doorbell",
            t.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drainer.join().unwrap();
}

// ---- 12. sendfile only from local file systems -------------------------------------------

/// FileOpen of /proc/self/status (a regular file on procfs) is refused with
/// EOPNOTSUPP; a regular file on the test's own file system is kept.
fn sendfile_refuses_proc_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let good = Arc::new(srv.attach());
    let h = RawHost::attach(&srv.socket).unwrap();
    let ctl = h.ctl.as_raw_fd();
    let proc_file = std::fs::File::open("/proc/self/status").unwrap();
    send_ctl(
        ctl,
        ControlMsg::FileOpen { handle: 1 },
        &[proc_file.as_raw_fd()],
    )
    .unwrap();
    let got = recv_ctl(ctl, Duration::from_secs(2)).map(|r| r.0);
    assert_eq!(
        got,
        Some(ControlMsg::Reply {
            handle: 1,
            errno: libc::EOPNOTSUPP
        }),
        "FileOpen of a procfs file"
    );
    assert!(
        srv.log_text().contains("not on a local file system"),
        "the refusal is logged:\n{}",
        srv.log_text()
    );
    let local = srv.dir.path().join("local-file");
    std::fs::write(&local, b"data").unwrap();
    let f = std::fs::File::open(&local).unwrap();
    send_ctl(ctl, ControlMsg::FileOpen { handle: 2 }, &[f.as_raw_fd()]).unwrap();
    let got = recv_ctl(ctl, Duration::from_secs(2)).map(|r| r.0);
    assert_eq!(
        got,
        Some(ControlMsg::Reply {
            handle: 2,
            errno: 0
        }),
        "FileOpen of {}",
        local.display()
    );
    assert_served(&good, "after FileOpen");
}

// ---- 17. the attach handshake; export gives back admission counts ------------------------

/// Ten connections that never send their Hello do not delay an attach.
fn silent_connections_body(engine: &'static str) {
    let srv = server(engine, &[]);
    let silent: Vec<OwnedFd> = (0..10).map(|_| silent_connection(&srv.socket)).collect();
    std::thread::sleep(Duration::from_millis(50));
    let path = srv.socket.clone();
    let t = Instant::now();
    within(
        Duration::from_secs(20),
        "attach behind silent connections",
        move || {
            let c = Client::attach(&path).unwrap();
            c.nop().unwrap();
        },
    );
    assert!(
        t.elapsed() < BOUND,
        "attach + Nop took {:?} behind 10 silent connections",
        t.elapsed()
    );
    drop(silent);
}

/// A connection to the control socket that never says anything.
fn silent_connection(path: &Path) -> OwnedFd {
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa
        .sun_path
        .iter_mut()
        .zip(path.as_os_str().as_encoded_bytes())
    {
        *d = *s as libc::c_char;
    }
    // SAFETY: a valid sockaddr_un of its size.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    fd
}

/// The server out of descriptors (its limit lowered with prlimit, then
/// filled with silent connections): the acceptor backs off and logs once
/// instead of spinning on accept4, and attaches work again once the
/// silent connections time out.
fn out_of_descriptors_body(engine: &'static str) {
    require_root("it lowers the server's descriptor limit");
    let srv = server(engine, &[]);
    let pid = srv.pid() as libc::pid_t;
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64;
    let rl = libc::rlimit {
        rlim_cur: open + 6,
        rlim_max: open + 6,
    };
    // SAFETY: prlimit on the server we started, with a valid rlimit.
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &rl, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    let silent: Vec<OwnedFd> = (0..20).map(|_| silent_connection(&srv.socket)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_ticks(srv.pid());
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_ticks(srv.pid()) - before;
    // At most 10% of a CPU: a spinning thread gets more even on a loaded
    // machine.
    assert!(
        used < clock_ticks_per_sec() / 20,
        "the server used {used} ticks of CPU in 0.5 s while out of descriptors"
    );
    drop(silent);
    // The silent connections it holds time out (1 s): attaches work again.
    std::thread::sleep(Duration::from_millis(1200));
    let path = srv.socket.clone();
    within(
        Duration::from_secs(5),
        "attach after running out of descriptors",
        move || {
            let c = Client::attach(&path).unwrap();
            c.nop().unwrap();
        },
    );
    let log = srv.log_text();
    assert_eq!(
        log.matches("out of descriptors").count(),
        1,
        "logged once per episode:\n{log}"
    );
}

/// An exported accepted connection gives its `--max-conns-per-addr` count
/// back: the next connection from the same address is admitted.
fn export_releases_admission_body(engine: &'static str) {
    let srv = server(
        engine,
        &["--max-conns-per-addr", "1", "--eager-accept", "off"],
    );
    let (a, a_ctl) = client_with_control(&srv);
    let (l, addr) = tcps_listener(&a);
    let _k1 = TcpStream::connect(addr).unwrap();
    let (c1, _) = a.accept(l, 0).unwrap();
    send_ctl(a_ctl, ControlMsg::Export { handle: c1 }, &[]).unwrap();
    let (reply, fds) = recv_ctl(a_ctl, Duration::from_secs(2)).expect("an Export reply");
    assert_eq!(
        reply,
        ControlMsg::Reply {
            handle: c1,
            errno: 0
        }
    );
    drop(fds);
    // Non-blocking: without the count given back the second connection
    // is reset at the server, and an accept would wait for good.
    a.set_nonblocking(l, true).unwrap();
    let _k2 = TcpStream::connect(addr).unwrap();
    let mut fds = [PollFd {
        sock: l,
        events: libc::POLLIN,
        revents: 0,
    }];
    let n = a.poll(&mut fds, 1000).unwrap();
    assert_eq!(
        n, 1,
        "the second connection from 127.0.0.1 was not admitted after the export"
    );
    a.accept(l, 0).expect("accept the second connection");
}

/// Each test runs under a deadline: on code without the fixes an attack
/// may hang a call for good, and the test must fail, not hang.
macro_rules! bounded {
    ($($name:ident => $body:ident),* $(,)?) => {$(
        fn $name(engine: &str) {
            let engine: &'static str = Box::leak(engine.to_string().into_boxed_str());
            within(Duration::from_secs(30), stringify!($name), move || $body(engine));
        }
    )*};
}

bounded!(
    control_flood_unread_replies => control_flood_unread_replies_body,
    lingering_close => lingering_close_body,
    huge_socket_timeouts => huge_socket_timeouts_body,
    poll_pri_same_socket => poll_pri_same_socket_body,
    export_then_new_host => export_then_new_host_body,
    doorbell_drainer => doorbell_drainer_body,
    sendfile_refuses_proc => sendfile_refuses_proc_body,
    silent_connections => silent_connections_body,
    export_releases_admission => export_releases_admission_body,
    out_of_descriptors => out_of_descriptors_body,
);

engine_tests!(
    control_flood_unread_replies,
    lingering_close,
    huge_socket_timeouts,
    poll_pri_same_socket,
    export_then_new_host,
    doorbell_drainer,
    sendfile_refuses_proc,
    silent_connections,
    export_releases_admission,
    out_of_descriptors,
);

// ---- per-uid host limit -------------------------------------------------------------------

/// `--max-hosts-per-uid 2`: uid 65534's third attach is refused with
/// EUSERS (naming the limit) while root still attaches.
#[test]
fn max_hosts_per_uid() {
    require_root("it starts an unprivileged child");
    let srv = server("epoll", &["--max-hosts-per-uid", "2"]);
    let exe = world_executable_self(srv.dir.path());
    let mut cmd = child_command_exe(&exe, "child_attach_many", "attach-many");
    cmd.env("TCPS_IT_SOCKET", &srv.socket).uid(65534).gid(65534);
    let mut child = ChildProc::spawn(cmd);
    assert_eq!(child.read_mark("attached", Duration::from_secs(10)), "2");
    let third = child.read_mark("third", Duration::from_secs(10));
    assert!(
        third.starts_with("EUSERS") && third.contains("max-hosts-per-uid 2"),
        "uid 65534's third attach: {third}"
    );
    // Root (another uid) still attaches, three times.
    let roots: Vec<Client> = (0..3).map(|_| srv.attach()).collect();
    for c in &roots {
        c.nop().unwrap();
    }
}

/// Child: attaches three times as uid 65534; reports the third's outcome.
#[test]
fn child_attach_many() {
    let Some(()) = child_role("attach-many") else {
        return;
    };
    let path = env("TCPS_IT_SOCKET");
    let first: Vec<Client> = (0..2).map(|_| Client::attach(&path).unwrap()).collect();
    mark("attached", first.len());
    match Client::attach(&path) {
        Ok(_) => mark("third", "attached"),
        Err(e) => mark(
            "third",
            format!("{} {}", errno_name(errno_of(&e)), tcps::last_attach_error()),
        ),
    }
    std::thread::sleep(Duration::from_secs(30));
}
