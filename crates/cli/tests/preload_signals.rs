//! Signals interrupt blocking calls as the kernel's do (issue 18 item 1).
//!
//! `tests/preload/signals.c` runs each case on kernel sockets and through
//! `tcps run`, and the outputs must be equal: SIGALRM breaking a blocking
//! accept and recv with EINTR (handlers without `SA_RESTART`, installed
//! with `sigaction`, `SA_SIGINFO` or not, or with `signal` +
//! `siginterrupt`), restarting them with `SA_RESTART`, EINTR despite
//! `SA_RESTART` with `SO_RCVTIMEO` and for poll, epoll_wait, select and
//! ppoll, `pthread_kill` interrupting one thread's recv and not another's,
//! a `signalfd` program's recv not interrupted, an interrupted
//! `MSG_WAITALL` recv returning the bytes it got, a blocking send to a peer
//! that does not read returning the count of what went (exactly those bytes
//! arrive; `sendfile` too), and 8 MiB received under
//! a 2 ms timer with and without `SA_RESTART` (checksums). Through tcps it
//! runs twice: with receive and accept rings (waits in host memory) and
//! with eager receive and accept off (calls parked at the server, which
//! the library cancels: `Cancel` requests counted).
//!
//! The native API (`tcps::Client`, no trampolines) returns EINTR when a
//! handler interrupts its wait, on both paths.

mod common;
mod preload;

use common::{Server, TempDir};
use preload::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/signals.c");
const ALARM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/alarm_accept.py");

fn build(dir: &Path) -> PathBuf {
    let exe = dir.join("signals");
    let out = std::process::Command::new("cc")
        .args(["-O1", "-pthread", "-Wno-deprecated-declarations", "-o"])
        .arg(&exe)
        .arg(SRC)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The probe's output on `net` (through `srv` for tcps).
fn run(net: Net, srv: &Server, dir: &Path, tag: &str, exe: &Path) -> String {
    run_argv(net, srv, dir, tag, &[exe.to_str().unwrap()], 20)
}

/// `argv`'s output on `net`; through tcps, checks that it made at least
/// `sockets` offloaded sockets and no kernel TCP socket.
fn run_argv(net: Net, srv: &Server, dir: &Path, tag: &str, argv: &[&str], sockets: u64) -> String {
    let log = dir.join(format!("{tag}.out"));
    let stats = dir.join(format!("{tag}.stats"));
    let cmd = command(net, srv, &stats, &log, argv);
    assert!(
        run_to_end(cmd, &log, Duration::from_secs(90)),
        "{tag}: the probe failed:\n{}",
        read(&log)
    );
    if net == Net::Tcps {
        let s = summaries(&stats);
        assert!(
            s.iter()
                .any(|s| s.offloaded >= sockets && s.kernel_tcp == 0),
            "{tag}: not offloaded: {s:?}"
        );
    }
    read(&log)
}

fn cancels(srv: &Server) -> u64 {
    srv.stat_json()["total"]["counters"]["calls"]["Cancel"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn signals_interrupt_as_on_kernel_sockets() {
    let dir = TempDir::new("preload-signals");
    let exe = build(dir.path());
    let rings = Server::start("uring", &[]);
    let kernel = run(Net::Kernel, &rings, dir.path(), "kernel", &exe);
    // The probe itself says what the kernel does.
    for line in [
        "accept restart=0 siginfo=0: -1 EINTR handled=1",
        "accept restart=1 siginfo=0: ok  handled=1",
        "recv restart=1 rcvtimeo=1 -> -1: -1 EINTR handled=1",
        "epoll_wait SA_RESTART: -1 EINTR handled=1",
        "pthread_kill: t1 -1 EINTR, t2 2 ok, handled=1",
        "signalfd: recv 5 ok, signalfd read SIGUSR2, handled=0",
        "waitall: first 50000 ok, total 1048576, intact 1, handled=1",
        "send restart=0: partial, arrived exactly those bytes, handled=1",
        "sendfile: partial, offset moved by the count, arrived exactly those bytes, handled=1",
        "storm restart=1: total 8388608, intact 1, eintr seen no",
        "done",
    ] {
        assert!(
            kernel.contains(line),
            "kernel run lacks {line:?}:\n{kernel}"
        );
    }
    let tcps = run(Net::Tcps, &rings, dir.path(), "rings", &exe);
    assert_eq!(tcps, kernel, "through tcps (rings) differs from the kernel");
    let parked = Server::start("epoll", &["--eager-recv", "off", "--eager-accept", "off"]);
    let tcps = run(Net::Tcps, &parked, dir.path(), "parked", &exe);
    assert_eq!(
        tcps, kernel,
        "through tcps (calls parked at the server) differs from the kernel"
    );
    let n = cancels(&parked);
    assert!(
        n >= 8,
        "only {n} Cancel requests: the parked calls were not cancelled"
    );
}

/// Python's way (`signal.signal` + `signal.siginterrupt`), as the issue
/// found it: SIGALRM after 0.5 s breaks a blocking accept.
#[test]
fn python_alarm_breaks_accept() {
    let dir = TempDir::new("preload-alarm");
    let srv = Server::start("uring", &[]);
    let argv = ["python3", ALARM];
    let kernel = run_argv(Net::Kernel, &srv, dir.path(), "kernel", &argv, 0);
    assert!(
        kernel.contains("alarm broke accept after 0.5 s")
            && kernel.contains("accepted after the handler ran: True"),
        "{kernel}"
    );
    let tcps = run_argv(Net::Tcps, &srv, dir.path(), "tcps", &argv, 2);
    assert_eq!(tcps, kernel);
}

extern "C" fn noop(_: libc::c_int) {}

/// A SIGUSR1 handler without SA_RESTART for this test process.
fn install_noop() {
    // SAFETY: installing a handler that does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = noop as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
}

/// Runs `f` on a thread and signals it with SIGUSR1 every 200 ms until it
/// returns (a signal that comes before the wait began is missed, as by the
/// kernel), at most 10 s; returns what `f` returned.
fn interrupted<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::unix::thread::JoinHandleExt;
    let t = std::thread::spawn(f);
    let start = std::time::Instant::now();
    while !t.is_finished() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the call was never interrupted"
        );
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signalling a thread of this process that has not been joined.
        unsafe { libc::pthread_kill(t.as_pthread_t(), libc::SIGUSR1) };
    }
    t.join().expect("thread")
}

#[test]
fn native_api_returns_eintr() {
    use std::io::Write;
    install_noop();
    for (engine, extra) in [
        ("uring", &[][..]),
        (
            "epoll",
            &["--eager-recv", "off", "--eager-accept", "off"][..],
        ),
    ] {
        let srv = Server::start(engine, extra);
        let c = std::sync::Arc::new(srv.attach());
        let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 4).unwrap();
        let c2 = c.clone();
        let r = interrupted(move || c2.accept(l, 0).map(|_| ()));
        let e = r.expect_err("accept returned without a connection");
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "{engine} accept: {e}");
        // The listener still works, and a recv is interrupted the same way.
        let addr = c.getsockname(l).unwrap();
        let mut peer = std::net::TcpStream::connect(addr).unwrap();
        let (s, _) = c.accept(l, 0).unwrap();
        let c2 = c.clone();
        let r = interrupted(move || c2.recv(s, &mut [0u8; 64], 0));
        let e = r.expect_err("recv returned without data");
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "{engine} recv: {e}");
        peer.write_all(b"after").unwrap();
        let mut buf = [0u8; 64];
        let n = c.recv(s, &mut buf, 0).unwrap();
        assert_eq!(
            &buf[..n],
            b"after",
            "{engine}: bytes after the interruption"
        );
        if engine == "epoll" {
            assert!(
                cancels(&srv) >= 2,
                "{engine}: the parked calls were not cancelled"
            );
        }
    }
}

/// The protocol itself (`Cancel`, by hand on channel 0): a parked
/// `MSG_WAITALL` recv that got bytes completes with them, one that got
/// nothing and a parked poll complete with EINTR, a cancel of a call
/// answered already is answered by nothing, and the socket works on.
#[test]
fn cancel_completes_parked_calls() {
    use common::{span, RawCalls, RawHost};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use tcps_proto::Call;
    for engine in ["uring", "epoll"] {
        let srv = Server::start(engine, &["--eager-recv", "off", "--eager-accept", "off"]);
        let raw = RawCalls::new(RawHost::attach(&srv.socket).unwrap());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mine = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        let sock = raw.h.adopt_socket(mine.as_raw_fd(), false).unwrap();
        drop(mine); // the server holds its own copy
        let cancel = |target: u64| raw.post(Call::Cancel { sock, target }.encode());
        // A recv that got part of what it waits for.
        let target = u64::from(raw.posted()) + 1;
        raw.post(
            Call::Recv {
                sock,
                data: span(0, 100_000),
                flags: libc::MSG_WAITALL,
            }
            .encode(),
        );
        let sent: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        peer.write_all(&sent).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            raw.next_completion(Duration::ZERO).is_none(),
            "{engine}: recv did not wait"
        );
        cancel(target);
        let c = raw
            .next_completion(Duration::from_secs(5))
            .expect("recv answered");
        assert_eq!(
            (c.user_data, c.errno, c.result),
            (target, 0, 1000),
            "{engine}"
        );
        assert_eq!(raw.arena_out(0, 1000), sent, "{engine}: the bytes");
        // One that got nothing, then a poll.
        let target = u64::from(raw.posted()) + 1;
        raw.post(
            Call::Recv {
                sock,
                data: span(0, 100),
                flags: 0,
            }
            .encode(),
        );
        cancel(target);
        let c = raw
            .next_completion(Duration::from_secs(5))
            .expect("recv answered");
        assert_eq!((c.user_data, c.errno), (target, libc::EINTR), "{engine}");
        let mut bytes = sock.to_ne_bytes().to_vec();
        bytes.extend(libc::POLLIN.to_ne_bytes());
        bytes.extend(0i16.to_ne_bytes());
        assert_eq!(
            bytes.len(),
            std::mem::size_of::<tcps_proto::msg::PollEntry>()
        );
        raw.arena(0, &bytes);
        let target = u64::from(raw.posted()) + 1;
        raw.post(
            Call::Poll {
                entries: span(0, 8),
                n: 1,
                timeout_ms: -1,
            }
            .encode(),
        );
        std::thread::sleep(Duration::from_millis(100));
        cancel(target);
        let c = raw
            .next_completion(Duration::from_secs(5))
            .expect("poll answered");
        assert_eq!((c.user_data, c.errno), (target, libc::EINTR), "{engine}");
        // Nothing to cancel: no answer; the socket still receives.
        cancel(target);
        assert!(
            raw.next_completion(Duration::from_millis(200)).is_none(),
            "{engine}"
        );
        peer.write_all(b"more").unwrap();
        let c = raw.run(Call::Recv {
            sock,
            data: span(0, 100),
            flags: 0,
        });
        assert_eq!(c.result, 4, "{engine}: recv after the cancels");
        assert_eq!(raw.arena_out(0, 4), b"more", "{engine}");
    }
}
