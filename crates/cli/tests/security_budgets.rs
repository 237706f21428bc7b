//! Security issue 12, budgets: one host cannot make the server hold without
//! bound what it asks it to hold, and `/metrics` shows no user's hosts
//! unless the operator asks.
//!
//! * finding 13: fork snapshots (each dup()s every socket of the host) are
//!   refused beyond the user's budget with EAGAIN; the server's descriptors
//!   stay bounded and a fresh host still attaches;
//! * finding 14: pull buffers grow as bytes arrive (idle pull sockets cost
//!   the server nothing) and a host's pull bytes have a budget beyond which
//!   bytes stay in the kernel, never lost;
//! * finding 15: a send-queue overrun fails the queue for good (EPROTO) and
//!   takes no more jobs, so repeating it behind a parked send does not
//!   grow the server;
//! * finding 16: registered bytes and registrations per host are budgeted
//!   (ENOMEM, ENOSPC) and a fresh host can still attach and register;
//! * finding 6: `/metrics` without `--metrics-per-host` has totals only.
//!
//! The attackers speak the raw protocol (`RawHost`): they control their
//! region, their control messages and the descriptors they pass.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};
use tcps_proto::Call;

// ---- a raw host on channel 0 ------------------------------------------------

/// Channel 0 driven by hand ([`RawCalls`]), plus control messages.
struct Raw(RawCalls);

impl std::ops::Deref for Raw {
    type Target = RawCalls;
    fn deref(&self) -> &RawCalls {
        &self.0
    }
}

impl Raw {
    fn new(srv: &Server) -> Raw {
        let h = RawHost::attach(&srv.socket).unwrap();
        let t = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: a valid timeval of its size on our control socket.
        unsafe {
            libc::setsockopt(
                h.ctl.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &t as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Raw(RawCalls::new(h))
    }

    /// A TCP socket made here (as a host makes its sockets, under its own
    /// credentials) and handed to the server: its socket id.
    fn socket(&self) -> u32 {
        self.adopt(None)
    }

    /// As [`socket`](Self::socket), bound to `addr` here first.
    fn socket_bound(&self, addr: SocketAddr) -> u32 {
        self.adopt(Some(addr))
    }

    fn adopt(&self, bind: Option<SocketAddr>) -> u32 {
        let sock = match bind {
            Some(a) => plain_kernel_bind(a).expect("bind"),
            None => {
                // SAFETY: plain syscall; the result is checked.
                let fd = unsafe {
                    libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
                };
                assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
                // SAFETY: a fresh descriptor we own.
                unsafe { OwnedFd::from_raw_fd(fd) }
            }
        };
        // The server keeps its own copy; ours closes when `sock` drops.
        self.h
            .adopt_socket(sock.as_raw_fd(), false)
            .unwrap_or_else(|e| panic!("SocketAdopt: errno {e}"))
    }

    /// A control message and the errno of its reply.
    fn control(&self, m: ControlMsg, fds: &[RawFd]) -> i32 {
        fdpass::send_with_fds(self.h.ctl.as_raw_fd(), &m.encode(), fds).expect("control send");
        let mut b = [0u8; CONTROL_MSG_LEN];
        let (n, _) = fdpass::recv_with_fds(self.h.ctl.as_raw_fd(), &mut b, 0).expect("reply");
        match ControlMsg::decode(&b[..n]) {
            Some(ControlMsg::Reply { errno, .. }) => errno,
            other => panic!("not a reply: {other:?} ({n} bytes)"),
        }
    }
}

fn sockaddr(a: std::net::SocketAddr) -> Vec<u8> {
    let std::net::SocketAddr::V4(v4) = a else {
        panic!("IPv4 only")
    };
    let mut b = vec![0u8; 16];
    b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    b[2..4].copy_from_slice(&v4.port().to_be_bytes());
    b[4..8].copy_from_slice(&v4.ip().octets());
    b
}

// ---- the server process, measured ------------------------------------------

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A fresh library host attaches and gets a round trip within `limit`.
fn fresh_host_works(srv: &Server, limit: Duration) -> tcps::Client {
    let t = Instant::now();
    let c = srv.attach();
    let s = c
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .expect("socket");
    c.close(s).expect("close");
    assert!(
        t.elapsed() < limit,
        "a fresh host took {:?} to attach and make a socket",
        t.elapsed()
    );
    c
}

// ---- finding 13: fork snapshots ------------------------------------------------

/// 100 sockets x 198 fork snapshots reached the server's descriptor limit
/// (attaches then stalled). Now the user's pending snapshots are budgeted:
/// beyond it a snapshot is refused with EAGAIN, the server's descriptors
/// stay bounded, and another host attaches at once.
#[test]
fn fork_snapshots_are_budgeted() {
    // The default budgets: 64 snapshots, 4096 descriptors per user.
    let srv = Server::start("uring", &["--poll", "adaptive", "--socket-mode", "666"]);
    let pid = srv.pid();
    let raw = Raw::new(&srv);
    for _ in 0..100 {
        raw.socket();
    }
    let before = fd_count(pid);
    let mut ok = 0;
    let mut refused = 0;
    for nonce in 1..=198u32 {
        match raw.control(ControlMsg::Fork { handle: nonce }, &[]) {
            0 => ok += 1,
            libc::EAGAIN => refused += 1,
            e => panic!("fork snapshot {nonce}: {}", errno_name(e)),
        }
    }
    let grown = fd_count(pid).saturating_sub(before);
    // 4096 descriptors / 100 sockets each: 40 snapshots.
    assert_eq!(ok, 40, "snapshots accepted ({refused} refused)");
    assert_eq!(refused, 158);
    assert!(
        grown <= 4096 + 50,
        "the server holds {grown} more descriptors"
    );
    assert!(
        srv.log_text().contains("snapshot refused"),
        "no log line for the refusal:\n{}",
        srv.log_text()
    );
    fresh_host_works(&srv, Duration::from_millis(500));
    // A repeated nonce whose snapshot waits is refused before any dup()
    // (each repeat redid the whole snapshot: a worker stall).
    assert_eq!(
        raw.control(ControlMsg::Fork { handle: 1 }, &[]),
        libc::EBUSY
    );
}

// ---- finding 16: registered memory ----------------------------------------

/// A sparse memfd of `len` bytes, sealed against shrinking.
fn sparse_memfd(len: u64) -> OwnedFd {
    // SAFETY: memfd_create with a valid name; checked.
    let fd = unsafe { libc::memfd_create(c"attack".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor we own; resized and sealed.
    unsafe {
        assert_eq!(libc::ftruncate(fd, len as i64), 0, "ftruncate");
        assert_eq!(
            libc::fcntl(
                fd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0
        );
        OwnedFd::from_raw_fd(fd)
    }
}

/// 1024 registrations x 64 GiB of one sparse memfd per host filled the
/// server's address space. Now each host has a budget of registered bytes
/// (ENOMEM beyond) and of registrations (ENOSPC beyond), and a fresh host
/// can still attach and register the library's 16 MiB staging pool.
#[test]
fn registered_memory_is_budgeted() {
    // The default budgets: 1 GiB and 256 registrations per host.
    let srv = Server::start("uring", &["--poll", "adaptive", "--socket-mode", "666"]);
    let raw = Raw::new(&srv);
    let huge = sparse_memfd(64 << 30);
    for handle in 0..4 {
        let e = raw.control(
            ControlMsg::Register {
                handle,
                len: 64 << 30,
            },
            &[huge.as_raw_fd()],
        );
        assert_eq!(e, libc::ENOMEM, "a 64 GiB registration: {}", errno_name(e));
    }
    let small = sparse_memfd(1 << 20);
    let mut ok = 0;
    let mut last = 0;
    for handle in 0..300 {
        last = raw.control(
            ControlMsg::Register {
                handle,
                len: 1 << 20,
            },
            &[small.as_raw_fd()],
        );
        if last != 0 {
            break;
        }
        ok += 1;
    }
    assert_eq!(ok, 256, "registrations accepted");
    assert_eq!(last, libc::ENOSPC, "beyond the count: {}", errno_name(last));
    // Room again after a deregistration.
    assert_eq!(raw.control(ControlMsg::Deregister { handle: 0 }, &[]), 0);
    assert_eq!(
        raw.control(
            ControlMsg::Register {
                handle: 0,
                len: 1 << 20
            },
            &[small.as_raw_fd()]
        ),
        0
    );
    assert!(
        srv.log_text().contains("registration refused"),
        "no log line:\n{}",
        srv.log_text()
    );
    let c = fresh_host_works(&srv, Duration::from_millis(500));
    let (_, mem) = c
        .alloc_registered(16 << 20)
        .expect("a fresh host registers");
    c.deregister_memory(mem).unwrap();
}

// ---- finding 15: send-queue overrun ------------------------------------------

/// A blocking Send parked on a connection whose peer never reads, then the
/// socket's send queue bound: jobs published now wait behind that send.
/// Returns (raw host, socket, kernel peer, listener).
fn parked_send_with_queue(srv: &Server) -> (Raw, u32, TcpStream, TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let raw = Raw::new(srv);
    let s = raw.socket();
    assert!(
        s < raw.h.region.layout().send_queues,
        "socket {s} has a queue"
    );
    let c = raw.run_with(&4096i32.to_ne_bytes(), |value| Call::SetSockOpt {
        sock: s,
        level: libc::SOL_SOCKET,
        name: libc::SO_SNDBUF,
        value,
    });
    assert_eq!(c.result, 0, "SO_SNDBUF: {c:?}");
    let c = raw.run_with(&sockaddr(l.local_addr().unwrap()), |addr| Call::Connect {
        sock: s,
        addr,
    });
    assert_eq!(c.result, 0, "connect: {c:?}");
    let (peer, _) = l.accept().unwrap();
    set_rcvbuf(&peer, 4096);
    // A whole arena of data: far more than both buffers hold.
    let arena = raw.h.region.layout().arena_size;
    raw.post(
        Call::Send {
            sock: s,
            data: span(0, arena),
            flags: 0,
        }
        .encode(),
    );
    let c = raw.run(Call::AsyncBind {
        sock: s,
        queue: s,
        start: 0,
    });
    assert_eq!(c.result, 0, "AsyncBind: {c:?}");
    (raw, s, peer, l)
}

/// Repeating an overrun (head beyond the credits) and 64 more descriptors
/// behind a parked blocking Send grew the server without bound (1M jobs,
/// +110 MB in 12 s). Now the first overrun fails the queue for good with
/// EPROTO and nothing more is taken: the server's memory stays flat.
fn send_queue_overrun_is_final(engine: &str) {
    let srv = Server::start(engine, &["--poll", "adaptive", "--socket-mode", "666"]);
    let pid = srv.pid();
    let (raw, s, _peer, _l) = parked_send_with_queue(&srv);
    let sq = raw.h.region.send_queue(s).unwrap();
    let entries = raw.h.region.layout().sq_entries;
    std::thread::sleep(Duration::from_millis(100));
    let before = rss_kib(pid);
    let t = Instant::now();
    let mut rounds = 0u32;
    while t.elapsed() < Duration::from_secs(3) {
        let done = sq.ctl().done.load(Ordering::Acquire);
        // Overrun: one descriptor more than the credits allow.
        let over = done.wrapping_add(entries + 1);
        sq.ctl().head.store(over, Ordering::Release);
        raw.post(Call::AsyncKick { sock: s }.encode());
        // A server that resets the queue publishes done = head at once.
        let w = Instant::now();
        while sq.ctl().done.load(Ordering::Acquire) != over
            && w.elapsed() < Duration::from_millis(2)
        {
            std::hint::spin_loop();
        }
        // A full queue's worth more, which such a server takes as jobs.
        sq.ctl()
            .head
            .store(over.wrapping_add(entries), Ordering::Release);
        raw.post(Call::AsyncKick { sock: s }.encode());
        rounds += 1;
    }
    // Let the server take what was posted.
    let w = Instant::now();
    let ch = raw.h.region.channel(0).unwrap();
    while ch.ctl().req_head.load(Ordering::Acquire) != raw.posted()
        && w.elapsed() < Duration::from_secs(5)
    {
        raw.h.ring();
        std::thread::sleep(Duration::from_millis(1));
    }
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("{rounds} overrun rounds: the server grew by {grown} KiB");
    assert!(
        grown < 8 * 1024,
        "{rounds} overrun rounds grew the server by {grown} KiB"
    );
    assert_eq!(
        sq.ctl().error.load(Ordering::Acquire),
        libc::EPROTO,
        "the overrun queue's error"
    );
    assert_eq!(
        sq.ctl().done.load(Ordering::Acquire),
        0,
        "jobs behind the parked send are not reported done"
    );
    // Other hosts are served as usual.
    fresh_host_works(&srv, Duration::from_millis(500));
}

engine_tests!(send_queue_overrun_is_final);

// ---- finding 14: pull buffers ------------------------------------------------

/// `n` kernel clients connected to a tcps listener and accepted by the host
/// (pull mode: each starts reading ahead at accept).
fn pull_connections(c: &tcps::Client, n: usize) -> (Vec<(u32, TcpStream)>, u32) {
    let (l, addr) = tcps_listener(c);
    let mut out = Vec::new();
    for _ in 0..n {
        let k = TcpStream::connect(addr).unwrap();
        let (s, _) = c.accept(l, 0).unwrap();
        out.push((s, k));
    }
    (out, l)
}

/// 20 idle pull sockets of 16 MiB each took the server from 6 MB to 334 MB:
/// the buffers were allocated (and zeroed) before any byte arrived. Now a
/// buffer grows as bytes arrive: idle sockets cost (almost) nothing.
fn idle_pull_sockets_cost_nothing(engine: &str) {
    let srv = Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--eager-recv",
            "pull",
            "--eager-recv-size",
            "16777216",
        ],
    );
    let pid = srv.pid();
    let c = srv.attach();
    let (l0, _) = tcps_listener(&c);
    c.close(l0).unwrap();
    let before = rss_kib(pid);
    let (conns, _l) = pull_connections(&c, 20);
    std::thread::sleep(Duration::from_millis(200));
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("20 idle pull sockets: the server grew by {grown} KiB");
    assert!(
        grown < 4 * 1024,
        "20 idle pull sockets grew the server by {grown} KiB"
    );
    // They still work: bytes sent now are read ahead and received.
    for (i, (s, k)) in conns.iter().enumerate() {
        let msg = format!("hello {i}");
        (&*k).write_all(msg.as_bytes()).unwrap();
        assert_eq!(tcps_recv_exact(&c, *s, msg.len()).unwrap(), msg.as_bytes());
    }
}

engine_tests!(idle_pull_sockets_cost_nothing);

/// A host's pull buffers have a budget: with 20 connections each sent
/// 2 MiB that the host does not read yet, the server holds at most about
/// the budget; the rest stays in the kernel, and every byte arrives when
/// the host reads (from the buffer, then from the kernel).
fn pull_budget_keeps_bytes_in_the_kernel(engine: &str) {
    let srv = Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--eager-recv",
            "pull",
            "--eager-recv-size",
            "16777216",
            "--max-pull-bytes-per-host",
            "1048576",
        ],
    );
    let pid = srv.pid();
    let c = srv.attach();
    let (l0, _) = tcps_listener(&c);
    c.close(l0).unwrap();
    let before = rss_kib(pid);
    const EACH: usize = 2 << 20;
    let (conns, _l) = pull_connections(&c, 20);
    let mut writers = Vec::new();
    let mut socks = Vec::new();
    for (i, (s, k)) in conns.into_iter().enumerate() {
        socks.push(s);
        writers.push(std::thread::spawn(move || {
            let mut k = k;
            let data = Rng::new(i as u64 + 1).bytes(EACH);
            k.write_all(&data).unwrap();
            k.shutdown(Shutdown::Write).unwrap();
            // Hold the connection until the host read it all.
            let mut rest = Vec::new();
            let _ = k.read_to_end(&mut rest);
            sha256(&data)
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("40 MiB sent to a host with a 1 MiB pull budget: the server grew by {grown} KiB");
    assert!(
        grown < 8 * 1024,
        "a 1 MiB pull budget, yet the server grew by {grown} KiB"
    );
    // The server's own count (`tcps stat`, published every 100 ms).
    let held = srv.stat_json()["total"]["depths"]["pull_buffer_bytes"]
        .as_u64()
        .expect("total.depths.pull_buffer_bytes");
    assert!(
        held > 0 && held <= 1 << 20,
        "pull buffers hold {held} B under a 1 MiB budget"
    );
    for (s, w) in socks.into_iter().zip(writers) {
        let got = tcps_recv_to_eof(&c, s, 64 << 10);
        c.close(s).unwrap();
        let want = w.join().unwrap();
        assert_eq!(got.len(), EACH, "bytes received on socket {s}");
        assert_eq!(sha256(&got), want, "bytes of socket {s}");
    }
}

engine_tests!(pull_budget_keeps_bytes_in_the_kernel);

// ---- parked polls ----------------------------------------------------------------

/// A host could park a poll of 4096 entries on every channel slot (16,384
/// by default): about 1.3 GB of server memory. Now the entries of a host's
/// parked polls are budgeted (65,536): a poll beyond it fails at once with
/// ENOMEM, and the host's other calls are still served.
#[test]
fn parked_poll_entries_are_budgeted() {
    let srv = Server::start("uring", &["--poll", "adaptive", "--socket-mode", "666"]);
    let raw = Raw::new(&srv);
    let l = raw.socket_bound("127.0.0.1:0".parse().unwrap());
    let listen = Call::Listen {
        sock: l,
        backlog: 16,
    };
    assert_eq!(raw.run(listen).result, 0, "listen");
    // 4096 entries, all the idle listener, for POLLIN: never ready.
    let mut set = Vec::with_capacity(4096 * 8);
    for _ in 0..4096 {
        set.extend_from_slice(&l.to_ne_bytes());
        set.extend_from_slice(&libc::POLLIN.to_ne_bytes());
        set.extend_from_slice(&0i16.to_ne_bytes());
    }
    raw.arena(0, &set);
    let first = raw.posted();
    for _ in 0..17 {
        raw.post(
            Call::Poll {
                entries: span(0, set.len() as u32),
                n: 4096,
                timeout_ms: -1,
            }
            .encode(),
        );
    }
    // 16 polls park (65,536 entries); the 17th is refused.
    let c = raw
        .next_completion(Duration::from_secs(2))
        .expect("the poll beyond the budget was parked too");
    assert_eq!(c.user_data, u64::from(first) + 17, "{c:?}");
    assert_eq!(c.errno, libc::ENOMEM, "{c:?}");
    let c = raw.run(Call::Nop);
    assert_eq!((c.result, c.errno), (0, 0), "a Nop after: {c:?}");
    fresh_host_works(&srv, Duration::from_millis(500));
}

// ---- finding 6: /metrics ------------------------------------------------------

fn http_get(addr: &str, path: &str) -> String {
    let mut k = TcpStream::connect(addr).unwrap();
    k.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(k, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    k.read_to_string(&mut out).unwrap();
    out
}

/// `/metrics` showed every user's hosts (pids, counters) to anyone who
/// reached it. Without `--metrics-per-host` it has server totals only.
#[test]
fn metrics_totals_only_without_the_flag() {
    let srv = Server::start(
        "uring",
        &["--poll", "adaptive", "--metrics-listen", "127.0.0.1:0"],
    );
    let addr = srv.metrics_addr();
    let c = srv.attach();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.close(s).unwrap();
    // The workers publish every 100 ms: wait until the totals show the calls.
    let t = Instant::now();
    let text = loop {
        let text = http_get(&addr, "/metrics");
        if text.contains("tcps_calls_total{op=\"Close\"} 1") || t.elapsed() > Duration::from_secs(5)
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("tcps_calls_total{op=\"Close\"} 1"), "{text}");
    assert!(text.contains("tcps_hosts_attached 1"), "{text}");
    assert!(!text.contains("tcps_host_"), "per-host series:\n{text}");
    let mine = format!("pid=\"{}\"", std::process::id());
    assert!(!text.contains(&mine), "our pid is shown:\n{text}");
    assert!(!text.contains("uid=\""), "a uid is shown:\n{text}");
}
