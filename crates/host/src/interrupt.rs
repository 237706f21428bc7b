//! Signals that interrupt a blocking wait, as they interrupt the kernel's
//! blocking socket calls.
//!
//! A wait learns that a signal handler ran in two ways: a futex sleep with
//! a timeout returns EINTR after any handler (the kernel restarts it only
//! when no handler ran), and, for a program run under the preload library,
//! a per-thread *signal generation* the library's handler trampoline
//! counts up ([`set_signal_generation`]), which also tells of a handler
//! that ran while the thread was spinning rather than asleep. An
//! interrupted wait stops: a call parked at the server is cancelled
//! (`Call::Cancel`) and returns what the server answers (the bytes moved
//! so far, else EINTR); a wait on a ring or queue returns EINTR. Whether to
//! restart the call (`SA_RESTART`) is the preload's decision; the native
//! API returns EINTR.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The generation source: a `fn() -> u64` (0: none).
static SOURCE: AtomicUsize = AtomicUsize::new(0);

/// Installs `f` as the calling thread's signal generation: a counter that
/// changes whenever a signal handler ran on the thread (the preload's
/// trampoline). Waits that see it change stop as interrupted.
pub fn set_signal_generation(f: fn() -> u64) {
    SOURCE.store(f as usize, Ordering::Release);
}

/// The calling thread's signal generation (0 without a source).
pub fn signal_generation() -> u64 {
    match SOURCE.load(Ordering::Acquire) {
        0 => 0,
        // SAFETY: only `set_signal_generation` stores here, a `fn() -> u64`.
        p => unsafe { std::mem::transmute::<usize, fn() -> u64>(p)() },
    }
}

/// The signal generation when a wait began.
#[derive(Clone, Copy)]
pub(crate) struct Mark(u64);

impl Mark {
    pub(crate) fn new() -> Mark {
        Mark(signal_generation())
    }

    /// Whether a handler ran on this thread since the mark.
    pub(crate) fn seen(&self) -> bool {
        signal_generation() != self.0
    }
}

/// Runs a futex sleep (`sleep`, which keeps errno as the system call left
/// it) and says whether a signal handler interrupted it (EINTR).
pub(crate) fn futex_interrupted(sleep: impl FnOnce()) -> bool {
    // SAFETY: errno is this thread's own int.
    unsafe { *libc::__errno_location() = 0 };
    sleep();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() == libc::EINTR }
}

/// EINTR as an error.
pub(crate) fn eintr() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINTR)
}
