//! Cross-process futex wait/wake on a word of the shared region.
//!
//! The region is a `MAP_SHARED` memfd mapping, so the futex must be a shared
//! (non-`FUTEX_PRIVATE_FLAG`) one: the kernel keys it by inode and offset and
//! a wake from the server process reaches a host process sleeping on it.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, for at most `timeout`. Returns early on a
/// wake, a signal or a changed value; callers re-check their condition.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call and
    // `ts` outlives it; FUTEX_WAIT only reads both.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every waiter sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    wake(word, i32::MAX)
}

/// Wakes at most `n` waiters sleeping on `word`.
pub fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key; it is valid and aligned.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n);
    }
}
