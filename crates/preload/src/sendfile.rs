//! sendfile / sendfile64 to an offloaded socket: the TCP server reads the
//! file itself and no file byte passes through this process or the channel.
//!
//! The open file is handed to the server once (`ControlMsg::FileOpen`,
//! SCM_RIGHTS on the control socket) and cached here by (device, inode,
//! size, mtime), so a file served again — nginx opens it anew for every
//! request — costs one fstat and an ordinary channel request
//! (`Client::sendfile`, `Op::SendFile`). At most [`MAX_FILES`] files are
//! kept open at the server; when the cache is full it is emptied.
//!
//! A blocking socket waits for POLLOUT (at the server) and asks again until
//! all of `count` is sent, as the kernel's blocking sendfile does; a
//! non-blocking one returns what the server sent, or EAGAIN.

use crate::errno::fail;
use crate::log::{debug, COUNTERS};
use crate::sock::on_socket;
use crate::{control, real};
use libc::{c_int, off64_t, size_t, ssize_t};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use tcps_proto::handshake::ControlMsg;

/// Largest range per request (the server's limit).
const MAX_CHUNK: usize = 1 << 30;
/// Files kept open at the server per process.
const MAX_FILES: usize = 1024;

/// (st_dev, st_ino, st_size, st_mtime, st_mtime_nsec)
type FileKey = (u64, u64, i64, i64, i64);

pub struct Files {
    generation: u64,
    next: u32,
    handles: HashMap<FileKey, u32>,
}

static FILES: Mutex<Option<Files>> = Mutex::new(None);

/// Held across fork (`fork.rs`), before the control lock (the order
/// [`file_handle`] takes them in).
pub fn lock_for_fork() -> std::sync::MutexGuard<'static, Option<Files>> {
    FILES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server's handle for the regular file open as `fd`.
fn file_handle(fd: c_int) -> Result<u32, i32> {
    // SAFETY: fstat into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(crate::errno::last_errno());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EINVAL);
    }
    let key = (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime,
        st.st_mtime_nsec,
    );
    let mut g = FILES.lock().unwrap_or_else(|p| p.into_inner());
    let generation = crate::state::generation();
    // A forked child's server-side files are not its parent's.
    let files = match g.as_mut() {
        Some(f) if f.generation == generation => f,
        _ => g.insert(Files {
            generation,
            next: 1,
            handles: HashMap::new(),
        }),
    };
    if let Some(&h) = files.handles.get(&key) {
        return Ok(h);
    }
    if files.handles.len() >= MAX_FILES {
        for (_, h) in files.handles.drain() {
            let _ = control::call(ControlMsg::FileClose { handle: h }, h);
        }
    }
    let h = files.next;
    files.next = files.next.wrapping_add(1).max(1);
    match control::exchange(ControlMsg::FileOpen { handle: h }, &[fd])? {
        ControlMsg::Reply { handle, errno: 0 } if handle == h => {}
        ControlMsg::Reply { handle, errno } if handle == h => return Err(errno),
        _ => return Err(libc::EPROTO),
    }
    debug!(
        "sendfile: file (dev {}, inode {}) handed to the server as file {h}",
        key.0, key.1
    );
    files.handles.insert(key, h);
    Ok(h)
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
            crate::errno::last_errno()
        } else {
            libc::EINVAL
        });
    }
    let file = match file_handle(in_fd) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    let nonblocking = real::fcntl()(out_fd, libc::F_GETFL) & libc::O_NONBLOCK != 0;
    crate::fdtable::note_write(id);
    // The server runs sendfile at once, not behind the send queue: the
    // bytes written before must be out first.
    if let Err(e) = crate::sendq::drain(c, id, nonblocking) {
        if e == libc::EPIPE {
            libc::raise(libc::SIGPIPE);
        }
        return fail(e);
    }
    let mut total = 0usize;
    let mut err = 0;
    while total < count {
        let chunk = (count - total).min(MAX_CHUNK) as u32;
        match c
            .sendfile(id, file, start as u64 + total as u64, chunk)
            .map_err(|e| crate::errno::errno_of(&e))
        {
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
                err = crate::errno::errno_of(&e);
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
