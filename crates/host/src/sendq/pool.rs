//! The staging pool of copying asynchronous sends: one registered region,
//! handed out in granules (first fit from a roving start over a bitmap).
//! `tcps_send_async` copies the caller's bytes here and queues them; the
//! range is freed when the server reports the send done.

use std::sync::{Mutex, PoisonError};

/// Allocation unit.
pub const GRANULE: usize = 1024;
/// Largest piece one descriptor stages (a larger send is split): small
/// enough that a fragmented pool still serves it.
pub const MAX_PIECE: usize = 64 * 1024;

pub struct Pool {
    pub base: *mut u8,
    pub handle: u32,
    bits: Mutex<Bits>,
}

// SAFETY: `base` points at a shared mapping that lives as long as the
// attachment; ranges are handed out under the lock, each to one sender.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

struct Bits {
    words: Vec<u64>,
    granules: usize,
    /// Where the next search starts.
    rover: usize,
}

impl Bits {
    fn is_free(&self, g: usize) -> bool {
        self.words[g / 64] & (1 << (g % 64)) == 0
    }

    fn set(&mut self, from: usize, n: usize, used: bool) {
        for g in from..from + n {
            if used {
                self.words[g / 64] |= 1 << (g % 64);
            } else {
                self.words[g / 64] &= !(1 << (g % 64));
            }
        }
    }

    /// First run of `n` free granules at or after `start` (wrapping once).
    fn find(&self, n: usize) -> Option<usize> {
        let total = self.granules;
        let mut g = self.rover;
        let mut run = 0;
        let mut scanned = 0;
        while scanned < total + n {
            if g >= total {
                g = 0;
                run = 0;
            }
            if g.is_multiple_of(64) && self.words[g / 64] == u64::MAX {
                g += 64;
                scanned += 64;
                run = 0;
                continue;
            }
            if self.is_free(g) {
                run += 1;
                if run == n {
                    return Some(g + 1 - n);
                }
            } else {
                run = 0;
            }
            g += 1;
            scanned += 1;
        }
        None
    }
}

impl Pool {
    pub fn new(base: *mut u8, handle: u32, len: usize) -> Pool {
        let granules = len / GRANULE;
        Pool {
            base,
            handle,
            bits: Mutex::new(Bits {
                words: vec![0; granules.div_ceil(64)],
                granules,
                rover: 0,
            }),
        }
    }

    /// Reserves room for `len` bytes (at most `MAX_PIECE`); returns the
    /// offset and the granules taken.
    pub fn alloc(&self, len: usize) -> Option<(u32, u32)> {
        let n = len.max(1).div_ceil(GRANULE);
        let mut b = self.bits.lock().unwrap_or_else(PoisonError::into_inner);
        let g = b.find(n)?;
        b.set(g, n, true);
        b.rover = g + n;
        Some(((g * GRANULE) as u32, n as u32))
    }

    pub fn free(&self, off: u32, n: u32) {
        let mut b = self.bits.lock().unwrap_or_else(PoisonError::into_inner);
        b.set(off as usize / GRANULE, n as usize, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_do_not_overlap_and_come_back() {
        let p = Pool::new(std::ptr::null_mut(), 0, 64 * GRANULE);
        let a = p.alloc(10 * GRANULE).unwrap();
        let b = p.alloc(1).unwrap();
        assert_eq!(a, (0, 10));
        assert_eq!(b, (10 * GRANULE as u32, 1));
        let c = p.alloc(53 * GRANULE).unwrap();
        assert_eq!(c.1, 53);
        assert!(p.alloc(1).is_none(), "full");
        p.free(a.0, a.1);
        assert!(p.alloc(11 * GRANULE).is_none(), "no run of 11");
        assert_eq!(p.alloc(10 * GRANULE), Some((0, 10)));
        p.free(b.0, b.1);
        assert_eq!(p.alloc(GRANULE), Some((10 * GRANULE as u32, 1)));
    }
}
