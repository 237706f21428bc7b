//! The process's attachment to the TCP server, made on the first TCP
//! socket, and what to do when there is none (`TCPS_FALLBACK`).
//!
//! The client lives behind a raw pointer that is never freed: reads are one
//! atomic load on every call, and a forked child simply replaces it with its
//! own attachment (`fork.rs`) without touching the parent's.

use crate::log::{self, debug, info, warning};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use tcps::Client;

const UNTRIED: u8 = 0;
const ATTACHING: u8 = 1;
const OFFLOAD: u8 = 2;
/// No server: TCP sockets go to the kernel (`TCPS_FALLBACK=kernel`).
const KERNEL: u8 = 3;
/// No server and `TCPS_FALLBACK=fail`: TCP socket() fails.
const FAILED: u8 = 4;

static MODE: AtomicU8 = AtomicU8::new(UNTRIED);
static CLIENT: AtomicPtr<Client> = AtomicPtr::new(std::ptr::null_mut());

/// The attachment, if this process has one.
pub fn client() -> Option<&'static Client> {
    let p = CLIENT.load(Ordering::Acquire);
    // SAFETY: a non-null CLIENT came from Box::into_raw and is never freed.
    unsafe { p.as_ref() }
}

/// Installs `c` as this process's attachment (leaking any previous one,
/// which after a fork belongs to the parent).
pub fn install(c: Client) {
    CLIENT.store(Box::into_raw(Box::new(c)), Ordering::Release);
    MODE.store(OFFLOAD, Ordering::Release);
}

/// Forgets the attachment without touching it (a forked child: the
/// parent's channels are not ours). The next TCP call attaches anew.
pub fn forget() {
    CLIENT.store(std::ptr::null_mut(), Ordering::Release);
    MODE.store(UNTRIED, Ordering::Release);
}

/// `TCPS_FALLBACK=fail`; any value but `kernel`, `fail` or none is
/// reported (once) and treated as `kernel`, the default.
fn fail_mode() -> bool {
    match std::env::var("TCPS_FALLBACK") {
        Ok(v) if v == "fail" => true,
        Ok(v) if v == "kernel" || v.is_empty() => false,
        Err(std::env::VarError::NotPresent) => false,
        other => {
            static REPORTED: std::sync::Once = std::sync::Once::new();
            REPORTED.call_once(|| {
                log::emit(&format!(
                    "TCPS_FALLBACK={:?} is not valid (expected kernel or fail); using kernel",
                    other.unwrap_or_default()
                ))
            });
            false
        }
    }
}

/// What a new TCP socket should be: `Ok(client)` to offload, `Err(None)` for
/// the kernel, `Err(Some(errno))` to fail the call.
pub fn for_new_socket() -> Result<&'static Client, Option<i32>> {
    loop {
        match MODE.load(Ordering::Acquire) {
            OFFLOAD => return client().ok_or(None),
            KERNEL => return Err(None),
            FAILED => return Err(Some(libc::ECONNREFUSED)),
            ATTACHING => std::thread::yield_now(),
            _ => {
                if MODE
                    .compare_exchange(UNTRIED, ATTACHING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    attach();
                }
            }
        }
    }
}

/// The attachment for a call on an already offloaded socket; a child that
/// has not attached yet attaches now (inheriting its parent's sockets).
pub fn for_existing() -> Option<&'static Client> {
    if let Some(c) = client() {
        return Some(c);
    }
    for_new_socket().ok()
}

/// The process (pid) that wants its summary even without an attach: the
/// one `tcps run` started (0: none). A forked child inherits the atexit
/// registration but not this wish (a shell's subshells write no lines).
static SUMMARY_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Registers the summary at exit for this process, attached or not.
pub fn summary_for_this_process() {
    SUMMARY_PID.store(std::process::id(), Ordering::Relaxed);
    at_exit_once();
}

/// Whether this process writes its summary at exit: it attached (or fell
/// back) itself, or it asked for it (`summary_for_this_process`).
pub fn summary_wanted() -> bool {
    MODE.load(Ordering::Acquire) != UNTRIED
        || SUMMARY_PID.load(Ordering::Relaxed) == std::process::id()
}

/// The summary at exit, registered once per process image (a forked child
/// inherits the registration).
fn at_exit_once() {
    static DONE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a plain extern "C" fn with atexit.
    DONE.call_once(|| unsafe {
        libc::atexit(log::at_exit);
    });
}

thread_local! {
    static IN_ATTACH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True while this thread attaches: the Unix socket it opens now is the
/// control socket (`sock.rs` tells `fork.rs`).
pub fn attaching_here() -> bool {
    IN_ATTACH.with(|a| a.get())
}

/// The control socket path, fixed by the first attach: a forked child uses
/// its parent's even if the program cleared its environment (nginx does).
fn socket_path() -> &'static std::path::Path {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(tcps::default_path)
}

fn attach() {
    let path = socket_path();
    crate::log::stats_file();
    IN_ATTACH.with(|a| a.set(true));
    let inherit = crate::fork::take_inherit_token();
    let result = match inherit {
        Some(token) => crate::fork::attach_inherit(path, token),
        None => Client::attach(path),
    };
    IN_ATTACH.with(|a| a.set(false));
    match result {
        Ok(c) => {
            info!(
                "attached to the TCP server at {}: TCP sockets are offloaded",
                path.display()
            );
            at_exit_once();
            install(c);
        }
        Err(e) => {
            let why = tcps::last_attach_error();
            let why = match e.raw_os_error() {
                Some(_) if !why.is_empty() => why,
                _ => e.to_string(),
            };
            if inherit.is_some() {
                exit_if_sockets_inherited(&why);
            }
            if fail_mode() {
                log::emit(&format!(
                    "no TCP server ({why}); TCPS_FALLBACK=fail: TCP sockets fail with ECONNREFUSED"
                ));
                MODE.store(FAILED, Ordering::Release);
            } else {
                if std::env::var_os("TCPS_FALLBACK_QUIET").is_none() {
                    warning!("no TCP server ({why}); running on kernel sockets");
                }
                debug!("fallback: every TCP socket of this process goes to the kernel");
                at_exit_once();
                MODE.store(KERNEL, Ordering::Release);
            }
        }
    }
}

/// A forked child whose attach (or claim of its parent's sockets) failed,
/// e.g. the server is full (`--max-hosts`): the offloaded sockets it
/// inherited cannot work without the server, and a child that runs on with
/// dead sockets (an nginx worker that silently never serves) is worse than
/// one that stops. So it exits at once, status 1, saying why, unless it
/// inherited no offloaded socket (then the usual fallback applies).
fn exit_if_sockets_inherited(why: &str) {
    let inherited = crate::fdtable::all().len();
    if inherited == 0 {
        return;
    }
    log::emit(&format!(
        "fork: the TCP server refused this child process ({why}); the {inherited} offloaded \
         sockets it inherited cannot work without the server, so it exits with status 1 \
         (let the server take more hosts, e.g. raise --max-hosts, or run fewer processes)"
    ));
    // SAFETY: _exit ends this process at once; a forked child must not run
    // its parent's atexit handlers or flush the parent's stdio buffers.
    unsafe { libc::_exit(1) };
}
