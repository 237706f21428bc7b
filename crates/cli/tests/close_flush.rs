//! A close right after asynchronous sends loses no byte, also when the
//! program exits at once: as with kernel sockets (close(2) and exit leave
//! the send buffer to go out, then the FIN), every byte queued before the
//! close reaches the peer. A Python program under `tcps run --fallback
//! fail` connects 8 times to a kernel sink, `sendall`s SIZE bytes per
//! connection in pieces (up to 1 MiB) from 8 threads (with the kernel's
//! SO_SNDBUF, or a small one set by the program so that the queue holds
//! the tail), closes and exits; the sink (a small fixed SO_RCVBUF) starts
//! reading only once the program has exited (or after a bound, as a
//! sender on kernel sockets waits for room) and reads to EOF. The same
//! program on kernel sockets gives the reference: each sink's SHA-256 must
//! be the sender's, on both, with a clean EOF.
//! (The server closed a detached host's sockets with their queued sends
//! still waiting for the late reader: the tail of each stream was lost.)

mod common;
mod preload;

use common::{hex, sha256, wait_timeout, Server, TempDir, TCPS};
use preload::*;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONNS: usize = 8;

/// Bytes per connection, the SO_SNDBUF the program sets (0: none) and the
/// size of its pieces, and whether its sockets are non-blocking (1).
type Case = (usize, usize, usize, usize);

/// argv: port, size, conns, sndbuf (0: the kernel's), piece, nonblocking.
/// Connection i sends its index (one byte), then SIZE bytes of pattern i
/// (non-blocking: `send` until EAGAIN, then `select` for room), from its
/// own thread, closes right after the last (maybe short) write, and the
/// program exits as soon as every thread has closed.
const SENDER: &str = r#"
import socket, sys, threading
import select
port, size, conns, sndbuf, piece, nb = (int(a) for a in sys.argv[1:7])
def data(i):
    return bytes((i * 31 + k * 7) & 0xff for k in range(251)) * (size // 251) + b"x" * (size % 251)
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
for s in socks:
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
def send(i, s):
    d = data(i)
    s.sendall(i.to_bytes(1, "big"))
    s.setblocking(not nb)
    off = 0
    while off < size:
        if not nb:
            s.sendall(d[off:off + piece]); off += piece; continue
        try:
            off += s.send(d[off:off + piece])
        except BlockingIOError:
            select.select([], [s], [], 30)
    s.close()
ts = [threading.Thread(target=send, args=(i, s)) for i, s in enumerate(socks)]
for t in ts: t.start()
for t in ts: t.join()
"#;

fn pattern(i: usize, size: usize) -> Vec<u8> {
    let unit: Vec<u8> = (0..251).map(|k| ((i * 31 + k * 7) & 0xff) as u8).collect();
    let mut d = unit.repeat(size / 251);
    d.resize(size, b'x');
    d
}

/// The sender on kernel sockets (`srv` None) or under `tcps run`.
fn sender(
    srv: Option<&Server>,
    port: usize,
    (size, sndbuf, piece, nb): Case,
    log: &std::path::Path,
) -> Child {
    let out = std::fs::File::create(log).unwrap();
    let mut c = match srv {
        None => Command::new("python3"),
        Some(srv) => {
            let mut c = Command::new(TCPS);
            c.arg("run").arg("--socket").arg(&srv.socket);
            c.args(["--fallback", "fail", "--", "python3"]);
            c.env("TCPS_PRELOAD_LIB", preload_lib());
            c
        }
    };
    c.args(["-c", SENDER])
        .args([port, size, CONNS, sndbuf, piece, nb].map(|v| v.to_string()))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    common::die_with_parent(&mut c);
    c.spawn().expect("spawn the sender")
}

/// Reads `s` to EOF: (connection index, SHA-256 of the rest, its length),
/// or the error that ended it (a reset, a timeout).
fn drain(mut s: TcpStream) -> Result<(usize, [u8; 32], usize), String> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).map_err(|e| e.to_string())?;
    let i = *got.first().ok_or("nothing received")? as usize;
    Ok((i, sha256(&got[1..]), got.len() - 1))
}

/// One run: what each connection's sink got, in connection order.
fn run(srv: Option<&Server>, case: Case, dir: &TempDir) -> Vec<String> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    common::set_rcvbuf(&l, 16 << 10);
    let port = l.local_addr().unwrap().port() as usize;
    let log = dir
        .path()
        .join(format!("sender-{case:?}-{}.log", srv.is_some()));
    let mut child = sender(srv, port, case, &log);
    let conns: Vec<_> = (0..CONNS).map(|_| l.accept().unwrap().0).collect();
    // The sink starts late: once the sender exited (its sends queued, its
    // sockets closed), or after a bound (kernel buffers too small for all
    // of it keep the sender's last sendall waiting for the reader).
    let exited = wait_timeout(&mut child, Duration::from_secs(2));
    let readers: Vec<_> = conns
        .into_iter()
        .map(|s| std::thread::spawn(move || drain(s)))
        .collect();
    let mut got: Vec<String> = vec![String::new(); CONNS];
    for (k, r) in readers.into_iter().enumerate() {
        match r.join().unwrap() {
            Ok((i, sum, len)) if i < CONNS => got[i] = format!("{len} {}", hex(&sum)),
            Ok((i, ..)) => got[k] = format!("bad connection index {i}"),
            Err(e) => got[k] = format!("error: {e}"),
        }
    }
    let st = exited
        .or_else(|| wait_timeout(&mut child, Duration::from_secs(60)))
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!("the sender did not finish:\n{}", read(&log))
        });
    assert!(st.success(), "{st:?}\n{}", read(&log));
    got
}

fn close_flushes(engine: &str) {
    need("python3");
    let srv = Server::start(engine, &[]);
    let dir = TempDir::new("closeflush");
    // Small pieces into a small SO_SNDBUF around one pool chunk (32 KiB);
    // 4 MiB + 1 in 1 MiB pieces with the kernel's SO_SNDBUF and a fixed
    // 1.5 MiB one (the queue then holds more than the kernel buffers).
    // Non-blocking: the last write may be short (what the queue took),
    // and the close follows it at once.
    let cases: [Case; 6] = [
        ((32 << 10) - 1, 8 << 10, 4 << 10, 0),
        ((32 << 10) + 1, 8 << 10, 4 << 10, 0),
        ((4 << 20) + 1, 0, 1 << 20, 0),
        ((4 << 20) + 1, 3 << 19, 1 << 20, 0),
        ((4 << 20) + 1, 3 << 19, 1 << 20, 1),
        ((32 << 10) + 1, 8 << 10, 5 << 10, 1),
    ];
    for case @ (size, ..) in cases {
        let want: Vec<String> = (0..CONNS)
            .map(|i| format!("{size} {}", hex(&sha256(&pattern(i, size)))))
            .collect();
        let t = Instant::now();
        let kernel = run(None, case, &dir);
        assert_eq!(kernel, want, "on kernel sockets, {case:?}");
        let tcps = run(Some(&srv), case, &dir);
        assert_eq!(
            tcps,
            kernel,
            "{engine}: {case:?} (size, SO_SNDBUF, piece, non-blocking), took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn close_right_after_sends_loses_nothing_uring() {
    close_flushes("uring");
}

#[test]
fn close_right_after_sends_loses_nothing_epoll() {
    close_flushes("epoll");
}
