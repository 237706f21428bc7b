//! Checking out a piece of a channel for one call (see the module above):
//! an idle channel first, the one this thread used last first; sharing a
//! busy one when none is idle; backing off only while none has room.

use super::conn::{bump, Backoff, Conn, LAST_CHANNEL, STAGE};
use super::lease::Lease;
use super::state::ChanState;
use std::cell::Cell;
use std::io;
use std::sync::atomic::Ordering;

impl Conn {
    /// Runs `f` with a piece of a channel for one call: an arena range of at
    /// least `min` and up to `want` bytes (both clamped to the arena; the
    /// lease's [`room`](Lease::room) says how much was granted). Prefers an
    /// idle channel, the one this thread used last first; shares a busy one
    /// when none is idle; waits only while no channel has room. `dead_errno`
    /// is returned if the attachment dies meanwhile.
    ///
    /// A small call (at most [`STAGE`] bytes) only picks a channel here and
    /// gets all it asks for: its bytes are staged in the lease, and its range
    /// is reserved and released inside the submit and drain critical
    /// sections of each request (see [`Lease::exchange`]).
    pub fn with_lease<T>(
        &self,
        dead_errno: i32,
        min: u32,
        want: u32,
        f: impl FnOnce(&mut Lease<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
        let want = want.min(self.arena_size());
        if want as usize <= STAGE {
            // Built in place: a lease with its stage is a few hundred bytes.
            let mut lease = Lease::new(self, self.choose(), dead_errno, want, true);
            return f(&mut lease);
        }
        f(&mut self.checkout(dead_errno, min.min(want), want)?)
    }

    /// Checks out a large call's piece of a channel (see [`with_lease`]).
    fn checkout(&self, dead_errno: i32, min: u32, want: u32) -> io::Result<Lease<'_>> {
        let (conn, hint) = LAST_CHANNEL.try_with(Cell::get).unwrap_or((0, 0));
        if conn == self.id {
            if let Some(l) = self.try_lease(hint, min, want, false) {
                return Ok(l);
            }
        }
        let n = self.slots.len() as u32;
        let mut backoff = Backoff::default();
        loop {
            let idle = (0..n).find_map(|i| self.try_lease(i, min, want, false));
            let lease = idle.or_else(|| {
                let fewest = self.fewest_users();
                self.try_lease(fewest, min, want, true).or_else(|| {
                    (0..n)
                        .filter(|&i| i != fewest && self.users(i) < self.max_users)
                        .find_map(|i| self.try_lease(i, min, want, true))
                })
            });
            if let Some(l) = lease {
                let _ = LAST_CHANNEL.try_with(|c| c.set((self.id, l.index)));
                return Ok(l);
            }
            self.check_open(dead_errno)?;
            backoff.wait();
        }
    }

    pub(super) fn users(&self, index: u32) -> u32 {
        self.slots[index as usize].users.load(Ordering::Relaxed)
    }

    /// The channel with the fewest users (the first of them).
    fn fewest_users(&self) -> u32 {
        (0..self.slots.len() as u32)
            .min_by_key(|&i| self.users(i))
            .unwrap_or(0)
    }

    /// Picks a channel for a small call without locking anything: this
    /// thread's last channel if idle, else the first idle one, else the one
    /// with the fewest users. Binding (under the lock) re-checks the room.
    pub(super) fn choose(&self) -> u32 {
        let (conn, hint) = LAST_CHANNEL.try_with(Cell::get).unwrap_or((0, 0));
        if conn == self.id && self.users(hint) == 0 {
            return hint;
        }
        let n = self.slots.len() as u32;
        let i = (0..n)
            .find(|&i| self.users(i) == 0)
            .unwrap_or_else(|| self.fewest_users());
        let _ = LAST_CHANNEL.try_with(|c| c.set((self.id, i)));
        i
    }

    /// Leases channel `index` if it is idle (or, with `share`, if it has
    /// room for one more call), reserving the call's range now.
    fn try_lease(&self, index: u32, min: u32, want: u32, share: bool) -> Option<Lease<'_>> {
        let slot = self.slots.get(index as usize)?;
        if !share && slot.users.load(Ordering::Relaxed) != 0 {
            return None;
        }
        let mut st = slot.lock();
        if !share && !st.uses.is_empty() {
            return None;
        }
        let tag = st.next_tag();
        let (_, off, len) = self.reserve(index, &mut st, min, want, tag)?;
        drop(st);
        let mut l = Lease::new(self, index, 0, len, false);
        l.tag = tag;
        l.off = off;
        Some(l)
    }

    /// Adds a user tagged `tag` to channel `index` (locked as `st`) with a
    /// range of at least `min` and up to `want` bytes. Returns (index in the
    /// users table, offset, length).
    #[inline]
    pub(super) fn reserve(
        &self,
        index: u32,
        st: &mut ChanState,
        min: u32,
        want: u32,
        tag: u64,
    ) -> Option<(usize, u32, u32)> {
        let slot = &self.slots[index as usize];
        let others = !st.uses.is_empty();
        let (i, off, len) = st.alloc(self.arena_size(), self.max_users, min, want, tag)?;
        slot.users.store(st.uses.len() as u32, Ordering::Relaxed);
        if others {
            bump(&slot.stats.shared);
        }
        self.announce(index, st);
        Some((i, off, len))
    }
}
