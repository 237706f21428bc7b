//! sendfile / sendfile64 to an offloaded socket: the TCP server reads the
//! file itself and no file byte passes through this process or the channel.
//!
//! The open file is handed to the server once (`Client::file_open`:
//! `ControlMsg::FileOpen`, SCM_RIGHTS on the control socket) and cached
//! here by (device, inode, size, mtime), so a file served again — nginx
//! opens it anew for every request — costs one fstat. At most
//! [`MAX_FILES`] files are kept open at the server; when the cache is full
//! it is emptied (ranges already queued keep their file open at the server
//! until they are sent).
//!
//! **On a server on another node** (`TCPS_REMOTE`) the server opens the
//! file at the same path itself (`Op::FileOpen`) if it shares the tree
//! (`tcps server --shared-files DIR`), and everything below runs as on one
//! node. A file it refuses (not shared, differs there, no permission) is
//! remembered as refused, and its bytes are read here and sent as
//! ordinary sends ([`remote_sendfile`]).
//!
//! **Asynchronous** (the default; `docs/PRELOAD.md`, "Sends"): the range is
//! queued on the socket's send queue (`Client::sendfile_async`, a
//! `DESC_FILE` descriptor) in order with the writes around it, and the call
//! returns at once with no round trip. The file offset moves as the
//! kernel's would, at once: with a NULL `offset` the file position of
//! `in_fd` (and not `*offset`), else `*offset` (and not the position).
//! The range counts against the socket's SO_SNDBUF budget like written
//! bytes (`sendq::try_sendfile`): a non-blocking socket gets a short count
//! or EAGAIN when the queue has less room, a blocking one queues what fits
//! and sends the rest the synchronous way. The kernel sends at most what
//! the file holds; a queued range cannot learn the size later, so `count`
//! is clamped to the size at the call (fstat, which the cache does anyway).
//! A file that shrinks after that: the server sends what there is, and the
//! send fails with EIO, reported on a later call like any failed
//! asynchronous send. Errors of earlier sends (EPIPE with SIGPIPE,
//! ECONNRESET) come from the next call, as for writes.
//!
//! **Synchronous** (`TCPS_ASYNC_SEND=0`, or the remainder above): after the
//! queued sends went out, one `Op::SendFile` round trip per attempt. A
//! blocking socket waits for POLLOUT (at the server) and asks again until
//! all of `count` is sent, as the kernel's blocking sendfile does; a
//! non-blocking one returns what the server sent, or EAGAIN.

use crate::errno::fail;
use crate::log::{debug, COUNTERS};
use crate::real;
use crate::sock::on_socket;
use libc::{c_int, off64_t, size_t, ssize_t};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Largest range per request (the server's limit).
const MAX_CHUNK: u64 = 1 << 30;
/// Files kept open at the server per process.
const MAX_FILES: usize = 1024;

/// (the server's place in a group, st_dev, st_ino, st_size, st_mtime,
/// st_mtime_nsec): each server of a group has handles of its own.
type FileKey = (usize, u64, u64, i64, i64, i64);

pub struct Files {
    generation: u64,
    next: u32,
    handles: HashMap<FileKey, u32>,
    /// Files the (remote) server would not open: their bytes are sent.
    refused: HashSet<FileKey>,
}

static FILES: Mutex<Option<Files>> = Mutex::new(None);

/// Held across fork (`fork.rs`), before the control lock (the order
/// [`file_handle`] takes them in).
pub fn lock_for_fork() -> std::sync::MutexGuard<'static, Option<Files>> {
    FILES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server's handle for the regular file open as `fd`, and the file's
/// size now.
fn file_handle(c: &tcps::Client, fd: c_int) -> Result<(u32, u64), i32> {
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
        crate::state::slot_of(c),
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime,
        st.st_mtime_nsec,
    );
    let mut g = FILES.lock().unwrap_or_else(|p| p.into_inner());
    // A forked child's server-side files are not its parent's, nor a new
    // attachment's (`--reattach`) the dead one's.
    let generation = crate::state::generation() ^ u64::from(crate::state::epoch()) << 48;
    let files = match g.as_mut() {
        Some(f) if f.generation == generation => f,
        _ => g.insert(Files {
            generation,
            next: 1,
            handles: HashMap::new(),
            refused: HashSet::new(),
        }),
    };
    let size = st.st_size.max(0) as u64;
    if let Some(&h) = files.handles.get(&key) {
        return Ok((h, size));
    }
    if files.refused.contains(&key) {
        return Err(libc::EOPNOTSUPP);
    }
    if files.handles.len() >= MAX_FILES {
        // This server's handles go (another's are its own to close).
        files.handles.retain(|k, &mut h| {
            k.0 != key.0 || {
                let _ = c.file_close(h);
                false
            }
        });
    }
    let h = files.next;
    files.next = files.next.wrapping_add(1).max(1);
    if let Err(e) = c.file_open(h, fd) {
        let e = crate::errno::errno_of(&e);
        if c.is_remote() {
            debug!("sendfile: the server does not share file (dev {}, inode {}): errno {e}; its bytes are sent", key.1, key.2);
            if files.refused.len() >= MAX_FILES {
                files.refused.clear();
            }
            files.refused.insert(key);
        }
        return Err(e);
    }
    debug!(
        "sendfile: file (dev {}, inode {}) handed to the server as file {h}",
        key.1, key.2
    );
    files.handles.insert(key, h);
    Ok((h, size))
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
    let (file, size) = match file_handle(c, in_fd) {
        Ok(h) => h,
        // The server on another node does not see this file: the bytes go.
        Err(_) if c.is_remote() => {
            return remote_sendfile(c, out_fd, id, in_fd, offset, start, count)
        }
        Err(e) => return fail(e),
    };
    // The kernel sends what the file holds; a queued range cannot learn the
    // size later, so it is clamped to the size now (see the module docs).
    let count = (count as u64).min(size.saturating_sub(start as u64));
    if count == 0 {
        return 0;
    }
    crate::fdtable::note_write(c, id);
    let nonblocking = real::fcntl()(out_fd, libc::F_GETFL) & libc::O_NONBLOCK != 0;
    let (total, err) = queue_or_send(c, id, (file, start as u64, count), nonblocking);
    // EAGAIN and short counts alike: EPOLLOUT re-arms.
    crate::fdtable::note_sent(c, id, count, total);
    debug!("sendfile(fd {out_fd}, file fd {in_fd}): {total} of {count} bytes queued or sent (errno {err})");
    finish(in_fd, offset, start, total as usize, err)
}

/// Queues the range on the send queue where it has room (asynchronous),
/// and sends what a blocking socket still owes (or what a socket without
/// a queue asks) the synchronous way: the bytes taken, and the errno that
/// ended it (0: none).
fn queue_or_send(
    c: &tcps::Client,
    id: u32,
    (file, start, count): (u32, u64, u64),
    nonblocking: bool,
) -> (u64, i32) {
    let mut total = 0u64;
    match crate::sendq::try_sendfile(c, id, nonblocking, (file, start, count)) {
        Some(Ok(n)) => total = n as u64,
        Some(Err(e)) => return (0, crate::errno::errno_of(&e)),
        None => {}
    }
    let mut err = 0;
    if total == 0 || (total < count && !nonblocking) {
        let (n, e) = sync_sendfile(c, id, file, start + total, count - total, nonblocking);
        total += n;
        err = e;
    }
    (total, err)
}

/// sendfile when attached to a server on another node (`TCPS_REMOTE`)
/// that does not share the file: its bytes read here and sent as writes
/// are (`io::send_id`: queued asynchronously while the send queue has
/// room, so a full one gives a non-blocking socket a short count or EAGAIN
/// and EPOLLOUT when room returns, as for any write), 64 KiB at a time,
/// until `count`, a short send or an error.
unsafe fn remote_sendfile(
    c: &tcps::Client,
    out_fd: c_int,
    id: u32,
    in_fd: c_int,
    offset: *mut off64_t,
    start: off64_t,
    count: size_t,
) -> ssize_t {
    let nonblocking = real::fcntl()(out_fd, libc::F_GETFL) & libc::O_NONBLOCK != 0;
    // SIGPIPE is raised once, by `finish`.
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let mut buf = vec![0u8; count.min(64 << 10)];
    let (mut total, mut err) = (0usize, 0);
    while total < count {
        let want = (count - total).min(buf.len());
        let at = start + total as off64_t;
        let n = libc::pread64(in_fd, buf.as_mut_ptr().cast(), want, at);
        if n <= 0 {
            err = if n < 0 { crate::errno::last_errno() } else { 0 };
            break;
        }
        let sent = crate::io::send_id(c, out_fd, id, &buf[..n as usize], flags);
        if sent < 0 {
            err = crate::errno::last_errno();
            break;
        }
        total += sent as usize;
        if (sent as usize) < n as usize {
            break;
        }
    }
    finish(in_fd, offset, start, total, err)
}

/// A sendfile moved `total` bytes from `start` (then met `err`, 0 if
/// none): counted, the file offset (or `*offset`) moved past them, and its
/// result — the bytes, or the error if none moved.
unsafe fn finish(
    in_fd: c_int,
    offset: *mut off64_t,
    start: off64_t,
    total: usize,
    err: i32,
) -> ssize_t {
    COUNTERS
        .sendfile_bytes
        .fetch_add(total as u64, Ordering::Relaxed);
    let end = start + total as off64_t;
    if offset.is_null() {
        libc::lseek64(in_fd, end, libc::SEEK_SET);
    } else {
        *offset = end;
    }
    if total == 0 && err != 0 {
        return fail_sending(err);
    }
    total as ssize_t
}

/// Fails a sendfile with `e`, raising SIGPIPE for EPIPE as the kernel's
/// sendfile does (it has no MSG_NOSIGNAL).
fn fail_sending(e: i32) -> ssize_t {
    if e == libc::EPIPE {
        // SAFETY: raise is async-signal-safe and takes any signal number.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    fail(e)
}

/// The synchronous way (`TCPS_ASYNC_SEND=0`, no room in the send queue for
/// a blocking socket, no send queue): waits until the queued sends went
/// out, then asks the server (`Op::SendFile`) until `count` bytes are sent
/// (blocking) or once (non-blocking). Bytes sent, and the errno that ended
/// it (0: none).
fn sync_sendfile(
    c: &tcps::Client,
    id: u32,
    file: u32,
    start: u64,
    count: u64,
    nonblocking: bool,
) -> (u64, i32) {
    // The server runs `Op::SendFile` at once, not behind the send queue:
    // the bytes written before must be out first.
    if let Err(e) = crate::sendq::drain(c, id, nonblocking) {
        return (0, e);
    }
    let mut total = 0u64;
    while total < count {
        let chunk = (count - total).min(MAX_CHUNK) as u32;
        match c
            .sendfile(id, file, start + total, chunk)
            .map_err(|e| crate::errno::errno_of(&e))
        {
            Ok(0) => break, // end of file
            Ok(n) => total += n as u64,
            Err(libc::EAGAIN) if !nonblocking => {}
            Err(e) => return (total, e),
        }
        if nonblocking {
            break;
        }
        if total < count {
            // Wait (parked at the server) until the socket can take more.
            let mut p = [tcps::PollFd {
                sock: id,
                events: libc::POLLOUT,
                revents: 0,
            }];
            if let Err(e) = c.poll(&mut p, -1) {
                return (total, crate::errno::errno_of(&e));
            }
        }
    }
    (total, 0)
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
        |c, id| {
            let r = crate::signals::restarting(c, id, libc::SO_SNDTIMEO, || {
                match offloaded_sendfile(c, out_fd, id, in_fd, offset, count) {
                    n if n < 0 => Err(std::io::Error::from_raw_os_error(
                        crate::errno::last_errno(),
                    )),
                    n => Ok(n),
                }
            });
            r.unwrap_or_else(|e| fail(crate::errno::errno_of(&e)))
        },
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
