//! Making the process's attachment to the TCP server: on the first TCP
//! socket, with the fallback when there is none (`TCPS_FALLBACK`), and in
//! a forked child, the claim of its parent's sockets (`fork.rs` leaves the
//! snapshot's nonce and the parent's descriptors here). The attachment
//! itself is held in `state.rs`.

use crate::log::{self, debug, info, warning};
use crate::state::{self, Mode};
use crate::{control, fdtable};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tcps::Client;
use tcps_proto::handshake::ControlMsg;

/// What a new TCP socket should be: `Ok(client)` to offload, `Err(None)` for
/// the kernel, `Err(Some(errno))` to fail the call.
pub fn for_new_socket() -> Result<&'static Client, Option<i32>> {
    loop {
        match state::mode() {
            Mode::Offload => {
                // The next server of a group that is still there; with one
                // server, that one.
                if let Some(c) = state::pick_member(|c| !crate::gone::check(c)) {
                    return Ok(c);
                }
                // The server died: new sockets fall back as told (until a
                // new server is attached: `reattach.rs`); the offloaded
                // ones keep the dead attachment (`gone.rs`).
                if fail_mode() {
                    state::fail_tcp_sockets();
                } else {
                    state::fall_back_to_kernel();
                }
            }
            Mode::Kernel => return Err(None),
            Mode::Failed => return Err(Some(libc::ECONNREFUSED)),
            Mode::Attaching => std::thread::yield_now(),
            Mode::Untried => {
                if state::begin_attach() {
                    attach();
                }
            }
        }
    }
}

/// The current attachment for a call on an already offloaded socket; a
/// child that has not attached yet attaches now (inheriting its parent's
/// sockets).
pub fn for_existing() -> Option<&'static Client> {
    if let Some(c) = state::client() {
        return Some(c);
    }
    match for_new_socket() {
        // A group whose last server did not answer: the first that did.
        Ok(_) if state::is_group() => state::members().map(|(_, c)| c).next(),
        r => r.ok(),
    }
}

/// `TCPS_FALLBACK=fail` (as pinned when the library loaded); any value but `kernel`, `fail` or none is
/// reported (once) and treated as `kernel`, the default.
fn fail_mode() -> bool {
    match tcps::setting_str("TCPS_FALLBACK") {
        Some(Ok(v)) if v == "fail" => true,
        Some(Ok(v)) if v == "kernel" || v.is_empty() => false,
        None => false,
        Some(other) => {
            static REPORTED: std::sync::Once = std::sync::Once::new();
            REPORTED.call_once(|| {
                log::emit(&format!(
                    "TCPS_FALLBACK={:?} is not valid (expected kernel or fail); using kernel",
                    other.unwrap_or_else(|v| v.to_string_lossy().into_owned())
                ))
            });
            false
        }
    }
}

thread_local! {
    static IN_ATTACH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True while this thread attaches: the Unix socket it opens now is the
/// control socket (`sock.rs` tells `control.rs`, for `fork.rs`).
pub fn attaching_here() -> bool {
    IN_ATTACH.with(|a| a.get())
}

/// The control socket path (`TCPS_SOCKET` as pinned when the library
/// loaded, `on_load`), fixed by the first attach.
fn socket_path() -> &'static std::path::Path {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(tcps::default_path)
}

/// Attaches to a server at the same path again (`reattach.rs`): a new
/// attachment, which takes direct connections as the first did.
pub fn attach_again() -> std::io::Result<Client> {
    let before = control::take_socket();
    IN_ATTACH.with(|a| a.set(true));
    let r = Client::attach(socket_path());
    IN_ATTACH.with(|a| a.set(false));
    match &r {
        Ok(c) => take_direct(c),
        // The socket noted while attaching is closed: keep the one before.
        Err(_) => control::note_socket(before),
    }
    r
}

fn attach() {
    let remotes = tcps::remote::addresses();
    if remotes.len() > 1 {
        return attach_group(&remotes);
    }
    let path = socket_path();
    log::stats_file();
    IN_ATTACH.with(|a| a.set(true));
    let inherit = take_inherit_token(0);
    let result = match inherit {
        Some(token) => attach_inherit(path, token),
        None => Client::attach(path),
    };
    IN_ATTACH.with(|a| a.set(false));
    match result {
        Ok(c) => {
            match tcps::setting_str("TCPS_REMOTE").and_then(Result::ok) {
                Some(r) if c.is_remote() => {
                    info!("attached to the TCP server at {r} (TCPS_REMOTE, over UCX): TCP sockets are offloaded")
                }
                _ => info!(
                    "attached to the TCP server at {}: TCP sockets are offloaded",
                    path.display()
                ),
            }
            take_direct(&c);
            state::at_exit_once();
            state::install(c);
        }
        Err(e) => {
            let why = attach_error(&e);
            if inherit.is_some() {
                exit_if_sockets_inherited(&why, state::epoch());
            }
            no_server(&why);
        }
    }
}

/// The words for a failed attach.
fn attach_error(e: &std::io::Error) -> String {
    let why = tcps::last_attach_error();
    match e.raw_os_error() {
        Some(_) if !why.is_empty() => why,
        _ => e.to_string(),
    }
}

/// Attaches to every server of `TCPS_REMOTE=a,b` (`group.rs`); a forked
/// child claims its parent's snapshot on each. The servers that do not
/// answer are left out; with none, as without a server.
fn attach_group(remotes: &[String]) {
    log::stats_file();
    let skip = SKIP.swap(0, Ordering::AcqRel);
    let mut cs = Vec::new();
    for (slot, r) in remotes.iter().take(state::MAX_GROUP).enumerate() {
        let inherit = take_inherit_token(slot);
        if skip & 1 << slot != 0 {
            debug!("fork: the TCP server at {r} was gone in the parent: not attached");
            cs.push(None);
            continue;
        }
        let got = Client::attach_remote(r).and_then(|c| match inherit {
            Some(token) => claim(c, token),
            None => Ok(c),
        });
        match got {
            Ok(c) => {
                info!("attached to the TCP server at {r} (TCPS_REMOTE, {} of {}, over UCX): TCP sockets are offloaded", slot + 1, remotes.len());
                cs.push(Some(c));
            }
            Err(e) => {
                let why = attach_error(&e);
                if inherit.is_some() {
                    exit_if_sockets_inherited(&why, state::group_first() + slot as u32);
                }
                warning!("the TCP server at {r} does not answer ({why}); the others are used");
                cs.push(None);
            }
        }
    }
    if cs.iter().all(Option::is_none) {
        return no_server("no server of TCPS_REMOTE answers");
    }
    state::at_exit_once();
    state::install_group(cs);
}

/// No server to attach to: new TCP sockets fail or go to the kernel, as
/// `TCPS_FALLBACK` says.
fn no_server(why: &str) {
    if fail_mode() {
        log::emit(&format!(
            "no TCP server ({why}); TCPS_FALLBACK=fail: TCP sockets fail with ECONNREFUSED"
        ));
        state::fail_tcp_sockets();
    } else {
        if tcps::setting("TCPS_FALLBACK_QUIET").is_none() {
            warning!("no TCP server ({why}); running on kernel sockets");
        }
        debug!("fallback: every TCP socket of this process goes to the kernel");
        state::at_exit_once();
        state::fall_back_to_kernel();
    }
}

/// `TCPS_BALANCE` (on unless 0/off/no/false): whether this process takes
/// the connections balancing hands over as kernel sockets.
static BALANCE: tcps::Switch = tcps::Switch::new("TCPS_BALANCE");

/// Tells the server this process takes direct connections (balancing): an
/// `accept` may then return a kernel socket the program uses as it is
/// (`sock.rs`). A server that does not know the message cuts the host
/// off, so an error here is only logged.
fn take_direct(c: &Client) {
    if !BALANCE.on() || c.is_remote() {
        debug!("TCPS_BALANCE off: every connection stays offloaded");
        return;
    }
    if let Err(e) = c.take_direct_connections() {
        warning!("the TCP server does not hand over connections directly: {e}");
    }
}

/// A forked child whose attach (or claim of its parent's sockets) failed,
/// e.g. the server is full (`--max-hosts`): the offloaded sockets it
/// inherited cannot work without the server, and a child that runs on with
/// dead sockets (an nginx worker that silently never serves) is worse than
/// one that stops. So it exits at once, status 1, saying why, unless it
/// inherited no offloaded socket (then the usual fallback applies).
fn exit_if_sockets_inherited(why: &str, epoch: u32) {
    let inherited = fdtable::all_in(epoch).len();
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

/// The parent's own descriptors of its sockets (`tcps::Client::kernel_fds`,
/// listed before the fork): the child's attachment takes them over with the
/// snapshot, or closes them.
static PARENT_KFDS: std::sync::Mutex<Vec<(u32, i32)>> = std::sync::Mutex::new(Vec::new());

/// A forked child keeps its parent's descriptors for its attach.
pub fn keep_parent_kfds(kfds: Vec<(u32, i32)>) {
    *PARENT_KFDS.lock().unwrap_or_else(|p| p.into_inner()) = kfds;
}

fn take_parent_kfds() -> Vec<(u32, i32)> {
    std::mem::take(&mut *PARENT_KFDS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Closes the parent's descriptors this child will not use.
pub fn close_parent_kfds() {
    for (_, fd) in take_parent_kfds() {
        // SAFETY: closing this process's copy of a descriptor only the
        // parent's (forgotten) attachment knew.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
}

/// The servers of a group a forked child does not attach to (bit per
/// place): gone in its parent.
static SKIP: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A forked child leaves out the group's servers of `mask`.
pub fn skip_servers(mask: u32) {
    SKIP.store(mask, Ordering::Release);
}

/// `1 << 32 | nonce` while a forked child has a snapshot to claim, per
/// server of a group (`group.rs`; one server: the first).
static INHERIT: [AtomicU64; state::MAX_GROUP] = [const { AtomicU64::new(0) }; state::MAX_GROUP];

/// A forked child has the parent's snapshot `nonce` to claim at its attach
/// to the server at group place `slot`.
pub fn set_inherit_token(slot: usize, nonce: u32) {
    INHERIT[slot % state::MAX_GROUP].store(1 << 32 | u64::from(nonce), Ordering::Release);
}

fn take_inherit_token(slot: usize) -> Option<u32> {
    let v = INHERIT[slot % state::MAX_GROUP].swap(0, Ordering::AcqRel);
    (v != 0).then_some(v as u32)
}

/// Attaches as a forked child and adopts the parent's snapshot `token`;
/// an error if the server refuses either.
fn attach_inherit(path: &Path, token: u32) -> std::io::Result<tcps::Client> {
    claim(tcps::Client::attach(path)?, token)
}

/// Claims the parent's snapshot `token` on the new attachment `c`.
fn claim(c: tcps::Client, token: u32) -> std::io::Result<tcps::Client> {
    match control::call_on(&c, ControlMsg::Inherit { handle: token }) {
        Ok(()) => {
            c.adopt_kernel_fds(&take_parent_kfds());
            debug!("fork: inherited the parent's sockets");
            Ok(c)
        }
        Err(e) => {
            close_parent_kfds();
            Err(std::io::Error::other(format!(
                "the server did not hand over the parent's sockets: {}",
                std::io::Error::from_raw_os_error(e)
            )))
        }
    }
}
