//! Programs whose sockets the preload library cannot see are never run on
//! kernel sockets without a word: a Go program (its runtime makes socket
//! system calls itself, not through libc, even dynamically linked) and a
//! statically linked one are refused by `tcps run --fallback fail` with the
//! reason, warned about with `--fallback kernel`, and warned about when a
//! wrapper (`sh -c`) execs them.

mod common;
mod preload;

use common::{TempDir, TCPS};

use preload::need;
use std::path::{Path, PathBuf};
use std::process::Command;

const GO_SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/runtimes/gohttp.go");

/// A Go net/http server built from `tests/runtimes/gohttp.go`.
fn go_server(dir: &Path) -> PathBuf {
    need("go");
    let src = dir.join("gohttp");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(GO_SERVER, src.join("main.go")).unwrap();
    std::fs::write(src.join("go.mod"), "module gohttp\ngo 1.21\n").unwrap();
    let out = src.join("gohttp");
    let st = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("GOFLAGS", "-mod=mod")
        .status()
        .expect("go build");
    assert!(st.success(), "go build failed");
    out
}

/// A statically linked C program.
fn static_program(dir: &Path) -> PathBuf {
    need("gcc");
    let c = dir.join("st.c");
    std::fs::write(&c, "int main(void) { return 0; }\n").unwrap();
    let out = dir.join("st");
    let st = Command::new("gcc")
        .arg("-static")
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc -static failed");
    out
}

fn tcps_run(socket: &Path, fallback: &str, argv: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(TCPS)
        .args(["run", "--wait", "0", "--fallback", fallback, "--socket"])
        .arg(socket)
        .arg("--")
        .args(argv)
        .output()
        .expect("tcps run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn go_and_static_programs_are_refused_or_named() {
    let srv = common::Server::start("uring", &[]);
    let sock = &srv.socket;
    let dir = TempDir::new("bypass");
    let go = go_server(dir.path());
    let st = static_program(dir.path());
    for (prog, why) in [(&go, "is a Go program"), (&st, "is statically linked")] {
        let p = prog.to_str().unwrap();
        // Refused before it runs (the Go server would listen on port 1).
        let (code, err) = tcps_run(sock, "fail", &[p, "1"]);
        assert_ne!(code, Some(0), "{p} ran under --fallback fail: {err}");
        assert!(
            err.contains(why) && err.contains("--fallback fail"),
            "unclear refusal: {err}"
        );
        // Warned about, and run.
        let (_, err) = tcps_run(sock, "kernel", &[st.to_str().unwrap()]);
        assert!(
            err.contains("is statically linked") && err.contains("not offloaded"),
            "no warning: {err}"
        );
    }
    // Behind a shell wrapper: the preload names it at the exec.
    let (_, err) = tcps_run(
        sock,
        "kernel",
        &["sh", "-c", &format!("{} ; exit 0", st.display())],
    );
    assert!(
        err.contains("exec:") && err.contains("is statically linked"),
        "no warning at the exec: {err}"
    );
    let (_, err) = tcps_run(
        sock,
        "kernel",
        &[
            "sh",
            "-c",
            &format!("timeout 0.5 {} 0; exit 0", go.display()),
        ],
    );
    assert!(
        err.contains("exec:") && err.contains("is a Go program"),
        "no warning at the exec: {err}"
    );
}
