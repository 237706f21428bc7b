//! posix_spawn, and closing ranges of descriptors before an exec.
//!
//! glibc's posix_spawn runs its child with clone(CLONE_VM|CLONE_VFORK) and
//! libc's internal dup2 and execve, none of which this library sees (and a
//! child sharing the parent's memory could not hand a socket back anyway,
//! `exec.rs`). So the parent hands back, before the spawn, every socket
//! the child can get: those without FD_CLOEXEC (posix_spawn), and the one
//! a `posix_spawn_file_actions_adddup2` names (when the action is added).
//! The parent then holds a plain kernel socket, shared with the child as
//! on the kernel; only that socket leaves the server.
//!
//! close_range and closefrom (CPython's subprocess closes every descriptor
//! above 2 between fork and exec) would close the library's own
//! descriptors (the control socket) under it, and offloaded sockets without
//! their close reaching the server. Over the control socket, the sockets
//! that cross exec are handed back first (`handoff::before_closing`, which
//! a plain close() of the control socket runs too); offloaded sockets in
//! the range are closed as close() would; then the real call. `docs/PRELOAD.md`
//! ("exec").

use crate::{exec, fdops, fdtable, handoff, state};
use libc::{c_char, c_int, c_uint, pid_t, posix_spawn_file_actions_t, posix_spawnattr_t};

/// Before a spawn: the sockets that cross exec handed back (Ok), or the
/// errno posix_spawn returns.
fn before_spawn() -> Result<(), c_int> {
    if state::in_shared_child() {
        return Ok(());
    }
    handoff::hand_back()
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    path: *const c_char,
    actions: *const posix_spawn_file_actions_t,
    attr: *const posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    if let Err(e) = before_spawn() {
        return e;
    }
    exec::exec_with(envp.cast(), |e| {
        crate::real::posix_spawn()(pid, path, actions, attr, argv, e.cast())
    })
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    file: *const c_char,
    actions: *const posix_spawn_file_actions_t,
    attr: *const posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    if let Err(e) = before_spawn() {
        return e;
    }
    exec::exec_with(envp.cast(), |e| {
        crate::real::posix_spawnp()(pid, file, actions, attr, argv, e.cast())
    })
}

/// The spawned child will get `fd` as `newfd`: an offloaded socket is
/// handed back now (its errno is returned if it cannot be).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    actions: *mut posix_spawn_file_actions_t,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    if fdtable::lookup(fd).is_some() && !state::in_shared_child() {
        if let Err(e) = handoff::hand_back_fd(fd) {
            return e;
        }
    }
    crate::real::posix_spawn_file_actions_adddup2()(actions, fd, newfd)
}

/// Before descriptors `first..=last` are closed (see the module).
fn before_closing(first: c_uint, last: c_uint) {
    if first > last || state::in_shared_child() {
        return;
    }
    handoff::before_closing(first, last);
    let within = |fd: c_int| u32::try_from(fd).is_ok_and(|fd| (first..=last).contains(&fd));
    for (fd, _, _) in fdtable::all_at() {
        if within(fd) {
            fdops::forget(fd);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        before_closing(first, last);
    }
    crate::real::close_range()(first, last, flags)
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    if let Ok(first) = c_uint::try_from(lowfd) {
        before_closing(first, c_uint::MAX);
    }
    crate::real::closefrom()(lowfd)
}
