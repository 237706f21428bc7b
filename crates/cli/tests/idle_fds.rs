//! An idle server's descriptors are steady from its "listening" line on:
//! the same set at every look, with no file opened and closed in the
//! background. The fault matrix compares the server's descriptor count
//! after each fault with the count it took at start; a descriptor the
//! server held for a moment when that count was taken (the worker's load
//! meter used to open and close its schedstat file at start and every
//! 500 ms) made a later, correct count look like a leak.
//!
//! Such a moment lasts microseconds, so the server runs under strace with
//! every openat held for 30 ms after it returns (`inject=openat:delay_exit`):
//! a file opened in the background is then open long enough for any look
//! to see it.

mod common;
mod preload;

use common::*;
use preload::need;
use std::time::{Duration, Instant};

/// The server's descriptor table as the kernel lists it, looked at as
/// quickly as can be (a descriptor open for a few microseconds is seen
/// only by a look within them): its /proc directory kept open, read again
/// from its start with one getdents64.
struct Looker {
    dir: std::os::fd::OwnedFd,
    buf: Vec<u8>,
}

impl Looker {
    fn new(pid: u32) -> Looker {
        use std::os::fd::FromRawFd;
        let path = std::ffi::CString::new(format!("/proc/{pid}/fd")).unwrap();
        // SAFETY: open(2) of a NUL-terminated path; the result is checked.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        assert!(fd >= 0, "open /proc/{pid}/fd");
        // SAFETY: a fresh descriptor, owned from here on.
        let dir = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Looker {
            dir,
            buf: vec![0u8; 64 << 10],
        }
    }

    /// The raw directory entries (names and positions) now.
    fn look(&mut self) -> Vec<u8> {
        use std::os::fd::AsRawFd;
        let fd = self.dir.as_raw_fd();
        // SAFETY: lseek and getdents64 on our directory descriptor, into
        // our buffer of its length.
        let n = unsafe {
            libc::lseek(fd, 0, libc::SEEK_SET);
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                self.buf.as_mut_ptr(),
                self.buf.len(),
            )
        };
        assert!(n > 0, "getdents64 of the server's descriptors: {n}");
        self.buf[..n as usize].to_vec()
    }
}

/// What the server's descriptors point at, for the failure's report.
fn targets(pid: u32) -> String {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let t = std::fs::read_link(e.path()).unwrap_or_default();
                    format!("{}->{}", e.file_name().to_string_lossy(), t.display())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.join(" ")
}

/// A server run under strace, every openat held 30 ms after it returns;
/// its pid and its log. Killed (with strace) when dropped.
struct Traced {
    strace: std::process::Child,
    pid: u32,
    log: std::path::PathBuf,
    _dir: TempDir,
}

impl Traced {
    fn start(engine: &str) -> Traced {
        need("strace");
        let dir = TempDir::new("idle-fds");
        let log = dir.path().join("server.log");
        let sock = dir.path().join("tcps.sock");
        let f = std::fs::File::create(&log).expect("log");
        let mut c = std::process::Command::new("strace");
        c.args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=openat"])
            .args(["-e", "inject=openat:delay_exit=30000", TCPS, "server"])
            .arg("--socket")
            .arg(&sock)
            .args(["--engine", engine, "--poll", "adaptive", "--balance", "off"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(f.try_clone().expect("dup"))
            .stderr(f);
        die_with_parent(&mut c);
        let strace = c.spawn().expect("spawn strace");
        let mut t = Traced {
            pid: 0,
            strace,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !read_text(&t.log).contains("tcps server listening") {
            assert!(
                Instant::now() < deadline,
                "the server never listened:\n{}",
                read_text(&t.log)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let kids = format!("/proc/{0}/task/{0}/children", t.strace.id());
        t.pid = read_text(std::path::Path::new(&kids))
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the server's pid");
        t
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the server this test started.
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }
}

fn read_text(p: &std::path::Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Looks at the descriptors of an idle server for a while (its worker's
/// periodic work included): always the set it had when it said it
/// listens.
fn steady(engine: &str) {
    let srv = Traced::start(engine);
    let mut looker = Looker::new(srv.pid);
    let first = looker.look();
    let t = Instant::now();
    let mut looks = 0u64;
    while t.elapsed() < Duration::from_millis(1600) {
        looks += 1;
        if looker.look() != first {
            panic!(
                "{engine}: the idle server's descriptors changed after {:?} ({looks} looks); now: {}",
                t.elapsed(),
                targets(srv.pid)
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(looks > 500, "only {looks} looks");
}

#[test]
fn idle_server_fds_steady_uring() {
    steady("uring");
}

#[test]
fn idle_server_fds_steady_epoll() {
    steady("epoll");
}
