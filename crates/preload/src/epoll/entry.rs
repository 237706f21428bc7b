//! An epoll entry for an offloaded socket: what the program asked for
//! (`events`), the edge-triggered and one-shot state, and the rules that
//! decide what a look at its socket asks (`wanted`) and whether it stays on
//! its set's ready list (`sticky`); EPOLLEXCLUSIVE's checks.

use crate::fdtable;
use libc::{c_int, epoll_event};
use std::sync::atomic::Ordering;
use tcps::Client;

pub(super) const EV_IN: u32 = libc::EPOLLIN as u32;
pub(super) const EV_OUT: u32 = libc::EPOLLOUT as u32;
pub(super) const EV_PRI: u32 = libc::EPOLLPRI as u32;
pub(super) const EV_RDHUP: u32 = libc::EPOLLRDHUP as u32;
pub(super) const EV_ERR: u32 = libc::EPOLLERR as u32;
pub(super) const EV_HUP: u32 = libc::EPOLLHUP as u32;
pub(super) const EV_ET: u32 = libc::EPOLLET as u32;
pub(super) const EV_ONESHOT: u32 = libc::EPOLLONESHOT as u32;
pub(super) const EV_EXCLUSIVE: u32 = libc::EPOLLEXCLUSIVE as u32;
/// What EPOLLEXCLUSIVE may be combined with (the kernel's
/// `EPOLLEXCLUSIVE_OK_BITS`).
pub(super) const EXCLUSIVE_OK: u32 =
    EV_IN | EV_OUT | EV_ERR | EV_HUP | libc::EPOLLWAKEUP as u32 | EV_ET | EV_EXCLUSIVE;
pub(super) const READ_SIDE: u32 = EV_IN | EV_PRI | EV_RDHUP;

pub(super) struct Entry {
    /// The attachment epoch of the socket (`fdtable.rs`).
    pub(super) epoch: u32,
    pub(super) id: u32,
    pub(super) events: u32,
    pub(super) data: u64,
    /// Edge-triggered, a socket whose edges are not visible here: the
    /// program's read/write sequence numbers when this entry last reported
    /// that direction (armed while they differ).
    pub(super) reported_rd: u32,
    pub(super) reported_wr: u32,
    /// Edge-triggered: the read edge spent by the last look (None: none).
    pub(super) rd_edge: Option<u64>,
    /// Edge-triggered: `full_seq` when EPOLLOUT was last reported.
    pub(super) reported_full: u32,
    /// Edge-triggered: `state_seq` when the entry last reported.
    pub(super) reported_state: u32,
    /// EPOLLONESHOT fired.
    pub(super) disabled: bool,
    /// On the set's ready list.
    pub(super) listed: bool,
    /// A listener opened on several servers: its siblings (epoch, id),
    /// whose connections are this entry's too (`group.rs`).
    pub(super) sibs: Vec<(u32, u32)>,
}

/// What a look at an entry's socket starts from.
#[derive(Clone, Copy)]
pub(super) struct Edges {
    pub(super) rd: u32,
    pub(super) wr: u32,
    pub(super) full: u32,
    /// `state_seq`: the program's own state changes (connect, shutdown).
    pub(super) state: u32,
    /// The receive or accept ring's edge (None: no ring).
    pub(super) rd_edge: Option<u64>,
    /// The socket's sends are queued here (its room is known here).
    pub(super) queue: bool,
}

impl Edges {
    /// The look at `id` for an entry with `events`.
    pub(super) fn of(c: &Client, id: u32, events: u32) -> Edges {
        let s = fdtable::id_state(c, id);
        Edges {
            rd: s.rd_seq.load(Ordering::Relaxed),
            wr: s.wr_seq.load(Ordering::Relaxed),
            full: s.full_seq.load(Ordering::Relaxed),
            state: s.state_seq.load(Ordering::Relaxed),
            rd_edge: if events & READ_SIDE != 0 {
                c.read_edge(id)
            } else {
                None
            },
            // Room is known here only while sends are queued here: with
            // asynchronous sends off the queue stays bound but never moves,
            // and the kernel socket at the server decides.
            queue: events & EV_OUT != 0 && crate::sendq::enabled() && c.write_edge(id).is_some(),
        }
    }
}

impl Entry {
    pub(super) fn new(epoch: u32, id: u32, ev: &epoll_event) -> Entry {
        let s = fdtable::id_state_at(epoch, id);
        Entry {
            epoch,
            id,
            events: ev.events,
            data: ev.u64,
            reported_rd: s.rd_seq.load(Ordering::Relaxed).wrapping_sub(1),
            reported_wr: s.wr_seq.load(Ordering::Relaxed).wrapping_sub(1),
            rd_edge: None,
            reported_full: s.full_seq.load(Ordering::Relaxed).wrapping_sub(1),
            reported_state: s.state_seq.load(Ordering::Relaxed),
            disabled: false,
            listed: false,
            sibs: crate::group::siblings(epoch, id).unwrap_or_default(),
        }
    }

    /// Every socket this entry watches: its own and its siblings'.
    pub(super) fn sockets(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        std::iter::once((self.epoch, self.id)).chain(self.sibs.iter().copied())
    }

    /// The look at the entry's socket (`Edges::of`) on attachment `c`; with
    /// siblings, the read edge moves when any of their rings does.
    pub(super) fn look(&self, c: &Client) -> Edges {
        let mut x = Edges::of(c, self.id, self.events);
        if self.sibs.is_empty() || self.events & READ_SIDE == 0 {
            return x;
        }
        for &(e, sid) in &self.sibs {
            let edge = crate::state::client_at(e).and_then(|m| m.read_edge(sid));
            x.rd_edge = match (x.rd_edge, edge) {
                (Some(a), Some(b)) => Some(a.wrapping_add(b)),
                _ => None,
            };
        }
        x
    }

    /// What the siblings have of `events` now (from their rings: no round
    /// trip), for the entry's report.
    pub(super) fn sibling_events(&self, events: u32) -> i16 {
        let mut got = 0;
        for &(e, sid) in &self.sibs {
            let Some(m) = crate::state::client_at(e).filter(|m| m.is_attached()) else {
                continue;
            };
            let mut p = [tcps::PollFd {
                sock: sid,
                events: (events & READ_SIDE) as i16,
                revents: 0,
            }];
            if m.poll(&mut p, 0).is_ok() {
                got |= p[0].revents;
            }
        }
        got
    }

    /// Whether the entry must stay on the ready list even when nothing is
    /// ready, because the ready log would not bring it back: a read side
    /// without a ring, and a write side (the log announces rings, not
    /// room) that is level-triggered, has no send queue, or waits for
    /// room after a full queue.
    pub(super) fn sticky(&self, x: &Edges) -> bool {
        if self.disabled {
            return false;
        }
        if x.state != self.reported_state {
            return true;
        }
        let read = self.events & READ_SIDE != 0 && x.rd_edge.is_none();
        let write = self.events & EV_OUT != 0
            && (self.events & EV_ET == 0 || !x.queue || self.write_pending(x));
        read || write
    }

    /// Whether EPOLLOUT waits for an edge (room after a full queue).
    pub(super) fn write_pending(&self, x: &Edges) -> bool {
        if x.queue {
            x.full != self.reported_full
        } else {
            x.wr != self.reported_wr
        }
    }

    /// What a look at an armed entry asks (`fired`: what [`wanted`]
    /// returned): everything the entry watches, so that a report holds all
    /// that is ready then, as the kernel's does (its ready list polls the
    /// whole mask: a reset found by the read side reports EPOLLOUT too).
    /// Only `fired` (or an error or hang-up) makes it an edge to report.
    ///
    /// [`wanted`]: Self::wanted
    pub(super) fn asked(&self, fired: u32) -> u32 {
        if fired == 0 {
            0
        } else {
            self.events & (READ_SIDE | EV_OUT)
        }
    }

    /// Whether a look that found `revents` (after asking for
    /// [`asked`](Self::asked)) is an edge of this entry: one of the
    /// directions that `fired`, an error or a hang-up.
    pub(super) fn is_edge(&self, fired: u32, revents: u32) -> bool {
        revents & self.events & (fired | EV_ERR | EV_HUP) != 0 || revents & (EV_ERR | EV_HUP) != 0
    }

    /// The poll events to ask for now (0: nothing armed).
    pub(super) fn wanted(&self, x: &Edges) -> u32 {
        if self.disabled {
            return 0;
        }
        let all = self.events & (READ_SIDE | EV_OUT);
        if self.events & EV_ET == 0 {
            return all;
        }
        let read_fired = match x.rd_edge {
            Some(g) => self.rd_edge != Some(g),
            None => x.rd != self.reported_rd,
        };
        let write_fired = self.write_pending(x);
        if x.state != self.reported_state {
            // The program's own connect or shutdown: an edge both ways.
            return all;
        }
        if x.rd_edge.is_some() || x.queue {
            // An edge reports all that holds, as the kernel's does.
            let fired = (read_fired && all & READ_SIDE != 0) || (write_fired && all & EV_OUT != 0);
            return if fired { all } else { 0 };
        }
        let mut w = all;
        if !read_fired {
            w &= !READ_SIDE;
        }
        if !write_fired {
            w &= !EV_OUT;
        }
        w
    }
}

/// EPOLLEXCLUSIVE as the kernel checks it: on EPOLL_CTL_ADD only, with
/// nothing but EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP, EPOLLWAKEUP and
/// EPOLLET beside it, and an exclusive entry cannot be modified (EINVAL
/// each). Its wake-up rule (one waiter of several sets) needs no more
/// here: the kernel promises "one or more", and each process waits on its
/// own rings.
pub(super) fn exclusive_ok(op: c_int, events: u32, existing: Option<&Entry>) -> Result<(), i32> {
    let exclusive = events & EV_EXCLUSIVE != 0;
    match op {
        libc::EPOLL_CTL_MOD
            if exclusive || existing.is_some_and(|e| e.events & EV_EXCLUSIVE != 0) =>
        {
            Err(libc::EINVAL)
        }
        libc::EPOLL_CTL_ADD if exclusive && events & !EXCLUSIVE_OK != 0 => Err(libc::EINVAL),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(events: u32) -> Entry {
        Entry {
            epoch: 1,
            id: 0,
            events,
            data: 0,
            reported_rd: 7,
            reported_wr: 9,
            rd_edge: Some(100),
            reported_full: 3,
            reported_state: 0,
            disabled: false,
            listed: false,
            sibs: Vec::new(),
        }
    }

    /// A look at a socket: sequence numbers, the ring's edge, a queue.
    fn look(rd: u32, wr: u32, full: u32, rd_edge: Option<u64>, queue: bool) -> Edges {
        Edges {
            rd,
            wr,
            full,
            state: 0,
            rd_edge,
            queue,
        }
    }

    #[test]
    fn level_triggered_always_asks() {
        let e = entry(EV_IN | EV_OUT | EV_RDHUP);
        assert_eq!(
            e.wanted(&look(7, 9, 3, Some(100), true)),
            EV_IN | EV_OUT | EV_RDHUP
        );
    }

    #[test]
    fn edge_triggered_without_a_ring_rearms_per_direction() {
        let e = entry(EV_IN | EV_OUT | EV_ET);
        // Both reported since the last read and write: nothing armed.
        assert_eq!(e.wanted(&look(7, 9, 3, None, false)), 0);
        // A read re-arms EPOLLIN only; a write EPOLLOUT only.
        assert_eq!(e.wanted(&look(8, 9, 3, None, false)), EV_IN);
        assert_eq!(e.wanted(&look(7, 10, 3, None, false)), EV_OUT);
    }

    #[test]
    fn edge_triggered_with_a_ring_fires_on_arrivals_and_room() {
        let e = entry(EV_IN | EV_OUT | EV_ET);
        // No arrival, no full queue since the last report: quiet, even
        // after the program read and wrote.
        assert_eq!(e.wanted(&look(8, 10, 3, Some(100), true)), 0);
        // A new arrival fires the entry, reporting all that holds.
        assert_eq!(e.wanted(&look(7, 9, 3, Some(101), true)), EV_IN | EV_OUT);
        // So does a full queue waiting for room.
        assert_eq!(e.wanted(&look(7, 9, 4, Some(100), true)), EV_IN | EV_OUT);
    }

    #[test]
    fn sticky_entries_are_what_the_ready_log_cannot_announce() {
        // A ring: read interest comes back through the log.
        assert!(!entry(EV_IN | EV_ET).sticky(&look(7, 9, 3, Some(100), false)));
        assert!(!entry(EV_IN).sticky(&look(7, 9, 3, Some(100), false)));
        // No ring: looked at on every wait.
        assert!(entry(EV_IN).sticky(&look(7, 9, 3, None, false)));
        // Level-triggered EPOLLOUT: room is not logged.
        assert!(entry(EV_OUT).sticky(&look(7, 9, 3, Some(100), true)));
        // Edge-triggered EPOLLOUT: only while waiting for room.
        assert!(!entry(EV_OUT | EV_ET).sticky(&look(7, 9, 3, Some(100), true)));
        assert!(entry(EV_OUT | EV_ET).sticky(&look(7, 9, 4, Some(100), true)));
        let mut e = entry(EV_IN);
        e.disabled = true;
        assert!(!e.sticky(&look(7, 9, 3, None, false)));
    }

    #[test]
    fn exclusive_as_the_kernel() {
        let add = libc::EPOLL_CTL_ADD;
        let m = libc::EPOLL_CTL_MOD;
        assert_eq!(
            exclusive_ok(add, EV_IN | EV_EXCLUSIVE | EV_ET, None),
            Ok(())
        );
        assert_eq!(
            exclusive_ok(add, EV_IN | EV_EXCLUSIVE | EV_RDHUP, None),
            Err(libc::EINVAL)
        );
        assert_eq!(
            exclusive_ok(add, EV_IN | EV_EXCLUSIVE | EV_ONESHOT, None),
            Err(libc::EINVAL)
        );
        assert_eq!(
            exclusive_ok(m, EV_IN | EV_EXCLUSIVE, Some(&entry(EV_IN))),
            Err(libc::EINVAL)
        );
        assert_eq!(
            exclusive_ok(m, EV_IN, Some(&entry(EV_IN | EV_EXCLUSIVE))),
            Err(libc::EINVAL)
        );
        assert_eq!(exclusive_ok(m, EV_IN, Some(&entry(EV_OUT))), Ok(()));
    }

    #[test]
    fn oneshot_disables() {
        let mut e = entry(EV_IN | EV_ONESHOT);
        e.disabled = true;
        assert_eq!(e.wanted(&look(0, 0, 0, Some(1), false)), 0);
    }
}
