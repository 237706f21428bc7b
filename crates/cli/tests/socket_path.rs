//! Where the control socket is when nobody says: one system-wide path,
//! `/run/tcps/tcps.sock`, for the server and every user's `tcps run` and
//! `tcps stat`, whatever `$XDG_RUNTIME_DIR` their login session has; else
//! `$TCPS_SOCKET` for all three. And a `--socket-group` or `--socket-mode`
//! that a directory on the socket's path makes meaningless is reported.
//!
//! The default-path test runs in a private mount namespace with a fresh
//! tmpfs on `/run`, so it neither meets nor disturbs any other server.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `script` under `sh` with `env`, bounded, and returns its stdout
/// (stderr on failure to run).
fn sh(script: &str, env: &[(&str, &Path)], unshare: bool) -> String {
    let mut c = if unshare {
        let mut c = Command::new("unshare");
        c.args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
        ]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    };
    c.env("TCPS", TCPS)
        .env_remove("TCPS_SOCKET")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    die_with_parent(&mut c);
    for (k, v) in env {
        c.env(k, v);
    }
    let (status, out, err) = run_child(c, Duration::from_secs(60));
    assert!(
        status.success(),
        "the script failed: {status}\n{out}\n{err}"
    );
    out
}

/// Starts `tcps server` (no --socket) in the background, waits for a socket
/// at either place, then lets another login session (its own
/// XDG_RUNTIME_DIR) run a program and query stat with no path given.
const AGREE: &str = r#"
"$TCPS" server --engine epoll $SERVER_ARGS 2>"$LOG" &
srv=$!
i=0
while [ ! -S "$EXPECT" ] && [ ! -S "$XDG_RUNTIME_DIR/tcps.sock" ] && [ $i -lt 1000 ]; do
    i=$((i+1)); sleep 0.01
done
[ -S "$EXPECT" ] && echo "socket=expected"
[ -e "$XDG_RUNTIME_DIR/tcps.sock" ] && echo "socket=server-session"
XDG_RUNTIME_DIR="$OTHER" "$TCPS" run --fallback fail --wait 2 -- true; echo "run=$?"
XDG_RUNTIME_DIR="$OTHER" "$TCPS" stat --json > /dev/null; echo "stat=$?"
kill $srv; wait $srv; echo "server=$?"
"#;

/// Two login sessions' runtime directories (0700, as logind makes them).
fn sessions(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (dir.join("run-user-0"), dir.join("run-user-1000"));
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    (a, b)
}

fn assert_agreed(out: &str, log: &Path) {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    for want in ["socket=expected", "run=0", "stat=0", "server=0"] {
        assert!(out.lines().any(|l| l == want), "no {want}:\n{out}\n{log}");
    }
    assert!(!out.contains("socket=server-session"), "{out}\n{log}");
}

/// Without --socket or TCPS_SOCKET, a server started from root's login
/// session (XDG_RUNTIME_DIR set) listens at /run/tcps/tcps.sock, and a
/// program and stat from another session find it there. It used to hide
/// in the session's own 0700 directory, where nobody else looked.
#[test]
fn default_socket_is_system_wide() {
    require_root("it mounts a tmpfs on /run in a private mount namespace");
    let dir = TempDir::new("sockpath-default");
    let (session, other) = sessions(dir.path());
    let log = dir.path().join("server.log");
    let script = format!("mount -t tmpfs tcps-test /run || exit 90\n{AGREE}");
    let expect = Path::new("/run/tcps/tcps.sock");
    let out = sh(
        &script,
        &[
            ("XDG_RUNTIME_DIR", &session),
            ("OTHER", &other),
            ("LOG", &log),
            ("EXPECT", expect),
        ],
        true,
    );
    assert_agreed(&out, &log);
}

/// TCPS_SOCKET names the socket for the server, run and stat alike, over
/// the default and whatever XDG_RUNTIME_DIR says.
#[test]
fn tcps_socket_names_it_for_all() {
    let dir = TempDir::new("sockpath-env");
    let (session, other) = sessions(dir.path());
    let log = dir.path().join("server.log");
    let sock = dir.path().join("from-env.sock");
    let script = format!("export TCPS_SOCKET=\"$EXPECT\"\n{AGREE}");
    let out = sh(
        &script,
        &[
            ("XDG_RUNTIME_DIR", &session),
            ("OTHER", &other),
            ("LOG", &log),
            ("EXPECT", &sock),
        ],
        false,
    );
    assert_agreed(&out, &log);
}

/// Starts a server at `sock` with `args`, waits (bounded) until it is
/// listening, stops it and returns its log.
fn server_log(sock: &Path, args: &[&str]) -> String {
    let log = sock.with_extension("log");
    let mut c = Command::new(TCPS);
    c.args(["server", "--engine", "epoll", "--socket"])
        .arg(sock)
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    die_with_parent(&mut c);
    let mut child = c.spawn().unwrap();
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let t = Instant::now();
    while !text().contains("tcps server listening") && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_timeout(&mut child, Duration::from_secs(5));
    let text = text();
    assert!(text.contains("tcps server listening"), "{text}");
    text
}

/// `--socket-group` or `--socket-mode 666` on a socket in a 0700 directory
/// (a login session's runtime directory) admits users who cannot reach
/// it: the server says so, naming the directory. In an open directory it
/// says nothing.
#[test]
fn socket_group_kept_out_by_its_directory_is_reported() {
    let dir = TempDir::new("sockpath-group");
    let (private, _) = sessions(dir.path());
    let sock = private.join("tcps.sock");
    for args in [&["--socket-group", "65534"][..], &["--socket-mode", "666"]] {
        let log = server_log(&sock, args);
        let warned = log
            .lines()
            .find(|l| l.contains("WARN") && l.contains("keeps them from reaching"));
        let warned = warned.unwrap_or_else(|| panic!("{args:?}: no warning:\n{log}"));
        assert!(
            warned.contains(args[0])
                && warned.contains(&format!("{} (mode 700", private.display())),
            "{args:?}: {warned}"
        );
    }
    let open = dir.path().join("open.sock");
    for args in [
        &["--socket-group", "65534"][..],
        &["--socket-mode", "666"],
        &[],
    ] {
        let log = server_log(&open, args);
        assert!(
            !log.contains("keeps them from reaching"),
            "{args:?}:\n{log}"
        );
    }
}
