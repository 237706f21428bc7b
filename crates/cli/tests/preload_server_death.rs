//! Programs under `tcps run` survive the TCP server's death (issue 18 item
//! 2): when the server is killed with SIGKILL every offloaded socket
//! reports a reset once (EPOLLERR|EPOLLHUP from epoll_wait, then
//! ECONNRESET from recv, ECONNABORTED from accept) and is quiet afterwards:
//! the program neither spins nor floods its log. New sockets fall back to
//! the kernel (`--fallback kernel`, the default).

mod common;
mod preload;

use common::{Server, TempDir};
use preload::*;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/server_death.py");

/// An epoll echo server (Python) with a listener and two connections: after
/// the kill each socket reports once, the loop wakes only for what the test
/// does afterwards, uses no CPU to speak of, and a new listener made after
/// the death (on the kernel) serves.
#[test]
fn epoll_program_reports_the_death_once() {
    let mut srv = Server::start("uring", &[]);
    let dir = TempDir::new("server-death");
    let log = dir.path().join("probe.out");
    let stats = dir.path().join("probe.stats");
    let mut cmd = command(Net::Tcps, &srv, &stats, &log, &["python3", PROBE]);
    cmd.stdin(Stdio::piped());
    let mut probe = cmd.spawn().expect("spawn the probe");
    let mut stdin = probe.stdin.take().unwrap();
    let port: u16 = wait_line(&log, "listening ")[10..].trim().parse().unwrap();
    let mut clients: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    for c in &mut clients {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        echo(c, b"before the death");
    }
    assert!(
        srv.stat_json()["hosts"]
            .as_array()
            .is_some_and(|h| !h.is_empty()),
        "the probe is not attached"
    );
    srv.kill9();
    // The reports, once each.
    wait_line(&log, "accept error");
    std::thread::sleep(Duration::from_secs(2));
    stdin.write_all(b"new\n").unwrap();
    let new_port: u16 = wait_line(&log, "relisten ")[9..].trim().parse().unwrap();
    let mut fresh = TcpStream::connect(("127.0.0.1", new_port)).unwrap();
    fresh
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    echo(&mut fresh, b"after the death, on the kernel");
    stop(&mut probe, libc::SIGTERM);
    let out = read(&log);
    let count = |p: &str| out.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(count("errhup listener"), 1, "{out}");
    assert_eq!(count("accept error ECONNABORTED"), 1, "{out}");
    assert_eq!(count("errhup client"), 2, "{out}");
    assert_eq!(count("recv error ECONNRESET"), 2, "{out}");
    assert_eq!(count("epoll error"), 0, "{out}");
    assert_eq!(
        count("the tcps server is gone") + count("tcps["),
        1,
        "{out}"
    );
    let last = wait_line(&log, "wakes after the first error ");
    let words: Vec<&str> = last.split_whitespace().collect();
    let wakes: u32 = words[5].parse().unwrap();
    let cpu: f64 = words[7].parse().unwrap();
    // The reports (one or two wakes), the command, the new connection
    // and its bytes: nothing else in over 2 s.
    assert!(wakes <= 6, "{wakes} wakes after the death:\n{out}");
    assert!(cpu < 0.3, "{cpu} s of CPU after the death:\n{out}");
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// nginx (master + 2 workers) with keep-alive connections open: after the
/// kill its workers log a few lines, not thousands, use (almost) no CPU,
/// and new clients are refused (the listener stopped listening).
#[test]
fn nginx_stays_quiet_after_the_death() {
    need("nginx");
    let mut srv = Server::start("uring", &[]);
    let dir = TempDir::new("server-death-nginx");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    std::fs::write(www.join("a.txt"), b"hello").unwrap();
    let port = free_port();
    let (mut nginx, _stats, log) =
        start_nginx(Net::Tcps, &srv, dir.path(), &www, port, true, "death");
    let mut conns: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.contains("200"), "nginx answered {status:?}");
        conns.push(s);
    }
    let pids = nginx_pids(nginx.0.id());
    assert!(pids.len() >= 3, "master + 2 workers expected: {pids:?}");
    srv.kill9();
    std::thread::sleep(Duration::from_millis(500));
    let error_log = dir.path().join("error.log");
    let lines_before = read(&error_log).lines().count();
    let ticks_before: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    std::thread::sleep(Duration::from_secs(2));
    let ticks = pids.iter().map(|&p| cpu_ticks(p)).sum::<u64>() - ticks_before;
    let lines = read(&error_log).lines().count() - lines_before;
    // The connections were reset.
    for c in &mut conns {
        let mut b = [0u8; 4096];
        let mut ended = false;
        for _ in 0..10 {
            match c.read(&mut b) {
                Ok(0) | Err(_) => {
                    ended = true;
                    break;
                }
                Ok(_) => continue,
            }
        }
        assert!(ended, "a connection of the dead server stays open");
    }
    // Its listener stopped listening: a new client is refused at once,
    // as by a dead backend, not queued for nobody.
    assert_refused(port, "nginx");
    stop(&mut nginx.0, libc::SIGQUIT);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    assert!(
        ticks * 1000 / hz < 200,
        "nginx used {} ms of CPU in the 2 s after the death",
        ticks * 1000 / hz
    );
    assert!(
        lines < 20,
        "nginx logged {lines} lines in the 2 s after the death:\n{}",
        read(&error_log)
    );
    eprintln!(
        "after the death: {} ms CPU, {lines} log lines in 2 s\n{}",
        ticks * 1000 / hz,
        read(&log)
    );
}

/// A connection to 127.0.0.1:`port` is refused within 2 s of the death (the
/// program notices it within its wait's 100 ms check).
fn assert_refused(port: u16, what: &str) {
    let t = std::time::Instant::now();
    loop {
        match TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
        {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return,
            r => assert!(
                t.elapsed() < Duration::from_secs(2),
                "{what}: a new client was not refused after the server's death: {r:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// redis under `tcps run`: after the server's death a new client is refused
/// (the listener stopped listening, it did not hang); with
/// `--exit-on-server-death` redis exits with status 75 for its supervisor.
#[test]
fn redis_refuses_or_exits_after_the_death() {
    need("redis-server");
    for exit in [false, true] {
        let mut srv = Server::start("uring", &[]);
        let dir = TempDir::new("server-death-redis");
        let port = free_port();
        let p = port.to_string();
        let stats = dir.path().join("redis.stats");
        let log = dir.path().join("redis.log");
        let argv = [
            "redis-server",
            "--port",
            &p,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ];
        let mut cmd = command(Net::Tcps, &srv, &stats, &log, &argv);
        if exit {
            cmd.env("TCPS_EXIT_ON_SERVER_DEATH", "1");
        }
        let mut child = cmd.spawn().expect("spawn redis");
        wait_port(port, &mut child, "redis", &log);
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"PING\r\n").unwrap();
        let mut b = [0u8; 7];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"+PONG\r\n");
        srv.kill9();
        if exit {
            let st = common::wait_timeout(&mut child, Duration::from_secs(5));
            assert_eq!(
                st.and_then(|s| s.code()),
                Some(75),
                "redis did not exit with 75 after the death:\n{}",
                read(&log)
            );
        } else {
            assert_refused(port, "redis");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
