//! fork(): parent and child both keep working sockets.
//!
//! The server keeps sockets per attached process, and the child must not
//! use the parent's channels (its threads, locks and completions are the
//! parent's). So, around the real fork(2):
//!
//! 1. the parent asks the server for a snapshot of its sockets
//!    (`ControlMsg::Fork` with a random nonce on its control socket; the
//!    server dup()s each one, see `crates/server/src/inherit/`);
//! 2. the child forgets the parent's attachment (closing its copy of the
//!    parent's control socket, so the server still sees the parent hang up
//!    when it exits) and keeps the nonce;
//! 3. the parent names the child (`ControlMsg::Forked` with its pid, or 0
//!    if fork(2) failed), so the server drops the snapshot as soon as that
//!    child is gone without claiming it (killed before it attached), as the
//!    kernel would close its sockets, instead of holding the connections;
//! 4. the child attaches anew at once and presents the nonce
//!    (`ControlMsg::Inherit`): it gets the snapshot under the same socket
//!    ids, so its fd table (copied by fork) stays valid. Claiming at once
//!    (not on first use) ties the snapshot's life to the child's, as with
//!    kernel fds: a child that never uses its sockets (redis' BGSAVE) still
//!    releases them when it exits.
//!
//! A child the server refuses (full: `--max-hosts`), or whose claim fails,
//! cannot use the offloaded sockets it inherited: it says why on stderr and
//! exits with status 1 (`attach.rs`), rather than run on with dead sockets.

use crate::log::{debug, warning};
use crate::{attach, control, errno, fdtable, real, state};
use tcps_proto::handshake::ControlMsg;

/// A random nonce for a snapshot (never 0), or None if the kernel gives
/// no randomness: a guessable nonce would let another child of this
/// parent claim the sockets, so the snapshot is then not asked for.
fn nonce() -> Option<u32> {
    for _ in 0..16 {
        let mut b = [0u8; 4];
        // SAFETY: getrandom fills at most our 4-byte buffer.
        let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
        if n == 4 && b != [0; 4] {
            return Some(u32::from_ne_bytes(b));
        }
        if n < 0 && errno::last_errno() != libc::EINTR {
            warning!(
                "fork: no random nonce (getrandom: errno {})",
                errno::last_errno()
            );
            return None;
        }
    }
    None
}

/// Asks `c`'s server for a snapshot of this process's sockets there: the
/// nonce the child presents, or None if refused.
fn snapshot(c: &tcps::Client) -> Option<u32> {
    let n = nonce()?;
    match control::call_on(c, ControlMsg::Fork { handle: n }) {
        Ok(()) => Some(n),
        Err(e) => {
            warning!("fork: the server refused a socket snapshot (errno {e}); the child will not have the parent's sockets");
            None
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    // `--reattach`: a server that came back takes the child's sockets (the
    // dead attachment of a process that slept through the death, as
    // nginx's master, is noticed here).
    if state::reattach_enabled() && state::client().is_some_and(crate::gone::check) {
        crate::reattach::try_now();
    }
    // The attachment, or each live server's of a group (`group.rs`): a
    // dead one is noticed now, so that its listeners move to a live
    // server before the snapshot (nginx's master forks a new worker long
    // after the death, never having waited on its listeners).
    let members: Vec<(u32, &'static tcps::Client)> = state::members()
        .filter(|&(_, c)| !state::is_group() || !crate::gone::check(c))
        .collect();
    let kfds = state::client().map(|c| c.kernel_fds()).unwrap_or_default();
    for (_, c) in &members {
        crate::sendq::flush_all(c);
    }
    let tokens: Vec<Option<u32>> = members.iter().map(|(_, c)| snapshot(c)).collect();
    // Locks another thread may hold must not be copied held into the
    // child (it would deadlock on them): take them across the fork, in the
    // order their users take them.
    let files = crate::sendfile::lock_for_fork();
    let ctl = control::lock_for_fork();
    let sets = crate::epoll::lock_for_fork();
    let group = crate::group::lock_for_fork();
    let attach_error = tcps::attach_error_lock_for_fork();
    let pid = real::fork()();
    let fork_errno = errno::last_errno();
    drop((attach_error, group, sets, ctl, files));
    if pid == 0 {
        state::note_own_process();
        state::new_generation();
        if !members.is_empty() {
            in_child(&members, &tokens, kfds);
        }
    } else {
        for ((_, c), token) in members.iter().zip(&tokens) {
            let Some(n) = *token else { continue };
            let child = u32::try_from(pid).unwrap_or(0);
            if let Err(e) = control::call_on(c, ControlMsg::Forked { handle: n, child }) {
                debug!("fork: naming child {pid} to the server failed (errno {e})");
            }
        }
        if pid > 0 {
            debug!("fork: child {pid}");
            if tokens.iter().any(Option::is_some) {
                share_inherited_sockets();
            }
        }
        errno::set_errno(fork_errno);
    }
    pid
}

/// vfork(2) is fork here. A vfork child shares its parent's memory until
/// it execs: every table this library keeps (fd → socket, the attachment,
/// its locks and channels) is the parent's, while the descriptor table the
/// child's dup2 and close change is its own. Whatever the library did for
/// the child's calls (CPython's `_posixsubprocess` dup2s a connection onto
/// fds 0 and 1, then execs) would rewrite the parent's tables, and the
/// hand-back at exec (`exec.rs`) would take the socket from the parent's
/// attachment. A forked child has its own memory and attachment, so every
/// path works as after fork. POSIX lets vfork be fork; only a program that
/// writes its parent's memory from a vfork child (undefined behaviour)
/// would tell. `docs/PRELOAD.md` ("fork", "exec").
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    fork()
}

/// The child's side: leaves its parent's attachments and claims the
/// snapshots at once (the snapshot holds the sockets at the server and
/// must live exactly as long as this process, as the kernel's fds would,
/// even if it never touches them). The sockets of a server that gave no
/// snapshot are not the child's.
fn in_child(
    members: &[(u32, &'static tcps::Client)],
    tokens: &[Option<u32>],
    kfds: Vec<(u32, i32)>,
) {
    // The parent's channels are not ours; its control sockets must not
    // stay open here (the server would not see the parent go).
    let noted = control::take_socket();
    for (_, c) in members {
        // Remote: the helper's socketpair, not noted by socket(2).
        let ctl = if noted >= 0 && !state::is_group() {
            noted
        } else {
            c.control_fd()
        };
        // SAFETY: closing this process's copy of the parent's control
        // socket, which nothing here uses from now on.
        unsafe { real::close()(ctl) };
    }
    // A group's servers that were dead in the parent are not tried again
    // here (a cut link would hold the child up for UCX's timeout).
    let live: u32 = members
        .iter()
        .map(|&(e, _)| 1u32 << state::slot(e))
        .fold(0, |a, b| a | b);
    if state::is_group() {
        attach::skip_servers(!live);
    }
    state::forget();
    attach::keep_parent_kfds(kfds);
    for ((e, _), token) in members.iter().zip(tokens) {
        match token {
            Some(n) => attach::set_inherit_token(state::slot(*e), *n),
            None => {
                for (fd, _) in fdtable::all_in(*e) {
                    fdtable::remove(fd);
                }
            }
        }
    }
    if tokens.iter().any(Option::is_some) {
        let _ = attach::for_new_socket();
        share_inherited_sockets();
    } else {
        attach::close_parent_kfds();
    }
}

/// The sockets the child inherited are the parent's too: neither may keep
/// their options (`tcps::Client::share_sockets`), the other can set them.
fn share_inherited_sockets() {
    for (e, c) in state::members() {
        let ids = fdtable::all_in(e).into_iter().map(|(_, id)| id);
        c.share_sockets(ids);
    }
}
