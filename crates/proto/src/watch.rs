//! The rings or send queues a fabric pump looks at in a pass, instead of
//! every one of the region's (a thousand or more, each a few cache lines
//! and bound checks): a set of indices, each with a stamp (when it was
//! last named or seen moving), with O(1) membership and O(members)
//! iteration. The pumps keep the bound ones and those named lately
//! (`docs/ARCHITECTURE.md`, "The channel over a fabric").

/// A set of indices below a fixed bound.
#[derive(Debug, Clone)]
pub struct Watch {
    list: Vec<u32>,
    /// Per index: its stamp, 0 if not a member.
    stamp: Vec<u64>,
}

impl Watch {
    /// An empty set of indices below `n`.
    pub fn new(n: usize) -> Watch {
        Watch {
            list: Vec::new(),
            stamp: vec![0; n],
        }
    }

    /// Adds `i` (or refreshes its stamp; a stamp is at least 1). Indices
    /// beyond the bound are ignored: callers pass what a peer named.
    pub fn touch(&mut self, i: u32, stamp: u64) {
        let Some(s) = self.stamp.get_mut(i as usize) else {
            return;
        };
        if *s == 0 {
            self.list.push(i);
        }
        *s = stamp.max(1);
    }

    pub fn contains(&self, i: u32) -> bool {
        self.stamp.get(i as usize).is_some_and(|&s| s != 0)
    }

    /// The members, in the order they joined (removals reorder).
    pub fn members(&self) -> &[u32] {
        &self.list
    }

    /// Keeps the members `keep(index, stamp)` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(u32, u64) -> bool) {
        let stamp = &mut self.stamp;
        self.list.retain(|&i| {
            let k = keep(i, stamp[i as usize]);
            if !k {
                stamp[i as usize] = 0;
            }
            k
        });
    }

    pub fn remove(&mut self, i: u32) {
        if self.contains(i) {
            self.retain(|j, _| j != i);
        }
    }

    /// How many indices the set may hold (its bound).
    pub fn capacity(&self) -> usize {
        self.stamp.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_join_once_and_leave_by_stamp() {
        let mut w = Watch::new(8);
        w.touch(3, 10);
        w.touch(5, 11);
        w.touch(3, 12);
        w.touch(8, 1); // beyond the bound: ignored
        assert_eq!(w.members(), &[3, 5]);
        assert!(w.contains(3) && !w.contains(8));
        w.retain(|_, s| s >= 12);
        assert_eq!(w.members(), &[3]);
        assert!(!w.contains(5));
        w.touch(5, 0); // a stamp of 0 still makes a member
        w.remove(3);
        assert_eq!(w.members(), &[5]);
        assert_eq!(w.capacity(), 8);
    }
}
