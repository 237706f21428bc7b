//! exec of a statically linked program: this library cannot follow it (no
//! dynamic loader runs, so `LD_PRELOAD` means nothing to it) and its
//! sockets stay the kernel's; nor a Go program's (its runtime makes its
//! socket system calls itself). `tcps run` says so for the program it starts;
//! this says it when a program it runs execs one (a shell wrapper,
//! `sh -c ./server`), which would otherwise lose tcps without a word.
//!
//! A vfork child may be the caller: nothing here allocates, takes a lock
//! or changes a descriptor the parent has (its own are opened and closed
//! with plain system calls).

use crate::log;
use crate::real;
use libc::{c_char, c_int};
use std::ffi::CStr;
use std::os::fd::RawFd;

/// The longest path looked at (`PATH_MAX`).
const PATH_MAX: usize = 4096;

/// Warns if `path` (searched in `$PATH` when `search` and it has no slash,
/// as execvp does) is a statically linked executable and the new program
/// would have loaded this library (`loads_us`).
///
/// SAFETY: `path` is NULL or a C string.
pub unsafe fn warn_path(path: *const c_char, search: bool, loads_us: bool) {
    if !loads_us || path.is_null() || level() < log::WARN {
        return;
    }
    let name = CStr::from_ptr(path).to_bytes();
    let mut buf = [0u8; PATH_MAX];
    let found = if search && !name.contains(&b'/') {
        on_path(name, &mut buf)
    } else {
        Some(name)
    };
    let Some(found) = found else { return };
    let Some(fd) = open(found, &mut [0u8; PATH_MAX]) else {
        return;
    };
    if tcps::statically_linked_fd(fd) == Some(true) {
        say(found, STATIC);
    } else if tcps::go_program_fd(fd) {
        say(found, GO);
    }
    // SAFETY: our own descriptor, opened above.
    libc::syscall(libc::SYS_close, fd);
}

/// As [`warn_path`] for `fexecve(fd, …)`.
pub fn warn_fd(fd: c_int, loads_us: bool) {
    if loads_us && level() >= log::WARN {
        if tcps::statically_linked_fd(fd) == Some(true) {
            say(b"the program (fexecve)", STATIC);
        } else if tcps::go_program_fd(fd) {
            say(b"the program (fexecve)", GO);
        }
    }
}

/// The log level, without reading the settings if they were not read yet
/// (that allocates): the default, warn.
fn level() -> u8 {
    log::level_if_read().unwrap_or(log::WARN)
}

/// The first `dir/name` on `$PATH` that exists and may be executed, in `buf`.
fn on_path<'a>(name: &[u8], buf: &'a mut [u8; PATH_MAX]) -> Option<&'a [u8]> {
    // SAFETY: getenv reads the environment; the name is a C string.
    let path = unsafe { libc::getenv(c"PATH".as_ptr()) };
    let dirs: &[u8] = if path.is_null() {
        b"/bin:/usr/bin"
    } else {
        // SAFETY: getenv returned a C string.
        unsafe { CStr::from_ptr(path) }.to_bytes()
    };
    let mut hit = None;
    for dir in dirs.split(|&b| b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let len = dir.len() + 1 + name.len();
        if len >= PATH_MAX {
            continue;
        }
        buf[..dir.len()].copy_from_slice(dir);
        buf[dir.len()] = b'/';
        buf[dir.len() + 1..len].copy_from_slice(name);
        buf[len] = 0;
        // SAFETY: buf holds a C string of len bytes.
        let ok = unsafe {
            libc::syscall(
                libc::SYS_faccessat,
                libc::AT_FDCWD,
                buf.as_ptr(),
                libc::X_OK,
                0,
            )
        };
        if ok == 0 {
            hit = Some(len);
            break;
        }
    }
    hit.map(|len| &buf[..len])
}

/// Opens `path` read-only (a copy with its NUL in `buf`).
fn open(path: &[u8], buf: &mut [u8; PATH_MAX]) -> Option<RawFd> {
    if path.len() >= PATH_MAX {
        return None;
    }
    buf[..path.len()].copy_from_slice(path);
    buf[path.len()] = 0;
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    // SAFETY: buf holds a C string.
    let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, buf.as_ptr(), flags) };
    RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)
}

/// Writes the warning to stderr from pieces (no formatting buffer).
/// Why a program's sockets stay the kernel's.
const STATIC: &[u8] =
    b" is statically linked: tcps cannot follow it, its sockets stay on the kernel's\n";
const GO: &[u8] =
    b" is a Go program: its runtime makes socket system calls itself, not through libc; its sockets stay on the kernel's\n";

fn say(what: &[u8], why: &[u8]) {
    let mut pid = [0u8; 10];
    // SAFETY: getpid cannot fail.
    let mut n = unsafe { libc::getpid() }.unsigned_abs();
    let mut at = pid.len();
    loop {
        at -= 1;
        pid[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    let parts: [&[u8]; 5] = [b"tcps[", &pid[at..], b"]: exec: ", what, why];
    let iov = parts.map(|p| libc::iovec {
        iov_base: p.as_ptr() as *mut libc::c_void,
        iov_len: p.len(),
    });
    // SAFETY: iov describes the local pieces above; fd 2 with the real
    // writev (never our interposed one).
    unsafe { real::writev()(2, iov.as_ptr(), iov.len() as c_int) };
}
