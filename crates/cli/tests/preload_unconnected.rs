//! Sends on sockets that may not send (never connected, bound, listening,
//! connecting, shut down for writing) fail at the call under `tcps run` as
//! on kernel sockets: an asynchronous send (which returns before the
//! server sends) must never take bytes the kernel refuses. The same
//! program (tests/preload/unconnected.py) prints each step's return value
//! or errno, and whether it raised SIGPIPE, on kernel sockets and through
//! the TCP server (`--fallback fail`), on both engines; every line must
//! match.

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir, TCPS};
use preload::*;
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/unconnected.py");

/// A kernel listener on 127.0.0.1 whose accept queue is full (backlog 0,
/// one connection not accepted): a further SYN is dropped, so a
/// non-blocking connect to it stays in progress. The listener, the
/// connection filling it, and the port.
fn full_listener() -> (OwnedFd, TcpStream, u16) {
    // SAFETY: plain socket calls on a descriptor owned from here on; the
    // address structures are initialised and of the size passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket");
        let l = OwnedFd::from_raw_fd(fd);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let sa = (&mut a as *mut libc::sockaddr_in).cast();
        assert_eq!(libc::bind(fd, sa, len), 0, "bind");
        assert_eq!(libc::listen(fd, 0), 0, "listen");
        assert_eq!(libc::getsockname(fd, sa, &mut len), 0, "getsockname");
        let port = u16::from_be(a.sin_port);
        let filler = TcpStream::connect(("127.0.0.1", port)).expect("connect the filler");
        (l, filler, port)
    }
}

/// The program's output on `net` (panics unless it ran to the end).
fn run(srv: &Server, dir: &TempDir, net: Net, port: u16) -> (String, Vec<Summary>) {
    let tag = format!("{net:?}");
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let out = std::fs::File::create(&log).expect("log");
    let mut c = match net {
        Net::Kernel => Command::new("python3"),
        Net::Tcps => {
            let mut c = Command::new(TCPS);
            c.arg("run").arg("--socket").arg(&srv.socket);
            c.args(["--fallback", "fail", "--", "python3"]);
            c
        }
    };
    let mut child = c
        .arg(PROG)
        .arg(port.to_string())
        .env("TCPS_PRELOAD_LIB", preload_lib())
        .env("TCPS_PRELOAD_STATS", &stats)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .spawn()
        .expect("spawn");
    let st = wait_timeout(&mut child, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{tag} did not finish:\n{}", read(&log))
    });
    let text = read(&log);
    assert!(
        st.success() && text.ends_with("done\n"),
        "{tag}: {st:?}\n{text}"
    );
    (text, summaries(&stats))
}

fn same_as_kernel(engine: &str) {
    need("python3");
    let (listener, _filler, port) = full_listener();
    let srv = Server::start(engine, &[]);
    let dir = TempDir::new("unconnected");
    let (kout, _) = run(&srv, &dir, Net::Kernel, port);
    let (tout, sums) = run(&srv, &dir, Net::Tcps, port);
    assert!(
        sums.len() == 1 && sums[0].offloaded >= 10 && sums[0].kernel_tcp == 0,
        "not offloaded: {sums:?}"
    );
    let k: Vec<&str> = kout.lines().collect();
    let t: Vec<&str> = tout.lines().collect();
    assert!(k.len() > 60, "only {} steps:\n{kout}", k.len());
    let differ: Vec<String> = k
        .iter()
        .zip(&t)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("  kernel: {a}\n  tcps:   {b}"))
        .collect();
    assert!(
        differ.is_empty() && k.len() == t.len(),
        "{engine}: {} of {} steps differ:\n{}\nkernel:\n{kout}\ntcps:\n{tout}",
        differ.len(),
        k.len(),
        differ.join("\n")
    );
    drop(listener); // kept until here: the connect case needs it
}

#[test]
fn unconnected_sends_fail_as_on_kernel_uring() {
    same_as_kernel("uring");
}

#[test]
fn unconnected_sends_fail_as_on_kernel_epoll() {
    same_as_kernel("epoll");
}
