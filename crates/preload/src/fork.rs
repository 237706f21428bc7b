//! fork(): the child gets its own attachment with the parent's sockets.
//!
//! (Step 1 stub: inheritance arrives with the server side.)

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Changes in every forked child: per-thread state made before the fork
/// (poll helpers) belongs to the parent.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

pub fn take_inherit_token() -> Option<u64> {
    None
}

pub fn attach_inherit(path: &Path, _token: u64) -> std::io::Result<tcps::Client> {
    tcps::Client::attach(path)
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    let guard = crate::epoll::lock_for_fork();
    let pid = crate::real::fork()();
    drop(guard);
    if pid == 0 {
        GENERATION.fetch_add(1, Ordering::Relaxed);
        crate::state::forget();
    }
    pid
}
