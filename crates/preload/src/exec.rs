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
//!
//! Settings: the new image reads its `TCPS_*` settings from the
//! environment exec gives it. If that environment still loads this library
//! (`LD_PRELOAD` names it) but lacks a setting this image pinned when it
//! loaded (the program rebuilt its environment), the pinned value is added,
//! so the child follows the same server and the same `--fallback`. An
//! environment without the library is passed as the program made it: that
//! child runs without tcps, on kernel sockets, as it would without
//! `tcps run`.

use crate::log::{debug, warning};
use crate::{control, fdtable, real, state, static_exec};
use libc::{c_char, c_int};
use std::ffi::{CStr, CString};
use std::os::fd::AsRawFd;
use tcps_proto::handshake::ControlMsg;

fn hand_back() {
    // The current attachment's sockets, or each server's of a group (a
    // dead one's have nothing to hand back).
    for (epoch, c) in state::members() {
        crate::sendq::flush_all(c);
        hand_back_from(epoch, c);
    }
}

/// Hands back the sockets of attachment `c` (`epoch`) whose fds cross the
/// exec.
fn hand_back_from(epoch: u32, c: &'static tcps::Client) {
    let fds = fdtable::all_in(epoch);
    for &(fd, id) in &fds {
        // SAFETY: F_GETFD on an fd we track.
        let fdflags = unsafe { real::fcntl()(fd, libc::F_GETFD) };
        if fdflags < 0
            || fdflags & libc::FD_CLOEXEC != 0
            || fdtable::lookup_at(fd) != Some((epoch, id))
        {
            continue;
        }
        let kernel = match control::exchange_on(c, ControlMsg::Export { handle: id }, &[]) {
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
        c.forget_kernel_fd(id);
        // Every fd naming this socket (dups) becomes the kernel socket.
        for &(other, oid) in &fds {
            if oid != id || fdtable::lookup_at(other) != Some((epoch, id)) {
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

/// The name this library has in `LD_PRELOAD`.
const LIBRARY: &[u8] = b"libtcps_preload";

extern "C" {
    static environ: *const *const c_char;
}

/// Visits the entries of a NULL-terminated environment array until `f`
/// says stop; true if it did. Allocates nothing (a vfork child may be
/// calling exec).
///
/// SAFETY: `envp` is NULL or a NULL-terminated array of C strings, as exec
/// requires.
unsafe fn any_entry(envp: *const *const c_char, mut f: impl FnMut(&[u8]) -> bool) -> bool {
    if envp.is_null() {
        return false;
    }
    let mut p = envp;
    // SAFETY: the caller's promise: every pointer up to the NULL is a C
    // string.
    while !(*p).is_null() {
        if f(CStr::from_ptr(*p).to_bytes()) {
            return true;
        }
        p = p.add(1);
    }
    false
}

/// Whether a program exec'd with `envp` loads this library (`LD_PRELOAD`
/// names it). Allocates nothing.
///
/// SAFETY: as [`any_entry`].
unsafe fn loads_us(envp: *const *const c_char) -> bool {
    any_entry(envp, |e| {
        e.strip_prefix(b"LD_PRELOAD=")
            .is_some_and(|v| v.windows(LIBRARY.len()).any(|w| w == LIBRARY))
    })
}

/// `envp` with the pinned settings it lacks, when it still loads this
/// library; `None` to pass it unchanged (the common case, decided without
/// allocating).
///
/// SAFETY: as [`any_entry`].
unsafe fn with_settings(envp: *const *const c_char) -> Option<Vec<CString>> {
    let pinned = tcps::pinned_settings();
    let has = |k: &[u8]| {
        any_entry(envp, |e| {
            e.len() > k.len() && e.starts_with(k) && e[k.len()] == b'='
        })
    };
    if !loads_us(envp) || pinned.iter().all(|(k, _)| has(k.as_encoded_bytes())) {
        return None;
    }
    let mut all = Vec::new();
    any_entry(envp, |e| {
        all.extend(CString::new(e).ok());
        false
    });
    for (k, v) in pinned.iter().filter(|(k, _)| !has(k.as_encoded_bytes())) {
        let e = [k.as_encoded_bytes(), b"=", v.as_encoded_bytes()].concat();
        all.extend(CString::new(e).ok());
    }
    debug!("exec: the new environment loads tcps but lacked some settings; they are added");
    Some(all)
}

/// Calls `exec` with `envp`, or with `envp` plus the settings it lacks.
///
/// SAFETY: `envp` is NULL or a NULL-terminated array of C strings.
unsafe fn exec_with(
    envp: *const *const c_char,
    exec: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    match with_settings(envp) {
        None => exec(envp),
        Some(strings) => {
            let mut ptrs: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
            ptrs.push(std::ptr::null());
            exec(ptrs.as_ptr())
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
    static_exec::warn_path(path, false, loads_us(envp));
    exec_with(envp, |e| real::execve()(path, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    hand_back();
    // SAFETY: `environ` is libc's current environment array.
    static_exec::warn_path(path, false, loads_us(environ));
    exec_with(environ, |e| real::execve()(path, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    hand_back();
    // SAFETY: as in `execv`.
    static_exec::warn_path(file, true, loads_us(environ));
    exec_with(environ, |e| real::execvpe()(file, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    hand_back();
    static_exec::warn_path(file, true, loads_us(envp));
    exec_with(envp, |e| real::execvpe()(file, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    hand_back();
    static_exec::warn_fd(fd, loads_us(envp));
    exec_with(envp, |e| real::fexecve()(fd, argv, e))
}
