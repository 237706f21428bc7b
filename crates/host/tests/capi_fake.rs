//! The C ABI against the in-process fake server. The ABI's client is
//! process-global, so this file holds a single test.

mod common;

use common::{Fake, Mode};
use std::ffi::{CStr, CString};
use std::mem::size_of;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};
use tcps::capi::*;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn strerror_last() -> String {
    // SAFETY: tcps_strerror_last returns a valid NUL-terminated static string.
    unsafe { CStr::from_ptr(tcps_strerror_last()) }
        .to_string_lossy()
        .into_owned()
}

fn sockaddr_in(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    }
}

#[test]
fn c_abi_end_to_end() {
    assert_eq!(strerror_last(), "");
    // No server: ECONNREFUSED and a message naming the path.
    let missing = CString::new("/nonexistent/tcps-c/x.sock").unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { tcps_attach(missing.as_ptr()) }, -1);
    assert_eq!(errno(), libc::ECONNREFUSED);
    assert!(strerror_last().contains("/nonexistent/tcps-c/x.sock"));

    let fake = Fake::start(Mode::Accept);
    let path = CString::new(fake.path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { tcps_attach(path.as_ptr()) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { tcps_attach(path.as_ptr()) }, -1);
    assert_eq!(errno(), libc::EISCONN);

    let s = tcps_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
    assert!(s >= 0, "errno {}", errno());
    let sin = sockaddr_in(8080);
    let sinlen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a valid sockaddr_in of `sinlen` bytes.
    assert_eq!(
        unsafe { tcps_bind(s, &sin as *const _ as *const libc::sockaddr, sinlen) },
        0
    );
    assert_eq!(tcps_listen(s, 16), 0);

    // getsockname with a roomy buffer: full length back, bytes equal.
    // SAFETY: zeroed sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: ss holds `len` bytes.
    assert_eq!(
        unsafe { tcps_getsockname(s, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) },
        0
    );
    assert_eq!(len, sinlen);
    // SAFETY: ss now holds a sockaddr_in.
    let got = unsafe { *(&ss as *const _ as *const libc::sockaddr_in) };
    assert_eq!(
        (got.sin_port, got.sin_addr.s_addr),
        (sin.sin_port, sin.sin_addr.s_addr)
    );

    // accept with and without an address.
    let mut len = sinlen;
    // SAFETY: ss holds more than `len` bytes.
    let a = unsafe { tcps_accept(s, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
    assert!(a >= 0 && a != s);
    assert_eq!(len, sinlen);
    // SAFETY: NULL address is allowed.
    let b = unsafe {
        tcps_accept4(
            s,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK,
        )
    };
    assert!(b >= 0);

    // send / recv round trip through the fake's loopback buffer.
    let msg = b"hello tcps";
    // SAFETY: msg is valid for its length.
    assert_eq!(
        unsafe { tcps_send(a, msg.as_ptr() as *const libc::c_void, msg.len(), 0) },
        msg.len() as isize
    );
    let mut buf = [0u8; 64];
    // SAFETY: buf is valid for its length.
    let n = unsafe { tcps_recv(a, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    assert_eq!(&buf[..n as usize], msg);

    // poll: negative fds are skipped and get revents 0.
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLOUT,
            revents: 0,
        },
        libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 123,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: fds holds 3 entries.
    assert_eq!(unsafe { tcps_poll(fds.as_mut_ptr(), 3, 0) }, 1);
    assert_eq!(
        [fds[0].revents, fds[1].revents, fds[2].revents],
        [libc::POLLOUT, 0, 0]
    );

    // getsockopt / setsockopt / fcntl.
    let mut v = 0i32;
    let mut vlen = 4 as libc::socklen_t;
    // SAFETY: v is 4 bytes.
    assert_eq!(
        unsafe {
            tcps_getsockopt(
                a,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut v as *mut _ as *mut libc::c_void,
                &mut vlen,
            )
        },
        0
    );
    assert_eq!((v, vlen), (7, 4));
    let one = 1i32;
    // SAFETY: one is 4 bytes.
    assert_eq!(
        unsafe {
            tcps_setsockopt(
                a,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &one as *const _ as *const libc::c_void,
                4,
            )
        },
        0
    );
    assert_eq!(
        tcps_fcntl(b, libc::F_GETFL, 0) & libc::O_NONBLOCK,
        libc::O_NONBLOCK
    );
    assert_eq!(
        tcps_fcntl(a, libc::F_SETFL, libc::O_NONBLOCK as libc::c_long),
        0
    );

    // Errors: -1 and errno.
    assert_eq!(tcps_close(9999), -1);
    assert_eq!(errno(), libc::EBADF);
    assert_eq!(tcps_shutdown(-3, libc::SHUT_RD), -1);
    assert_eq!(errno(), libc::EBADF);
    assert_eq!(tcps_close(a), 0);

    // Other threads use the same attachment.
    let ts: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..100 {
                    let s = tcps_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    assert!(s >= 0);
                    assert_eq!(tcps_close(s), 0);
                }
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }

    // Detach hangs up; the next call attaches again on demand ($TCPS_SOCKET).
    tcps_detach();
    let t = Instant::now();
    while fake.hosts_gone() < 1 {
        assert!(t.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::env::set_var("TCPS_SOCKET", &fake.path);
    let s = tcps_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
    assert!(
        s >= 0,
        "lazy re-attach failed: errno {} {}",
        errno(),
        strerror_last()
    );

    // The server dies: a blocked call fails with ECONNRESET within a second,
    // later calls with ENOTCONN (EPIPE for send).
    let blocked = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        // SAFETY: b is valid for its length.
        let n = unsafe { tcps_recv(s, b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
        (n, errno())
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    fake.kill();
    assert_eq!(blocked.join().unwrap(), (-1, libc::ECONNRESET));
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(tcps_listen(s, 1), -1);
    assert_eq!(errno(), libc::ENOTCONN);
    // SAFETY: a valid buffer.
    assert_eq!(
        unsafe { tcps_send(s, b"x".as_ptr() as *const libc::c_void, 1, 0) },
        -1
    );
    assert_eq!(errno(), libc::EPIPE);
    tcps_detach();
}
