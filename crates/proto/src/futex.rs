//! Cross-process futex wait/wake on a word of the shared region.
//!
//! The region is a `MAP_SHARED` memfd mapping, so the futex must be a shared
//! (non-`FUTEX_PRIVATE_FLAG`) one: the kernel keys it by inode and offset and
//! a wake from the server process reaches a host process sleeping on it.
//!
//! Wakes go through [`crate::wake_batch`], which lets a thread defer them.

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

/// Wakes at most `n` waiters on the word at `addr` now (`FUTEX_WAKE`).
pub fn wake_addr(addr: usize, n: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key (an address no
    // longer mapped gets EFAULT, one mapped again a spurious wake-up).
    unsafe {
        libc::syscall(libc::SYS_futex, addr as *const u32, libc::FUTEX_WAKE, n);
    }
}
