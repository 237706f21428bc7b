//! What a wait that cannot sleep on the host doorbells (an entry's socket
//! has no ring or send queue to register on: a listener inherited through
//! fork before its first accept, a connect in progress, eager receive off)
//! asks its servers to watch instead, in one parked poll per server.
//!
//! That wait must end on everything the doorbell sleep ends on, or an edge
//! is lost until something else happens to end it (nginx's worker waited
//! for a request body's second segment until its client gave up): the
//! armed entries, and every arrival into a ring an edge-triggered entry
//! watches, armed or not. A server's poll answers readability, not
//! arrivals; for a ring the program emptied the two are the same (the next
//! arrival makes it readable), so such an entry asks for readability. A
//! ring still holding bytes (or connections) the program left there
//! cannot be watched that way (the poll would answer at once): while there
//! is one, the wait sleeps in slices of [`SLICE_MS`], each followed by a
//! look at the ready log.

use super::entry::{Entry, READ_SIDE};
use super::set::{self, Set};
use crate::group_wait::{part_for, Part};
use libc::c_int;
use tcps::{Client, PollFd};

/// The longest a wait sleeps without looking at the ready log, when a
/// ring it watches holds bytes the program left (see the module docs).
pub(super) const SLICE_MS: c_int = 10;

/// Rings a parked poll asks about beyond the armed entries: more are
/// watched in slices instead, so that a set of thousands of connections
/// stays well inside a poll's entry limit.
const RING_ASKS: usize = 1024;

/// How the fallback wait watches one socket of an entry.
#[derive(Debug, PartialEq, Eq)]
enum Watch {
    /// Ask the server for these poll events.
    Ask(u32),
    /// Its next arrival cannot be asked for: look again within a slice.
    Slice,
    /// Nothing: no edge can come (disabled, no read side, an ended ring),
    /// or the socket has no ring and re-arms on the program's own calls.
    Quiet,
}

/// How to watch socket `id` (on `m`) of entry `e`, whose look armed `w`.
fn watch(e: &Entry, w: u32, m: &Client, id: u32) -> Watch {
    if w != 0 {
        return Watch::Ask(w);
    }
    if e.disabled || e.events & READ_SIDE == 0 || m.read_edge(id).is_none() {
        return Watch::Quiet;
    }
    // Answered from the ring, no request.
    let mut p = [PollFd {
        sock: id,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    if m.poll(&mut p, 0).is_err() {
        return Watch::Slice;
    }
    ring_watch(e.events, p[0].revents)
}

/// What a ring whose poll says `revents` lets an entry with `events` ask.
fn ring_watch(events: u32, revents: i16) -> Watch {
    let ended = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR;
    if revents & ended != 0 {
        Watch::Quiet // nothing more arrives into an ended ring
    } else if revents != 0 {
        Watch::Slice
    } else {
        Watch::Ask(events & READ_SIDE)
    }
}

/// Every entry of set `s` to watch (O(interest)), by attachment, a
/// listener's siblings as entries of their own (see the module docs), and
/// whether the wait must look again within [`SLICE_MS`].
pub(super) fn all_watched(s: &Set) -> (Vec<Part>, bool) {
    let mut parts = Vec::new();
    let mut slice = false;
    let mut rings = 0;
    for e in s.entries.values().filter(|e| set::live(e.epoch)) {
        let Some(c) = crate::state::client_at(e.epoch) else {
            continue;
        };
        let w = e.wanted(&e.look(c));
        for (ep, id) in e.sockets() {
            let Some(m) = crate::state::client_at(ep).filter(|m| m.is_attached()) else {
                continue;
            };
            let events = match watch(e, w, m, id) {
                Watch::Ask(ev) if w != 0 => ev,
                Watch::Ask(ev) if rings < RING_ASKS => {
                    rings += 1;
                    ev
                }
                Watch::Ask(_) | Watch::Slice => {
                    slice = true;
                    continue;
                }
                Watch::Quiet => continue,
            };
            let part = part_for(&mut parts, m);
            part.fds.push(PollFd {
                sock: id,
                events: events as i16,
                revents: 0,
            });
            part.at.push(0);
        }
    }
    (parts, slice)
}

/// `timeout` (ms, <0: forever) cut to a slice when `slice`.
pub(super) fn sliced(timeout: c_int, slice: bool) -> c_int {
    if slice && !(0..=SLICE_MS).contains(&timeout) {
        SLICE_MS
    } else {
        timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoll::entry::{EV_ET, EV_IN, EV_RDHUP};

    #[test]
    fn an_emptied_ring_asks_for_its_next_arrival() {
        assert_eq!(ring_watch(EV_IN | EV_ET, 0), Watch::Ask(EV_IN));
        assert_eq!(
            ring_watch(EV_IN | EV_RDHUP | EV_ET, 0),
            Watch::Ask(EV_IN | EV_RDHUP)
        );
    }

    #[test]
    fn bytes_left_in_a_ring_cut_the_wait_into_slices() {
        assert_eq!(ring_watch(EV_IN | EV_ET, libc::POLLIN), Watch::Slice);
    }

    #[test]
    fn an_ended_ring_is_quiet() {
        let r = libc::POLLIN | libc::POLLRDHUP;
        assert_eq!(ring_watch(EV_IN | EV_ET, r), Watch::Quiet);
        assert_eq!(ring_watch(EV_IN | EV_ET, libc::POLLERR), Watch::Quiet);
    }

    #[test]
    fn slices_bound_long_waits_only() {
        assert_eq!(sliced(-1, true), SLICE_MS);
        assert_eq!(sliced(5000, true), SLICE_MS);
        assert_eq!(sliced(3, true), 3);
        assert_eq!(sliced(0, true), 0);
        assert_eq!(sliced(-1, false), -1);
    }
}
