//! Shared helpers of the `tcps` integration tests: a real `tcps server`
//! subprocess per test, kernel-side peers (echo servers), payloads and their
//! SHA-256, the re-exec trick for child processes, and a raw-protocol
//! ("rogue") attach. No mocks: every byte crosses real kernel sockets.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tcps::Client;
use tcps_proto::Region;

/// The `tcps` binary under test.
pub const TCPS: &str = env!("CARGO_BIN_EXE_tcps");

/// Both socket engines; every server-side scenario runs against each.
pub const ENGINES: [&str; 2] = ["uring", "epoll"];

/// Declares `mod $name { #[test] fn uring(); #[test] fn epoll(); }`, each
/// calling `$name(engine)`. `cargo test echo_sizes::epoll` runs one.
#[macro_export]
macro_rules! engine_tests {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn uring() {
                super::$name("uring")
            }
            #[test]
            fn epoll() {
                super::$name("epoll")
            }
        }
    )*};
}

// ---- errno helpers -----------------------------------------------------------

pub fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

pub fn errno_name(e: i32) -> String {
    let names = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::EACCES, "EACCES"),
        (libc::EFAULT, "EFAULT"),
        (libc::EINVAL, "EINVAL"),
        (libc::EMFILE, "EMFILE"),
        (libc::EPIPE, "EPIPE"),
        (libc::EUSERS, "EUSERS"),
        (libc::EADDRINUSE, "EADDRINUSE"),
        (libc::ECONNRESET, "ECONNRESET"),
        (libc::ENOTCONN, "ENOTCONN"),
        (libc::ECONNREFUSED, "ECONNREFUSED"),
        (libc::EINPROGRESS, "EINPROGRESS"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::EIO, "EIO"),
        (libc::EPROTO, "EPROTO"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == e)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("errno {e}"))
}

/// Asserts that `r` failed with `want` (an errno), with a readable message.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!(
            "{what}: expected {} but the call succeeded: {v:?}",
            errno_name(want)
        ),
        Err(e) => assert_eq!(
            errno_of(&e),
            want,
            "{what}: expected {}, got {} ({e})",
            errno_name(want),
            errno_name(errno_of(&e))
        ),
    }
}

// ---- temp dirs -------------------------------------------------------------

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A fresh directory under the temp dir, mode 0755 (so uid 65534 can reach a
/// control socket in it), removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "tcps-it-{tag}-{}-{}",
            std::process::id(),
            UNIQUE.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- resource limits -------------------------------------------------------

/// Raises RLIMIT_NOFILE's soft limit to the hard limit (inherited by servers
/// spawned afterwards). Returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid rlimit to fill / read.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        if rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
    }
    rl.rlim_cur
}

/// Makes closing `k` reset the connection (SO_LINGER {on, 0}: the kernel
/// sends an RST instead of a FIN).
pub fn reset_on_close(k: &std::net::TcpStream) {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger of its size on a socket the caller owns.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(k),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &lg as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

/// Fixes a socket's receive buffer at `bytes` (SO_RCVBUF), which also stops
/// the kernel from growing it: a peer can then have at most about that much
/// in flight towards it while it does not read.
pub fn set_rcvbuf(fd: &impl AsRawFd, bytes: i32) {
    // SAFETY: a valid int of its size on a socket the caller owns.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &bytes as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
}

// ---- the server subprocess -------------------------------------------------

/// A `tcps server` subprocess with its own control socket; SIGTERMed and
/// reaped on drop. Its stderr goes to `log` and is printed if the test fails.
pub struct Server {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub engine: String,
    pub dir: TempDir,
}

pub fn start_server(engine: &str) -> Server {
    Server::start(engine, &["--poll", "adaptive"])
}

impl Server {
    /// `tcps server --socket <tmp> --engine <engine> <extra...>`; waits until
    /// the control socket exists.
    pub fn start(engine: &str, extra: &[&str]) -> Server {
        Server::start_limited(engine, extra, None)
    }

    /// As [`start`](Server::start), with the server's soft RLIMIT_NOFILE
    /// lowered to `nofile_soft` (the hard limit stays: the server may raise it).
    pub fn start_limited(engine: &str, extra: &[&str], nofile_soft: Option<u64>) -> Server {
        let s = Server::spawn(engine, extra, nofile_soft);
        s.wait_signals_handled();
        s.wait_listening_logged();
        s
    }

    /// Starts a server and returns as soon as its control socket exists,
    /// without waiting for its SIGTERM/SIGINT handling to be in place.
    pub fn start_raw(engine: &str, extra: &[&str]) -> Server {
        Server::spawn(engine, extra, None)
    }

    fn spawn(engine: &str, extra: &[&str], nofile_soft: Option<u64>) -> Server {
        raise_nofile();
        let dir = TempDir::new(&format!("srv-{engine}"));
        let socket = dir.path().join("tcps.sock");
        let log = dir.path().join("server.log");
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("server"),
            OsStr::new("--socket"),
            socket.as_os_str(),
            OsStr::new("--engine"),
            OsStr::new(engine),
        ];
        args.extend(extra.iter().map(OsStr::new));
        // Balancing hands connections over by the machine's load, which
        // would make tests of offloaded sockets depend on it: off unless
        // a test asks (`tests/balance.rs`).
        if !extra.iter().any(|a| a.starts_with("--balance")) {
            args.extend([OsStr::new("--balance"), OsStr::new("off")]);
        }
        let child = spawn_logged(&args, &log, nofile_soft);
        let mut s = Server {
            child: Some(child),
            socket,
            log,
            engine: engine.to_string(),
            dir,
        };
        s.wait_ready();
        s
    }

    /// Waits (bounded) until the server catches SIGTERM and SIGINT (`SigCgt`
    /// in /proc/<pid>/status), so a signal sent by a test gets the clean
    /// shutdown. (`SigBlk` is no sign: glibc blocks every signal for a moment
    /// while it creates a thread.)
    pub fn wait_signals_handled(&self) {
        let want = (1u64 << (libc::SIGTERM - 1)) | (1u64 << (libc::SIGINT - 1));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
            let mask = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                    .unwrap_or(0)
            };
            if mask("SigCgt:") & want == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tcps server ({}) never caught SIGTERM/SIGINT:\n{status}",
                self.engine
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.socket.exists() {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "tcps server ({}) exited before listening: {st}\n{}",
                    self.engine,
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "tcps server ({}) did not create {} within 10 s\n{}",
                self.engine,
                self.socket.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    pub fn attach(&self) -> Client {
        Client::attach(&self.socket).unwrap_or_else(|e| {
            panic!(
                "attach to {} failed: {e} ({})\n{}",
                self.socket.display(),
                tcps::last_attach_error(),
                self.log_text()
            )
        })
    }

    /// Waits (bounded) for the server's "listening" log line, written once
    /// every worker runs, so tests that read the log see the startup lines.
    fn wait_listening_logged(&self) {
        let t = Instant::now();
        while !self.log_text().contains("tcps server listening") {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "server never logged that it listens:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address `--metrics-listen` bound, from the server's log.
    pub fn metrics_addr(&self) -> String {
        let log = self.log_text();
        log.split("metrics listening")
            .nth(1)
            .and_then(|l| l.split("addr=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"))
            .to_string()
    }

    /// `tcps stat --json` of this server.
    pub fn stat_json(&self) -> serde_json::Value {
        let out = Command::new(TCPS)
            .args(["stat", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("tcps stat");
        assert!(out.status.success(), "tcps stat: {out:?}");
        serde_json::from_slice(&out.stdout).expect("stat JSON")
    }

    /// Whether the server process is still running.
    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        }
    }

    /// SIGTERM and wait (at most `timeout`); returns the exit status, or
    /// None if it had to be SIGKILLed.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let r = wait_timeout(&mut child, timeout);
        if r.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        r
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let st = self.terminate(Duration::from_secs(5));
        if std::thread::panicking() {
            eprintln!(
                "---- tcps server ({}) log, exit {st:?} ----\n{}",
                self.engine,
                self.log_text()
            );
        }
    }
}

/// Spawns `tcps <args>` with stderr (and stdout) appended to `log`.
/// Held (shared) while this test process forks a child: between fork and
/// exec the child holds a copy of every descriptor, close-on-exec ones
/// included, so a socket "closed" meanwhile is still open there. A test
/// that needs a close to take effect at once holds it exclusively
/// (`no_forks`).
pub static FORKING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// No child is forked by this test process while the guard lives.
pub fn no_forks() -> std::sync::RwLockWriteGuard<'static, ()> {
    FORKING.write().unwrap_or_else(|p| p.into_inner())
}

pub fn spawn_logged(args: &[&OsStr], log: &Path, nofile_soft: Option<u64>) -> Child {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open server log");
    let mut cmd = Command::new(TCPS);
    die_with_parent(&mut cmd);
    if let Some(soft) = nofile_soft {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only calls async-signal-safe getrlimit/setrlimit.
        unsafe {
            cmd.pre_exec(move || {
                let mut rl = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
                rl.rlim_cur = soft as libc::rlim_t;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("dup log"))
        .stderr(f);
    let _forking = FORKING.read().unwrap_or_else(|p| p.into_inner());
    cmd.spawn().expect("spawn tcps server")
}

/// The child gets SIGKILL if the thread that spawned it dies (e.g. the test
/// binary is killed after a hang): no stray servers outlive a test run.
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

// ---- payloads ----------------------------------------------------------------

/// xorshift64*: deterministic pseudo-random bytes for payloads and fuzzing.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    pub fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

pub fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---- kernel-side peers -------------------------------------------------------

/// A kernel (std) TCP echo server: every connection gets back what it sent;
/// at EOF the echo side shuts down its write half. Runs until the process exits.
pub fn kernel_echo_server(bind: &str) -> SocketAddr {
    let l = TcpListener::bind(bind).expect("bind kernel echo server");
    let a = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = io::copy(&mut r, &mut s);
                let _ = s.shutdown(Shutdown::Write);
            });
        }
    });
    a
}

/// Sends `payload` on a connected tcps socket (one thread) while receiving
/// until EOF (this thread); the peer must echo. Returns what came back.
pub fn tcps_echo_exchange(c: &Client, s: u32, payload: &[u8]) -> Vec<u8> {
    std::thread::scope(|sc| {
        let sender = sc.spawn(|| {
            c.send_all(s, payload).expect("tcps send_all");
            c.shutdown(s, libc::SHUT_WR)
                .expect("tcps shutdown(SHUT_WR)");
        });
        let got = tcps_recv_to_eof(c, s, payload.len());
        sender.join().expect("sender thread");
        got
    })
}

/// Receives on a tcps socket until EOF.
pub fn tcps_recv_to_eof(c: &Client, s: u32, hint: usize) -> Vec<u8> {
    let mut got = Vec::with_capacity(hint);
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        match c.recv(s, &mut buf, 0) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("tcps recv after {} bytes: {e}", got.len()),
        }
    }
}

/// Receives exactly `n` bytes on a tcps socket.
/// A blocking tcps listener on 127.0.0.1 (any port) and its address.
pub fn tcps_listener(c: &Client) -> (u32, SocketAddr) {
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 1024).unwrap();
    (l, c.getsockname(l).unwrap())
}

pub fn tcps_recv_exact(c: &Client, s: u32, n: usize) -> io::Result<Vec<u8>> {
    let mut got = vec![0u8; n];
    let mut have = 0;
    while have < n {
        match c.recv(s, &mut got[have..], 0)? {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("EOF after {have} of {n} bytes"),
                ))
            }
            k => have += k,
        }
    }
    Ok(got)
}

/// A checksummed echo round trip through tcps to a kernel echo server:
/// connect, exchange `payload`, compare SHA-256, close.
#[track_caller]
pub fn echo_roundtrip(c: &Client, echo: SocketAddr, payload: &[u8]) {
    let s = c
        .tcp_connect(echo)
        .expect("tcps connect to the echo server");
    let got = tcps_echo_exchange(c, s, payload);
    assert_eq!(
        got.len(),
        payload.len(),
        "echo of {} bytes came back with {} bytes",
        payload.len(),
        got.len()
    );
    assert_eq!(
        hex(&sha256(&got)),
        hex(&sha256(payload)),
        "echo of {} bytes came back corrupted",
        payload.len()
    );
    c.close(s).expect("tcps close");
}

/// Kernel client side of an echo through a tcps listener: writes `payload`
/// (a thread), reads until EOF, returns what came back.
pub fn kernel_echo_client(addr: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let s = TcpStream::connect(addr).expect("kernel connect to the tcps listener");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            w.write_all(payload).expect("kernel write");
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::with_capacity(payload.len());
        (&s).read_to_end(&mut got).expect("kernel read");
        got
    })
}

/// Serves one echo connection on a tcps socket: recv → send_all until EOF,
/// then shutdown(SHUT_WR).
pub fn tcps_serve_echo(c: &Client, s: u32) -> usize {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    loop {
        let n = c.recv(s, &mut buf, 0).expect("tcps recv (echo)");
        if n == 0 {
            break;
        }
        c.send_all(s, &buf[..n]).expect("tcps send (echo)");
        total += n;
    }
    c.shutdown(s, libc::SHUT_WR).expect("tcps shutdown (echo)");
    total
}

/// A kernel socket without SO_REUSEADDR bound to `addr` (a "plain" bind).
pub fn plain_kernel_bind(addr: SocketAddr) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let b = tcps_proto::addr::encode(&addr);
    // SAFETY: b holds a sockaddr of its length.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            b.as_ptr() as *const libc::sockaddr,
            b.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

// ---- deadlines -----------------------------------------------------------------

/// Runs `f` in a thread and fails the test if it does not finish within
/// `limit` (the thread is left behind: this guards against hangs).
#[track_caller]
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("{what}: did not finish within {limit:?} (hang)"),
    }
}

// ---- child processes (re-exec of the test binary) ------------------------------

/// The env var telling a re-executed test binary which role to play.
pub const ROLE_ENV: &str = "TCPS_IT_ROLE";
/// Marks lines a child prints for its parent.
pub const MARK: &str = "TCPS-MARK ";

/// In a `child_*` test: `Some(())` if this process was started to play
/// `role`, else `None` (the test is then a no-op in the normal run).
pub fn child_role(role: &str) -> Option<()> {
    (std::env::var(ROLE_ENV).ok().as_deref() == Some(role)).then_some(())
}

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs ${name}"))
}

/// A line for the parent: `TCPS-MARK key value`.
pub fn mark(key: &str, value: impl std::fmt::Display) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "\n{MARK}{key} {value}");
    let _ = out.flush();
}

/// Re-executes this test binary to run only test `test_name` as `role`.
pub fn child_command(test_name: &str, role: &str) -> Command {
    child_command_exe(
        &std::env::current_exe().expect("current_exe"),
        test_name,
        role,
    )
}

/// This test binary as a path any user can execute: itself if every
/// directory above it is searchable and it is world-executable, else a copy
/// in `dir` (which must be world-searchable).
pub fn world_executable_self(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode())
            .unwrap_or(0)
    };
    let ok = mode(&exe) & 0o005 == 0o005
        && exe
            .ancestors()
            .skip(1)
            .all(|d| d.as_os_str().is_empty() || mode(d) & 0o001 != 0);
    if ok {
        return exe;
    }
    let copy = dir.join("test-binary");
    std::fs::copy(&exe, &copy).expect("copy the test binary");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// As [`child_command`], running the binary at `exe`.
pub fn child_command_exe(exe: &Path, test_name: &str, role: &str) -> Command {
    let mut c = Command::new(exe);
    die_with_parent(&mut c);
    c.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A running child whose stdout lines arrive on a channel (read by a
/// thread, so a silent child cannot hang the test). Killed on drop.
pub struct ChildProc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: String,
}

impl ChildProc {
    pub fn spawn(mut cmd: Command) -> ChildProc {
        let mut child = cmd.spawn().expect("spawn child test process");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        ChildProc {
            child,
            lines: rx,
            seen: String::new(),
        }
    }

    /// Waits for the mark `key`; returns its value. Panics (with the output
    /// so far) if the child ends first or `limit` passes.
    pub fn read_mark(&mut self, key: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let prefix = format!("{key} ");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if let Some(v) = line
                        .split(MARK)
                        .nth(1)
                        .and_then(|r| r.strip_prefix(&prefix))
                    {
                        return v.trim().to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("child ended before printing {key}:\n{}", self.seen)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("child did not print {key} within {limit:?}:\n{}", self.seen)
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a child to completion (at most `limit`); returns status, stdout, stderr.
pub fn run_child(mut cmd: Command, limit: Duration) -> (ExitStatus, String, String) {
    let mut child = cmd.spawn().expect("spawn child test process");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let st = match wait_timeout(&mut child, limit) {
        Some(st) => st,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "child process did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                to.join().unwrap_or_default(),
                te.join().unwrap_or_default()
            );
        }
    };
    (
        st,
        to.join().unwrap_or_default(),
        te.join().unwrap_or_default(),
    )
}

/// The marks `key` a finished child printed.
pub fn marks(stdout: &str, key: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.split(MARK).nth(1))
        .filter_map(|rest| rest.strip_prefix(&format!("{key} ")).map(str::to_string))
        .collect()
}

// ---- /proc ---------------------------------------------------------------------

/// utime + stime of a process (all threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/pid/stat");
    // Fields after the parenthesised command name: state is field 3.
    let rest = &s[s.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f[11].parse().unwrap();
    let stime: u64 = f[12].parse().unwrap();
    utime + stime
}

/// Resident memory of a process, KiB (VmRSS; 0 if it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no memory effects.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as u64
}

// ---- a raw-protocol host -----------------------------------------------------------

/// A host that attached with the raw protocol and holds the mapped region:
/// it can write anything anywhere in it.
pub struct RawHost {
    pub ctl: OwnedFd,
    pub doorbell: OwnedFd,
    /// The region's memfd, as the server handed it over.
    pub memfd: OwnedFd,
    pub region: Region,
    pub region_size: usize,
}

impl RawHost {
    /// Attaches with the host library's raw handshake (`tcps::attach_raw`:
    /// SEQPACKET control socket, Hello, Welcome + [memfd, doorbell], region
    /// mapped) and keeps every piece to abuse.
    pub fn attach(path: &Path) -> io::Result<RawHost> {
        let tcps::Attached {
            ctl,
            doorbell,
            memfd,
            region,
        } = tcps::attach_raw(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{e}: {}", tcps::last_attach_error())))?;
        let region_size = region.layout().region_size();
        Ok(RawHost {
            ctl,
            doorbell,
            memfd,
            region,
            region_size,
        })
    }

    /// Rings the server's doorbell.
    pub fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes to an eventfd.
        unsafe {
            libc::write(
                self.doorbell.as_raw_fd(),
                one.as_ptr() as *const libc::c_void,
                8,
            )
        };
    }

    /// Whether the server hung up the control socket (cut us off).
    pub fn cut_off(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let rc = unsafe { libc::poll(&mut p, 1, 0) };
        rc > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Base pointer of the whole mapping (for scribbling anywhere).
    pub fn base(&self) -> *mut u8 {
        self.region.header() as *const _ as *mut u8
    }

    /// Writes `bytes` at `offset` in the region (clamped to it), volatile.
    pub fn scribble(&self, offset: usize, bytes: &[u8]) {
        let off = offset.min(self.region_size);
        let n = bytes.len().min(self.region_size - off);
        for (i, b) in bytes[..n].iter().enumerate() {
            // SAFETY: off + i < region_size: inside our own shared mapping.
            unsafe { std::ptr::write_volatile(self.base().add(off + i), *b) };
        }
    }
}

impl RawHost {
    /// Hands the server a kernel socket this process made
    /// (`ControlMsg::SocketAdopt`, protocol v5): its new socket id, or the
    /// server's errno.
    pub fn adopt_socket(&self, fd: std::os::fd::RawFd, nonblocking: bool) -> Result<u32, i32> {
        use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};
        let handle = 0x5eed;
        let msg = ControlMsg::SocketAdopt {
            handle,
            nonblocking,
        };
        tcps_proto::fdpass::send_with_fds(self.ctl.as_raw_fd(), &msg.encode(), &[fd])
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let mut b = [0u8; CONTROL_MSG_LEN + 1];
        let (n, _) = tcps_proto::fdpass::recv_with_fds(self.ctl.as_raw_fd(), &mut b, 0)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        match ControlMsg::decode(&b[..n]) {
            Some(ControlMsg::Adopted { handle: h, sock }) if h == handle => Ok(sock),
            Some(ControlMsg::Reply { errno, .. }) => Err(errno),
            other => panic!("unexpected answer to SocketAdopt: {other:?}"),
        }
    }
}

/// For tests that drop to another uid, chown, or lower limits: they run as
/// root (`scripts/test.sh`, CI), and fail loudly rather than pass without
/// testing anything when they cannot.
pub fn require_root(why: &str) {
    // SAFETY: geteuid has no side effects.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test must run as root: {why}");
}

/// `len` bytes at `off` of a channel arena, as a call names them.
pub fn span(off: u32, len: u32) -> tcps_proto::msg::ArenaRange {
    tcps_proto::msg::ArenaRange { off, len }
}

/// Channel 0 of a [`RawHost`] driven one request at a time, in order: the
/// raw-protocol tests' synchronous calls (requests and completions by hand,
/// no host library).
pub struct RawCalls {
    pub h: RawHost,
    /// Requests posted and completions taken on channel 0.
    req: std::cell::Cell<u32>,
    cq: std::cell::Cell<u32>,
}

impl RawCalls {
    pub fn new(h: RawHost) -> RawCalls {
        h.region.header().channels_used.store(1, Ordering::Release);
        RawCalls {
            h,
            req: Default::default(),
            cq: Default::default(),
        }
    }

    /// Requests posted so far (the next one's slot).
    pub fn posted(&self) -> u32 {
        self.req.get()
    }

    /// Publishes a request (its `user_data`: its number + 1), first waiting
    /// (bounded) until the server took enough of the ring that the slot is free.
    pub fn post(&self, r: tcps_proto::Request) {
        let ch = self.h.region.channel(0).unwrap();
        let entries = self.h.region.layout().ring_entries;
        let t = Instant::now();
        let req = self.req.get();
        while req.wrapping_sub(ch.ctl().req_head.load(Ordering::Acquire)) >= entries - 1 {
            assert!(t.elapsed() < Duration::from_secs(5), "request ring stuck");
            self.h.ring();
            std::thread::yield_now();
        }
        self.publish(r);
        self.h.ring();
    }

    /// Publishes a request without ringing the doorbell, whatever
    /// `server_sleeping` says (a host that breaks the protocol); the ring
    /// must have room.
    pub fn publish(&self, mut r: tcps_proto::Request) {
        let ch = self.h.region.channel(0).unwrap();
        let req = self.req.get();
        r.user_data = u64::from(req) + 1;
        ch.write_request(req, &r);
        self.req.set(req + 1);
        ch.ctl().req_tail.store(req + 1, Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// The next completion on channel 0, if one arrives within `limit`.
    pub fn next_completion(&self, limit: Duration) -> Option<tcps_proto::Completion> {
        let ch = self.h.region.channel(0).unwrap();
        let t = Instant::now();
        let cq = self.cq.get();
        while ch.ctl().cq_tail.load(Ordering::Acquire) <= cq {
            if t.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let c = ch.read_completion(cq);
        self.cq.set(cq + 1);
        ch.ctl().cq_head.store(cq + 1, Ordering::Release);
        Some(c)
    }

    /// Posts `r` and returns its completion (within 5 s).
    pub fn call(&self, r: tcps_proto::Request) -> tcps_proto::Completion {
        self.post(r);
        self.next_completion(Duration::from_secs(5))
            .expect("no completion within 5 s")
    }

    /// Posts `call` (built with the protocol's encoder) and returns its
    /// completion (within 5 s).
    pub fn run(&self, call: tcps_proto::Call) -> tcps_proto::Completion {
        self.call(call.encode())
    }

    /// Writes `input` at the start of channel 0's arena, then runs the call
    /// `call` builds on that range.
    pub fn run_with(
        &self,
        input: &[u8],
        call: impl FnOnce(tcps_proto::msg::ArenaRange) -> tcps_proto::Call,
    ) -> tcps_proto::Completion {
        self.arena(0, input);
        self.run(call(span(0, input.len() as u32)))
    }

    /// Writes `b` into channel 0's arena at `off`.
    pub fn arena(&self, off: u32, b: &[u8]) {
        assert!(self.h.region.channel(0).unwrap().copy_to_arena(off, b));
    }

    /// `n` bytes of channel 0's arena at `off`.
    pub fn arena_out(&self, off: u32, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        assert!(self
            .h
            .region
            .channel(0)
            .unwrap()
            .copy_from_arena(off, &mut b));
        b
    }
}

/// Why a benchmark's quick-run test cannot run here (not root, a tool of
/// `tools` missing, the example web server not built), or None.
pub fn bench_skip_reason(tools: &[&str]) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces)".into());
    }
    for tool in tools {
        let found = Command::new("which").arg(tool).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("{tool} not installed"));
        }
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !repo.join("examples/build/webserver").is_file() {
        return Some("examples/build/webserver not built (make examples)".into());
    }
    None
}

/// No namespace `{prefix}…-{tag}` whose run (the pid in `tag`, after any
/// letters) is gone is left: a benchmark deletes its nodes however it ends.
pub fn assert_no_stale_namespaces(prefix: &str) {
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let ns = String::from_utf8_lossy(&ns.stdout);
    assert!(
        !ns.lines().any(|l| {
            l.starts_with(prefix)
                && l.split_whitespace()
                    .next()
                    .and_then(|n| n.rsplit('-').next())
                    .map(|t| t.trim_start_matches(|c: char| !c.is_ascii_digit()))
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        }),
        "namespaces left behind:\n{ns}"
    );
}
