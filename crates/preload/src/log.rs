//! Decisions in words (`TCPS_LOG=debug|info|warn|off`, default `warn`) and
//! the counters behind the exit summary.
//!
//! Lines go to stderr with the real `write(2)`, never through our own
//! interposed `write`: a daemon may have put a socket on fd 2. With
//! `TCPS_PRELOAD_STATS=FILE` every process appends its summary line to FILE
//! at exit (daemons have no stderr; tests read the file).

use crate::real;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

pub const OFF: u8 = 0;
pub const WARN: u8 = 1;
pub const INFO: u8 = 2;
pub const DEBUG: u8 = 3;

/// 255: not read from the settings yet.
static LEVEL: AtomicU8 = AtomicU8::new(255);

pub fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != 255 {
        return l;
    }
    let l = match tcps::setting_str("TCPS_LOG") {
        None => WARN,
        Some(Ok(v)) => match v.as_str() {
            "off" | "0" | "none" => OFF,
            "info" => INFO,
            "debug" | "trace" => DEBUG,
            "warn" | "warning" | "" => WARN,
            other => {
                emit(&format!(
                    "TCPS_LOG={other:?} is not valid (expected debug, info, warn or off); using warn"
                ));
                WARN
            }
        },
        Some(Err(_)) => {
            emit("TCPS_LOG is not valid (expected debug, info, warn or off); using warn");
            WARN
        }
    };
    LEVEL.store(l, Ordering::Relaxed);
    l
}

/// The level if the settings were read already (reading them allocates,
/// which a vfork child must not).
pub fn level_if_read() -> Option<u8> {
    Some(LEVEL.load(Ordering::Relaxed)).filter(|&l| l != 255)
}

pub fn emit(line: &str) {
    let msg = format!("tcps[{}]: {line}\n", std::process::id());
    // SAFETY: writes a local buffer to fd 2 with the real write(2).
    unsafe { real::write()(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
}

macro_rules! debug {
    ($($t:tt)*) => { if $crate::log::level() >= $crate::log::DEBUG { $crate::log::emit(&format!($($t)*)) } };
}
macro_rules! info {
    ($($t:tt)*) => { if $crate::log::level() >= $crate::log::INFO { $crate::log::emit(&format!($($t)*)) } };
}
macro_rules! warning {
    ($($t:tt)*) => { if $crate::log::level() >= $crate::log::WARN { $crate::log::emit(&format!($($t)*)) } };
}
pub(crate) use {debug, info, warning};

/// What happened to the sockets this process asked for.
pub struct Counters {
    /// TCP sockets created or accepted through the TCP server.
    pub offloaded: AtomicU64,
    /// Of those, accepted connections.
    pub accepted: AtomicU64,
    /// Connections the server handed over as kernel sockets (balancing):
    /// accepted, but not offloaded.
    pub direct: AtomicU64,
    /// TCP sockets that went to the kernel (fallback: no server).
    pub kernel_tcp: AtomicU64,
    /// Other sockets (UDP, Unix, raw, ...), always the kernel's.
    pub kernel_other: AtomicU64,
    /// Bytes sent by sendfile without passing through this process.
    pub sendfile_bytes: AtomicU64,
    /// Looks of epoll at its offloaded entries (one per pass of a wait)…
    pub epoll_passes: AtomicU64,
    /// …and the entries those looks examined (the ready lists' lengths:
    /// O(ready), not O(interest), is their ratio).
    pub epoll_looks: AtomicU64,
}

pub static COUNTERS: Counters = Counters {
    offloaded: AtomicU64::new(0),
    accepted: AtomicU64::new(0),
    direct: AtomicU64::new(0),
    kernel_tcp: AtomicU64::new(0),
    kernel_other: AtomicU64::new(0),
    sendfile_bytes: AtomicU64::new(0),
    epoll_passes: AtomicU64::new(0),
    epoll_looks: AtomicU64::new(0),
};

pub fn summary() -> String {
    let c = &COUNTERS;
    format!(
        "offloaded={} accepted={} kernel_tcp={} kernel_other={} sendfile_bytes={} direct={} epoll_passes={} epoll_looks={}",
        c.offloaded.load(Ordering::Relaxed),
        c.accepted.load(Ordering::Relaxed),
        c.kernel_tcp.load(Ordering::Relaxed),
        c.kernel_other.load(Ordering::Relaxed),
        c.sendfile_bytes.load(Ordering::Relaxed),
        c.direct.load(Ordering::Relaxed),
        c.epoll_passes.load(Ordering::Relaxed),
        c.epoll_looks.load(Ordering::Relaxed),
    )
}

/// `TCPS_PRELOAD_STATS`, as pinned when the library loaded.
pub fn stats_file() -> Option<&'static std::ffi::OsStr> {
    static FILE: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| tcps::setting("TCPS_PRELOAD_STATS"))
        .as_deref()
}

/// The summary line (info level) and the stats file, at exit (the hook is
/// `state::at_exit`, which knows whether this process wants them).
pub fn write_exit_summary() {
    let line = summary();
    info!("exit: {line}");
    // Balancing may have handed connections over as kernel sockets: a run
    // under `tcps run` must not turn into a kernel run without a word.
    let (offloaded, direct) = (
        COUNTERS.accepted.load(Ordering::Relaxed),
        COUNTERS.direct.load(Ordering::Relaxed),
    );
    if direct > 0 {
        warning!(
            "exit: of {} connections accepted, {offloaded} were offloaded and {direct} handed over \
             as kernel sockets by balancing (the TCP server was busier than this program; \
             TCPS_BALANCE=0 keeps every connection offloaded)",
            offloaded + direct
        );
    }
    if let Some(path) = stats_file() {
        use std::io::Write;
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write(2) per line: processes (nginx's master and workers)
            // append to the same file, and `writeln!` on a File writes each
            // piece of its format separately, so their pieces interleaved.
            let record = format!("pid={} exe={exe} {line}\n", std::process::id());
            let _ = f.write_all(record.as_bytes());
        }
    }
}
