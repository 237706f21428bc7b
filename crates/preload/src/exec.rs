//! exec: offloaded sockets are handed back to the kernel.
//!
//! An attachment cannot cross exec(2) (the new image has a fresh library
//! and the control socket is close-on-exec). So before exec, every
//! offloaded socket whose fd is not FD_CLOEXEC is taken out of the server
//! (`ControlMsg::Export`) and its kernel socket is dup2()ed over the
//! placeholder, with the placeholder's O_NONBLOCK: the new program finds a
//! plain kernel socket, connected and with its data, at the same fd number.
//! Close-on-exec sockets are simply closed by the exec (the server closes
//! them when the old image's control socket goes).
//!
//! Only execve, execv, execvp, execvpe and fexecve are interposed (the
//! variadic execl* cannot be defined in stable Rust). If exec fails, the
//! handed-back sockets stay kernel sockets. A socket the server cannot hand
//! over (calls parked on it, an asynchronous send queue) stays a
//! placeholder, and is lost to the new image (logged).

use crate::log::{debug, warning};
use crate::{control, fdtable, real, state};
use libc::{c_char, c_int};
use std::os::fd::AsRawFd;
use tcps_proto::handshake::ControlMsg;

fn hand_back() {
    if state::client().is_none() {
        return;
    }
    if let Some(c) = state::client() {
        crate::sendq::flush_all(c);
    }
    let fds = fdtable::all();
    for &(fd, id) in &fds {
        // SAFETY: F_GETFD on an fd we track.
        let fdflags = unsafe { real::fcntl()(fd, libc::F_GETFD) };
        if fdflags < 0 || fdflags & libc::FD_CLOEXEC != 0 || fdtable::lookup(fd) != Some(id) {
            continue;
        }
        let kernel = match control::exchange_fds(ControlMsg::Export { handle: id }, &[]) {
            Ok((ControlMsg::Reply { handle, errno: 0 }, mut got))
                if handle == id && got.len() == 1 =>
            {
                got.remove(0)
            }
            Ok((ControlMsg::Reply { errno, .. }, _)) => {
                warning!("exec: fd {fd} (tcps socket {id}) cannot be handed back (errno {errno}); the new program loses it");
                continue;
            }
            other => {
                warning!("exec: fd {fd}: unexpected answer {other:?}");
                continue;
            }
        };
        // This process's own descriptor of it (`tcps::Client::kernel_fds`)
        // must not keep it open should the exec fail.
        if let Some(c) = state::client() {
            c.forget_kernel_fd(id);
        }
        // Every fd naming this socket (dups) becomes the kernel socket.
        for &(other, oid) in &fds {
            if oid != id || fdtable::lookup(other) != Some(id) {
                continue;
            }
            // SAFETY: plain fcntl/dup2 on descriptors we own or track.
            unsafe {
                let fl = real::fcntl()(other, libc::F_GETFL);
                let kfl = real::fcntl()(kernel.as_raw_fd(), libc::F_GETFL);
                let want = (kfl & !libc::O_NONBLOCK) | (fl & libc::O_NONBLOCK);
                real::fcntl()(kernel.as_raw_fd(), libc::F_SETFL, want);
                let cloexec = real::fcntl()(other, libc::F_GETFD) & libc::FD_CLOEXEC;
                if real::dup2()(kernel.as_raw_fd(), other) == other {
                    real::fcntl()(other, libc::F_SETFD, cloexec);
                }
            }
            fdtable::remove(other);
            crate::epoll::forget_fd(other);
            debug!("exec: fd {other} is now the kernel socket of tcps socket {id}");
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    hand_back();
    real::execve()(path, argv, envp)
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    hand_back();
    real::execv()(path, argv)
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    hand_back();
    real::execvp()(file, argv)
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    hand_back();
    real::execvpe()(file, argv, envp)
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    hand_back();
    real::fexecve()(fd, argv, envp)
}
