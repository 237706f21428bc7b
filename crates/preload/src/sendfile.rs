//! sendfile / sendfile64 to an offloaded socket.
//!
//! (Step 1: a copying fallback — the file is read here and sent through the
//! channel.)

use crate::io::send_id;
use crate::real;
use crate::sock::on_socket;
use libc::{c_int, off64_t, size_t, ssize_t};

const CHUNK: usize = 128 * 1024;

unsafe fn copy_out(
    c: &tcps::Client,
    id: u32,
    in_fd: c_int,
    offset: *mut off64_t,
    count: size_t,
) -> ssize_t {
    let mut pos = if offset.is_null() {
        let p = libc::lseek64(in_fd, 0, libc::SEEK_CUR);
        if p < 0 {
            return -1;
        }
        p
    } else {
        *offset
    };
    let mut buf = vec![0u8; count.min(CHUNK)];
    let mut total: usize = 0;
    while total < count {
        let want = (count - total).min(buf.len());
        let n = real::pread64()(in_fd, buf.as_mut_ptr() as *mut libc::c_void, want, pos);
        if n < 0 {
            if total == 0 {
                return -1;
            }
            break;
        }
        if n == 0 {
            break;
        }
        let s = send_id(c, id, &buf[..n as usize], 0);
        if s < 0 {
            if total == 0 {
                return -1;
            }
            break;
        }
        total += s as usize;
        pos += s as off64_t;
        if (s as usize) < n as usize {
            break;
        }
    }
    if offset.is_null() {
        libc::lseek64(in_fd, pos, libc::SEEK_SET);
    } else {
        *offset = pos;
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
    on_socket!(out_fd, |c, id| copy_out(c, id, in_fd, offset, count), else real::sendfile64()(out_fd, in_fd, offset, count))
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
