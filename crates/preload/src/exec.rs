//! exec: offloaded sockets are handed back to the kernel.
//!
//! An attachment cannot cross exec(2) (the new image has a fresh library
//! and the control socket is close-on-exec). So before exec, every
//! offloaded socket whose fd is not FD_CLOEXEC is taken out of the server
//! and its kernel socket put over the placeholder (`handoff.rs`): the new
//! program finds a plain kernel socket, connected and with its data, at
//! the same fd number. Close-on-exec sockets are simply closed by the exec
//! (the server closes them when the old image's control socket goes).
//!
//! execve, execv, execvp, execvpe and fexecve are interposed here, the
//! variadic execl, execlp and execle in `execl.rs`, posix_spawn in
//! `spawn.rs`. If exec fails, the handed-back sockets stay kernel sockets.
//! A socket the server cannot hand over (bytes it read ahead that the
//! program has not taken, calls parked on it) makes the exec fail with the
//! errno (EBUSY) and a line on stderr: the new program would otherwise hold
//! a dead placeholder and wait on it for ever.
//!
//! A child that shares its parent's memory (`state::in_shared_child`) must
//! leave the parent's tables and attachment alone: see
//! [`shared_child_check`].
//!
//! Settings: the new image reads its `TCPS_*` settings from the
//! environment exec gives it. If that environment still loads this library
//! (`LD_PRELOAD` names it) but lacks a setting this image pinned when it
//! loaded (the program rebuilt its environment), the pinned value is added,
//! so the child follows the same server and the same `--fallback`. An
//! environment without the library is passed as the program made it: that
//! child runs without tcps, on kernel sockets, as it would without
//! `tcps run`.

use crate::log::debug;
use crate::{errno, fdtable, handoff, real, state, static_exec};
use libc::{c_char, c_int};
use std::ffi::{CStr, CString};

/// What must happen before the real exec: the sockets that cross it handed
/// back to the kernel. False (errno set) to refuse the exec: a socket the
/// new program would hold as a dead placeholder (reads would block for
/// ever) is worse than an exec that fails with a reason.
unsafe fn before_exec() -> bool {
    let r = if state::in_shared_child() {
        shared_child_check()
    } else {
        handoff::hand_back()
    };
    match r {
        Ok(()) => true,
        Err(e) => {
            errno::set_errno(e);
            false
        }
    }
}

/// A child that shares its parent's memory (clone(CLONE_VM) or a raw
/// vfork system call: the library's vfork is fork, `fork.rs`) may change
/// none of the parent's tables nor use its attachment, so it cannot hand a
/// socket back. Its exec is refused (EBUSY, one line on stderr) if one of
/// its descriptors without FD_CLOEXEC is an offloaded socket's placeholder
/// (the same open file as one of the parent's, `kcmp(2)`); otherwise it
/// goes ahead. System calls only: nothing allocated, no lock taken.
unsafe fn shared_child_check() -> Result<(), i32> {
    const MSG: &[u8] = b"tcps: exec refused (EBUSY) in a child that shares its parent's memory (clone(CLONE_VM), or vfork(2) as a raw system call): it holds an offloaded socket, which only a forked child can hand to another program\n";
    let (me, parent) = (libc::syscall(libc::SYS_getpid), i64::from(state::own_pid()));
    // Descriptors up to the limit (at most 2^16 looked at: a rare path).
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
        limit.rlim_cur.clamp(1024, 1 << 16) as i32
    } else {
        1024
    };
    for f in 0..max {
        let fl = libc::syscall(libc::SYS_fcntl, f, libc::F_GETFD);
        if fl < 0 || fl as i32 & libc::FD_CLOEXEC != 0 {
            continue;
        }
        let same = |p: i32| libc::syscall(libc::SYS_kcmp, me, parent, 0, f, p) == 0;
        if fdtable::any_fd(same) {
            libc::syscall(libc::SYS_write, 2, MSG.as_ptr(), MSG.len());
            return Err(libc::EBUSY);
        }
    }
    Ok(())
}

/// The name this library has in `LD_PRELOAD`.
const LIBRARY: &[u8] = b"libtcps_preload";

extern "C" {
    static environ: *const *const c_char;
}

/// Visits the entries of a NULL-terminated environment array until `f`
/// says stop; true if it did.
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
pub(crate) unsafe fn exec_with(
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
    if !before_exec() {
        return -1;
    }
    static_exec::warn_path(path, false, loads_us(envp));
    exec_with(envp, |e| real::execve()(path, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    if !before_exec() {
        return -1;
    }
    // SAFETY: `environ` is libc's current environment array.
    static_exec::warn_path(path, false, loads_us(environ));
    exec_with(environ, |e| real::execve()(path, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    if !before_exec() {
        return -1;
    }
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
    if !before_exec() {
        return -1;
    }
    static_exec::warn_path(file, true, loads_us(envp));
    exec_with(envp, |e| real::execvpe()(file, argv, e))
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if !before_exec() {
        return -1;
    }
    static_exec::warn_fd(fd, loads_us(envp));
    exec_with(envp, |e| real::fexecve()(fd, argv, e))
}
