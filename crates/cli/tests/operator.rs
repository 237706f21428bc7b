//! An operator's first day (issue 16) and who may attach (issue 12): each
//! test tries a mistake an operator makes, or a signal a service gets, and
//! checks the outcome and the message, not just that something failed.

mod common;
mod preload;

use common::{spawn_logged, wait_timeout, Server, TempDir, TCPS};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

// ---- helpers -----------------------------------------------------------------

/// `tcps <args>` to completion (bounded by the caller's choice of args),
/// with a clean environment for the TCPS_* variables under test.
fn tcps(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(TCPS);
    c.args(args)
        .env_remove("TCPS_SOCKET")
        .env_remove("TCPS_FALLBACK")
        .env_remove("TCPS_LOG")
        .env_remove("TCPS_SPIN_US")
        .env_remove("TCPS_PRELOAD_LIB")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    common::die_with_parent(&mut c);
    run_bounded(c, Duration::from_secs(10))
}

/// Runs `c` to completion within `limit` (killed and failed after it).
fn run_bounded(mut c: Command, limit: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    // A fresh copy of tcps may be "busy" for a moment: another test's
    // fork may still hold the copy's write descriptor until its exec.
    let mut tries = 0;
    let mut child = loop {
        match c.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other.expect("spawn"),
        }
    };
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = match wait_timeout(&mut child, limit) {
        Some(st) => st,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?} did not finish within {limit:?}");
        }
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `tcps server <args>` that must fail at start: its stderr.
fn server_refuses_to_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = vec!["server"];
    all.extend_from_slice(args);
    let out = tcps(&all, env);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "tcps {all:?} should refuse to start; it exited {}\n{err}",
        out.status
    );
    err
}

/// A copy of tcps that uid 65534 can execute (`dir` must be 0755).
fn world_executable_tcps(dir: &Path) -> PathBuf {
    let exe = dir.join("tcps-copy");
    std::fs::copy(TCPS, &exe).expect("copy tcps");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// `exe <args>` as uid/gid 65534.
fn as_nobody(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(exe);
    c.args(args)
        .env_remove("TCPS_SOCKET")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("TCPS_FALLBACK")
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    run_bounded(c, Duration::from_secs(10))
}

/// Waits (bounded) until `cond(log)` holds for the server's log.
fn wait_log(srv: &Server, what: &str, cond: impl Fn(&str) -> bool) {
    let t = Instant::now();
    while !cond(&srv.log_text()) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the server never logged {what}:\n{}",
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---- 1. --socket must not replace what is not a socket ------------------------

/// A regular file or a directory at `--socket` is refused with a message
/// naming it, and left as it was; a stale socket file is reused.
#[test]
fn socket_path_refuses_non_sockets_reuses_stale_socket() {
    let dir = TempDir::new("op-socket");
    let file = dir.path().join("precious.txt");
    std::fs::write(&file, b"do not delete me\n").unwrap();
    let f = file.to_str().unwrap();
    let err = server_refuses_to_start(&["--socket", f], &[]);
    assert!(
        err.contains(f) && err.contains("not a socket"),
        "the refusal should name {f} and say it is not a socket:\n{err}"
    );
    assert_eq!(
        std::fs::read(&file).expect("the file must still exist"),
        b"do not delete me\n"
    );

    let sub = dir.path().join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("inside"), b"x").unwrap();
    let d = sub.to_str().unwrap();
    let err = server_refuses_to_start(&["--socket", d], &[]);
    assert!(
        err.contains(d) && err.contains("directory"),
        "the refusal should name {d} and say it is a directory:\n{err}"
    );
    assert!(sub.join("inside").is_file(), "the directory was touched");

    // A stale socket (its server gone) is replaced as before.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(std::fs::metadata(&stale).unwrap().file_type().is_socket());
    let log = dir.path().join("stale.log");
    let mut child = spawn_logged(
        &[
            "server".as_ref(),
            "--socket".as_ref(),
            stale.as_os_str(),
            "--engine".as_ref(),
            "epoll".as_ref(),
        ],
        &log,
        None,
    );
    let t = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("tcps server listening")
    {
        assert!(
            child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(10),
            "the server did not reuse the stale socket:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    tcps::Client::attach(&stale).expect("attach through the reused socket");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut child, Duration::from_secs(5)).expect("server stops on SIGTERM");
}

// ---- 2. a forked child the server refuses fails loudly --------------------------

/// `--max-hosts 2`: a fork-per-connection Python server runs under `tcps
/// run` and takes one slot, the test the other (after `tcps run`'s probe
/// let go of it); the forked children are refused. A child must say so
/// (naming the limit) and exit, not run on with inherited sockets that fail
/// with EBADF after a "running on kernel sockets".
#[test]
fn forked_child_refused_by_full_server_fails_loudly() {
    preload::need("python3");
    let srv = Server::start("uring", &["--poll", "adaptive", "--max-hosts", "2"]);
    let dir = TempDir::new("op-fork");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/preload/forking_upper.py"
    );
    let port = preload::free_port();
    let p = port.to_string();
    let stats = dir.path().join("stats");
    let log = dir.path().join("python.log");
    let mut python = preload::Daemon(
        preload::command(
            preload::Net::Tcps,
            &srv,
            &stats,
            &log,
            &["python3", script, &p],
        )
        .spawn()
        .expect("spawn the forking server"),
    );
    preload::wait_port(port, &mut python.0, "forking server", &log);
    // The parent must be the host holding the slot (not a kernel fallback).
    assert!(
        !preload::read(&log).contains("kernel sockets"),
        "the parent did not attach:\n{}\n{}",
        preload::read(&log),
        srv.log_text()
    );
    // Take the second slot (retrying while the probe's slot is released).
    let t = Instant::now();
    let _holder = loop {
        match tcps::Client::attach(&srv.socket) {
            Ok(c) => break c,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(5), "holder: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(b"hello through a refused fork\n").unwrap();
    let mut line = String::new();
    let _ = std::io::BufReader::new(s).read_line(&mut line);
    let t = Instant::now();
    while !preload::read(&log).contains("refused this child")
        && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = preload::read(&log);
    assert!(
        out.contains("refused this child")
            && out.contains("--max-hosts 2")
            && out.contains("exits with status 1"),
        "the refused child should say why (the limit) and exit:\n{out}\n{}",
        srv.log_text()
    );
    assert!(
        !out.contains("running on kernel sockets") && !out.contains("Bad file descriptor"),
        "the refused child half-worked:\n{out}"
    );
    assert!(
        line.is_empty(),
        "no child served the request, yet: {line:?}"
    );
    assert!(
        srv.log_text().contains("server full"),
        "the server should log the refusal:\n{}",
        srv.log_text()
    );
}

// ---- 3. signals ------------------------------------------------------------------

/// SIGHUP (a closed SSH session) is logged and survived; the server still
/// attaches and serves a new host; SIGTERM logs how many hosts it leaves.
#[test]
fn sighup_is_survived_and_shutdown_logs_attached_hosts() {
    let mut srv = Server::start("epoll", &["--poll", "adaptive"]);
    let first = srv.attach();
    srv.signal(libc::SIGHUP);
    wait_log(&srv, "the SIGHUP", |l| l.contains("SIGHUP ignored"));
    assert!(
        srv.is_alive(),
        "SIGHUP killed the server:\n{}",
        srv.log_text()
    );
    let second = srv.attach();
    let s = second
        .socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        .expect("a socket call after SIGHUP");
    second.close(s).unwrap();
    wait_log(&srv, "the second attach", |l| {
        l.matches("host attached").count() == 2
    });
    let st = srv.terminate(Duration::from_secs(5));
    assert!(
        st.is_some_and(|s| s.success()),
        "SIGTERM: {st:?}\n{}",
        srv.log_text()
    );
    let log = srv.log_text();
    assert!(
        log.contains("shutting down on SIGTERM: 2 hosts attached"),
        "the shutdown should be logged with the attached hosts:\n{log}"
    );
    assert!(!srv.socket.exists(), "the socket file was left behind");
    drop((first, second));
}

// ---- 4. environment ---------------------------------------------------------------

/// Invalid TCPS_* values are refused by `tcps run`, naming the variable
/// and what it takes; the program does not run.
#[test]
fn run_rejects_invalid_environment_values() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let dir = TempDir::new("op-env");
    let ran = dir.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let socket = srv.socket.to_str().unwrap();
    let cases = [
        ("TCPS_FALLBACK", "FAIL", "kernel or fail"),
        ("TCPS_LOG", "verbose", "debug, info, warn or off"),
        ("TCPS_SPIN_US", "abc", "microseconds"),
        ("TCPS_BALANCE", "maybe", "1 (on) or 0 (off)"),
        ("TCPS_ASYNC_SEND", "sometimes", "1 (on) or 0 (off)"),
        ("TCPS_HOST_DOORBELL", "loud", "1 (on) or 0 (off)"),
        (
            "TCPS_PRELOAD_LIB",
            "/nonexistent/libtcps_preload.so",
            "no such file",
        ),
    ];
    for (name, value, valid) in cases {
        let out = tcps(
            &["run", "--socket", socket, "--", "sh", "-c", &touch],
            &[(name, value)],
        );
        let err = text(&out.stderr);
        assert!(
            !out.status.success() && err.contains(name) && err.contains(valid),
            "{name}={value}: expected a refusal naming {name} and {valid:?}; exit {}\n{err}",
            out.status
        );
        assert!(!ran.exists(), "{name}={value}: the program ran anyway");
    }
}

/// `tcps run` keeps a TCPS_FALLBACK the user set (no --fallback): `fail`
/// with no server stops it; with a server the program sees `fail`.
#[test]
fn run_keeps_the_users_tcps_fallback() {
    let dir = TempDir::new("op-fallback");
    let missing = dir.path().join("no-server.sock");
    let out = tcps(
        &["run", "--socket", missing.to_str().unwrap(), "--", "true"],
        &[("TCPS_FALLBACK", "fail")],
    );
    assert!(
        !out.status.success() && text(&out.stderr).contains("no TCP server answers"),
        "TCPS_FALLBACK=fail was overridden: exit {}\n{}",
        out.status,
        text(&out.stderr)
    );
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let out = tcps(
        &[
            "run",
            "--socket",
            srv.socket.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo fallback=$TCPS_FALLBACK",
        ],
        &[
            ("TCPS_FALLBACK", "fail"),
            ("TCPS_PRELOAD_LIB", preload::preload_lib().to_str().unwrap()),
        ],
    );
    assert_eq!(
        text(&out.stdout).trim(),
        "fallback=fail",
        "{}",
        text(&out.stderr)
    );
}

/// `tcps server` listens where TCPS_SOCKET says, as `run` and `stat` look.
#[test]
fn server_honours_tcps_socket() {
    let dir = TempDir::new("op-envsock");
    let sock = dir.path().join("from-env.sock");
    let xdg = dir.path().join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    let log = dir.path().join("server.log");
    let mut c = Command::new(TCPS);
    c.args(["server", "--engine", "epoll"])
        .env("TCPS_SOCKET", &sock)
        .env("XDG_RUNTIME_DIR", &xdg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    common::die_with_parent(&mut c);
    let mut child = c.spawn().unwrap();
    let t = Instant::now();
    while !sock.exists() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let found = sock.exists();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut child, Duration::from_secs(5));
    assert!(
        found,
        "no socket at TCPS_SOCKET={}:\n{}",
        sock.display(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

// ---- 5. config file ------------------------------------------------------------

/// Unknown keys and bad values are reported with the file and line.
#[test]
fn config_errors_name_file_and_line() {
    let dir = TempDir::new("op-conf");
    let conf = dir.path().join("tcps.conf");
    let c = conf.to_str().unwrap();
    let sock = dir.path().join("s.sock");
    let s = sock.to_str().unwrap();
    std::fs::write(&conf, "# a comment\npoll = busy\nx = 1\n").unwrap();
    let err = server_refuses_to_start(&["--config", c, "--socket", s], &[]);
    assert!(
        err.contains(&format!("{c}:3: unknown key 'x'")),
        "expected `{c}:3: unknown key 'x'`:\n{err}"
    );
    for (line, bad) in [
        ("poll = fast", "poll"),
        ("max-hosts = many", "max-hosts"),
        ("socket-mode = 999", "socket-mode"),
        ("cpus = 0-x", "cpus"),
    ] {
        std::fs::write(&conf, format!("engine = epoll\n\n{line}\n")).unwrap();
        let err = server_refuses_to_start(&["--config", c, "--socket", s], &[]);
        assert!(
            err.contains(&format!("{c}:3: bad value")) && err.contains(bad),
            "`{line}`: expected `{c}:3: bad value ... {bad}`:\n{err}"
        );
    }
    assert!(!sock.exists());
}

/// docs/tcps.conf names every option of `tcps server` and the server
/// accepts it unchanged.
#[test]
fn example_config_is_complete_and_accepted() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/tcps.conf");
    let conf = std::fs::read_to_string(example).expect("docs/tcps.conf");
    let help = text(&tcps(&["server", "--help"], &[]).stdout);
    let keys: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', ',']).next())
        .filter(|k| *k != "help" && *k != "config")
        .collect();
    assert!(keys.len() > 15, "options not found in --help:\n{help}");
    for k in keys {
        assert!(
            conf.lines().any(|l| {
                let l = l.trim_start_matches(['#', ' ']);
                l.strip_prefix(k)
                    .is_some_and(|r| r.trim_start().starts_with('='))
            }),
            "docs/tcps.conf does not mention `{k} = ...`"
        );
    }
    let dir = TempDir::new("op-example");
    let sock = dir.path().join("example.sock");
    let log = dir.path().join("server.log");
    let mut child = spawn_logged(
        &[
            "server".as_ref(),
            "--config".as_ref(),
            example.as_ref(),
            "--socket".as_ref(),
            sock.as_os_str(),
        ],
        &log,
        None,
    );
    let t = Instant::now();
    let listening = loop {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        if l.contains("tcps server listening") {
            break true;
        }
        if child.try_wait().unwrap().is_some() || t.elapsed() > Duration::from_secs(10) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut child, Duration::from_secs(5));
    assert!(
        listening,
        "the server did not start with docs/tcps.conf:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

// ---- 6. errors that say what they are about --------------------------------------

/// A full server refuses `tcps run`: the message says it refused and why,
/// not that no server answers.
#[test]
fn run_says_the_server_refused() {
    let srv = Server::start("epoll", &["--poll", "adaptive", "--max-hosts", "1"]);
    let _holder = srv.attach();
    let out = tcps(
        &[
            "run",
            "--fallback",
            "fail",
            "--socket",
            srv.socket.to_str().unwrap(),
            "--",
            "true",
        ],
        &[],
    );
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("refused")
            && err.contains("--max-hosts 1")
            && !err.contains("no TCP server answers"),
        "expected `the TCP server ... refused ... --max-hosts 1`: exit {}\n{err}",
        out.status
    );
    // With the kernel fallback: the same words in the warning.
    let out = tcps(
        &[
            "run",
            "--socket",
            srv.socket.to_str().unwrap(),
            "--",
            "true",
        ],
        &[],
    );
    let err = text(&out.stderr);
    assert!(
        out.status.success() && err.contains("refused") && !err.contains("no TCP server answers"),
        "{err}"
    );
}

/// A socket path the server may not create names the path and suggests
/// --socket and, for a server of one's own, `$XDG_RUNTIME_DIR` (as uid
/// 65534, the default /run/tcps path; and a path under a regular file).
#[test]
fn socket_path_errors_name_the_path_and_the_way_out() {
    let dir = TempDir::new("op-path");
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let under = file.join("tcps.sock");
    let err = server_refuses_to_start(&["--socket", under.to_str().unwrap()], &[]);
    assert!(
        err.contains(file.to_str().unwrap()) && err.contains("--socket"),
        "expected the path and a hint:\n{err}"
    );
    common::require_root("it runs tcps as uid 65534");
    let exe = world_executable_tcps(dir.path());
    let out = as_nobody(&exe, &["server", "--engine", "epoll"], &[]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("/run/tcps")
            && err.contains("Permission denied")
            && err.contains("--socket")
            && err.contains("XDG_RUNTIME_DIR"),
        "as uid 65534 with the default path: exit {}\n{err}",
        out.status
    );
}

// ---- 9. tcps stat ------------------------------------------------------------------

/// `tcps stat --watch 1 | head`: the reader goes away; stat exits quietly
/// (no panic) and successfully.
#[test]
fn stat_watch_exits_quietly_on_a_closed_pipe() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let mut c = Command::new(TCPS);
    c.args(["stat", "--watch", "0.1", "--socket"])
        .arg(&srv.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    common::die_with_parent(&mut c);
    let mut child = c.spawn().unwrap();
    let mut first = [0u8; 16];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let st = wait_timeout(&mut child, Duration::from_secs(5));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        st.is_some_and(|s| s.success()) && !err.contains("panicked"),
        "tcps stat --watch on a closed pipe: {st:?}\n{err}"
    );
}

/// Each host's row shows its process name (/proc/PID/comm).
#[test]
fn stat_shows_each_hosts_command() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let c = srv.attach();
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    let comm = comm.trim();
    let t = Instant::now();
    loop {
        let out = tcps(&["stat", "--socket", srv.socket.to_str().unwrap()], &[]);
        let report = text(&out.stdout);
        let me = format!(" {} ", std::process::id());
        let row = report
            .lines()
            .find(|l| l.starts_with("host ") && l.contains(&me));
        if let Some(row) = row {
            assert!(report.contains("COMMAND"), "{report}");
            assert!(
                row.split_whitespace().any(|w| w == comm),
                "no {comm:?} in my row:\n{report}"
            );
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "my host never showed:\n{report}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(c);
}

// ---- security: who may attach -------------------------------------------------

/// By default the socket is 0660 with the server's group: uid 65534 cannot
/// attach (EACCES) and is told how to be allowed.
#[test]
fn default_socket_keeps_other_users_out() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let meta = std::fs::metadata(&srv.socket).unwrap();
    assert_eq!(
        meta.mode() & 0o777,
        0o660,
        "mode of {}",
        srv.socket.display()
    );
    // SAFETY: getegid has no side effects.
    assert_eq!(meta.gid(), unsafe { libc::getegid() });
    common::require_root("it runs tcps as uid 65534");
    let exe = world_executable_tcps(srv.dir.path());
    let socket = srv.socket.to_str().unwrap();
    let out = as_nobody(
        &exe,
        &[
            "run",
            "--fallback",
            "fail",
            "--socket",
            socket,
            "--",
            "true",
        ],
        &[],
    );
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("permission denied")
            && err.contains(socket)
            && err.contains("--socket-group"),
        "uid 65534 should be refused and told how to be allowed: exit {}\n{err}",
        out.status
    );
    assert!(
        !srv.log_text().contains("uid=65534"),
        "uid 65534 attached:\n{}",
        srv.log_text()
    );
}

/// `--socket-group` gives the socket to that group, whose members attach;
/// an unknown group is a clear error.
#[test]
fn socket_group_lets_its_members_attach() {
    let err = server_refuses_to_start(
        &[
            "--socket-group",
            "no-such-group-tcps",
            "--socket",
            "/tmp/never.sock",
        ],
        &[],
    );
    assert!(
        err.contains("no-such-group-tcps") && err.contains("no such group"),
        "{err}"
    );
    common::require_root("the server chowns its socket to another group");
    let srv = Server::start("epoll", &["--poll", "adaptive", "--socket-group", "65534"]);
    let meta = std::fs::metadata(&srv.socket).unwrap();
    assert_eq!(meta.gid(), 65534, "group of {}", srv.socket.display());
    assert_eq!(meta.mode() & 0o777, 0o660);
    let exe = world_executable_tcps(srv.dir.path());
    let out = as_nobody(
        &exe,
        &["stat", "--json", "--socket", srv.socket.to_str().unwrap()],
        &[],
    );
    assert!(
        out.status.success() && text(&out.stdout).contains("\"viewer\""),
        "a member of group 65534 should reach the server: {}\n{}",
        out.status,
        text(&out.stderr)
    );
}

// ---- 7. readiness ------------------------------------------------------------------

/// `tcps run` started just before its server waits for it (`--wait`,
/// default 1 s) instead of falling back at once.
#[test]
fn run_waits_for_a_starting_server() {
    let dir = TempDir::new("op-wait");
    let sock = dir.path().join("late.sock");
    let mut run = Command::new(TCPS);
    run.args(["run", "--fallback", "fail", "--socket"])
        .arg(&sock)
        .args(["--", "true"])
        .env("TCPS_PRELOAD_LIB", preload::preload_lib())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    common::die_with_parent(&mut run);
    let mut run = run.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let log = dir.path().join("server.log");
    let mut server = spawn_logged(
        &[
            "server".as_ref(),
            "--socket".as_ref(),
            sock.as_os_str(),
            "--engine".as_ref(),
            "epoll".as_ref(),
        ],
        &log,
        None,
    );
    let st = wait_timeout(&mut run, Duration::from_secs(10));
    let mut err = String::new();
    let _ = run.stderr.take().unwrap().read_to_string(&mut err);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut server, Duration::from_secs(5));
    assert!(
        st.is_some_and(|s| s.success()),
        "tcps run did not wait for the server: {st:?}\n{err}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// Under systemd (`Type=notify`) the server says READY=1 once its socket
/// accepts (a host attaches at once), and STOPPING=1 on SIGTERM.
#[test]
fn server_notifies_systemd_when_ready() {
    let dir = TempDir::new("op-notify");
    let notify = dir.path().join("notify");
    let listener = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let sock = dir.path().join("tcps.sock");
    let log = dir.path().join("server.log");
    let mut c = Command::new(TCPS);
    c.args(["server", "--engine", "epoll", "--socket"])
        .arg(&sock)
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    common::die_with_parent(&mut c);
    let mut server = c.spawn().unwrap();
    let mut buf = [0u8; 256];
    let n = listener.recv(&mut buf).unwrap_or(0);
    let msg = text(&buf[..n]);
    let attached = tcps::Client::attach(&sock).map(drop);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let n = listener.recv(&mut buf).unwrap_or(0);
    let stopping = text(&buf[..n]);
    wait_timeout(&mut server, Duration::from_secs(5));
    assert!(
        msg.contains("READY=1") && msg.contains(&format!("MAINPID={}", server.id())),
        "no READY=1 from the server: {msg:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        attached.is_ok(),
        "READY=1 before the socket accepts: {attached:?}"
    );
    assert!(stopping.contains("STOPPING=1"), "{stopping:?}");
}

// ---- 8. programs tcps cannot serve ----------------------------------------------

/// A statically linked program (ldconfig, static-pie on Debian) gets a
/// warning: LD_PRELOAD cannot reach it.
#[test]
fn run_warns_about_statically_linked_programs() {
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("ldconfig (a statically linked program in Debian's libc-bin)");
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let lib = preload::preload_lib();
    let socket = srv.socket.to_str().unwrap();
    let env = [("TCPS_PRELOAD_LIB", lib.to_str().unwrap())];
    let out = tcps(
        &["run", "--socket", socket, "--", ldconfig, "--version"],
        &env,
    );
    let err = text(&out.stderr);
    assert!(
        out.status.success() && err.contains("statically linked") && err.contains(ldconfig),
        "exit {}\n{err}",
        out.status
    );
    // A dynamically linked one gets no such warning.
    let out = tcps(&["run", "--socket", socket, "--", "true"], &env);
    assert!(!text(&out.stderr).contains("statically linked"));
}

/// A statically linked program behind a shell wrapper (`sh -c`, a
/// `start.sh`): the library in the shell says so at the exec, by path or
/// found on PATH, instead of nothing. A dynamically linked one: no word.
#[test]
fn run_warns_about_static_programs_behind_a_wrapper() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let lib = preload::preload_lib();
    let socket = srv.socket.to_str().unwrap();
    let env = [("TCPS_PRELOAD_LIB", lib.to_str().unwrap())];
    for script in ["ldconfig --version", "true; exec ldconfig --version"] {
        let out = tcps(&["run", "--socket", socket, "--", "sh", "-c", script], &env);
        let err = text(&out.stderr);
        assert!(
            out.status.success()
                && err.contains("exec: ")
                && err.contains("ldconfig is statically linked"),
            "sh -c {script:?}: exit {}\n{err}",
            out.status
        );
    }
    let out = tcps(
        &[
            "run",
            "--socket",
            socket,
            "--",
            "sh",
            "-c",
            "ls / >/dev/null",
        ],
        &env,
    );
    let err = text(&out.stderr);
    assert!(
        out.status.success() && !err.contains("statically linked"),
        "{err}"
    );
}

/// A program that cannot be run: `tcps run` exits as env(1) does, 127
/// when it is not found, 126 when it is not executable (it exited 1).
#[test]
fn run_exit_status_when_the_program_cannot_run() {
    let dir = TempDir::new("op-noexec");
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, b"#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let missing = dir.path().join("no-server.sock");
    for (prog, want) in [
        (dir.path().join("nonexistent"), 127),
        (plain.clone(), 126),
        (dir.path().to_path_buf(), 126),
    ] {
        let prog = prog.to_str().unwrap();
        let env_status = Command::new("env").arg(prog).status().unwrap().code();
        let socket = missing.to_str().unwrap();
        let out = tcps(&["run", "--socket", socket, "--wait", "0", "--", prog], &[]);
        let err = text(&out.stderr);
        assert_eq!(
            (out.status.code(), env_status),
            (Some(want), Some(want)),
            "{prog}: tcps run and env\n{err}"
        );
        assert!(err.contains("cannot run") && err.contains(prog), "{err}");
    }
}

// ---- 12. running as a systemd service ------------------------------------------

/// Where `prog` is on PATH, if anywhere.
fn on_path(prog: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// contrib/systemd/{tcps.service,tcps.socket,tcps-run.conf} pass
/// `systemd-analyze verify` (with ExecStart pointing at the tcps under
/// test), the drop-in applied to a service of its own.
#[test]
fn systemd_units_verify() {
    let Some(analyze) = on_path("systemd-analyze") else {
        eprintln!("systemd-analyze is not installed; skipped");
        return;
    };
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let dir = TempDir::new("op-units");
    let install = |name: &str, to: &Path| {
        let text = std::fs::read_to_string(units.join(name)).expect(name);
        std::fs::write(to, text.replace("/usr/local/bin/tcps", TCPS)).unwrap();
    };
    install("tcps.service", &dir.path().join("tcps.service"));
    install("tcps.socket", &dir.path().join("tcps.socket"));
    std::fs::write(
        dir.path().join("web.service"),
        "[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("web.service.d")).unwrap();
    install("tcps-run.conf", &dir.path().join("web.service.d/tcps.conf"));
    let mut c = Command::new(analyze);
    c.arg("verify")
        .arg(dir.path().join("tcps.service"))
        .arg(dir.path().join("tcps.socket"))
        .arg(dir.path().join("web.service"))
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.path().display()));
    let out = run_bounded(c, Duration::from_secs(30));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    let about_ours: Vec<&str> = said
        .lines()
        .filter(|l| {
            l.contains(dir.path().to_str().unwrap())
                || l.contains("tcps")
                || l.contains("web.service")
        })
        .collect();
    assert!(
        out.status.success() && about_ours.is_empty(),
        "systemd-analyze verify: {}\n{said}",
        out.status
    );
}

/// Socket activation (tcps.socket): the server serves on the socket
/// systemd passes as fd 3, says so, and leaves the socket file to systemd.
#[test]
fn socket_activation_serves_the_passed_socket() {
    let Some(activate) = on_path("systemd-socket-activate") else {
        eprintln!("systemd-socket-activate is not installed; skipped");
        return;
    };
    let dir = TempDir::new("op-activate");
    let sock = dir.path().join("activated.sock");
    // Where the server would make a socket of its own.
    let own = dir.path().join("own.sock");
    let log = dir.path().join("server.log");
    let mut c = Command::new(activate);
    c.arg("--seqpacket")
        .arg("-l")
        .arg(&sock)
        .args([TCPS, "server", "--engine", "epoll"])
        .env("TCPS_SOCKET", &own)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    common::die_with_parent(&mut c);
    let mut server = c.spawn().unwrap();
    let t = Instant::now();
    while !sock.exists() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The first connection makes systemd-socket-activate exec the server.
    let attached = common::within(Duration::from_secs(15), "attach", {
        let sock = sock.clone();
        move || tcps::Client::attach(&sock).map(|c| c.nop().is_ok())
    });
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let t = Instant::now();
    while !log_text().contains("socket activation") && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signalling our own child (the server, after the exec).
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut server, Duration::from_secs(5));
    assert!(
        matches!(attached, Ok(true)),
        "attach through the activated socket: {attached:?}\n{}",
        log_text()
    );
    assert!(log_text().contains("socket activation"), "{}", log_text());
    assert!(!own.exists(), "the server made a socket of its own");
    assert!(sock.exists(), "the server removed systemd's socket file");
}

// ---- 10. logs for operators ------------------------------------------------------

/// Starts `tcps server --socket <dir>/s.sock <extra>` (RUST_LOG=info) and
/// returns its log once its socket exists, after SIGTERM.
fn server_log(tag: &str, extra: &[&str]) -> String {
    let dir = TempDir::new(tag);
    let sock = dir.path().join("s.sock");
    let log = dir.path().join("server.log");
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["server".as_ref(), "--socket".as_ref(), sock.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let mut server = spawn_logged(&args, &log, None);
    let t = Instant::now();
    while !sock.exists() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    tcps::Client::attach(&sock).expect("attach").nop().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut server, Duration::from_secs(5));
    std::fs::read_to_string(&log).unwrap_or_default()
}

/// `--log-format json`: every line is a JSON object; the start-up line
/// names the engine as the workers do and the pinned CPUs.
/// `--log-level warn` beats RUST_LOG=info.
#[test]
fn log_format_json_and_log_level() {
    let log = server_log(
        "op-json",
        &["--log-format", "json", "--cpus", "0", "--poll", "block"],
    );
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{log}")))
        .collect();
    let start = lines
        .iter()
        .find(|v| v["message"] == "tcps server listening")
        .unwrap_or_else(|| panic!("no start-up line:\n{log}"));
    assert_eq!(start["level"], "INFO", "{start}");
    assert_eq!(start["fields"]["cpus"], "0", "{start}");
    assert_eq!(start["fields"]["engine"], "io_uring", "{start}");
    assert_eq!(start["fields"]["poll"], "block", "{start}");
    // Every line's fields as the operator types them, no Rust Debug dumps.
    for v in lines.iter().filter(|v| v["message"] == "worker running") {
        assert_eq!(v["fields"]["poll"], "block", "{v}");
    }
    assert!(
        !log.contains("Block") && !log.contains("Privileges"),
        "a Rust Debug dump in the log:\n{log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["message"] == "host attached" && v["fields"]["pid"].is_u64()),
        "{log}"
    );
    let log = server_log("op-level", &["--log-level", "warn", "--poll", "block"]);
    assert!(
        !log.contains("tcps server listening") && !log.contains("host attached"),
        "--log-level warn still logged info lines:\n{log}"
    );
}

// ---- 11. make install ----------------------------------------------------------

/// `make install PREFIX=<tmp>` installs what a system-wide user needs; the
/// installed `tcps run` finds the installed preload library; a C program
/// builds against the installed header and library through pkg-config.
#[test]
fn make_install_into_a_prefix() {
    let Some(make) = on_path("make") else {
        eprintln!("make is not installed; skipped");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let prefix = TempDir::new("op-install");
    let p = prefix.path();
    let mut c = Command::new(make);
    c.arg("install")
        .arg(format!("PREFIX={}", p.display()))
        .current_dir(&root);
    let out = run_bounded(c, Duration::from_secs(300));
    assert!(out.status.success(), "make install: {}", text(&out.stderr));
    for f in [
        "bin/tcps",
        "lib/libtcps.so",
        "lib/tcps/libtcps_preload.so",
        "include/tcps.h",
        "lib/pkgconfig/tcps.pc",
        "share/man/man1/tcps.1",
        "share/man/man1/tcps-server.1",
        "share/man/man1/tcps-run.1",
        "share/man/man1/tcps-stat.1",
        "share/bash-completion/completions/tcps",
        "share/doc/tcps/tcps.conf",
        "share/doc/tcps/LICENSE-MIT",
        "share/doc/tcps/LICENSE-APACHE",
        "share/doc/tcps/tcps-run.conf",
        "lib/systemd/system/tcps.service",
        "lib/systemd/system/tcps.socket",
    ] {
        assert!(p.join(f).is_file(), "{f} not installed");
    }
    let man = std::fs::read_to_string(p.join("share/man/man1/tcps-server.1")).unwrap();
    // clap_mangen's roff: a lower-case title, hyphens escaped.
    assert!(
        man.contains(".TH tcps-server 1") && man.contains(r"\-\-socket\-group"),
        "{man}"
    );
    let unit = std::fs::read_to_string(p.join("lib/systemd/system/tcps.service")).unwrap();
    assert!(
        unit.contains(&format!("ExecStart={}/bin/tcps server", p.display())),
        "{unit}"
    );
    let completion = p.join("share/bash-completion/completions/tcps");
    let st = Command::new("bash")
        .arg("-n")
        .arg(&completion)
        .status()
        .unwrap();
    assert!(st.success(), "the bash completion does not parse");

    // The installed tcps finds the installed preload library.
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let mut c = Command::new(p.join("bin/tcps"));
    c.args(["run", "--socket"])
        .arg(&srv.socket)
        .args(["--", "sh", "-c", "echo $LD_PRELOAD"])
        .env_remove("TCPS_PRELOAD_LIB")
        .env_remove("LD_PRELOAD");
    let out = run_bounded(c, Duration::from_secs(10));
    assert_eq!(
        text(&out.stdout).trim(),
        p.join("lib/tcps/libtcps_preload.so").to_str().unwrap(),
        "{}",
        text(&out.stderr)
    );

    // A C program builds against it through pkg-config.
    if on_path("pkg-config").is_some() && on_path("cc").is_some() {
        let src = p.join("uses_tcps.c");
        std::fs::write(
            &src,
            "#include <tcps.h>\nint main(void) { return tcps_socket == 0; }\n",
        )
        .unwrap();
        let flags = Command::new("pkg-config")
            .args(["--cflags", "--libs", "tcps"])
            .env("PKG_CONFIG_PATH", p.join("lib/pkgconfig"))
            .output()
            .unwrap();
        assert!(
            flags.status.success(),
            "pkg-config: {}",
            text(&flags.stderr)
        );
        let mut cc = Command::new("cc");
        cc.arg("-o")
            .arg(p.join("uses_tcps"))
            .arg(&src)
            .args(text(&flags.stdout).split_whitespace());
        let out = run_bounded(cc, Duration::from_secs(60));
        assert!(out.status.success(), "cc: {}", text(&out.stderr));
    }
}

/// TCPS_PRELOAD_STATS: the program `tcps run` started writes its summary
/// line also if it never makes a TCP socket.
#[test]
fn summary_line_also_without_tcp_sockets() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let dir = TempDir::new("op-summary");
    let stats = dir.path().join("stats");
    let lib = preload::preload_lib();
    let out = tcps(
        &[
            "run",
            "--socket",
            srv.socket.to_str().unwrap(),
            "--",
            "true",
        ],
        &[
            ("TCPS_PRELOAD_LIB", lib.to_str().unwrap()),
            ("TCPS_PRELOAD_STATS", stats.to_str().unwrap()),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = preload::summaries(&stats);
    assert!(
        lines.len() == 1 && lines[0].offloaded == 0 && lines[0].kernel_tcp == 0,
        "one summary line (no sockets) expected: {lines:?}"
    );
}

/// Issue 16 item 8: `TCPS_LOG=debug` logs every decision, kernel sockets
/// included (a UDP socket and a Unix socket go to the kernel, and say so),
/// as docs/PRELOAD.md documents.
#[test]
fn debug_log_names_kernel_sockets_too() {
    let srv = Server::start("epoll", &["--poll", "adaptive"]);
    let lib = preload::preload_lib();
    let prog = "import socket\n\
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()\n\
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()\n\
                socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()\n";
    let out = tcps(
        &[
            "run",
            "--socket",
            srv.socket.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            prog,
        ],
        &[
            ("TCPS_PRELOAD_LIB", lib.to_str().unwrap()),
            ("TCPS_LOG", "debug"),
        ],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let kernel: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kernel (not a TCP socket)"))
        .collect();
    assert!(
        kernel.iter().any(|l| l.contains("(domain 2, type 0x80002"))
            && kernel.iter().any(|l| l.contains("(domain 1, type 0x80001")),
        "the UDP and Unix sockets' decisions are not logged:\n{err}"
    );
    assert!(err.contains("offloaded as tcps socket"), "{err}");
}

/// Issue 16 item 6, for programs linked with the host library: an attach
/// the control socket's mode refuses says so (and how to be let in), not
/// "is `tcps server` running?".
#[test]
fn attach_denied_says_why() {
    common::require_root("it drops to uid 65534");
    let srv = Server::start("epoll", &["--poll", "adaptive"]); // default mode 0660
    let dir = TempDir::new("op-denied");
    let exe = common::world_executable_self(dir.path());
    let mut cmd = common::child_command_exe(&exe, "child_attach_denied", "attach-denied");
    cmd.env("TCPS_IT_SOCKET", &srv.socket).uid(65534).gid(65534);
    let (st, out, err) = common::run_child(cmd, Duration::from_secs(20));
    assert!(st.success(), "child failed: {st}\n{out}\n{err}");
    assert_eq!(
        common::marks(&out, "errno"),
        vec![libc::EACCES.to_string()],
        "{out}"
    );
    let msg = common::marks(&out, "msg").join("\n");
    assert!(
        msg.contains("does not let this user in") && !msg.contains("is `tcps server` running"),
        "attach message: {msg}"
    );
}

/// Child of `attach_denied_says_why`, as uid 65534.
#[test]
fn child_attach_denied() {
    let Some(()) = common::child_role("attach-denied") else {
        return;
    };
    let r = tcps::Client::attach(common::env("TCPS_IT_SOCKET"));
    common::mark("errno", r.err().and_then(|e| e.raw_os_error()).unwrap_or(0));
    common::mark("msg", tcps::last_attach_error().replace('\n', " "));
}
