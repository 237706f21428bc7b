//! Handing an offloaded socket to an exec'd program, as inetd, CGI runners
//! and supervisors do, behaves as on kernel sockets.
//!
//! `tests/preload/handoff.c` and `handoff.py` accept a connection, hand it
//! to `/bin/cat` as its stdin and stdout (CPython's `subprocess.Popen`, which
//! uses vfork; Popen with `preexec_fn`, which forks; C vfork + dup2 +
//! execv; fork + execl, execlp and execle; fork, close() of every fd above
//! 2, execv; posix_spawn with dup2 file
//! actions), then send 48 KiB through the connection's peer and read cat's
//! echo to EOF. Each case runs on kernel sockets and under
//! `tcps run --fallback fail`: the peer must get the same bytes (SHA-256),
//! cat must see EOF and exit 0, and the parent's own stdout must get exactly
//! its own lines (a vfork child that rewrote the parent's descriptor table
//! sent them to the peer). Every run is bounded: a hang fails the test.
//!
//! A connection whose first bytes the server already read ahead (into the
//! process's memory) cannot become a kernel socket with them: that
//! hand-off is refused at the call, with EBUSY and one line on stderr,
//! instead of a child that waits for ever on a dead descriptor.

mod common;
mod preload;

use common::{die_with_parent, hex, sha256, wait_timeout, Server, TempDir, TCPS};
use preload::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const C_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/handoff.c");
const PY_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/handoff.py");

/// What the peer got from cat, what the parent printed, and its stderr.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    received: String,
    stdout: String,
    stderr: String,
}

/// 48 KiB of the programs' pattern.
fn payload() -> Vec<u8> {
    (0..48 * 1024usize)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect()
}

fn digest(bytes: &[u8]) -> String {
    format!("{} bytes, sha256 {}", bytes.len(), hex(&sha256(bytes)))
}

fn build(dir: &Path) -> PathBuf {
    let exe = dir.join("handoff");
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&exe)
        .arg(C_SRC)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `argv` (its last argument is where the peer's bytes go) on `net`,
/// bounded; through tcps with `--fallback fail` and without balancing, and
/// checks that the sockets were offloaded.
fn run(net: Net, srv: &Server, dir: &Path, tag: &str, argv: &[&str]) -> Outcome {
    let tag = format!("{tag}-{net:?}");
    let got = dir.join(format!("{tag}.got"));
    let (out, err) = (
        dir.join(format!("{tag}.out")),
        dir.join(format!("{tag}.err")),
    );
    let stats = dir.join(format!("{tag}.stats"));
    let mut c = match net {
        Net::Kernel => Command::new(argv[0]),
        Net::Tcps => {
            let mut c = Command::new(TCPS);
            c.args(["run", "--fallback", "fail", "--socket"])
                .arg(&srv.socket);
            c.arg("--").arg(argv[0]);
            c
        }
    };
    c.args(&argv[1..])
        .arg(&got)
        .env("TCPS_PRELOAD_LIB", preload_lib())
        .env("TCPS_PRELOAD_STATS", &stats)
        .env("TCPS_BALANCE", "0")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"));
    die_with_parent(&mut c);
    let mut child = c.spawn().expect("spawn");
    let Some(st) = wait_timeout(&mut child, Duration::from_secs(40)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{tag}: hangs (killed after 40 s); stderr:\n{}", read(&err));
    };
    assert!(st.success(), "{tag}: {st}; stderr:\n{}", read(&err));
    if net == Net::Tcps {
        let s = summaries(&stats);
        assert!(
            s.iter()
                .any(|s| s.offloaded >= 3 && s.kernel_tcp == 0 && s.direct == 0),
            "{tag}: not offloaded: {s:?}; stderr:\n{}",
            read(&err)
        );
    }
    Outcome {
        received: digest(&std::fs::read(&got).unwrap_or_default()),
        stdout: read(&out),
        stderr: read(&err),
    }
}

/// The case on kernel sockets, then through tcps: the same outcome, the
/// one expected.
fn same_as_kernel(tag: &str, argv: &[&str]) {
    let srv = Server::start("uring", &[]);
    let dir = TempDir::new(&format!("exec-{tag}"));
    let kernel = run(Net::Kernel, &srv, dir.path(), tag, argv);
    let want = Outcome {
        received: digest(&payload()),
        stdout: "parent stdout line\ncat: exit 0\n".into(),
        stderr: String::new(),
    };
    assert_eq!(kernel, want, "{tag}: on kernel sockets");
    let tcps = run(Net::Tcps, &srv, dir.path(), tag, argv);
    assert_eq!(tcps, kernel, "{tag}: through tcps (right: kernel)");
}

fn c_case(mode: &str) {
    let dir = TempDir::new("exec-build");
    let exe = build(dir.path());
    same_as_kernel(mode, &[exe.to_str().unwrap(), mode]);
}

fn py_case(mode: &str) {
    need("python3");
    same_as_kernel(mode, &["python3", PY_SRC, mode]);
}

/// CPython's `subprocess.Popen` (vfork in `_posixsubprocess`) with the
/// connection as stdin and stdout; the parent's stdout stays its own.
#[test]
fn python_popen_vfork() {
    py_case("popen");
}

/// The same with `preexec_fn` (CPython then forks).
#[test]
fn python_popen_preexec_fork() {
    py_case("preexec");
}

#[test]
fn c_vfork_dup2_execv() {
    c_case("vfork_execv");
}

#[test]
fn c_fork_execl() {
    c_case("fork_execl");
}

#[test]
fn c_fork_execlp() {
    c_case("fork_execlp");
}

#[test]
fn c_fork_execle() {
    c_case("fork_execle");
}

/// The forked child closes every descriptor above 2 (the library's control
/// socket among them) with close() before execv.
#[test]
fn c_fork_close_all_execv() {
    c_case("fork_closeall");
}

/// posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK), its own dup2 and
/// execve inside libc) with `posix_spawn_file_actions_adddup2`.
#[test]
fn c_posix_spawn_dup2() {
    c_case("spawn");
}

/// The peer's first bytes were read ahead before the hand-off: on the
/// kernel cat echoes everything; through tcps Popen fails with EBUSY, one
/// line on stderr says why, and the peer gets the connection's end
/// (nothing), in bounded time.
#[test]
fn python_popen_after_read_ahead_refused_loudly() {
    need("python3");
    let srv = Server::start("uring", &[]);
    let dir = TempDir::new("exec-early");
    let argv = ["python3", PY_SRC, "early"];
    let kernel = run(Net::Kernel, &srv, dir.path(), "early", &argv);
    assert_eq!(kernel.received, digest(&payload()), "on kernel sockets");
    assert_eq!(kernel.stdout, "parent stdout line\ncat: exit 0\n");
    let tcps = run(Net::Tcps, &srv, dir.path(), "early", &argv);
    assert_eq!(tcps.received, digest(b""), "through tcps");
    assert_eq!(tcps.stdout, "hand-off refused: EBUSY\nparent stdout line\n");
    let said: Vec<&str> = tcps.stderr.lines().collect();
    assert!(
        said.len() == 1 && said[0].contains("cannot be handed to another program"),
        "one line on stderr expected:\n{}",
        tcps.stderr
    );
}

/// The same hand-off with a server that does not read ahead
/// (`--eager-recv off`): the first bytes wait in the kernel socket, and cat
/// gets everything, as on the kernel.
#[test]
fn python_popen_after_read_ahead_with_eager_recv_off() {
    need("python3");
    let srv = Server::start("uring", &["--eager-recv", "off"]);
    let dir = TempDir::new("exec-early-off");
    let argv = ["python3", PY_SRC, "early"];
    let kernel = run(Net::Kernel, &srv, dir.path(), "early-off", &argv);
    assert_eq!(kernel.received, digest(&payload()), "on kernel sockets");
    let tcps = run(Net::Tcps, &srv, dir.path(), "early-off", &argv);
    assert_eq!(tcps, kernel, "through tcps (right: kernel)");
}

/// A child made with clone(CLONE_VM|CLONE_VFORK) (which no interposed
/// function sees) shares its parent's memory: its dup2 must not change
/// the parent's tables, and its exec, which cannot hand the socket back, is
/// refused with one line on stderr. The parent's stdout stays its own.
#[test]
fn c_clone_vm_child_leaves_the_parent_alone() {
    let dir = TempDir::new("exec-clone");
    let exe = build(dir.path());
    let srv = Server::start("uring", &[]);
    let argv = [exe.to_str().unwrap(), "clone_vm"];
    let kernel = run(Net::Kernel, &srv, dir.path(), "clone", &argv);
    assert_eq!(kernel.received, digest(&payload()), "on kernel sockets");
    assert_eq!(kernel.stdout, "parent stdout line\ncat: exit 0\n");
    let tcps = run(Net::Tcps, &srv, dir.path(), "clone", &argv);
    assert_eq!(
        tcps.stdout,
        "parent stdout line\nhand-off refused: Device or resource busy, status 127\n"
    );
    assert_eq!(tcps.received, digest(b""), "through tcps: nothing sent");
    let said: Vec<&str> = tcps.stderr.lines().collect();
    assert!(
        said.len() == 1 && said[0].contains("exec refused (EBUSY)"),
        "one line on stderr expected:\n{}",
        tcps.stderr
    );
}

/// The variadic exec family reads its whole list (beyond the argument
/// registers, and execle's environment after it) as libc does: the same
/// output with the library preloaded as without.
#[test]
fn execl_family_argument_lists_as_libc() {
    let dir = TempDir::new("exec-args");
    let exe = dir.path().join("execl_args");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/execl_args.c");
    let out = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for mode in ["l", "lp", "le", "l0"] {
        let outputs: Vec<String> = [false, true]
            .iter()
            .map(|&preload| {
                let mut c = Command::new(&exe);
                c.arg(mode).env("TCPS_FALLBACK_QUIET", "1");
                if preload {
                    c.env("LD_PRELOAD", preload_lib());
                }
                let o = c.output().expect("run execl_args");
                assert!(o.status.success(), "{mode} (preload {preload}): {o:?}");
                String::from_utf8_lossy(&o.stdout).into_owned()
            })
            .collect();
        assert!(!outputs[0].is_empty() || mode == "l0", "{mode}: no output");
        assert_eq!(
            outputs[1], outputs[0],
            "{mode}: with the library (right: without)"
        );
    }
}
