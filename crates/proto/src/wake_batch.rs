//! Deferred futex wakes ([`crate::futex`]). A thread may *defer* its
//! wakes ([`defer`]): they are then only recorded (one entry per word, counts added), and the thread hands them
//! to the kernel itself, all at once ([`take`]) — the server's
//! worker submits them as io_uring `FUTEX_WAKE` operations with the rest of
//! its pass, so waking host threads costs it no system call of its own. A
//! deferred wake is only later, never lost, as long as the thread takes
//! the list before it blocks: the sleeper's side of the handshake (count
//! itself a waiter, fence, re-read, `FUTEX_WAIT` only while the word still
//! holds what it read) does not depend on when the wake comes.

use std::cell::{Cell, RefCell};
use std::sync::atomic::AtomicU32;

thread_local! {
    static DEFER: Cell<bool> = const { Cell::new(false) };
    static DEFERRED: RefCell<Vec<(usize, i32)>> = const { RefCell::new(Vec::new()) };
}

/// From now on this thread's wakes are recorded, not made (`on`), or made
/// at once again (`!on`; take what was recorded first).
pub fn defer(on: bool) {
    DEFER.with(|d| d.set(on));
}

/// Moves this thread's recorded wakes — (address of the word, how many
/// waiters) — into `out` (cleared first; both lists keep their room).
pub fn take(out: &mut Vec<(usize, i32)>) {
    out.clear();
    let _ = DEFERRED.try_with(|d| std::mem::swap(&mut *d.borrow_mut(), out));
}

/// Records a wake of `n` waiters on `word` if this thread defers; whether
/// it did.
fn record(word: &AtomicU32, n: i32) -> bool {
    if !DEFER.with(|d| d.get()) {
        return false;
    }
    let addr = word.as_ptr() as usize;
    DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        match d.iter_mut().find(|(a, _)| *a == addr) {
            Some((_, k)) => *k = k.saturating_add(n),
            None => d.push((addr, n)),
        }
    });
    true
}

/// Wakes at most `n` waiters on the word at `addr` now (`FUTEX_WAKE`): a
/// recorded wake its thread makes itself.
pub fn wake_now(addr: usize, n: i32) {
    crate::futex::wake_addr(addr, n)
}

/// Wakes every waiter sleeping on `word` (or records it, if this thread
/// defers its wakes).
pub fn wake_all(word: &AtomicU32) {
    wake(word, i32::MAX)
}

/// Wakes at most `n` waiters sleeping on `word` (or records it, if this
/// thread defers its wakes).
pub fn wake(word: &AtomicU32, n: i32) {
    if !record(word, n) {
        wake_now(word.as_ptr() as usize, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_wakes_are_recorded_per_word() {
        let (a, b) = (AtomicU32::new(0), AtomicU32::new(0));
        defer(true);
        wake(&a, 1);
        wake(&b, i32::MAX);
        wake(&a, 2);
        defer(false);
        let mut got = Vec::new();
        take(&mut got);
        assert_eq!(
            got,
            vec![(a.as_ptr() as usize, 3), (b.as_ptr() as usize, i32::MAX)]
        );
        take(&mut got);
        assert!(got.is_empty());
        wake(&a, 1); // not deferred: made at once, nothing recorded
        take(&mut got);
        assert!(got.is_empty());
    }
}
