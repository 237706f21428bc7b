//! The two building blocks of the per-socket record (`crate::socket`): a
//! table found by socket id without a global lock (two levels of lazily
//! created entries that live as long as the attachment; a socket id reused
//! after close finds its entry reset), and the spin lock that guards each
//! part of an entry: held for a few dozen instructions (or one bounded copy
//! out of a receive ring), never across a wait.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

const CHUNK: usize = 1024;
const CHUNKS: usize = 16384; // socket ids below 16M (the server's limit)

pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, one at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> SpinLock<T> {
        SpinLock::new(T::default())
    }
}

impl<T> SpinLock<T> {
    pub fn new(v: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(v),
        }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        while self.locked.swap(true, Ordering::Acquire) {
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        SpinGuard { lock: self }
    }
}

pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

type Chunk<T> = Box<[OnceLock<T>]>;

pub struct SockTable<T> {
    chunks: Box<[OnceLock<Chunk<T>>]>,
}

impl<T: Default> SockTable<T> {
    pub fn new() -> SockTable<T> {
        SockTable {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The entry of socket `s`, if it was ever created.
    #[inline]
    pub fn get(&self, s: u32) -> Option<&T> {
        let s = s as usize;
        self.chunks.get(s / CHUNK)?.get()?[s % CHUNK].get()
    }

    /// The entry of socket `s`, created on first use; `None` for an id
    /// beyond any the server hands out.
    #[inline]
    pub fn get_or_insert(&self, s: u32) -> Option<&T> {
        let s = s as usize;
        let chunk = self
            .chunks
            .get(s / CHUNK)?
            .get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        Some(chunk[s % CHUNK].get_or_init(T::default))
    }

    /// Calls `f` with every created entry and its socket id.
    pub fn for_each(&self, mut f: impl FnMut(u32, &T)) {
        for (c, chunk) in self.chunks.iter().enumerate() {
            let Some(chunk) = chunk.get() else { continue };
            for (i, e) in chunk.iter().enumerate() {
                if let Some(e) = e.get() {
                    f((c * CHUNK + i) as u32, e);
                }
            }
        }
    }

    /// Whether `f` holds for any entry.
    pub fn any(&self, f: impl FnMut(&T) -> bool) -> bool {
        self.chunks
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|c| c.iter().filter_map(OnceLock::get))
            .any(f)
    }
}
