//! Sends under `tcps run` are asynchronous (issue 14 items 1 and 2): the
//! same Python program (tests/preload/async_send.py, and
//! tests/preload/sendfile_stream.py for sendfile) on kernel sockets and
//! through the TCP server prints the same, ends the same way (SIGPIPE
//! included), and through the server its writes and sendfiles cost no
//! round trip.

mod common;
mod preload;

use common::{wait_timeout, Server, TempDir};
use preload::*;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

const PROG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/async_send.py");
const SENDFILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/preload/sendfile_stream.py"
);

fn server() -> Server {
    Server::start("uring", &["--poll", "adaptive"])
}

/// Runs the program `prog` with `args` on `net`: its exit status, output
/// and summary lines.
fn run(
    srv: &Server,
    dir: &TempDir,
    net: Net,
    prog: &str,
    args: &[&str],
) -> (ExitStatus, String, Vec<Summary>) {
    let tag = format!("{net:?}-{}", args.join("-").replace('/', "_"));
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.out"));
    let mut argv = vec!["python3", prog];
    argv.extend_from_slice(args);
    let mut child = command(net, srv, &stats, &log, &argv)
        .spawn()
        .expect("spawn");
    let st = wait_timeout(&mut child, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{argv:?} on {net:?} did not finish:\n{}", read(&log))
    });
    (st, read(&log), summaries(&stats))
}

/// The program prints the same on both, succeeds on both, and was
/// offloaded through the server.
fn same_as_kernel(args: &[&str], must: &[&str]) {
    same_as_kernel_with(PROG, args, must);
}

fn same_as_kernel_with(prog: &str, args: &[&str], must: &[&str]) -> String {
    need("python3");
    let srv = server();
    let dir = TempDir::new("sends");
    let (kst, kout, _) = run(&srv, &dir, Net::Kernel, prog, args);
    let (tst, tout, sums) = run(&srv, &dir, Net::Tcps, prog, args);
    assert!(kst.success(), "{args:?} failed on kernel sockets:\n{kout}");
    assert!(tst.success(), "{args:?} failed through tcps:\n{tout}");
    assert_eq!(
        kout, tout,
        "{args:?}: output differs (left: kernel, right: tcps)"
    );
    for m in must {
        assert!(tout.contains(m), "{args:?}: {m:?} missing:\n{tout}");
    }
    assert!(
        sums.len() == 1 && sums[0].offloaded >= 2 && sums[0].kernel_tcp == 0,
        "not offloaded: {sums:?}"
    );
    tout
}

/// Many small writes of a checksummed stream, then close at once: the peer
/// gets every byte (close stays behind the queued sends).
#[test]
fn small_writes_then_close_arrive_whole() {
    same_as_kernel(&["stream"], &["match True"]);
}

/// A non-blocking writer fills the queue (EAGAIN), sees no POLLOUT while
/// nobody reads, POLLOUT once the peer reads, writes again; all arrives.
#[test]
fn nonblocking_writer_eagain_then_pollout() {
    same_as_kernel(
        &["nonblock"],
        &[
            "pollout while nobody reads: False",
            "pollout once the peer reads: True",
            "EAGAIN right after POLLOUT: 0",
            "total intact: True",
        ],
    );
}

/// Writes after the peer reset fail within a few calls (the error of an
/// asynchronous send comes on a later call), as on kernel sockets.
#[test]
fn write_after_reset_fails_within_a_few_calls() {
    same_as_kernel(
        &["reset", "ignore"],
        &["broken: True within a few calls: True"],
    );
}

/// ... and a program that does not ignore SIGPIPE dies of it, as on kernel
/// sockets.
#[test]
fn write_after_reset_raises_sigpipe() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("sigpipe");
    for net in [Net::Kernel, Net::Tcps] {
        let (st, out, _) = run(&srv, &dir, net, PROG, &["reset", "dfl"]);
        assert_eq!(st.signal(), Some(libc::SIGPIPE), "{net:?}: {st:?}\n{out}");
    }
}

/// The environment of a run with asynchronous sends on or off.
fn env_of(async_send: bool) -> Vec<(&'static str, &'static str)> {
    if async_send {
        vec![]
    } else {
        vec![("TCPS_ASYNC_SEND", "0")]
    }
}

/// `writes` writes of 100 bytes: the host's round trips once the peer got
/// every byte.
fn write_round_trips(srv: &Server, dir: &TempDir, writes: u32, async_send: bool) -> u64 {
    let n = writes.to_string();
    let args = ["writes", "{port}", &n];
    let c = host_counters(srv, dir, PROG, &args, &env_of(async_send), |k, tag| {
        let mut got = vec![0u8; writes as usize * 100];
        k.read_exact(&mut got)
            .unwrap_or_else(|e| panic!("{tag}: {e}"));
        assert!(got.iter().all(|&b| b == b'y'));
        got.len() as u64
    });
    c["round_trips"].as_u64().unwrap_or(u64::MAX)
}

/// Through the server the writes cost ~0 round trips (TCPS_ASYNC_SEND=0: one
/// each, for comparison).
#[test]
fn writes_make_no_round_trips() {
    compare_round_trips("writes", 2000, write_round_trips);
}

/// `n` operations through the server, synchronous (`TCPS_ASYNC_SEND=0`: at
/// least a round trip each) and asynchronous (at most one in 20).
fn compare_round_trips(what: &str, n: u32, run: fn(&Server, &TempDir, u32, bool) -> u64) {
    need("python3");
    let srv = server();
    let dir = TempDir::new("roundtrips");
    let sync = run(&srv, &dir, n, false);
    let asyn = run(&srv, &dir, n, true);
    eprintln!("round trips for {n} {what}: synchronous {sync}, asynchronous {asyn}");
    assert!(sync >= u64::from(n), "synchronous: {sync} round trips");
    assert!(
        asyn * 20 <= u64::from(n),
        "asynchronous: {asyn} round trips for {n} {what}"
    );
}

/// Small writes (send, writev, sendmsg) interleaved with sendfile and
/// sendfile64 of several files (NULL offset and offset pointer, several
/// offsets, counts past the end of file): every return value and file
/// offset as on kernel sockets, and the peer gets the exact stream.
#[test]
fn sendfile_interleaved_with_writes_as_kernel() {
    let out = sendfile_as_kernel("stream", &["match True"]);
    assert!(out.contains("= 10 "), "a count past EOF clamped:\n{out}");
}

/// sendfile_stream.py `mode`, its files in a fresh directory: as on kernel
/// sockets (see [`same_as_kernel`]); its output.
fn sendfile_as_kernel(mode: &str, must: &[&str]) -> String {
    let dir = TempDir::new(&format!("sendfile-{mode}"));
    let d = dir.path().to_str().unwrap();
    same_as_kernel_with(SENDFILE, &[mode, d], must)
}

/// A non-blocking sendfile of a big file to a peer that does not read gets
/// a short count or EAGAIN; once the peer reads all of it arrives intact.
#[test]
fn nonblocking_sendfile_is_bounded() {
    sendfile_as_kernel(
        "nonblock",
        &[
            "short count or EAGAIN before the peer read: True",
            "total intact: True",
        ],
    );
}

/// sendfile after the peer reset fails within a few calls, as on kernel
/// sockets (the error of a queued file send comes on a later call).
#[test]
fn sendfile_after_reset_fails_within_a_few_calls() {
    sendfile_as_kernel("reset", &["broken: True within a few calls: True"]);
}

/// `n` responses (writev of headers, sendfile of a 16 KiB file), each
/// after a one-byte request: the host's round trips; every response is
/// checked byte for byte.
fn sendfile_round_trips(srv: &Server, dir: &TempDir, n: u32, async_send: bool) -> u64 {
    let files = dir.path().join(if async_send { "async" } else { "sync" });
    std::fs::create_dir_all(&files).unwrap();
    let (count, d) = (n.to_string(), files.to_str().unwrap().to_string());
    let args = ["rt", "{port}", &count, &d];
    let c = host_counters(srv, dir, SENDFILE, &args, &env_of(async_send), |k, tag| {
        let body = std::fs::read(files.join("page")).expect("the program wrote its file");
        let mut total = 0;
        for i in 0..n {
            k.write_all(b"?").unwrap();
            let mut want =
                format!("HTTP/1.1 200 OK\r\nContent-Length: 16384\r\nX-N: {i:08}\r\n\r\n")
                    .into_bytes();
            want.extend_from_slice(&body);
            let mut got = vec![0u8; want.len()];
            k.read_exact(&mut got)
                .unwrap_or_else(|e| panic!("{tag}: response {i}: {e}"));
            assert!(got == want, "{tag}: response {i} differs");
            total += want.len() as u64;
        }
        total
    });
    c["round_trips"].as_u64().unwrap_or(u64::MAX)
}

/// Through the server a writev + sendfile response costs ~0 round trips
/// (TCPS_ASYNC_SEND=0: at least one each, for comparison).
#[test]
fn sendfile_makes_no_round_trips() {
    compare_round_trips("writev + sendfile responses", 400, sendfile_round_trips);
}

/// A server that answers each of `n` connections with 8 KiB (more than the
/// sends that never need SO_SNDBUF) and closes it.
const ANSWER_EACH: &str = r#"
import socket, sys
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(64)
print(l.getsockname()[1], flush=True)
for i in range(int(sys.argv[1])):
    c, _ = l.accept()
    c.sendall(bytes([i % 251]) * 8192)
    c.close()
# Stay attached (the test reads this host's counters) until told to go.
l.accept()
"#;

/// Connections a listener accepted start with the SO_SNDBUF its first one
/// read: a server that sends more than a few KiB per connection pays no
/// getsockopt round trip per connection (it paid one each before), and
/// every connection still gets its bytes.
#[test]
fn accepted_connections_share_their_listeners_sndbuf() {
    need("python3");
    let srv = server();
    let dir = TempDir::new("sndbuf");
    let (stats, log) = (dir.path().join("p.stats"), dir.path().join("p.out"));
    let n = 50u32;
    let count = n.to_string();
    let argv = ["python3", "-c", ANSWER_EACH, &count];
    let mut child = command(Net::Tcps, &srv, &stats, &log, &argv)
        .spawn()
        .expect("spawn");
    let t = std::time::Instant::now();
    let port = loop {
        if let Ok(p) = read(&log).trim().parse::<u16>() {
            break p;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{}", read(&log));
        std::thread::sleep(Duration::from_millis(20));
    };
    for i in 0..n {
        let mut k = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        k.read_to_end(&mut got).unwrap();
        assert!(got == vec![(i % 251) as u8; 8192], "connection {i}");
    }
    let h = counters_once_sent(&srv, child.id(), u64::from(n) * 8192)
        .unwrap_or_else(|| panic!("host not in tcps stat\n{}", read(&log)));
    // The program waits for one more connection before it exits, so that
    // its counters were still there to read (they went with it before: a
    // race the test lost under load).
    drop(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    assert!(wait_timeout(&mut child, Duration::from_secs(20)).is_some());
    let reads = h["calls"]["GetSockOpt"].as_u64().unwrap_or(u64::MAX);
    assert!(
        reads <= 2,
        "{reads} getsockopt round trips for {n} connections: {h}"
    );
}
