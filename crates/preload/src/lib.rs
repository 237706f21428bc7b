//! `libtcps_preload.so`: runs an unmodified, dynamically linked program with
//! its TCP sockets (AF_INET/AF_INET6, SOCK_STREAM) served by a tcps TCP
//! server. Load it with `tcps run -- PROGRAM` or `LD_PRELOAD`.
//!
//! Every socket-related libc function is interposed (`#[no_mangle]`); the
//! real one is found with `dlsym(RTLD_NEXT)` (`real`). A call on a kernel fd
//! goes straight to the real function; a call on an offloaded socket becomes
//! a `tcps::Client` call. See `docs/PRELOAD.md` for what is intercepted, how
//! epoll, fork and sendfile work, and what is not supported.
//!
//! Modules: `state` (the attachment, fallback), `control` (messages on
//! the control socket), `fdtable` (fd → socket id),
//! `sock` (socket calls), `io` (data calls), `fdops` (close, dup, fcntl,
//! ioctl), `poll` (poll/select and the mixed wait), `epoll`, `fork`, `exec`,
//! `sendfile`, `log` (TCPS_LOG, counters).
#![allow(clippy::missing_safety_doc)]

mod control;
mod epoll;
mod exec;
mod fdops;
mod fdtable;
mod fork;
mod io;
mod log;
mod poll;
mod real;
mod sendfile;
mod sock;
mod state;

/// Runs when the library is loaded, before the program's `main`. The
/// program `tcps run` started (it keeps `tcps run`'s pid, `TCPS_RUN_PID`)
/// writes its summary at exit when asked (`TCPS_PRELOAD_STATS`, or
/// `TCPS_LOG=info`) even if it never makes a TCP socket; other processes
/// register it at their first attach, so helper processes of a wrapper
/// script add no lines.
extern "C" fn on_load() {
    let started_by_run =
        std::env::var("TCPS_RUN_PID").is_ok_and(|pid| pid.trim() == std::process::id().to_string());
    if started_by_run && (log::stats_file().is_some() || log::level() >= log::INFO) {
        state::summary_for_this_process();
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

pub(crate) fn last_errno() -> i32 {
    // SAFETY: errno is thread-local; reading it is always valid.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// Sets errno and returns -1, the libc convention.
pub(crate) fn fail<T: From<i8>>(e: i32) -> T {
    set_errno(e);
    T::from(-1)
}

pub(crate) fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}
