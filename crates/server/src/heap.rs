//! Counts the heap allocations each server thread makes, so `tcps stat`
//! can show what a worker's passes allocate (`server.heap_allocations`):
//! accepting and serving a connection should take nothing from the heap
//! once the tables have grown to the load (connection caching, issue 15
//! item 2; `calls::common::insert_socket` reuses a closed socket's entry).
//!
//! The process's global allocator is the system's with a per-thread
//! counter in front: one thread-local add per allocation, no atomics.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // const-initialised and without a destructor: safe to touch from the
    // allocator (no lazy initialisation that would itself allocate).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations per thread.
pub struct Counting;

fn count() {
    // `try_with`: a thread being torn down has no counter any more.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; counting touches only a thread-local integer.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received (GlobalAlloc's contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// This thread's allocations (and reallocations) since the last look, and
/// zero again.
pub fn take_count() -> u64 {
    ALLOCATIONS.with(|c| c.replace(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_this_threads_allocations() {
        super::take_count();
        let v: Vec<u64> = Vec::with_capacity(16);
        let n = super::take_count();
        drop(v);
        assert_eq!(n, 1);
        // Each thread has its own count.
        let other = std::thread::spawn(|| {
            super::take_count();
            drop(vec![1u8; 64]);
            drop(vec![1u8; 64]);
            super::take_count()
        });
        assert_eq!(other.join().unwrap(), 2);
    }
}
