//! Asynchronous sends and registered memory end to end, through a real
//! `tcps server` on both engines: bytes are compared by SHA-256 at a kernel
//! receiver; flow control, error reporting and memory ownership rules are
//! checked by what the calls return. File ranges (`sendfile_async`) too:
//! in order with byte sends, and what the server does with ranges it must
//! not send (a file of another host, a file that shrank).

mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tcps::{Client, IoHandle};

/// A kernel listener and a tcps socket connected to it; returns the
/// accepted kernel side too.
fn connected(c: &Client) -> (u32, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let s = c.tcp_connect(addr).expect("tcps connect");
    let (k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    (s, k)
}

/// Reads until EOF, hashing; `pause` sleeps once in a while (a slow reader).
fn hash_to_eof(mut k: TcpStream, pause: Duration) -> (u64, [u8; 32]) {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut reads = 0u64;
    loop {
        let n = k.read(&mut buf).expect("kernel read");
        if n == 0 {
            return (total, h.finalize().into());
        }
        h.update(&buf[..n]);
        total += n as u64;
        reads += 1;
        if reads.is_multiple_of(512) {
            std::thread::sleep(pause);
        }
    }
}

/// 1 GiB of asynchronous sends of random sizes (1 B .. 64 KiB), copying and
/// registered mixed, into a reader that starts late and pauses: arrives
/// intact and in order.
fn one_gib_of_async_sends(engine: &str) {
    const TOTAL: u64 = 1 << 30;
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c);
    // A registered source of random bytes, never written while in flight.
    const SRC: usize = 8 << 20;
    let (p, mem) = c.alloc_registered(SRC).expect("alloc_registered");
    // SAFETY: `p` is SRC bytes of fresh registered memory, ours alone.
    let src = unsafe { std::slice::from_raw_parts_mut(p, SRC) };
    let mut rng = Rng::new(7);
    rng.fill(src);
    let src: &[u8] = src;
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200)); // let credits run out
        hash_to_eof(k, Duration::from_millis(1))
    });
    let mut h = Sha256::new();
    let mut sent = 0u64;
    let mut last = IoHandle::DONE;
    while sent < TOTAL {
        let len = (1 + rng.below(65536) as usize).min((TOTAL - sent) as usize);
        let off = rng.below((SRC - len) as u64) as usize;
        let piece = &src[off..off + len];
        if rng.below(2) == 0 {
            let n = c.send_async(s, piece, 0).expect("send_async");
            assert_eq!(n, len, "an asynchronous send reports the full length");
        } else {
            last = c
                .send_async_registered(s, piece.as_ptr(), len, 0, mem)
                .expect("send_async_registered");
        }
        h.update(piece);
        sent += len as u64;
    }
    c.io_wait(last, Some(Duration::from_secs(120)))
        .expect("the last registered send completes");
    c.close(s).expect("close with sends in flight");
    let (got, digest) = reader.join().unwrap();
    assert_eq!(got, TOTAL, "bytes at the receiver");
    let want: [u8; 32] = h.finalize().into();
    assert_eq!(hex(&digest), hex(&want), "SHA-256 of 1 GiB");
    let st = c.stats();
    assert!(st.async_sends > 10_000, "{st:?}");
    assert_eq!(st.async_fallbacks, 0, "{st:?}");
    assert!(
        st.kicks < st.async_sends / 4,
        "most sends found the server watching: {st:?}"
    );
}

/// Credits run out on a non-blocking socket: EAGAIN, and every byte
/// accepted before it arrives; nothing accepted is lost or duplicated.
fn credits_exhausted_nonblocking_gets_eagain(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c);
    c.set_nonblocking(s, true).unwrap();
    let mut rng = Rng::new(3);
    let chunk = rng.bytes(16 * 1024);
    let mut accepted = Vec::new();
    let mut eagain = false;
    for i in 0..100_000u32 {
        let mut piece = chunk.clone();
        piece[..4].copy_from_slice(&i.to_le_bytes());
        match c.send_async(s, &piece, 0) {
            Ok(n) => {
                assert_eq!(n, piece.len());
                accepted.extend_from_slice(&piece);
            }
            Err(e) => {
                assert_eq!(errno_of(&e), libc::EAGAIN, "{e}");
                eagain = true;
                break;
            }
        }
    }
    assert!(
        eagain,
        "a reader that does not read must exhaust the credits"
    );
    let reader = std::thread::spawn(move || hash_to_eof(k, Duration::ZERO));
    c.set_nonblocking(s, false).unwrap();
    c.flush_async(s, Some(Duration::from_secs(30)))
        .expect("everything accepted is sent");
    c.close(s).unwrap();
    let (n, digest) = reader.join().unwrap();
    assert_eq!(
        n as usize,
        accepted.len(),
        "bytes accepted == bytes received"
    );
    assert_eq!(hex(&digest), hex(&sha256(&accepted)));
}

/// shutdown(SHUT_WR) behind asynchronous sends a reader does not take
/// returns at once, as the kernel's does with a full send buffer, and the
/// FIN still follows every byte: the reader gets them all, then EOF.
fn shutdown_behind_queued_sends_does_not_wait(engine: &str) {
    // Without eager receive the host knows nothing of the connection's
    // state and asks the server (with it, `shutdown` is posted unanswered).
    let srv = Server::start(engine, &["--eager-recv", "off"]);
    let c = srv.attach();
    // Small buffers both ends: most of what is queued stays queued.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_rcvbuf(&l, 4096);
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.setsockopt(s, libc::SOL_SOCKET, libc::SO_SNDBUF, &4096i32.to_ne_bytes())
        .unwrap();
    c.connect(s, &l.local_addr().unwrap())
        .expect("tcps connect");
    let (k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c.set_nonblocking(s, true).unwrap();
    let mut rng = Rng::new(5);
    let mut accepted = Vec::new();
    loop {
        let piece = rng.bytes(16 * 1024);
        match c.send_async(s, &piece, 0) {
            Ok(n) => accepted.extend_from_slice(&piece[..n]),
            Err(e) => {
                assert_eq!(errno_of(&e), libc::EAGAIN, "{e}");
                break;
            }
        }
    }
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let c2 = c.clone();
    std::thread::spawn(move || tx.send(c2.shutdown(s, libc::SHUT_WR)).unwrap());
    let r = rx.recv_timeout(Duration::from_secs(5));
    let waited = t.elapsed();
    let reader = std::thread::spawn(move || hash_to_eof(k, Duration::ZERO));
    assert!(
        matches!(r, Ok(Ok(()))),
        "shutdown with {} bytes queued: {r:?} after {waited:?}",
        accepted.len()
    );
    assert!(
        waited < Duration::from_secs(1),
        "shutdown waited {waited:?}"
    );
    let (n, digest) = reader.join().unwrap();
    assert_eq!(
        n as usize,
        accepted.len(),
        "bytes accepted == bytes received"
    );
    assert_eq!(hex(&digest), hex(&sha256(&accepted)));
    c.close(s).unwrap();
}

/// Credits run out on a blocking socket: the sender waits (it has not
/// returned while the reader sleeps) and finishes once the reader reads.
fn credits_exhausted_blocking_waits(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c);
    let payload = Rng::new(4).bytes(32 << 20);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for piece in payload.chunks(8192) {
                c.send_async(s, piece, 0).expect("blocking send_async");
            }
            tx.send(Instant::now()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "32 MiB cannot fit in 64 credits and socket buffers: the sender must wait"
        );
        let t = Instant::now();
        let (n, digest) = {
            let reader = sc.spawn(move || hash_to_eof(k, Duration::ZERO));
            let done = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("sender finished");
            assert!(done >= t, "the sender finished only after the reader read");
            c.close(s).unwrap();
            reader.join().unwrap()
        };
        assert_eq!(n as usize, payload.len());
        assert_eq!(hex(&digest), hex(&sha256(&payload)));
    });
}

/// The peer resets mid-stream: a later call on the socket reports
/// ECONNRESET or EPIPE, and so does the io handle of a later send.
fn peer_reset_surfaces_later(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c);
    let (p, mem) = c.alloc_registered(1 << 20).unwrap();
    // SAFETY: fresh registered memory of 1 MiB.
    unsafe { std::ptr::write_bytes(p, 0xab, 1 << 20) };
    c.send_async(s, b"hello", 0).unwrap();
    let mut got = [0u8; 5];
    (&k).read_exact(&mut got).unwrap();
    // SO_LINGER 0 + close: the kernel sends RST.
    reset_on_close(&k);
    drop(k);
    std::thread::sleep(Duration::from_millis(50));
    let mut io = IoHandle::DONE;
    let mut reported = None;
    for _ in 0..10_000 {
        match c.send_async_registered(s, p, 64 * 1024, 0, mem) {
            Ok(h) => io = h,
            Err(e) => {
                reported = Some(errno_of(&e));
                break;
            }
        }
    }
    let e = match reported {
        Some(e) => e,
        // Every send was queued: the failure shows on the next call.
        None => {
            std::thread::sleep(Duration::from_millis(100));
            let mut b = [0u8; 1];
            errno_of(&c.recv(s, &mut b, libc::MSG_DONTWAIT).unwrap_err())
        }
    };
    assert!(
        e == libc::ECONNRESET || e == libc::EPIPE,
        "a later call reports the reset: {}",
        errno_name(e)
    );
    if io != IoHandle::DONE {
        let r = c.io_wait(io, Some(Duration::from_secs(10)));
        let e = errno_of(&r.expect_err("the io handle reports the failure"));
        assert!(
            e == libc::ECONNRESET || e == libc::EPIPE,
            "{}",
            errno_name(e)
        );
    }
    c.close(s).unwrap();
}

/// A registration is not deregistered while a send from it is in flight
/// (EBUSY); once the send is done it is.
fn deregister_in_flight_is_ebusy(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    // The reader's small, fixed receive buffer (inherited from the
    // listener) keeps most of the 8 MiB at the server while it does not
    // read: with autotuning (tcp_rmem up to 32 MiB here) the whole send
    // could finish before the write below, and then there is no misuse.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    set_rcvbuf(&l, 64 * 1024);
    let s = c
        .tcp_connect(l.local_addr().unwrap())
        .expect("tcps connect");
    let (k, _) = l.accept().unwrap();
    k.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    const N: usize = 8 << 20;
    let (p, mem) = c.alloc_registered(N).unwrap();
    // SAFETY: fresh registered memory of N bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, N) };
    Rng::new(5).fill(buf);
    let want = sha256(buf);
    let io = c.send_async_registered(s, p, N, 0, mem).unwrap();
    assert_errno(
        c.deregister_memory(mem),
        libc::EBUSY,
        "deregister in flight",
    );
    assert!(
        !c.io_done(io).unwrap(),
        "8 MiB cannot be sent to a reader that does not read"
    );
    let reader = std::thread::spawn(move || hash_to_eof(k, Duration::ZERO));
    c.io_wait(io, Some(Duration::from_secs(30))).unwrap();
    c.deregister_memory(mem).expect("deregister once done");
    c.close(s).unwrap();
    let (n, digest) = reader.join().unwrap();
    assert_eq!(n as usize, N);
    assert_eq!(hex(&digest), hex(&want), "the data was not corrupted");
}

/// Registered calls with memory that is not registered: EINVAL, nothing sent.
fn unregistered_memory_is_einval(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let (s, k) = connected(&c);
    let (p, mem) = c.alloc_registered(4096).unwrap();
    let plain = vec![1u8; 4096];
    assert_errno(
        c.send_async_registered(s, plain.as_ptr(), plain.len(), 0, mem),
        libc::EINVAL,
        "async send from unregistered memory",
    );
    assert_errno(
        c.send_registered(s, plain.as_ptr(), plain.len(), 0, mem),
        libc::EINVAL,
        "sync send from unregistered memory",
    );
    // SAFETY: p + 4000 is inside the registration; 200 bytes run past it.
    let tail = unsafe { p.add(4000) };
    assert_errno(
        c.send_async_registered(s, tail, 200, 0, mem),
        libc::EINVAL,
        "range running past the registration",
    );
    assert_errno(
        c.send_async_registered(s, p, 16, 0, mem + 1),
        libc::EINVAL,
        "unknown registration",
    );
    c.send(s, b"ok", 0).unwrap();
    c.close(s).unwrap();
    let mut got = Vec::new();
    (&k).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"ok", "nothing of the refused sends reached the peer");
}

/// Synchronous registered send and receive: no host copy (0 bytes copied
/// per network byte) and the bytes intact both ways.
fn registered_sync_roundtrip_copies_nothing(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let echo = kernel_echo_server("127.0.0.1:0");
    let s = c.tcp_connect(echo).unwrap();
    const N: usize = 1 << 20;
    let (tx, mem) = c.alloc_registered(2 * N).unwrap();
    // SAFETY: fresh registered memory of 2N bytes: [0, N) out, [N, 2N) in.
    let (out, inn) = unsafe {
        (
            std::slice::from_raw_parts_mut(tx, N),
            std::slice::from_raw_parts_mut(tx.add(N), N),
        )
    };
    Rng::new(6).fill(out);
    let before = c.stats();
    let sent = c.send_registered(s, out.as_ptr(), N, 0, mem).unwrap();
    assert_eq!(sent, N, "a blocking registered send sends everything");
    let mut have = 0;
    while have < N {
        let n = c
            .recv_registered(s, inn[have..].as_mut_ptr(), N - have, 0, mem)
            .unwrap();
        assert!(n > 0, "EOF after {have}");
        have += n;
    }
    assert_eq!(hex(&sha256(inn)), hex(&sha256(out)));
    let after = c.stats();
    assert_eq!(
        after.bytes_copied, before.bytes_copied,
        "registered calls copy nothing"
    );
    assert!(after.bytes_sent - before.bytes_sent >= N as u64);
    c.close(s).unwrap();
}

/// Debug mode: writing a registered buffer while its send is in flight is
/// detected and counted.
fn debug_mode_detects_writes_in_flight(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    // Not TCPS_DEBUG_REGISTERED: the environment is shared by the tests
    // running in parallel in this process.
    c.set_registered_debug(true);
    let (s, k) = connected(&c);
    const N: usize = 8 << 20;
    let (p, mem) = c.alloc_registered(N).unwrap();
    // SAFETY: fresh registered memory of N bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, N) };
    buf.fill(1);
    let io = c.send_async_registered(s, p, N, 0, mem).unwrap();
    // The reader does not read yet, so most of the buffer is still unsent:
    // the misuse the debug mode is there to catch.
    buf[N - 1] = 2;
    let reader = std::thread::spawn(move || hash_to_eof(k, Duration::ZERO));
    c.io_wait(io, Some(Duration::from_secs(30))).unwrap();
    // Flushing looks at the queue, where the server counted the misuse.
    c.flush_async(s, Some(Duration::from_secs(30))).unwrap();
    c.close(s).unwrap();
    reader.join().unwrap();
    let st = c.stats();
    assert_eq!(st.registered_misuse, 1, "{st:?}");
}

// ---- asynchronous sendfile (file ranges on the send queue, issue 14 item 2)

/// A file of `len` random bytes in `dir`, open: (file, its bytes).
fn random_file(dir: &TempDir, name: &str, len: usize, seed: u64) -> (std::fs::File, Vec<u8>) {
    let bytes = Rng::new(seed).bytes(len);
    let path = dir.path().join(name);
    std::fs::write(&path, &bytes).unwrap();
    (std::fs::File::open(&path).unwrap(), bytes)
}

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

/// Byte sends and file ranges of two files, interleaved, with a file handle
/// closed while ranges of it are still queued: the kernel receiver gets
/// exactly the expected stream.
fn file_ranges_in_order_with_bytes(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let dir = TempDir::new("async-sendfile");
    let (fa, a) = random_file(&dir, "a", 3 << 20, 1);
    let (fb, b) = random_file(&dir, "b", 12345, 2);
    c.file_open(1, fa.as_raw_fd()).unwrap();
    c.file_open(2, fb.as_raw_fd()).unwrap();
    let (s, k) = connected(&c);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        (&k).read_to_end(&mut got).unwrap();
        got
    });
    let mut want = Vec::new();
    let mut rng = Rng::new(3);
    for i in 0..300u32 {
        let hdr = format!("header {i}\r\n");
        c.send_async(s, hdr.as_bytes(), 0).unwrap();
        want.extend_from_slice(hdr.as_bytes());
        let (file, bytes) = if i % 3 == 0 { (2, &b) } else { (1, &a) };
        let off = rng.below(bytes.len() as u64 - 1) as usize;
        let len = 1 + rng.below((bytes.len() - off).min(40_000) as u64 - 1) as usize;
        c.sendfile_async(s, file, off as u64, len as u32, 0)
            .unwrap();
        want.extend_from_slice(&bytes[off..off + len]);
    }
    // The whole of `a`, then its handle closed at once: the queued range
    // keeps the server's copy of the file open until it was sent.
    let io = c.sendfile_async(s, 1, 0, a.len() as u32, 0).unwrap();
    want.extend_from_slice(&a);
    c.file_close(1).unwrap();
    c.send_async(s, b"trailer", 0).unwrap();
    want.extend_from_slice(b"trailer");
    c.io_wait(io, WAIT).unwrap();
    c.flush_async(s, WAIT).unwrap();
    c.close(s).unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got.len(), want.len());
    assert_eq!(
        Sha256::digest(&got),
        Sha256::digest(&want),
        "stream differs"
    );
    // The handle is gone now: a new range of it fails.
    let (s, _k) = connected(&c);
    let io = c.sendfile_async(s, 1, 0, 10, 0).unwrap();
    let e = c.io_wait(io, WAIT).expect_err("closed handle");
    assert_eq!(errno_of(&e), libc::EINVAL, "{}", errno_name(errno_of(&e)));
}

/// A range naming a file another host handed over is not sent: it fails
/// (EINVAL) and the stream with it; the owner is not disturbed. Malformed
/// ranges are refused at the call.
fn foreign_file_handle_fails(engine: &str) {
    let srv = start_server(engine);
    let owner = srv.attach();
    let other = srv.attach();
    let dir = TempDir::new("async-sendfile-foreign");
    let (f, bytes) = random_file(&dir, "secret", 4096, 4);
    owner.file_open(7, f.as_raw_fd()).unwrap();
    let (s, k) = connected(&other);
    let io = other.sendfile_async(s, 7, 0, 4096, 0).unwrap();
    let e = other.io_wait(io, WAIT).expect_err("not this host's file");
    assert_eq!(errno_of(&e), libc::EINVAL, "{}", errno_name(errno_of(&e)));
    // Every later send of the socket fails too (the stream has a hole).
    let later = other
        .send_async(s, b"x", 0)
        .and_then(|_| other.flush_async(s, WAIT));
    assert!(later.is_err(), "a send after the failed range");
    other.close(s).unwrap();
    let mut got = Vec::new();
    (&k).read_to_end(&mut got).unwrap();
    assert!(got.is_empty(), "sent {} bytes of a foreign file", got.len());
    for (off, len) in [(i64::MAX as u64, 1), (0, (1 << 30) + 1), (u64::MAX, 1)] {
        let e = other.sendfile_async(s, 7, off, len, 0).unwrap_err();
        assert_eq!(errno_of(&e), libc::EINVAL, "({off}, {len})");
    }
    // The owner still sends it.
    let (s, k) = connected(&owner);
    owner.sendfile_async(s, 7, 0, 4096, 0).unwrap();
    owner.flush_async(s, WAIT).unwrap();
    owner.close(s).unwrap();
    let mut got = Vec::new();
    (&k).read_to_end(&mut got).unwrap();
    assert_eq!(got, bytes);
}

/// A file that shrank after its range was queued: the server sends what
/// there is and fails the range with EIO.
fn shrunk_file_fails_with_eio(engine: &str) {
    let srv = start_server(engine);
    let c = srv.attach();
    let dir = TempDir::new("async-sendfile-shrunk");
    let (f, bytes) = random_file(&dir, "shrinks", 64 << 10, 5);
    c.file_open(3, f.as_raw_fd()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("shrinks"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    let (s, k) = connected(&c);
    let io = c.sendfile_async(s, 3, 0, 64 << 10, 0).unwrap();
    let e = c.io_wait(io, WAIT).expect_err("the file ended early");
    assert_eq!(errno_of(&e), libc::EIO, "{}", errno_name(errno_of(&e)));
    c.close(s).unwrap();
    let mut got = Vec::new();
    (&k).read_to_end(&mut got).unwrap();
    assert_eq!(got, bytes[..1000], "what the file still held");
}

engine_tests!(
    one_gib_of_async_sends,
    credits_exhausted_nonblocking_gets_eagain,
    credits_exhausted_blocking_waits,
    shutdown_behind_queued_sends_does_not_wait,
    peer_reset_surfaces_later,
    deregister_in_flight_is_ebusy,
    unregistered_memory_is_einval,
    registered_sync_roundtrip_copies_nothing,
    debug_mode_detects_writes_in_flight,
    file_ranges_in_order_with_bytes,
    foreign_file_handle_fails,
    shrunk_file_fails_with_eio,
);
