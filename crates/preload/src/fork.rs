//! fork(): parent and child both keep working sockets.
//!
//! The server keeps sockets per attached process, and the child must not
//! use the parent's channels (its threads, locks and completions are the
//! parent's). So, around the real fork(2):
//!
//! 1. the parent asks the server for a snapshot of its sockets
//!    (`ControlMsg::Fork` with a random nonce on its control socket; the
//!    server dup()s each one, see `crates/server/src/inherit.rs`);
//! 2. the child forgets the parent's attachment (closing its copy of the
//!    parent's control socket, so the server still sees the parent hang up
//!    when it exits) and keeps the nonce;
//! 3. the child attaches anew at once and presents the nonce
//!    (`ControlMsg::Inherit`): it gets the snapshot under the same socket
//!    ids, so its fd table (copied by fork) stays valid. Claiming at once
//!    (not on first use) ties the snapshot's life to the child's, as with
//!    kernel fds: a child that never uses its sockets (redis' BGSAVE) still
//!    releases them when it exits.
//!
//! A child the server refuses (full: `--max-hosts`), or whose claim fails,
//! cannot use the offloaded sockets it inherited: it says why on stderr and
//! exits with status 1 (`state.rs`), rather than run on with dead sockets.

use crate::log::{debug, warning};
use crate::{control, fdtable, real, state};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tcps_proto::handshake::ControlMsg;

static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The parent's own descriptors of its sockets (`tcps::Client::kernel_fds`,
/// listed before the fork): the child's attachment takes them over with the
/// snapshot, or closes them.
static PARENT_KFDS: std::sync::Mutex<Vec<(u32, i32)>> = std::sync::Mutex::new(Vec::new());

fn take_parent_kfds() -> Vec<(u32, i32)> {
    std::mem::take(&mut *PARENT_KFDS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Closes the parent's descriptors this child will not use.
fn close_parent_kfds() {
    for (_, fd) in take_parent_kfds() {
        // SAFETY: closing this process's copy of a descriptor only the
        // parent's (forgotten) attachment knew.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
}
/// `1 << 32 | nonce` while a forked child has a snapshot to claim.
static INHERIT: AtomicU64 = AtomicU64::new(0);

/// Changes in every forked child: per-thread state made before the fork
/// (poll helpers) belongs to the parent.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

pub fn take_inherit_token() -> Option<u32> {
    let v = INHERIT.swap(0, Ordering::AcqRel);
    (v != 0).then_some(v as u32)
}

fn nonce() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom fills our 4-byte buffer.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
    u32::from_ne_bytes(b).max(1)
}

/// Attaches as a forked child and adopts the parent's snapshot `token`;
/// an error if the server refuses either.
pub fn attach_inherit(path: &Path, token: u32) -> std::io::Result<tcps::Client> {
    let c = tcps::Client::attach(path)?;
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

#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    let attached = state::client().is_some();
    let kfds = state::client().map(|c| c.kernel_fds()).unwrap_or_default();
    let token = if attached {
        let n = nonce();
        match control::call(ControlMsg::Fork { handle: n }, n) {
            Ok(()) => Some(n),
            Err(e) => {
                warning!("fork: the server refused a socket snapshot (errno {e}); the child will not have the parent's sockets");
                None
            }
        }
    } else {
        None
    };
    // Locks another thread may hold must not be copied held into the
    // child (it would deadlock on them): take them across the fork, in the
    // order their users take them.
    let files = crate::sendfile::lock_for_fork();
    let ctl = control::lock_for_fork();
    let sets = crate::epoll::lock_for_fork();
    let pid = real::fork()();
    drop((sets, ctl, files));
    if pid == 0 {
        GENERATION.fetch_add(1, Ordering::Relaxed);
        if attached {
            // The parent's channels are not ours; its control socket must
            // not stay open here (the server would not see the parent go).
            let ctl = control::take_socket();
            if ctl >= 0 {
                real::close()(ctl);
            }
            state::forget();
            *PARENT_KFDS.lock().unwrap_or_else(|p| p.into_inner()) = kfds;
            if let Some(n) = token {
                INHERIT.store(1 << 32 | u64::from(n), Ordering::Release);
                // Claim at once: the snapshot holds the sockets at the server
                // and must live exactly as long as this process (as the
                // kernel's fds would), even if it never touches them.
                let _ = state::for_new_socket();
            } else {
                close_parent_kfds();
                for (fd, _) in fdtable::all() {
                    fdtable::remove(fd);
                }
            }
        }
    } else if pid > 0 {
        debug!("fork: child {pid}");
    }
    pid
}
