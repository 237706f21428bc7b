//! `tcps server` as a command: its flags, errors for bad ones, the config
//! file, clean exit on SIGTERM, and the control socket file's life cycle.

mod common;

use common::*;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tcps::Client;

/// Runs `tcps <args>` to completion (bounded); returns (status, stdout, stderr).
fn run_tcps(args: &[&OsStr]) -> (std::process::ExitStatus, String, String) {
    let mut cmd = Command::new(TCPS);
    die_with_parent(&mut cmd);
    cmd.args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run_child(cmd, Duration::from_secs(20))
}

fn os(v: &[&str]) -> Vec<&'static OsStr> {
    v.iter()
        .map(|s| OsStr::new(Box::leak(s.to_string().into_boxed_str())))
        .collect()
}

#[test]
fn help_mentions_every_flag() {
    let (st, out, _) = run_tcps(&os(&["server", "--help"]));
    assert!(st.success(), "tcps server --help: {st}");
    for flag in [
        "--socket",
        "--cpus",
        "--poll",
        "--spin-us",
        "--engine",
        "--max-hosts",
        "--max-sockets-per-host",
        "--channels",
        "--arena-kib",
        "--socket-mode",
        "--config",
    ] {
        assert!(out.contains(flag), "--help does not mention {flag}:\n{out}");
    }
    for word in [
        "busy", "adaptive", "block", "uring", "epoll", "EUSERS", "EMFILE",
    ] {
        assert!(out.contains(word), "--help does not mention {word}:\n{out}");
    }
    let (st, out, _) = run_tcps(&os(&["--help"]));
    assert!(st.success());
    assert!(out.contains("server"), "{out}");
}

/// A bad flag value: the server exits non-zero at once, says what is wrong,
/// and leaves no control socket behind.
fn bad_flags(engine: &str) {
    let dir = TempDir::new("badflags");
    let sock = dir.path().join("s.sock");
    let sock_s = sock.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (&["--cpus", "99"], &["CPU 99", "does not exist"]),
        (&["--cpus", "0-x"], &["bad CPU list"]),
        (&["--poll", "nope"], &["nope", "busy", "adaptive", "block"]),
        (&["--engine", "nope"], &["nope", "uring", "epoll"]),
        (&["--arena-kib", "3"], &["--arena-kib 3", "multiple of 4"]),
        (&["--arena-kib", "0"], &["--arena-kib 0"]),
        (&["--channels", "0"], &["--channels 0"]),
        (&["--sq-entries", "3"], &["--sq-entries 3", "power of two"]),
        (&["--send-queues", "70000"], &["--send-queues 70000"]),
        (&["--recv-rings", "2000000"], &["--recv-rings 2000000"]),
        (&["--socket-mode", "xyz"], &["socket-mode"]),
        (&["--max-hosts", "0"], &["max-hosts"]),
        (&["--spin-us=-5"], &["spin-us", "-5"]),
        (&["--no-such-flag"], &["no-such-flag"]),
    ];
    for (flags, words) in cases {
        let mut args = vec!["server", "--socket", sock_s, "--engine", engine];
        // `--engine nope` must win over the valid one above: later flags override.
        args.extend_from_slice(flags);
        let (st, out, err) = run_tcps(&os(&args));
        assert!(
            !st.success(),
            "tcps server {flags:?} should fail\nstdout:\n{out}\nstderr:\n{err}"
        );
        for w in *words {
            assert!(
                err.contains(w),
                "tcps server {flags:?}: the error should mention {w:?}:\n{err}"
            );
        }
        // Options by their names, not the fields they set.
        for field in [
            "arena_size",
            "sq_entries",
            "n_channels",
            "send_queues",
            "recv_rings",
        ] {
            assert!(
                !err.contains(field),
                "tcps server {flags:?} says {field}:\n{err}"
            );
        }
        assert!(!sock.exists(), "{flags:?} left a control socket behind");
    }
}

fn config_file(engine: &str) {
    let dir = TempDir::new("config");
    let cfg = dir.path().join("tcps.conf");
    std::fs::write(
        &cfg,
        "# a tcps server config\npoll = block\nmax-hosts = 1   # one host only\n\nspin-us = \"10\"\n",
    )
    .unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let srv = Server::start(engine, &["--config", cfg_s]);
    let log = srv.log_text();
    assert!(
        log.contains("poll=\"block\""),
        "config poll = block not applied:\n{log}"
    );
    assert!(
        log.contains("max_hosts=1"),
        "config max-hosts not applied:\n{log}"
    );
    let c = srv.attach();
    echo_roundtrip(
        &c,
        kernel_echo_server("127.0.0.1:0"),
        &Rng::new(5).bytes(300_000),
    );
    assert_errno(
        Client::attach(&srv.socket).map(drop),
        libc::EUSERS,
        "second host with max-hosts = 1 from the config",
    );
    drop(c);
    drop(srv);

    // The command line overrides the file.
    let srv = Server::start(engine, &["--config", cfg_s, "--max-hosts", "2"]);
    assert!(srv.log_text().contains("max_hosts=2"), "{}", srv.log_text());
    let a = srv.attach();
    let b = srv.attach();
    a.nop().unwrap();
    b.nop().unwrap();
    drop(srv);

    // Broken config files are refused with a message.
    let (st, _, err) = run_tcps(&os(&[
        "server",
        "--config",
        dir.path().join("missing.conf").to_str().unwrap(),
    ]));
    assert!(!st.success());
    assert!(err.contains("cannot read config"), "{err}");
    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, "poll block\n").unwrap();
    let (st, _, err) = run_tcps(&os(&["server", "--config", bad.to_str().unwrap()]));
    assert!(!st.success());
    assert!(err.contains("key = value"), "{err}");
    std::fs::write(&bad, "poll = sometimes\n").unwrap();
    let sock = dir.path().join("never.sock");
    let (st, _, err) = run_tcps(&os(&[
        "server",
        "--socket",
        sock.to_str().unwrap(),
        "--config",
        bad.to_str().unwrap(),
    ]));
    assert!(!st.success());
    assert!(err.contains("sometimes"), "{err}");
}

fn sigterm_exits_cleanly(engine: &str) {
    let mut srv = start_server(engine);
    let c = srv.attach();
    c.nop().unwrap();
    let sock = srv.socket.clone();
    assert!(sock.exists());
    let st = srv.terminate(Duration::from_secs(5));
    let st = st.expect("server did not exit within 5 s of SIGTERM");
    assert!(
        st.success(),
        "exit status after SIGTERM: {st}\n{}",
        srv.log_text()
    );
    assert!(!sock.exists(), "the control socket file was not removed");
    // The host notices.
    assert!(c.nop().is_err());
    // SIGINT too.
    let mut srv = start_server(engine);
    srv.signal(libc::SIGINT);
    let mut child = srv.child.take().unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(5)).expect("exit after SIGINT");
    assert!(st.success(), "{st}");
    assert!(!srv.socket.exists());
}

/// The control socket file is how a supervisor (or this harness) knows the
/// server is up: a SIGTERM sent as soon as it appears must already get the
/// clean exit (status 0, socket file removed), not the default action.
fn sigterm_right_after_start(engine: &str) {
    for round in 0..30 {
        let mut srv = Server::start_raw(engine, &["--poll", "adaptive"]);
        srv.signal(libc::SIGTERM);
        let mut child = srv.child.take().unwrap();
        let st = wait_timeout(&mut child, Duration::from_secs(5)).expect("exit after SIGTERM");
        assert!(
            st.success(),
            "round {round}: SIGTERM right after the control socket appeared: {st} \
             (signal handlers installed after the socket is created?)"
        );
        assert!(
            !srv.socket.exists(),
            "round {round}: socket file left behind"
        );
    }
}

fn control_socket_lifecycle(engine: &str) {
    let mut srv = start_server(engine);
    let sock = srv.socket.clone();
    let sock_s = sock.to_str().unwrap().to_string();
    // Mode 0660 by default (root and the server's group attach; issue 12).
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let md = std::fs::metadata(&sock).unwrap();
    assert!(md.file_type().is_socket());
    assert_eq!(md.permissions().mode() & 0o777, 0o660);
    // A second server on a live socket refuses to start and leaves it alone.
    let (st, _, err) = run_tcps(&os(&["server", "--socket", &sock_s, "--engine", engine]));
    assert!(!st.success(), "a second server started on a live socket");
    assert!(err.contains("another tcps server"), "{err}");
    assert!(sock.exists());
    srv.attach().nop().unwrap();
    // A stale socket (server SIGKILLed) is replaced by the next server.
    srv.kill9();
    assert!(sock.exists(), "SIGKILL cannot remove the file");
    let log = srv.dir.path().join("second.log");
    let mut child = spawn_logged(
        &os(&[
            "server",
            "--socket",
            &sock_s,
            "--engine",
            engine,
            "--socket-mode",
            "600",
        ]),
        &log,
        None,
    );
    let c = within(
        Duration::from_secs(10),
        "attach to the replacement server",
        {
            let sock = sock.clone();
            move || loop {
                if let Ok(c) = Client::attach(&sock) {
                    break c;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        },
    );
    c.nop().unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "--socket-mode 600");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_timeout(&mut child, Duration::from_secs(5)).expect("exit");
    assert!(
        st.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(!Path::new(&sock).exists());
}

/// `--channels` and `--arena-kib` shape every host's region; transfers
/// larger than a small arena are split and still arrive intact.
fn geometry_flags(engine: &str) {
    let srv = Server::start(
        engine,
        &["--poll", "adaptive", "--channels", "3", "--arena-kib", "16"],
    );
    let c = srv.attach();
    assert_eq!(c.n_channels(), 3);
    assert_eq!(c.arena_size(), 16 * 1024);
    let echo = kernel_echo_server("127.0.0.1:0");
    let mut rng = Rng::new(11);
    for n in [1usize, 16 * 1024, 16 * 1024 + 1, 1 << 20] {
        echo_roundtrip(&c, echo, &rng.bytes(n));
    }
    // More threads than channels: short calls queue for a channel, all complete.
    let threads: Vec<_> = (0..6u64)
        .map(|_| {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    c.nop().unwrap();
                }
            })
        })
        .collect();
    within(
        Duration::from_secs(30),
        "6 threads on 3 channels",
        move || {
            for t in threads {
                t.join().unwrap();
            }
        },
    );
}

/// `--cpus 0,1`: one worker per CPU, pinned; hosts spread over the workers
/// all work.
fn cpus_flag(engine: &str) {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let list = if ncpu >= 2 { "0,1" } else { "0" };
    let srv = Server::start(engine, &["--poll", "adaptive", "--cpus", list]);
    let hosts: Vec<Client> = (0..3).map(|_| srv.attach()).collect();
    let echo = kernel_echo_server("127.0.0.1:0");
    for (i, c) in hosts.iter().enumerate() {
        echo_roundtrip(c, echo, &Rng::new(i as u64).bytes(100_000));
    }
    let mut pinned = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{}/task", srv.pid())).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if let Some(idx) = comm.trim().strip_prefix("tcps-worker-") {
            let status = std::fs::read_to_string(t.join("status")).unwrap();
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_string();
            pinned.push((idx.to_string(), cpus));
        }
    }
    pinned.sort();
    let want: Vec<(String, String)> = list
        .split(',')
        .enumerate()
        .map(|(i, c)| (i.to_string(), c.to_string()))
        .collect();
    assert_eq!(pinned, want, "worker threads and their CPUs");
}

engine_tests!(
    geometry_flags,
    cpus_flag,
    bad_flags,
    config_file,
    sigterm_exits_cleanly,
    sigterm_right_after_start,
    control_socket_lifecycle
);
