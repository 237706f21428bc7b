//! A channel's host-side state: the users table (calls holding a piece of
//! the channel: tag, arena range, where the request is), which is also the
//! arena allocator, and the mailbox of completions drained for others.

use tcps_proto::ring::HostCursor;
use tcps_proto::Completion;

/// Arena ranges start and end on multiples of this (poll arrays need 8).
const GRANULE: u32 = 64;
/// A call on an idle channel leaves 1/SHARE_DIV of the arena free, and a
/// call sharing a channel gets at most 1/SHARE_DIV of its free arena (at
/// least a granule, and at least what it must have): a parked call never
/// takes all the room, the grants shrink geometrically, and a channel's ring
/// slots, not its arena, bound how many parked calls it carries.
const SHARE_DIV: u32 = 16;

pub(super) fn round_up(n: u32) -> u32 {
    n.div_ceil(GRANULE) * GRANULE
}

/// Where a user's current request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UseState {
    /// No request in flight (before the first submit, after a completion
    /// was taken).
    Idle,
    /// Submitted; the completion has not been drained yet.
    Waiting,
    /// Drained by another thread into the mailbox; the owner has not taken
    /// it yet.
    Arrived,
    /// The lease was dropped while its request was in flight: free the
    /// range when the completion is drained.
    Abandoned,
}

/// A call holding a piece of the channel.
#[derive(Clone, Copy, Debug)]
pub(super) struct Use {
    /// Tag of the user's current (or last) request; identifies the entry.
    pub(super) tag: u64,
    /// Arena range reserved: `off .. off + size` (multiples of GRANULE;
    /// size 0 for calls without arena traffic).
    pub(super) off: u32,
    pub(super) size: u32,
    pub(super) state: UseState,
}

/// A channel's host-side state, shared by the calls using it.
pub(super) struct ChanState {
    pub(super) cursor: HostCursor,
    /// The last request tag used on this channel (tags start at 1).
    pub(super) tag: u64,
    /// Users; those with arena bytes sorted by `off`. Capacity `max_users`
    /// (never reallocates).
    pub(super) uses: Vec<Use>,
    /// Completions drained on behalf of another thread (its entry is
    /// `Arrived`). At most one per user, so it never reallocates either.
    pub(super) mailbox: Vec<Completion>,
    /// Host threads asleep (or about to sleep) on this channel's futex.
    pub(super) sleepers: u32,
    /// Whether `channels_used` already covers this channel.
    pub(super) announced: bool,
}

impl ChanState {
    pub(super) fn new(max_users: u32) -> ChanState {
        ChanState {
            cursor: HostCursor::default(),
            tag: 0,
            uses: Vec::with_capacity(max_users as usize),
            mailbox: Vec::with_capacity(max_users as usize),
            sleepers: 0,
            announced: false,
        }
    }

    pub(super) fn next_tag(&mut self) -> u64 {
        self.tag = self.tag.wrapping_add(1).max(1);
        self.tag
    }

    pub(super) fn find(&self, tag: u64) -> Option<usize> {
        self.uses.iter().position(|u| u.tag == tag)
    }

    /// Inserts a user at `at` (appending without a memmove when it can).
    pub(super) fn add(&mut self, at: usize, u: Use) -> usize {
        if at >= self.uses.len() {
            self.uses.push(u);
            self.uses.len() - 1
        } else {
            self.uses.insert(at, u);
            at
        }
    }

    /// Removes user `i`, keeping the order of the others (and its mail).
    pub(super) fn free(&mut self, i: usize) {
        if self.uses[i].state == UseState::Arrived {
            let tag = self.uses[i].tag;
            self.mailbox.retain(|c| c.user_data != tag);
        }
        if i + 1 == self.uses.len() {
            self.uses.pop();
        } else {
            self.uses.remove(i);
        }
    }

    /// Takes the completion filed for user `i` from the mailbox.
    pub(super) fn take_mail(&mut self, i: usize) -> Option<Completion> {
        if self.uses[i].state != UseState::Arrived {
            return None;
        }
        let tag = self.uses[i].tag;
        let k = self.mailbox.iter().position(|c| c.user_data == tag)?;
        self.uses[i].state = UseState::Idle;
        Some(self.mailbox.swap_remove(k))
    }

    /// Adds a user tagged `tag` with an arena range of at least `min` and
    /// up to `want` bytes. An idle channel grants `want` up to 15/16 of the
    /// arena (the rest is headroom for sharers); a shared one at most a
    /// sixteenth of its free arena. Returns (index, offset, length granted),
    /// or `None` if the channel has no room.
    #[inline]
    pub(super) fn alloc(
        &mut self,
        arena: u32,
        max_users: u32,
        min: u32,
        want: u32,
        tag: u64,
    ) -> Option<(usize, u32, u32)> {
        if self.uses.is_empty() {
            // The common case: an idle channel. All of the request at 0, but
            // leave sharers some headroom: this call may park for long.
            let len = want.min(arena - arena / SHARE_DIV).max(min);
            self.uses.push(Use {
                tag,
                off: 0,
                size: round_up(len),
                state: UseState::Idle,
            });
            return Some((0, 0, len));
        }
        if self.uses.len() >= max_users as usize {
            return None;
        }
        let target = {
            let used: u32 = self.uses.iter().map(|u| u.size).sum();
            let free = arena.saturating_sub(used);
            want.min((free / SHARE_DIV).max(GRANULE)).max(min)
        };
        let mut entry = Use {
            tag,
            off: 0,
            size: 0,
            state: UseState::Idle,
        };
        if target == 0 {
            return Some((self.add(usize::MAX, entry), 0, 0));
        }
        let need = round_up(target);
        // First fit; remember the largest gap for a smaller grant.
        let mut pos = 0u32;
        let mut largest = (0u32, 0u32, 0usize); // (size, off, insert index)
        let mut found = None;
        for i in 0..=self.uses.len() {
            let end = match self.uses.get(i) {
                Some(u) if u.size == 0 => continue,
                Some(u) => u.off,
                None => arena,
            };
            let gap = end.saturating_sub(pos);
            if gap >= need {
                found = Some((pos, target, i));
                break;
            }
            if gap > largest.0 {
                largest = (gap, pos, i);
            }
            if let Some(u) = self.uses.get(i) {
                pos = u.off + u.size;
            }
        }
        let (off, len, at) = match found {
            Some(f) => f,
            None if largest.0 >= round_up(min.max(1)) => {
                (largest.1, target.min(largest.0), largest.2)
            }
            None => return None,
        };
        entry.off = off;
        entry.size = round_up(len);
        Some((self.add(at, entry), off, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ChanState {
        ChanState::new(7)
    }

    /// (offset, length) of a new user's range.
    fn al(
        st: &mut ChanState,
        arena: u32,
        max: u32,
        min: u32,
        want: u32,
        tag: u64,
    ) -> Option<(u32, u32)> {
        st.alloc(arena, max, min, want, tag)
            .map(|(_, off, len)| (off, len))
    }

    #[test]
    fn idle_channel_grants_the_request_but_leaves_headroom() {
        let mut st = state();
        assert_eq!(al(&mut st, 16384, 7, 1, 1000, 1), Some((0, 1000)));
        let mut st = state();
        assert_eq!(al(&mut st, 16384, 7, 1, 16384, 1), Some((0, 15360)));
        // The headroom is for sharers.
        assert_eq!(al(&mut st, 16384, 7, 1, 16384, 2), Some((15360, 64)));
        assert_eq!(al(&mut st, 16384, 7, 16, 16, 3), Some((15424, 16)));
        assert_eq!(
            al(&mut st, 16384, 7, 0, 0, 4),
            Some((0, 0)),
            "no arena needed"
        );
        // A must-have beyond the headroom rule is honoured on an idle channel.
        let mut st = state();
        assert_eq!(al(&mut st, 4096, 7, 4000, 4000, 1), Some((0, 4000)));
    }

    #[test]
    fn parked_whole_arena_calls_leave_room_for_small_ones() {
        // Every channel held by a recv with a buffer larger than the arena:
        // a connect (16 bytes) and a poll of 8 sockets still fit.
        let mut st = state();
        let arena = 256 * 1024;
        assert!(al(&mut st, arena, 7, 1, arena, 1).is_some());
        assert!(al(&mut st, arena, 7, 16, 16, 2).is_some());
        assert!(al(&mut st, arena, 7, 64, 64, 3).is_some());
        assert!(al(&mut st, arena, 7, 1, arena, 4).is_some());
    }

    #[test]
    fn sharers_get_a_capped_first_fit_range() {
        let mut st = state();
        assert_eq!(al(&mut st, 65536, 7, 1, 100, 1), Some((0, 100)));
        // Capped at a sixteenth of the free arena (65536 - 128), placed after
        // the first user's granule-rounded range.
        assert_eq!(al(&mut st, 65536, 7, 1, 65536, 2), Some((128, 4088)));
        // A must-have larger than the cap is honoured.
        assert_eq!(
            al(&mut st, 65536, 7, 10_000, 10_000, 3),
            Some((128 + 4096, 10_000))
        );
        // Freeing the first range makes room for a small one at offset 0.
        let i = st.find(1).unwrap();
        st.free(i);
        assert_eq!(al(&mut st, 65536, 7, 64, 64, 4), Some((0, 64)));
        let offs: Vec<u32> = st.uses.iter().map(|u| u.off).collect();
        assert!(offs.windows(2).all(|w| w[0] <= w[1]), "{offs:?}");
        // Sharing a channel whose users need no arena: a sixteenth of it.
        let mut st = state();
        assert_eq!(al(&mut st, 1 << 20, 7, 0, 0, 1), Some((0, 0)));
        assert_eq!(al(&mut st, 1 << 20, 7, 1, 1 << 20, 2), Some((0, 1 << 16)));
    }

    #[test]
    fn ring_room_and_arena_room_bound_the_users() {
        let mut st = ChanState::new(3);
        for t in 1..=3 {
            assert!(al(&mut st, 4096, 3, 0, 0, t).is_some());
        }
        assert_eq!(al(&mut st, 4096, 3, 0, 0, 4), None, "ring room");
        let mut st = state();
        assert_eq!(al(&mut st, 4096, 7, 4032, 4032, 1), Some((0, 4032)));
        // Only one granule left: a sharer takes what there is...
        assert_eq!(al(&mut st, 4096, 7, 1, 1000, 2), Some((4032, 64)));
        // ...then nothing is left for a call that needs arena bytes.
        assert_eq!(al(&mut st, 4096, 7, 1, 1000, 3), None);
        assert_eq!(al(&mut st, 4096, 7, 0, 0, 4), Some((0, 0)));
    }

    #[test]
    fn sharers_leave_room_for_many_more() {
        let mut st = ChanState::new(63);
        let arena = 256 * 1024;
        assert!(al(&mut st, arena, 63, 1, 65536, 1).is_some());
        let mut granted = 1;
        for t in 2..=63 {
            if al(&mut st, arena, 63, 1, 65536, t).is_some() {
                granted += 1;
            }
        }
        assert_eq!(granted, 63, "every ring slot usable by parked recvs");
    }
}
