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
//! Modules, bottom up (each uses only those on its own or lower layers):
//!
//! 1. `real` (libc's functions), `errno`, `deadline` (what is left of a
//!    wait's timeout), `signals` (handlers behind a
//!    trampoline, restarting calls as the kernel does), `fdtable` (fd →
//!    socket id);
//! 2. `log` (TCPS_LOG, counters), then `state` (the attachment as held, its
//!    mode, the fork generation), `gone` (the server died: each socket
//!    reports a reset once), `group` (several servers at once: listeners'
//!    siblings, a dead server's listeners moved);
//! 3. `control` (messages on the control socket), then `attach` (making
//!    the attachment, fallback, a forked child's claim of its parent's
//!    sockets), then `reattach` (a server that came back after the death:
//!    a new attachment, the listeners taken over);
//! 4. the interposed entry points: `sock` (socket calls, with
//!    `group_accept`) below `io` (data calls), `sendfile` and `fdops`
//!    (close, dup, fcntl, ioctl); `group_wait` (waits over several
//!    servers) below `poll` (poll/select and the mixed wait) below `epoll`, below `exec` and
//!    `fork` (which takes the others' locks across the real fork); `sendq`
//!    (asynchronous sends and their room, for `io`, `poll` and `epoll`)
//!    sits just above `sock`;
//! 5. this file: the load-time hook.
#![allow(clippy::missing_safety_doc)]

mod attach;
mod control;
mod deadline;
mod epoll;
mod errno;
mod exec;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod execl;
mod fdops;
mod fdtable;
mod fork;
mod gone;
mod group;
mod group_accept;
mod group_wait;
mod handoff;
mod io;
mod log;
mod poll;
mod real;
mod reattach;
mod ring_sleep;
mod sendfile;
mod sendq;
mod signals;
mod sock;
mod spawn;
mod state;
mod static_exec;

/// Runs when the library is loaded, before the program's `main`: pins every
/// `TCPS_*` setting (`tcps::pin_settings`) before the program can replace
/// or clear its environment (nginx with its perl module does, before it
/// opens a socket), so `--socket` and `--fallback fail` hold whatever it
/// does to `environ`. The
/// program `tcps run` started (it keeps `tcps run`'s pid, `TCPS_RUN_PID`)
/// writes its summary at exit when asked (`TCPS_PRELOAD_STATS`, or
/// `TCPS_LOG=info`) even if it never makes a TCP socket; other processes
/// register it at their first attach, so helper processes of a wrapper
/// script add no lines.
extern "C" fn on_load() {
    state::note_own_process();
    tcps::pin_settings();
    tcps::interrupt::set_signal_generation(signals::generation);
    sendq::enabled();
    let started_by_run = tcps::setting_str("TCPS_RUN_PID")
        .is_some_and(|pid| pid.is_ok_and(|pid| pid.trim() == std::process::id().to_string()));
    if started_by_run && (log::stats_file().is_some() || log::level() >= log::INFO) {
        state::summary_for_this_process();
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
