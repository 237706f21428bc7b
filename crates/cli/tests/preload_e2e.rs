//! End-to-end tests of `tcps run` / libtcps_preload.so with programs nobody
//! here wrote. Each runs the same program on kernel sockets and through the
//! TCP server and compares what clients see; each also checks (from the
//! library's per-process summary and the server's log) that the sockets
//! really were offloaded, so a silent fallback fails the test.

mod common;
mod preload;

use common::{Server, TempDir, TCPS};
use preload::*;
use std::process::Command;
use std::time::Duration;

const PROBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/probe.py");

fn server() -> Server {
    Server::start("uring", &["--poll", "adaptive"])
}

/// The socket-emulation probe (blocking and non-blocking calls, poll,
/// select, mixed and edge-triggered epoll, dup, options, shutdown, refused
/// connects, IPv6, UDP/Unix pass-through) prints the same on both.
#[test]
fn probe_matches_kernel() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("probe");
    let mut outputs = Vec::new();
    for net in [Net::Kernel, Net::Tcps] {
        let stats = dir.path().join(format!("{net:?}.stats"));
        let log = dir.path().join(format!("{net:?}.out"));
        let ok = run_to_end(
            command(net, &srv, &stats, &log, &["python3", PROBE]),
            &log,
            Duration::from_secs(120),
        );
        assert!(ok, "probe failed on {net:?}:\n{}", read(&log));
        outputs.push((read(&log), summaries(&stats)));
    }
    assert_eq!(
        outputs[0].0, outputs[1].0,
        "probe output differs (left: kernel, right: tcps)"
    );
    assert!(
        outputs[0].0.lines().count() >= 40,
        "probe printed too little:\n{}",
        outputs[0].0
    );
    let kernel = &outputs[0].1;
    assert!(
        kernel.is_empty(),
        "kernel run loaded the library: {kernel:?}"
    );
    let t = &outputs[1].1;
    assert_eq!(t.len(), 1, "one summary line expected: {t:?}");
    assert!(
        t[0].offloaded >= 50 && t[0].accepted >= 25 && t[0].kernel_tcp == 0,
        "not offloaded: {t:?}"
    );
    // The forked child's exec got its socket back from the server.
    assert!(
        srv.log_text().contains("exec: socket handed back"),
        "no socket was handed back at exec:\n{}",
        srv.log_text()
    );
    assert!(
        srv.log_text().contains(&format!("pid={}", t[0].pid)),
        "the server never saw pid {}",
        t[0].pid
    );
}

/// `python3 -m http.server`, fetched with curl: identical bytes.
#[test]
fn python_http_server_with_curl() {
    need("python3");
    need("curl");
    let srv = server();
    let dir = TempDir::new("pyhttp");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let mut rng = common::Rng::new(7);
    std::fs::write(www.join("big.bin"), rng.bytes(3 << 20)).unwrap();
    std::fs::write(www.join("small.txt"), b"hello through tcps\n").unwrap();
    let mut seen = Vec::new();
    for net in [Net::Kernel, Net::Tcps] {
        let port = free_port();
        let stats = dir.path().join(format!("{net:?}.stats"));
        let log = dir.path().join(format!("{net:?}.log"));
        let p = port.to_string();
        let www_s = www.to_str().unwrap();
        let mut child = command(
            net,
            &srv,
            &stats,
            &log,
            &[
                "python3",
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                "--directory",
                www_s,
                &p,
            ],
        )
        .spawn()
        .expect("spawn http.server");
        wait_port(port, &mut child, "http.server", &log);
        let mut got = Vec::new();
        for f in ["big.bin", "small.txt", "big.bin", "missing"] {
            let out = Command::new("curl")
                .args([
                    "-s",
                    "-w",
                    "%{http_code}",
                    &format!("http://127.0.0.1:{port}/{f}"),
                ])
                .output()
                .expect("curl");
            got.push(out.stdout);
        }
        stop(&mut child, libc::SIGINT);
        seen.push((
            got,
            wait_summaries(&stats, if net == Net::Tcps { 1 } else { 0 }),
        ));
    }
    assert_eq!(seen[0].0, seen[1].0, "curl saw different bytes");
    let big = std::fs::read(www.join("big.bin")).unwrap();
    assert_eq!(
        &seen[1].0[0][..big.len()],
        &big[..],
        "big.bin differs from the file"
    );
    let t = &seen[1].1;
    assert!(
        t.len() == 1 && t[0].accepted >= 4 && t[0].kernel_tcp == 0,
        "not offloaded: {t:?}"
    );
}

/// redis-server driven by redis-benchmark (GET/SET/LPUSH/LRANGE) with no
/// errors, then the same redis-cli script gives the same answers on both.
#[test]
fn redis_benchmark() {
    for p in ["redis-server", "redis-benchmark", "redis-cli"] {
        need(p);
    }
    let srv = server();
    let dir = TempDir::new("redis");
    let script = "SET k1 v1\nGET k1\nLPUSH l a b c\nLRANGE l 0 -1\nINCR n\nINCRBY n 41\nGET n\nDEL k1\nEXISTS k1\n";
    let mut answers = Vec::new();
    for net in [Net::Kernel, Net::Tcps] {
        let port = free_port();
        let p = port.to_string();
        let stats = dir.path().join(format!("{net:?}.stats"));
        let log = dir.path().join(format!("{net:?}.log"));
        let mut child = redis_server(net, &srv, &stats, &log, port, dir.path());
        let bench = Command::new("redis-benchmark")
            .args([
                "-p",
                &p,
                "-t",
                "get,set,lpush,lrange",
                "-n",
                "4000",
                "-c",
                "20",
                "-q",
                "--csv",
            ])
            .output()
            .expect("redis-benchmark");
        let text = String::from_utf8_lossy(&bench.stdout).to_string()
            + &String::from_utf8_lossy(&bench.stderr);
        assert!(
            bench.status.success(),
            "redis-benchmark failed on {net:?}:\n{text}"
        );
        assert!(
            !text.to_lowercase().contains("error"),
            "redis-benchmark reported errors on {net:?}:\n{text}"
        );
        for t in ["SET", "GET", "LPUSH", "LRANGE_100"] {
            assert!(
                text.contains(&format!("\"{t}")),
                "no {t} result on {net:?}:\n{text}"
            );
        }
        let mut cli = Command::new("redis-cli");
        cli.args(["-p", &p, "-n", "1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut c = cli.spawn().expect("redis-cli");
        use std::io::Write;
        c.stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = c.wait_with_output().expect("redis-cli output");
        let _ = Command::new("redis-cli")
            .args(["-p", &p, "shutdown", "nosave"])
            .output();
        stop(&mut child, libc::SIGTERM);
        answers.push((
            String::from_utf8_lossy(&out.stdout).to_string(),
            wait_summaries(&stats, if net == Net::Tcps { 1 } else { 0 }),
        ));
    }
    assert_eq!(answers[0].0, answers[1].0, "redis answers differ");
    assert!(
        answers[0].0.contains("42"),
        "unexpected redis answers: {}",
        answers[0].0
    );
    let t = &answers[1].1;
    assert!(
        t.len() == 1 && t[0].accepted >= 80 && t[0].kernel_tcp == 0,
        "not offloaded: {t:?}"
    );
}

/// No server: `--fallback kernel` runs on kernel sockets after exactly one
/// warning line; `--fallback fail` exits with the reason.
#[test]
fn fallback_without_server() {
    need("python3");
    let dir = TempDir::new("fallback");
    let sock = dir.path().join("nobody.sock");
    let code = "import socket; l=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(); c=socket.create_connection(l.getsockname()); a,_=l.accept(); c.send(b'ok'); print(a.recv(2).decode())";
    let run = |fallback: &str| {
        Command::new(TCPS)
            .args([
                "run",
                "--socket",
                sock.to_str().unwrap(),
                "--fallback",
                fallback,
            ])
            .args(["--", "python3", "-c", code])
            .env("TCPS_PRELOAD_LIB", preload_lib())
            .output()
            .expect("tcps run")
    };
    let out = run("kernel");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fallback kernel run failed: {err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert_eq!(
        err.lines().count(),
        1,
        "expected exactly one warning line, got:\n{err}"
    );
    assert!(
        err.contains("warning") && err.contains("kernel sockets"),
        "{err}"
    );
    let out = run("fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--fallback fail ran the program");
    assert!(out.stdout.is_empty(), "the program ran: {:?}", out.stdout);
    assert!(
        err.contains("no TCP server") && err.contains("nobody.sock"),
        "unclear message: {err}"
    );
}

/// nginx, master and 2 workers (the workers inherit the listening socket
/// through fork), `sendfile on` and `off`, driven by wrk; files fetched
/// with curl are byte-identical to the kernel run's and to the files.
#[test]
fn nginx_workers_sendfile_on_off() {
    for p in ["nginx", "wrk", "curl"] {
        need(p);
    }
    let srv = server();
    let dir = TempDir::new("nginx");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    let mut rng = common::Rng::new(11);
    let files = [
        ("big.bin", 1usize << 20),
        ("16k.bin", 16 << 10),
        ("odd.bin", 12345),
        ("empty.txt", 0),
    ];
    for (name, len) in files {
        std::fs::write(www.join(name), rng.bytes(len)).unwrap();
    }
    for sendfile in [true, false] {
        let mut fetched = Vec::new();
        for net in [Net::Kernel, Net::Tcps] {
            let tag = format!("{net:?}-{sendfile}");
            let port = free_port();
            let (mut nginx, stats, log) =
                start_nginx(net, &srv, dir.path(), &www, port, sendfile, &tag);
            let mut got = Vec::new();
            for (name, _) in files.iter().chain([("missing", 0)].iter()) {
                let out = Command::new("curl")
                    .args([
                        "-s",
                        "-w",
                        "%{http_code}",
                        &format!("http://127.0.0.1:{port}/{name}"),
                    ])
                    .output()
                    .expect("curl");
                got.push(out.stdout);
            }
            let requests = wrk_requests(port, "16k.bin");
            assert!(requests > 100, "{tag}: only {requests} requests");
            stop(&mut nginx.0, libc::SIGQUIT);
            let sums = wait_summaries(&stats, if net == Net::Tcps { 3 } else { 0 });
            if net == Net::Tcps {
                assert_eq!(
                    sums.len(),
                    3,
                    "{tag}: master + 2 workers expected: {sums:?}\n{}",
                    read(&log)
                );
                let accepted: u64 = sums.iter().map(|s| s.accepted).sum();
                assert!(
                    accepted >= 16 + 5,
                    "{tag}: connections not offloaded: {sums:?}"
                );
                // sendfile on: the server sent every file body itself.
                let by_server: u64 = sums.iter().map(|s| s.sendfile_bytes).sum();
                if sendfile {
                    assert!(
                        by_server >= (1 << 20) + 100 * (16 << 10),
                        "{tag}: sendfile bytes {by_server}: {sums:?}"
                    );
                } else {
                    assert_eq!(by_server, 0, "{tag}: sendfile off used sendfile: {sums:?}");
                }
                assert!(
                    sums.iter().all(|s| s.kernel_tcp == 0),
                    "{tag}: kernel sockets: {sums:?}"
                );
            }
            fetched.push(got);
        }
        assert_eq!(
            fetched[0], fetched[1],
            "sendfile {sendfile}: curl saw different bytes"
        );
        for (i, (name, _)) in files.iter().enumerate() {
            let want = std::fs::read(www.join(name)).unwrap();
            assert_eq!(
                &fetched[1][i][..want.len()],
                &want[..],
                "{name} differs (sendfile {sendfile})"
            );
            assert_eq!(&fetched[1][i][want.len()..], b"200", "{name} status");
        }
    }
    let log = srv.log_text();
    assert!(
        log.matches("child inherited its parent's sockets").count() >= 4,
        "workers did not inherit:\n{log}"
    );
}

/// memcached (2 threads, libevent) checked by memccapable (the protocol
/// compatibility suite) and loaded by memcslap: same verdicts on both.
#[test]
fn memcached_memccapable_memcslap() {
    for p in ["memcached", "memccapable", "memcslap"] {
        need(p);
    }
    let srv = server();
    let dir = TempDir::new("memcached");
    let mut verdicts = Vec::new();
    for net in [Net::Kernel, Net::Tcps] {
        let port = free_port();
        let p = port.to_string();
        let stats = dir.path().join(format!("{net:?}.stats"));
        let log = dir.path().join(format!("{net:?}.log"));
        let argv = [
            "memcached",
            "-u",
            "root",
            "-l",
            "127.0.0.1",
            "-p",
            &p,
            "-U",
            "0",
            "-t",
            "2",
        ];
        let mut child = command(net, &srv, &stats, &log, &argv)
            .spawn()
            .expect("spawn memcached");
        wait_port(port, &mut child, "memcached", &log);
        let cap = Command::new("memccapable")
            .args(["-h", "127.0.0.1", "-p", &p])
            .output()
            .expect("memccapable");
        let cap_text = String::from_utf8_lossy(&cap.stdout).to_string();
        assert!(
            cap.status.success(),
            "memccapable failed on {net:?}:\n{cap_text}"
        );
        let slap = Command::new("memcslap")
            .args([
                &format!("--servers=127.0.0.1:{p}"),
                "--concurrency=8",
                "--execute-number=500",
            ])
            .output()
            .expect("memcslap");
        let slap_text = String::from_utf8_lossy(&slap.stdout).to_string()
            + &String::from_utf8_lossy(&slap.stderr);
        assert!(
            slap.status.success(),
            "memcslap failed on {net:?}:\n{slap_text}"
        );
        assert!(
            slap_text.contains("Time to set"),
            "memcslap did not run on {net:?}:\n{slap_text}"
        );
        stop(&mut child, libc::SIGTERM);
        verdicts.push((
            cap_text,
            wait_summaries(&stats, if net == Net::Tcps { 1 } else { 0 }),
        ));
    }
    assert_eq!(verdicts[0].0, verdicts[1].0, "memccapable verdicts differ");
    assert!(
        verdicts[1].0.contains("All tests passed"),
        "{}",
        verdicts[1].0
    );
    let t = &verdicts[1].1;
    assert!(
        t.len() == 1 && t[0].accepted >= 9 && t[0].kernel_tcp == 0,
        "not offloaded: {t:?}"
    );
}

/// Bytes iperf3 moved, from its JSON report (panics on an error report).
fn iperf_bytes(out: &std::process::Output, what: &str) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: bad JSON ({e}):\n{text}"));
    assert!(v.get("error").is_none(), "{what}: {}", v["error"]);
    v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0)
}

/// iperf3 as server and as client through the TCP server, both directions
/// (-R), against a kernel peer; and the same runs on kernel sockets.
#[test]
fn iperf3_both_roles_both_directions() {
    need("iperf3");
    let srv = server();
    let dir = TempDir::new("iperf3");
    for net in [Net::Kernel, Net::Tcps] {
        for (offloaded_role, reverse) in [
            ("server", false),
            ("server", true),
            ("client", false),
            ("client", true),
        ] {
            let tag = format!("{net:?}-{offloaded_role}-{reverse}");
            let port = free_port();
            let p = port.to_string();
            let stats = dir.path().join(format!("{tag}.stats"));
            let slog = dir.path().join(format!("{tag}.server.log"));
            let clog = dir.path().join(format!("{tag}.client.log"));
            let server_net = if offloaded_role == "server" {
                net
            } else {
                Net::Kernel
            };
            let client_net = if offloaded_role == "client" {
                net
            } else {
                Net::Kernel
            };
            let mut s = command(
                server_net,
                &srv,
                &stats,
                &slog,
                &["iperf3", "-s", "-1", "--forceflush", "-p", &p],
            )
            .spawn()
            .expect("spawn iperf3 -s");
            // iperf3 -s accepts the probe connection as a test: wait on the log instead.
            let t = std::time::Instant::now();
            while !read(&slog).contains("Server listening") {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{tag}: iperf3 -s not listening:\n{}",
                    read(&slog)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut argv = vec!["iperf3", "-c", "127.0.0.1", "-p", &p, "-t", "1", "-J"];
            if reverse {
                argv.push("-R");
            }
            let mut c = command(client_net, &srv, &stats, &clog, &argv);
            c.stdout(std::process::Stdio::piped());
            let out = c.output().expect("iperf3 -c");
            let bytes = iperf_bytes(&out, &tag);
            assert!(bytes > 10 << 20, "{tag}: only {bytes} bytes");
            if common::wait_timeout(&mut s, Duration::from_secs(10)).is_none() {
                stop(&mut s, libc::SIGKILL);
            }
            let sums = wait_summaries(&stats, if net == Net::Tcps { 1 } else { 0 });
            if net == Net::Tcps {
                assert!(
                    sums.len() == 1 && sums[0].offloaded >= 2 && sums[0].kernel_tcp == 0,
                    "{tag}: not offloaded: {sums:?}"
                );
            } else {
                assert!(sums.is_empty(), "{tag}: {sums:?}");
            }
        }
    }
}

/// A Python asyncio echo server (one event loop, epoll) with many
/// concurrent clients: every byte comes back, on both.
#[test]
fn python_asyncio_echo() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("asyncio");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/asyncio_echo.py");
    const CONNS: usize = 24;
    for net in [Net::Kernel, Net::Tcps] {
        let port = free_port();
        let p = port.to_string();
        let n = CONNS.to_string();
        let stats = dir.path().join(format!("{net:?}.stats"));
        let log = dir.path().join(format!("{net:?}.log"));
        let mut child = command(
            net,
            &srv,
            &stats,
            &log,
            &["python3", script, &p, "--conns", &n],
        )
        .spawn()
        .expect("spawn asyncio");
        // The readiness probe is a connection too: the server counts it.
        wait_port(port, &mut child, "asyncio echo", &log);
        let clients: Vec<_> = (0..CONNS - 1)
            .map(|i| {
                std::thread::spawn(move || {
                    echo_client(
                        port,
                        common::Rng::new(i as u64 + 1).bytes(50_000 + i * 7_919),
                    )
                })
            })
            .collect();
        for (i, c) in clients.into_iter().enumerate() {
            assert!(
                c.join().expect("client"),
                "{net:?}: connection {i} echoed wrong bytes"
            );
        }
        let st = common::wait_timeout(&mut child, Duration::from_secs(20));
        assert!(
            st.is_some_and(|s| s.success()),
            "{net:?}: asyncio server did not finish: {st:?}\n{}",
            read(&log)
        );
        if net == Net::Tcps {
            let t = summaries(&stats);
            assert!(
                t.len() == 1 && t[0].accepted == CONNS as u64 && t[0].kernel_tcp == 0,
                "not offloaded: {t:?}"
            );
        }
    }
}

/// A fork-per-connection server (Python `socketserver.ForkingTCPServer`:
/// the parent accepts, forks, closes its copy; the child reads the request).
/// The request is read ahead into the parent's ring before the fork; the
/// snapshot carries it to the child, so every connection is answered, on
/// both.
#[test]
fn forking_server_gets_requests_read_ahead() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("forking");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/preload/forking_upper.py"
    );
    const CONNS: usize = 20;
    let mut seen = Vec::new();
    for net in [Net::Kernel, Net::Tcps] {
        let port = free_port();
        let p = port.to_string();
        let stats = dir.path().join(format!("{net:?}.stats"));
        let log = dir.path().join(format!("{net:?}.log"));
        let mut server = Daemon(
            command(net, &srv, &stats, &log, &["python3", script, &p])
                .spawn()
                .expect("spawn forking server"),
        );
        wait_port(port, &mut server.0, "forking server", &log);
        let mut got = Vec::new();
        for i in 0..CONNS {
            use std::io::{BufRead, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(format!("request {i} through a fork\n").as_bytes())
                .expect("write");
            let mut line = String::new();
            let r = std::io::BufReader::new(s).read_line(&mut line);
            assert!(
                r.is_ok() && !line.is_empty(),
                "{net:?}: connection {i} got no answer within 10 s: {r:?}\n{}",
                read(&log)
            );
            got.push(line);
        }
        stop(&mut server.0, libc::SIGINT);
        seen.push((
            got,
            wait_summaries(&stats, if net == Net::Tcps { 1 } else { 0 }),
        ));
    }
    assert_eq!(seen[0].0, seen[1].0, "the clients saw different answers");
    assert_eq!(seen[0].0[3], "REQUEST 3 THROUGH A FORK\n");
    let t = &seen[1].1;
    assert!(
        t.iter().all(|s| s.kernel_tcp == 0)
            && t.iter().map(|s| s.accepted).sum::<u64>() > CONNS as u64,
        "not offloaded: {t:?}"
    );
    let log = srv.log_text();
    assert!(
        log.matches("carried=1").count() >= CONNS / 2,
        "the requests were not read ahead before the forks:\n{log}"
    );
}
