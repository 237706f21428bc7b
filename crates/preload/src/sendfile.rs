//! sendfile / sendfile64 to an offloaded socket: the TCP server reads the
//! file itself. The open file travels to the server (SCM_RIGHTS on the
//! control socket, `ControlMsg::SendFile`) with the range; the server does
//! a non-blocking sendfile(2) on its kernel socket and answers the count.
//! No file byte passes through this process or the channel.
//!
//! A blocking socket waits for POLLOUT (at the server) and asks again until
//! all of `count` is sent, as the kernel's blocking sendfile does; a
//! non-blocking one returns what the server sent, or EAGAIN.

use crate::log::{debug, COUNTERS};
use crate::sock::on_socket;
use crate::{control, fail, real};
use libc::{c_int, off64_t, size_t, ssize_t};
use std::sync::atomic::Ordering;
use tcps_proto::handshake::ControlMsg;

/// Largest range per message (the server's limit).
const MAX_CHUNK: usize = 1 << 30;

/// One server-side sendfile: bytes sent or an errno.
fn server_sendfile(id: u32, in_fd: c_int, offset: u64, count: usize) -> Result<usize, i32> {
    let msg = ControlMsg::SendFile {
        sock: id,
        offset,
        count: count.min(MAX_CHUNK) as u32,
    };
    match control::exchange(msg, &[in_fd])? {
        ControlMsg::Sent { sock, bytes } if sock == id => Ok(bytes as usize),
        ControlMsg::Reply { handle, errno } if handle == id && errno != 0 => Err(errno),
        _ => Err(libc::EPROTO),
    }
}

unsafe fn offloaded_sendfile(
    c: &tcps::Client,
    out_fd: c_int,
    id: u32,
    in_fd: c_int,
    offset: *mut off64_t,
    count: size_t,
) -> ssize_t {
    let start = if offset.is_null() {
        libc::lseek64(in_fd, 0, libc::SEEK_CUR)
    } else {
        *offset
    };
    if start < 0 {
        return fail(if offset.is_null() {
            crate::last_errno()
        } else {
            libc::EINVAL
        });
    }
    let nonblocking = real::fcntl()(out_fd, libc::F_GETFL) & libc::O_NONBLOCK != 0;
    crate::fdtable::note_write(id);
    let mut total = 0usize;
    let mut err = 0;
    while total < count {
        match server_sendfile(id, in_fd, start as u64 + total as u64, count - total) {
            Ok(0) => break, // end of file
            Ok(n) => total += n,
            Err(libc::EAGAIN) if !nonblocking => {}
            Err(e) => {
                err = e;
                break;
            }
        }
        if total < count && !nonblocking {
            // Wait (parked at the server) until the socket can take more.
            let mut p = [tcps::PollFd {
                sock: id,
                events: libc::POLLOUT,
                revents: 0,
            }];
            if let Err(e) = c.poll(&mut p, -1) {
                err = crate::errno_of(&e);
                break;
            }
        } else if nonblocking {
            break;
        }
    }
    COUNTERS
        .sendfile_bytes
        .fetch_add(total as u64, Ordering::Relaxed);
    debug!("sendfile(fd {out_fd}, file fd {in_fd}): {total} of {count} bytes sent by the server (errno {err})");
    let end = start + total as off64_t;
    if offset.is_null() {
        libc::lseek64(in_fd, end, libc::SEEK_SET);
    } else {
        *offset = end;
    }
    if total == 0 && err != 0 {
        if err == libc::EPIPE {
            libc::raise(libc::SIGPIPE);
        }
        return fail(err);
    }
    total as ssize_t
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off64_t,
    count: size_t,
) -> ssize_t {
    on_socket!(
        out_fd,
        |c, id| offloaded_sendfile(c, out_fd, id, in_fd, offset, count),
        else real::sendfile64()(out_fd, in_fd, offset, count)
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    if crate::fdtable::lookup(out_fd).is_none() {
        return real::sendfile()(out_fd, in_fd, offset, count);
    }
    // off_t is 64-bit on the 64-bit targets we build for.
    sendfile64(out_fd, in_fd, offset as *mut off64_t, count)
}
