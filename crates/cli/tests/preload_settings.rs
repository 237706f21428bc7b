//! Settings that survive the program: the preload library pins every
//! `TCPS_*` variable when it loads, so a program that clears its
//! environment before it opens a socket (nginx with its perl module) is
//! still offloaded to the server `tcps run --socket` named, and
//! `--fallback fail` still keeps it off kernel sockets.

mod common;
mod preload;

use common::{Server, TempDir, TCPS};
use preload::*;
use std::path::Path;
use std::process::{Command, Output};

const CLEARED_ENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/cleared_env.py");

/// `python3 cleared_env.py` against a kernel echo server, with the
/// preload library and a stats file: through `tcps run --socket SOCKET
/// --fallback fail`, or (`direct`) with the variables `tcps run` sets, as
/// `LD_PRELOAD` users do; `tcps run` itself refuses to start the program
/// when no server answers at SOCKET, so only this way reaches the
/// library's own `--fallback fail` with a bogus socket.
fn run_cleared(socket: &Path, stats: &Path, direct: bool, exec: bool) -> Output {
    let echo = common::kernel_echo_server("127.0.0.1:0");
    let mut cmd = if direct {
        let mut c = Command::new("python3");
        c.env("LD_PRELOAD", preload_lib())
            .env("TCPS_SOCKET", socket)
            .env("TCPS_FALLBACK", "fail");
        c
    } else {
        let mut c = Command::new(TCPS);
        c.arg("run")
            .arg("--socket")
            .arg(socket)
            .args(["--fallback", "fail", "--", "python3"])
            .env("TCPS_PRELOAD_LIB", preload_lib());
        c
    };
    cmd.arg(CLEARED_ENV)
        .arg(echo.ip().to_string())
        .arg(echo.port().to_string())
        .args(exec.then_some("exec"))
        .env("TCPS_PRELOAD_STATS", stats)
        .output()
        .expect("run python3")
}

/// A counter of the server's hosts, live and detached together.
fn counter(v: &serde_json::Value, name: &str) -> u64 {
    v["total"]["counters"][name].as_u64().unwrap_or(0)
        + v["detached"]["counters"][name].as_u64().unwrap_or(0)
}

/// A program that cleared its environment is offloaded all the same: the
/// server saw it attach and make its calls, every byte came back, and the
/// library counted no kernel TCP socket.
#[test]
fn cleared_environment_still_offloaded() {
    offloaded_after_clearing(false);
}

/// The program execs itself with an environment holding only `LD_PRELOAD`:
/// the new image gets the settings its predecessor pinned, and is
/// offloaded to the same server.
#[test]
fn settings_reach_an_exec_with_a_rebuilt_environment() {
    offloaded_after_clearing(true);
}

fn offloaded_after_clearing(exec: bool) {
    need("python3");
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let dir = TempDir::new("cleared-env");
    let stats = dir.path().join("stats");
    let before = srv.stat_json();
    let out = run_cleared(&srv.socket, &stats, false, exec);
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == format!("ok {}", 2 << 20),
        "the program failed ({}): {stdout}\n{err}",
        out.status
    );
    let after = srv.stat_json();
    // Two hosts came and went: `tcps run`'s probe and the program.
    let came = |v: &serde_json::Value| v["server"]["hosts_detached"].as_u64().unwrap_or(0);
    assert!(
        came(&after) >= came(&before) + 2,
        "the program never attached: {after}"
    );
    let grew = |name: &str| counter(&after, name) - counter(&before, name);
    assert!(grew("calls_total") > 0, "the server saw no calls: {after}");
    assert!(
        grew("bytes_sent") >= 2 << 20,
        "the server did not send the program's bytes: {after}"
    );
    let t = summaries(&stats);
    assert!(
        t.len() == 1 && t[0].offloaded >= 3 && t[0].accepted == 1 && t[0].kernel_tcp == 0,
        "not offloaded: {t:?}\n{err}"
    );
}

/// `TCPS_FALLBACK=fail` with no server at `TCPS_SOCKET`: the program
/// cleared its environment, yet its first TCP socket call fails (ECONNREFUSED, with
/// the reason on stderr) instead of running on kernel sockets.
#[test]
fn cleared_environment_keeps_fallback_fail() {
    need("python3");
    let dir = TempDir::new("cleared-env-fail");
    let stats = dir.path().join("stats");
    let out = run_cleared(&dir.path().join("nobody.sock"), &stats, true, false);
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        (out.status.code(), stdout.trim()),
        (Some(3), "error ECONNREFUSED"),
        "the socket call did not fail as --fallback fail promises:\n{stdout}\n{err}"
    );
    assert!(
        err.contains("no TCP server") && err.contains("nobody.sock"),
        "unclear message: {err}"
    );
    let t = summaries(&stats);
    assert!(
        t.iter().all(|s| s.kernel_tcp == 0),
        "kernel sockets used: {t:?}"
    );
}
