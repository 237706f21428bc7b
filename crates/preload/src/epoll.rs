//! epoll over a mix of offloaded sockets and kernel fds.
//!
//! The kernel epoll fd is real (created by the program's epoll_create) and
//! holds the kernel fds (eventfds, timerfds, pipes, Unix sockets). Interest
//! in offloaded sockets is kept here, per epoll fd. epoll_wait polls both
//! without blocking (tcps_poll with timeout 0, epoll_wait with timeout 0)
//! and, if nothing is ready, blocks on both through `poll::wait_mixed`,
//! which watches the epoll fd itself (readable when its kernel fds have
//! events) so that no kernel event is consumed by the wait.
//!
//! Edge-triggered interest (EPOLLET; nginx uses it) cannot be read off a
//! level poll, so an entry reports a direction once and is then quiet until
//! the program operates on the socket in that direction again (any
//! read/recv/accept re-arms EPOLLIN, any write/send/connect re-arms
//! EPOLLOUT; `fdtable::note_read/note_write`). A program that reads until
//! EAGAIN, or stops after a short read, sees what the kernel would show it;
//! the only difference is an extra wake-up where the kernel would have seen
//! no new edge, which edge-triggered programs tolerate. EPOLLONESHOT
//! disables an entry after one report until EPOLL_CTL_MOD.

use crate::errno::fail;
use crate::log::debug;
use crate::{attach, fdtable, poll, real};
use libc::{c_int, epoll_event};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use tcps::PollFd;

const EV_IN: u32 = libc::EPOLLIN as u32;
const EV_OUT: u32 = libc::EPOLLOUT as u32;
const EV_PRI: u32 = libc::EPOLLPRI as u32;
const EV_RDHUP: u32 = libc::EPOLLRDHUP as u32;
const EV_ERR: u32 = libc::EPOLLERR as u32;
const EV_HUP: u32 = libc::EPOLLHUP as u32;
const EV_ET: u32 = libc::EPOLLET as u32;
const EV_ONESHOT: u32 = libc::EPOLLONESHOT as u32;
const READ_SIDE: u32 = EV_IN | EV_PRI | EV_RDHUP;

struct Entry {
    id: u32,
    events: u32,
    data: u64,
    /// Edge-triggered: the program's read/write sequence numbers when this
    /// entry last reported that direction (armed while they differ).
    reported_rd: u32,
    reported_wr: u32,
    /// EPOLLONESHOT fired.
    disabled: bool,
}

impl Entry {
    fn new(id: u32, ev: &epoll_event) -> Entry {
        let s = fdtable::id_state(id);
        Entry {
            id,
            events: ev.events,
            data: ev.u64,
            reported_rd: s.rd_seq.load(Ordering::Relaxed).wrapping_sub(1),
            reported_wr: s.wr_seq.load(Ordering::Relaxed).wrapping_sub(1),
            disabled: false,
        }
    }

    /// The poll events to ask for now (0: nothing armed).
    fn wanted(&self, rd: u32, wr: u32) -> u32 {
        if self.disabled {
            return 0;
        }
        let mut w = self.events & (READ_SIDE | EV_OUT);
        if self.events & EV_ET != 0 {
            if rd == self.reported_rd {
                w &= !READ_SIDE;
            }
            if wr == self.reported_wr {
                w &= !EV_OUT;
            }
        }
        w
    }
}

#[derive(Default)]
pub struct Set {
    /// Offloaded fds registered in this set.
    entries: BTreeMap<c_int, Entry>,
    /// Kernel fds registered in the real epoll fd (saturating; a closed fd
    /// leaves the count high, which only costs a real epoll_wait).
    kernel_fds: usize,
}

static SETS: Mutex<BTreeMap<c_int, Set>> = Mutex::new(BTreeMap::new());

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<c_int, Set>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// An offloaded fd was closed: it leaves every set (as the kernel does when
/// the last reference to a file goes).
pub fn forget_fd(fd: c_int) {
    for s in sets().values_mut() {
        s.entries.remove(&fd);
    }
}

/// A (possibly epoll) fd was closed.
pub fn forget_set(fd: c_int) {
    sets().remove(&fd);
}

/// Held across fork so that the child's copy is consistent (`fork.rs`).
pub fn lock_for_fork() -> std::sync::MutexGuard<'static, BTreeMap<c_int, Set>> {
    sets()
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    if size <= 0 {
        return fail(libc::EINVAL);
    }
    epoll_create1(0)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    let fd = real::epoll_create1()(flags);
    if fd >= 0 {
        sets().insert(fd, Set::default());
    }
    fd
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    let Some(id) = fdtable::lookup(fd) else {
        let r = real::epoll_ctl()(epfd, op, fd, ev);
        if r == 0 {
            let mut sets = sets();
            let s = sets.entry(epfd).or_default();
            match op {
                libc::EPOLL_CTL_ADD => s.kernel_fds += 1,
                libc::EPOLL_CTL_DEL => s.kernel_fds = s.kernel_fds.saturating_sub(1),
                _ => {}
            }
        }
        return r;
    };
    // Validate epfd as the kernel would (EBADF / EINVAL for a non-epoll fd).
    if real::fcntl()(epfd, libc::F_GETFD) < 0 {
        return -1;
    }
    if epfd == fd {
        return fail(libc::EINVAL);
    }
    let mut sets = sets();
    let s = sets.entry(epfd).or_default();
    match op {
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD => {
            let Some(ev) = ev.as_ref() else {
                return fail(libc::EFAULT);
            };
            let exists = s.entries.contains_key(&fd);
            if op == libc::EPOLL_CTL_ADD && exists {
                return fail(libc::EEXIST);
            }
            if op == libc::EPOLL_CTL_MOD && !exists {
                return fail(libc::ENOENT);
            }
            debug!(
                "epoll_ctl(epfd {epfd}, {}, fd {fd}, events {:#x})",
                if exists { "MOD" } else { "ADD" },
                { ev.events }
            );
            s.entries.insert(fd, Entry::new(id, ev));
            0
        }
        libc::EPOLL_CTL_DEL => match s.entries.remove(&fd) {
            Some(_) => 0,
            None => fail(libc::ENOENT),
        },
        _ => fail(libc::EINVAL),
    }
}

/// One candidate of a pass: fd, the sequence numbers it was armed with.
struct Cand {
    fd: c_int,
    id: u32,
    rd: u32,
    wr: u32,
}

/// The armed offloaded entries of `epfd` (None: the set has none at all)
/// and whether the set has kernel fds.
/// The candidates of a pass and the poll entries to ask the server about.
type Pass = (Vec<Cand>, Vec<PollFd>);

fn candidates(epfd: c_int) -> (Option<Pass>, bool) {
    let sets = sets();
    let Some(s) = sets.get(&epfd) else {
        return (None, true);
    };
    if s.entries.is_empty() {
        return (None, true);
    }
    let mut cands = Vec::new();
    let mut pfds = Vec::new();
    for (&fd, e) in &s.entries {
        let st = fdtable::id_state(e.id);
        let (rd, wr) = (
            st.rd_seq.load(Ordering::Relaxed),
            st.wr_seq.load(Ordering::Relaxed),
        );
        let w = e.wanted(rd, wr);
        if w != 0 {
            cands.push(Cand {
                fd,
                id: e.id,
                rd,
                wr,
            });
            pfds.push(PollFd {
                sock: e.id,
                events: w as i16,
                revents: 0,
            });
        }
    }
    (Some((cands, pfds)), s.kernel_fds > 0)
}

/// Turns poll results into epoll events (at most `room`), updating
/// edge-triggered and one-shot state. In arrival order (`ranks`), as the
/// kernel's ready list: a program that handles events in the order given
/// reads bytes that arrived earlier on one connection before bytes that
/// arrived later on another.
fn collect(
    epfd: c_int,
    cands: &[Cand],
    pfds: &[PollFd],
    ranks: &[u16],
    out: &mut Vec<epoll_event>,
    room: usize,
) {
    let mut sets = sets();
    let Some(s) = sets.get_mut(&epfd) else { return };
    let mut order: Vec<usize> = (0..pfds.len()).filter(|&i| pfds[i].revents != 0).collect();
    order.sort_by_key(|&i| ranks[i]);
    for i in order {
        let (c, p) = (&cands[i], &pfds[i]);
        if out.len() >= room {
            break;
        }
        if p.revents == 0 {
            continue;
        }
        let Some(e) = s.entries.get_mut(&c.fd) else {
            continue;
        };
        if e.id != c.id {
            continue; // closed and reused meanwhile
        }
        let ev = (p.revents as u16 as u32) & (e.events | EV_ERR | EV_HUP);
        if ev == 0 {
            continue;
        }
        if e.events & EV_ET != 0 {
            if ev & (READ_SIDE | EV_ERR | EV_HUP) != 0 {
                e.reported_rd = c.rd;
            }
            if ev & (EV_OUT | EV_ERR | EV_HUP) != 0 {
                e.reported_wr = c.wr;
            }
        }
        if e.events & EV_ONESHOT != 0 {
            e.disabled = true;
        }
        out.push(epoll_event {
            events: ev,
            u64: e.data,
        });
    }
}

/// While offloaded sockets keep the loop busy, the kernel side (a timer, a
/// pipe, nginx's channel to its master) is looked at only every
/// [`KERNEL_EVERY`] passes: a system call saved on most iterations, and a
/// kernel event waits at most that many passes. With no offloaded event the
/// kernel side is always checked (and waited on).
const KERNEL_EVERY: u32 = 8;

fn kernel_turn() -> bool {
    thread_local! {
        static PASS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    PASS.with(|p| {
        let v = p.get().wrapping_add(1);
        p.set(v);
        v % KERNEL_EVERY == 0
    })
}

unsafe fn wait_impl(epfd: c_int, events: *mut epoll_event, max: c_int, timeout: c_int) -> c_int {
    let (offloaded, has_kernel) = candidates(epfd);
    if offloaded.is_none() {
        return real::epoll_wait()(epfd, events, max, timeout);
    }
    if max <= 0 || events.is_null() {
        return fail(libc::EINVAL);
    }
    let Some(c) = attach::for_existing() else {
        return real::epoll_wait()(epfd, events, max, timeout);
    };
    let max = max as usize;
    let deadline = (timeout > 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout as u64));
    let mut first = Some(offloaded);
    loop {
        let (offloaded, has_kernel) = match first.take() {
            Some(o) => (o, has_kernel),
            None => candidates(epfd),
        };
        let Some((cands, mut pfds)) = offloaded else {
            return real::epoll_wait()(epfd, events, max as c_int, timeout);
        };
        // Non-blocking pass over both sides.
        let mut ready = 0;
        let mut ranks = vec![0u16; pfds.len()];
        if !pfds.is_empty() {
            match crate::poll::poll_offloaded(c, &mut pfds, &mut ranks, 0) {
                Ok(n) => ready = n,
                Err(e) => return fail(crate::errno::errno_of(&e)),
            }
        }
        let mut out = Vec::new();
        // Offloaded events leave the kernel side at least one slot.
        let off_room = if has_kernel && max > 1 { max - 1 } else { max };
        if ready > 0 {
            collect(epfd, &cands, &pfds, &ranks, &mut out, off_room);
        }
        let mut n = out.len();
        std::ptr::copy_nonoverlapping(out.as_ptr(), events, n);
        if has_kernel && n < max && (n == 0 || kernel_turn()) {
            let k = real::epoll_wait()(epfd, events.add(n), (max - n) as c_int, 0);
            if k > 0 {
                n += k as usize;
            } else if k < 0 && n == 0 {
                return -1;
            }
        }
        let remaining = match deadline {
            None if timeout < 0 => -1,
            None => 0,
            Some(d) => d
                .saturating_duration_since(std::time::Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as c_int,
        };
        if n > 0 || remaining == 0 {
            return n as c_int;
        }
        // Nothing ready: block on both sides, then look again.
        let mut kernel = Vec::new();
        if has_kernel {
            kernel.push(libc::pollfd {
                fd: epfd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if pfds.is_empty() && kernel.is_empty() {
            // Nothing armed at all: sleep like epoll_wait on an empty set.
            return real::epoll_wait()(epfd, events, max as c_int, remaining);
        }
        if pfds.is_empty() {
            return real::epoll_wait()(epfd, events, max as c_int, remaining);
        }
        for p in &mut pfds {
            p.revents = 0;
        }
        if let Err(e) = poll::wait_mixed(c, &mut pfds, &mut kernel, remaining) {
            return fail(e);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    wait_impl(epfd, events, max, timeout)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if candidates(epfd).0.is_none() {
        return real::epoll_pwait()(epfd, events, max, timeout, mask);
    }
    poll::with_sigmask(mask, || wait_impl(epfd, events, max, timeout))
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let ms =
        match ts.as_ref() {
            None => -1,
            Some(t) => (t.tv_sec.max(0) * 1000 + (t.tv_nsec + 999_999) / 1_000_000)
                .min(i32::MAX as i64) as c_int,
        };
    if candidates(epfd).0.is_none() {
        return real::epoll_pwait()(epfd, events, max, ms, mask);
    }
    poll::with_sigmask(mask, || wait_impl(epfd, events, max, ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(events: u32) -> Entry {
        Entry {
            id: 0,
            events,
            data: 0,
            reported_rd: 7,
            reported_wr: 9,
            disabled: false,
        }
    }

    #[test]
    fn level_triggered_always_asks() {
        let e = entry(EV_IN | EV_OUT | EV_RDHUP);
        assert_eq!(e.wanted(7, 9), EV_IN | EV_OUT | EV_RDHUP);
    }

    #[test]
    fn edge_triggered_rearms_per_direction() {
        let e = entry(EV_IN | EV_OUT | EV_ET);
        // Both reported since the last read and write: nothing armed.
        assert_eq!(e.wanted(7, 9), 0);
        // A read re-arms EPOLLIN only; a write EPOLLOUT only.
        assert_eq!(e.wanted(8, 9), EV_IN);
        assert_eq!(e.wanted(7, 10), EV_OUT);
    }

    #[test]
    fn oneshot_disables() {
        let mut e = entry(EV_IN | EV_ONESHOT);
        e.disabled = true;
        assert_eq!(e.wanted(0, 0), 0);
    }

    #[test]
    fn kernel_side_checked_every_few_passes() {
        let turns = (0..KERNEL_EVERY * 4).filter(|_| kernel_turn()).count();
        assert_eq!(turns, 4);
    }
}
