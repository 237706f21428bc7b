//! The server side of eager receive and accept (PROTOCOL §10), spoken raw: a host
//! that reads the accept and receive rings itself (no host library), so
//! the server's contract is checked on its own — accept ahead after the
//! first kick, setup with accept, receive straight into the ring, pause and
//! resume under backpressure, end of stream, ring-aware poll, SOL_TCPS
//! options, and the listener's untaken connections closed with it.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use tcps_proto::eager::*;
use tcps_proto::{Call, Completion};

/// Channel 0 driven by hand ([`RawCalls`]), with the rings read by hand.
struct Raw(RawCalls);

impl std::ops::Deref for Raw {
    type Target = RawCalls;
    fn deref(&self) -> &RawCalls {
        &self.0
    }
}

impl Raw {
    fn new(srv: &Server) -> Raw {
        Raw(RawCalls::new(RawHost::attach(&srv.socket).unwrap()))
    }

    fn kick(&self, sock: u32) {
        self.post(Call::RecvKick { sock }.encode());
    }

    fn ring(&self, sock: u32) -> tcps_proto::region::RecvRingRef<'_> {
        self.h.region.recv_ring(sock).unwrap()
    }

    fn wait_tail(&self, sock: u32, at_least: u32) -> u32 {
        let t = Instant::now();
        loop {
            let tail = self.ring(sock).ctl().tail.load(Ordering::Acquire);
            if tail >= at_least {
                return tail;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "ring {sock}: tail {tail} < {at_least}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn setsockopt_int(&self, sock: u32, level: i32, name: i32, v: i32) -> Completion {
        self.arena(512, &v.to_ne_bytes());
        self.run(Call::SetSockOpt {
            sock,
            level,
            name,
            value: span(512, 4),
        })
    }

    fn getsockopt_int(&self, sock: u32, level: i32, name: i32) -> Result<i32, i32> {
        let c = self.run(Call::GetSockOpt {
            sock,
            level,
            name,
            value: span(512, 4),
        });
        if c.result < 0 {
            return Err(c.errno);
        }
        let b = self.arena_out(512, 4);
        Ok(i32::from_ne_bytes(b.try_into().unwrap()))
    }
}

fn sockaddr_loopback() -> Vec<u8> {
    let mut a = vec![0u8; 16];
    a[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    a[4..8].copy_from_slice(&[127, 0, 0, 1]);
    a
}

/// A listener: the host makes and binds its kernel socket itself and hands
/// it over (protocol v5: the server creates and binds no socket for a
/// local host); the server listens on it.
fn listener(raw: &Raw) -> (u32, u16, Completion) {
    let a = sockaddr_loopback();
    // SAFETY: plain syscalls; `a` is a sockaddr_in of its length.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        assert_eq!(
            libc::bind(fd, a.as_ptr() as *const libc::sockaddr, a.len() as u32),
            0
        );
        fd
    };
    let l = raw.h.adopt_socket(fd, false).expect("SocketAdopt");
    // SAFETY: our copy; the server keeps its own.
    unsafe { libc::close(fd) };
    let lc = raw.run(Call::Listen {
        sock: l,
        backlog: 16,
    });
    assert_eq!(lc.result, 0);
    let c = raw.run(Call::GetSockName {
        sock: l,
        addr: span(0, 128),
    });
    assert_eq!(c.result, 0);
    let a = raw.arena_out(0, 4);
    (l, u16::from_be_bytes([a[2], a[3]]), lc)
}

fn eager_receive_and_accept(engine: &str) {
    let srv = Server::start(
        engine,
        &[
            "--poll",
            "adaptive",
            "--eager-accept",
            "on",
            "--eager-recv",
            "push",
            "--setup-with-accept",
            "on",
        ],
    );
    let raw = Raw::new(&srv);
    let (l, port, lc) = listener(&raw);
    assert_eq!(lc.aux, RECV_MODE_RING, "listen binds the accept ring");
    let ctl = raw.ring(l).ctl();
    assert_eq!(ctl.owner.load(Ordering::Acquire), l + 1);
    assert_eq!(ctl.kind.load(Ordering::Acquire), KIND_ACCEPT);

    // No accepting ahead before the host asked.
    let mut c1 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c1.write_all(b"hello").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(raw.ring(l).ctl().tail.load(Ordering::Acquire), 0);
    raw.kick(l);
    raw.wait_tail(l, ACCEPT_RECORD_SIZE);
    assert_eq!(raw.ring(l).ctl().kicks_seen.load(Ordering::Acquire), 1);
    let rec = raw.ring(l).read_record(0);
    assert_eq!(rec.flags, SETUP_SENDQ | SETUP_RECV_RING, "{rec:?}");
    assert!(rec.addr_len == 16);
    let s = rec.sock;
    raw.ring(l)
        .ctl()
        .head
        .store(ACCEPT_RECORD_SIZE, Ordering::Release);
    let sq = raw.h.region.send_queue(s).unwrap();
    assert_eq!(sq.ctl().owner.load(Ordering::Acquire), s + 1);
    assert_eq!(raw.ring(s).ctl().kind.load(Ordering::Acquire), KIND_BYTES);

    // The request bytes are in the ring with no recv request.
    raw.wait_tail(s, 5);
    let mut b = [0u8; 5];
    raw.ring(s).read_at(0, &mut b);
    assert_eq!(&b, b"hello");
    raw.ring(s).ctl().head.store(5, Ordering::Release);

    // Requests the host library never sends: EINVAL.
    let c = raw.run(Call::Accept {
        sock: l,
        addr: span(0, 128),
        flags: 0,
    });
    assert_eq!(c.errno, libc::EINVAL);
    let c = raw.run(Call::Recv {
        sock: s,
        data: span(0, 100),
        flags: 0,
    });
    assert_eq!(c.errno, libc::EINVAL);
    let c = raw.run(Call::RecvBind { sock: s });
    assert_eq!(c.result as u64, RECV_MODE_RING);

    // Policy options.
    assert_eq!(raw.getsockopt_int(s, SOL_TCPS, TCPS_EAGER_RECV), Ok(2));
    assert_eq!(
        raw.getsockopt_int(s, SOL_TCPS, TCPS_EAGER_RECV_SIZE),
        Ok(32 * 1024)
    );
    assert_eq!(
        raw.setsockopt_int(s, SOL_TCPS, TCPS_EAGER_RECV, 1).errno,
        libc::EBUSY
    );
    assert_eq!(
        raw.setsockopt_int(s, SOL_TCPS, TCPS_EAGER_RECV, 7).errno,
        libc::EINVAL
    );
    assert_eq!(
        raw.setsockopt_int(s, SOL_TCPS, 99, 1).errno,
        libc::ENOPROTOOPT
    );
    assert_eq!(raw.getsockopt_int(s, SOL_TCPS, 99), Err(libc::ENOPROTOOPT));
    assert_eq!(
        raw.setsockopt_int(s, SOL_TCPS, TCPS_EAGER_RECV_SIZE, 100)
            .errno,
        libc::EINVAL
    );

    // Backpressure: far more than the ring; the reader consumes slowly and
    // kicks when it finds the ring paused.
    let data = Rng::new(7).bytes(1 << 20);
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        c1.write_all(&sent).unwrap();
        c1.shutdown(Shutdown::Write).unwrap();
        c1
    });
    let mut got = Vec::with_capacity(data.len());
    let mut head = 5u32;
    let mut saw_pause = false;
    let t = Instant::now();
    let end = loop {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "stalled at {}",
            got.len()
        );
        let r = raw.ring(s);
        let tail = r.ctl().tail.load(Ordering::Acquire);
        let used = tail.wrapping_sub(head);
        assert!(used <= r.size(), "server overran the ring");
        if used == 0 {
            let end = r.ctl().end.load(Ordering::Acquire);
            if end != END_NONE && r.ctl().tail.load(Ordering::Acquire) == head {
                break end;
            }
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        if got.len() < 100_000 {
            std::thread::sleep(Duration::from_millis(2)); // let it fill up
        }
        let n = used.min(3000);
        let mut b = vec![0u8; n as usize];
        r.read_at(head, &mut b);
        got.extend_from_slice(&b);
        head = head.wrapping_add(n);
        r.ctl().head.store(head, Ordering::Release);
        fence(Ordering::SeqCst);
        if r.ctl().paused.load(Ordering::Acquire) != 0 {
            saw_pause = true;
            raw.kick(s);
        }
    };
    assert_eq!(end, END_EOF);
    assert!(
        got == data,
        "bytes differ ({} of {})",
        got.len(),
        data.len()
    );
    assert!(
        saw_pause,
        "a 1 MiB stream through a 32 KiB ring never paused"
    );
    let mut c1 = writer.join().unwrap();

    // Ring-aware poll: EOF is POLLIN|POLLRDHUP with nothing left in the kernel.
    let mut entry = Vec::new();
    entry.extend_from_slice(&s.to_ne_bytes());
    entry.extend_from_slice(&(libc::POLLIN | libc::POLLRDHUP).to_ne_bytes());
    entry.extend_from_slice(&0i16.to_ne_bytes());
    raw.arena(1024, &entry);
    let c = raw.run(Call::Poll {
        entries: span(1024, 8),
        n: 1,
        timeout_ms: 0,
    });
    assert_eq!(c.result, 1, "{c:?}");
    let ev = raw.arena_out(1024, 8);
    let revents = i16::from_ne_bytes([ev[6], ev[7]]);
    assert_eq!(
        revents & (libc::POLLIN | libc::POLLRDHUP),
        libc::POLLIN | libc::POLLRDHUP
    );

    // The connection still sends (the server did not touch the write side).
    raw.arena(0, b"bye");
    let send = Call::Send {
        sock: s,
        data: span(0, 3),
        flags: 0,
    };
    assert_eq!(raw.run(send).result, 3);
    let mut b = [0u8; 3];
    c1.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"bye");
    assert_eq!(
        raw.run(Call::Close {
            sock: s,
            reply: true
        })
        .result,
        0
    );
    assert_eq!(raw.ring(s).ctl().owner.load(Ordering::Acquire), 0);

    // A connection accepted ahead and never taken closes with its listener.
    let mut c2 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.wait_tail(l, 2 * ACCEPT_RECORD_SIZE);
    assert_eq!(
        raw.run(Call::Close {
            sock: l,
            reply: true
        })
        .result,
        0
    );
    c2.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 1];
    match c2.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("untaken connection not closed: {other:?}"),
    }
    assert_eq!(raw.ring(l).ctl().owner.load(Ordering::Acquire), 0);
}

#[test]
fn eager_receive_and_accept_uring() {
    eager_receive_and_accept("uring");
}

#[test]
fn eager_receive_and_accept_epoll() {
    eager_receive_and_accept("epoll");
}

/// Pull: the server reads ahead into its own buffer and answers `Recv`
/// requests from it; end of stream after the data.
fn pull(engine: &str) {
    let srv = Server::start(
        engine,
        &[
            "--eager-accept",
            "off",
            "--eager-recv",
            "pull",
            "--setup-with-accept",
            "on",
        ],
    );
    let raw = Raw::new(&srv);
    let (l, port, lc) = listener(&raw);
    assert_eq!(lc.aux, RECV_MODE_NONE);
    let mut c1 = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let c = raw.run(Call::Accept {
        sock: l,
        addr: span(0, 128),
        flags: 0,
    });
    assert!(c.result >= 0, "{c:?}");
    assert_eq!(c.aux & 0xffff_ffff, 16);
    assert_eq!(
        (c.aux >> 32) as u32,
        SETUP_SENDQ | SETUP_RECV_PLAIN,
        "pull: the send queue is set up, and receiving is by requests"
    );
    let s = c.result as u32;
    assert_eq!(
        raw.run(Call::RecvBind { sock: s }).result as u64,
        RECV_MODE_PULL
    );
    c1.write_all(b"abcdef").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let c = raw.run(Call::Recv {
        sock: s,
        data: span(0, 4),
        flags: libc::MSG_PEEK,
    });
    assert_eq!(c.result, 4);
    assert_eq!(raw.arena_out(0, 4), b"abcd");
    let c = raw.run(Call::Recv {
        sock: s,
        data: span(0, 4),
        flags: 0,
    });
    assert_eq!(c.result, 4);
    assert_eq!(raw.arena_out(0, 4), b"abcd");
    let c = raw.run(Call::Recv {
        sock: s,
        data: span(0, 100),
        flags: 0,
    });
    assert_eq!(c.result, 2);
    assert_eq!(raw.arena_out(0, 2), b"ef");
    c1.write_all(b"xyz").unwrap();
    c1.shutdown(Shutdown::Write).unwrap();
    let c = raw.run(Call::Recv {
        sock: s,
        data: span(0, 100),
        flags: libc::MSG_WAITALL,
    });
    assert_eq!(c.result, 3, "WAITALL stops at the end of stream");
    assert_eq!(raw.arena_out(0, 3), b"xyz");
    let c = raw.run(Call::Recv {
        sock: s,
        data: span(0, 100),
        flags: 0,
    });
    assert_eq!(c.result, 0);
    drop(c1);
}

#[test]
fn pull_uring() {
    pull("uring");
}

#[test]
fn pull_epoll() {
    pull("epoll");
}
