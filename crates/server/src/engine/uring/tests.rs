//! The io_uring engine's own tests: operations hold their memory, settle,
//! urgent data, accepts into their slots, shutdown and close.

use super::super::{Engine, EpollEngine, Keep, SendOp};
use super::UringEngine;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

/// Reaps until `token`'s completion (bounded).
fn completion(eng: &mut UringEngine, token: u64) -> i32 {
    let mut out = Vec::new();
    for _ in 0..100 {
        eng.wait(Some(Duration::from_millis(10)), &mut out).unwrap();
        if let Some(e) = out.iter().find(|e| e.token == token) {
            return e.res;
        }
    }
    panic!("no completion for {token}");
}

/// A receive waiting for data holds its `Keep` until `forget` cancelled
/// it and the cancellation was reaped; a send's completion reports the
/// bytes and lets its `Keep` go.
#[test]
fn operations_hold_their_memory_until_reaped() {
    let (a, b) = pair();
    let mut eng = UringEngine::new().unwrap();
    let mut buf = vec![0u8; 64];
    let keep = Arc::new(());
    // SAFETY: `buf` outlives the operation (reaped below).
    let ok = unsafe {
        eng.submit_recv(
            a.as_raw_fd(),
            buf.as_mut_ptr(),
            64,
            1,
            Keep::Mapped(keep.clone()),
        )
    };
    assert!(ok);
    eng.flush();
    assert_eq!(Arc::strong_count(&keep), 2, "held while in flight");
    eng.forget(a.as_raw_fd(), 0);
    assert_eq!(completion(&mut eng, 1), -libc::ECANCELED);
    assert_eq!(Arc::strong_count(&keep), 1, "released once reaped");
    assert_eq!(eng.ops_in_flight(), 0);
    // A send of two buffers (SENDMSG).
    let (x, y) = (b"hello ".to_vec(), b"world".to_vec());
    let mut iov = [x.as_slice(), y.as_slice()].map(|p| libc::iovec {
        iov_base: p.as_ptr() as *mut libc::c_void,
        iov_len: p.len(),
    });
    // SAFETY: zeroed msghdr, then its iovecs.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = 2;
    let op = SendOp {
        fd: b.as_raw_fd(),
        msg: &msg,
        flags: libc::MSG_NOSIGNAL | libc::MSG_WAITALL,
    };
    // SAFETY: msg, iov and the buffers outlive the operation.
    assert!(unsafe { eng.submit_send(op, 2, Keep::Mapped(keep.clone())) });
    eng.flush();
    assert_eq!(completion(&mut eng, 2), 11);
    assert_eq!(Arc::strong_count(&keep), 1);
    let mut got = [0u8; 11];
    std::io::Read::read_exact(&mut &a, &mut got).unwrap();
    assert_eq!(&got, b"hello world");
}

/// `settle` hands back what a receive got before it was cancelled, and
/// `wait` never reports it again.
#[test]
fn settle_returns_what_arrived() {
    let (a, b) = pair();
    let mut eng = UringEngine::new().unwrap();
    let mut buf = vec![0u8; 64];
    // SAFETY: `buf` outlives the operation (settled below).
    assert!(unsafe { eng.submit_recv(a.as_raw_fd(), buf.as_mut_ptr(), 64, 9, Keep::Nothing) });
    eng.flush();
    std::io::Write::write_all(&mut &b, b"abc").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(eng.settle(9), Some(3));
    assert_eq!(&buf[..3], b"abc");
    let mut out = Vec::new();
    eng.wait(Some(Duration::from_millis(10)), &mut out).unwrap();
    assert!(out.iter().all(|e| e.token != 9), "{out:?}");
    assert_eq!(eng.settle(9), None, "nothing in flight");
    // Settling a receive that got nothing cancels it.
    // SAFETY: as above.
    assert!(unsafe { eng.submit_recv(a.as_raw_fd(), buf.as_mut_ptr(), 64, 10, Keep::Nothing) });
    eng.flush();
    assert_eq!(eng.settle(10), Some(-libc::ECANCELED));
}

/// What `Engine::urgent_needs_pollin` says: urgent (MSG_OOB) data wakes
/// an io_uring poll for POLLIN|POLLPRI but not one for POLLPRI alone;
/// epoll reports POLLPRI alone.
#[test]
fn urgent_data_wakes_as_documented() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let engines: [Box<dyn Engine>; 2] = [
        Box::new(UringEngine::new().unwrap()),
        Box::new(EpollEngine::new().unwrap()),
    ];
    for mut eng in engines {
        let mut mask = libc::POLLPRI as u32;
        if eng.urgent_needs_pollin() {
            mask |= libc::POLLIN as u32;
        }
        eng.arm(a.as_raw_fd(), 7, mask).unwrap();
        let mut out = Vec::new();
        eng.wait(Some(Duration::from_millis(20)), &mut out).unwrap();
        assert!(out.is_empty(), "{}: {out:?}", eng.name());
        // SAFETY: one byte from a valid buffer.
        unsafe {
            libc::send(
                b.as_raw_fd(),
                b"!".as_ptr() as *const libc::c_void,
                1,
                libc::MSG_OOB,
            )
        };
        eng.wait(Some(Duration::from_millis(1000)), &mut out)
            .unwrap();
        assert_eq!(out.len(), 1, "{}: urgent data not reported", eng.name());
        let mut x = [0u8; 1];
        // SAFETY: one byte into a valid buffer.
        unsafe {
            libc::recv(
                a.as_raw_fd(),
                x.as_mut_ptr() as *mut libc::c_void,
                1,
                libc::MSG_OOB,
            )
        };
        eng.forget(a.as_raw_fd(), 7);
    }
}

/// An accept waits in the kernel until a client connects; its completion
/// puts the connection and the client's address in the slot. One whose
/// listener closes is cancelled, and a slot nobody takes closes its
/// connection.
#[test]
fn accepts_fill_their_slots() {
    use super::super::AcceptSlot;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut eng = UringEngine::new().unwrap();
    let slot = AcceptSlot::new();
    assert!(eng.submit_accept(l.as_raw_fd(), slot.clone(), None, 5));
    eng.flush();
    assert!(slot.take().is_none(), "nothing accepted yet");
    let k = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    assert!(completion(&mut eng, 5) >= 0);
    let (fd, addr, len) = slot.take().expect("the connection");
    let mut peer = [0u8; 16];
    // SAFETY: copying the 16 bytes of an IPv4 address out of the storage.
    unsafe { std::ptr::copy_nonoverlapping(&addr as *const _ as *const u8, peer.as_mut_ptr(), 16) };
    assert_eq!(len, 16);
    let port = u16::from_be_bytes([peer[2], peer[3]]);
    assert_eq!(port, k.local_addr().unwrap().port(), "the client's address");
    drop(fd);
    // Cancelled with its listener's close; the listener's port is free.
    let slot = AcceptSlot::new();
    assert!(eng.submit_accept(l.as_raw_fd(), slot.clone(), None, 6));
    let at = l.local_addr().unwrap();
    eng.close(std::os::fd::OwnedFd::from(l));
    assert_eq!(completion(&mut eng, 6), -libc::ECANCELED);
    assert!(slot.take().is_none());
    drop(std::net::TcpListener::bind(at).expect("the port is free"));
}

/// A close goes out with the next batch; a shutdown completes with its
/// result, and the close of its socket queued meanwhile waits for it.
#[test]
fn shutdown_then_close() {
    let (a, b) = pair();
    let mut eng = UringEngine::new().unwrap();
    assert!(eng.submit_shutdown(a.as_raw_fd(), libc::SHUT_WR, 7));
    eng.close(std::os::fd::OwnedFd::from(a));
    assert_eq!(completion(&mut eng, 7), 0);
    // Its close follows at the next submission: the peer sees the end.
    eng.flush();
    let mut x = [0u8; 1];
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(std::io::Read::read(&mut &b, &mut x).unwrap(), 0);
    // A plain close: the socket is closed after the flush (the peer sees
    // the end).
    let (c, d) = pair();
    eng.close(std::os::fd::OwnedFd::from(c));
    eng.flush();
    d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(std::io::Read::read(&mut &d, &mut x).unwrap(), 0);
}
