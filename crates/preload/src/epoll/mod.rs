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
//! Edge-triggered interest (EPOLLET; nginx and redis use it) fires on
//! edges, as the kernel's: a socket with a receive or accept ring fires
//! whenever the server publishes into the ring (new bytes, a connection, an
//! end: `Client::read_edge`), whether or not the program read what came
//! before; EPOLLOUT fires once at registration and then when room appears
//! after a write found the send queue full (the kernel's SOCK_NOSPACE:
//! `fdtable::note_sent`). When an entry fires it reports everything that
//! holds then (EPOLLIN with EPOLLOUT, as the kernel's ready list does), and
//! an edge is spent by the look that follows it, reported or not. A socket
//! with no ring (eager receive off, a connect in progress) cannot show its
//! edges here: its entry reports a direction once and is then quiet until
//! the program operates on the socket in that direction again
//! (`fdtable::note_read/note_write`), with at most an extra wake-up where
//! the kernel saw no new edge. EPOLLONESHOT disables an entry after one
//! report until EPOLL_CTL_MOD.
//!
//! O(ready), not O(interest): each set keeps a ready list (`set.rs`), fed
//! by the host's ready log, where the server announces every receive or
//! accept ring it publishes into. A wait looks at the listed entries only:
//! those the log named since the last look, those added or modified,
//! level-triggered ones reported last time, and *sticky* ones the log
//! cannot announce (`Entry::sticky`: no ring, level-triggered EPOLLOUT,
//! EPOLLOUT waiting for room). A wait with nothing ready sleeps on the host
//! doorbell, registered on the ready log and on the send queues of entries
//! waiting for room (`Client::sleep_on_edges`); sets with a socket it
//! cannot watch that way (a listener inherited through fork before its
//! first accept, a connect in progress) wait in a poll parked at the
//! server through `poll::wait_mixed`, which must end on the same events:
//! every armed entry, and the next arrival into every ring an entry
//! watches, armed or not (`fallback.rs`).

mod entry;
mod fallback;
mod set;

use crate::deadline::Deadline;
use crate::errno::fail;
use crate::log::{debug, COUNTERS};
use crate::{attach, fdtable, poll, real};
use entry::*;
use libc::{c_int, epoll_event};
pub use set::Set;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use tcps::{Client, PollFd};

static SETS: Mutex<BTreeMap<c_int, Set>> = Mutex::new(BTreeMap::new());

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<c_int, Set>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// An offloaded fd was closed: it leaves every set (as the kernel does when
/// the last reference to a file goes).
pub fn forget_fd(fd: c_int) {
    for s in sets().values_mut() {
        s.remove(fd);
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
    let Some((epoch, id)) = fdtable::lookup_at(fd) else {
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
            if let Err(e) = exclusive_ok(op, ev.events, s.entries.get(&fd)) {
                return fail(e);
            }
            debug!(
                "epoll_ctl(epfd {epfd}, {}, fd {fd}, events {:#x})",
                if exists { "MOD" } else { "ADD" },
                { ev.events }
            );
            s.insert(fd, Entry::new(epoch, id, ev));
            0
        }
        libc::EPOLL_CTL_DEL => match s.remove(fd) {
            Some(_) => 0,
            None => fail(libc::ENOENT),
        },
        _ => fail(libc::EINVAL),
    }
}

/// One candidate of a pass: fd, its socket, and what its look started
/// from.
struct Cand {
    fd: c_int,
    epoch: u32,
    id: u32,
    x: Edges,
    /// The directions that fired (`Entry::wanted`): a report needs one.
    fired: u32,
    /// What a listener's siblings on other servers have (`group.rs`).
    extra: i16,
}

impl Cand {
    /// Whether entry `e` still watches the socket this candidate looked at.
    fn names(&self, e: &Entry) -> bool {
        e.id == self.id && e.epoch == self.epoch
    }
}

/// One attachment's part of a pass: its candidates and the poll entries
/// to ask its server about.
struct Pass {
    c: &'static Client,
    cands: Vec<Cand>,
    pfds: Vec<PollFd>,
}

/// The pass of attachment `c` in `passes` (made on first use).
fn pass_for<'a>(passes: &'a mut Vec<Pass>, c: &'static Client) -> &'a mut Pass {
    let i = match passes.iter().position(|p| std::ptr::eq(p.c, c)) {
        Some(i) => i,
        None => {
            passes.push(Pass {
                c,
                cands: Vec::new(),
                pfds: Vec::new(),
            });
            passes.len() - 1
        }
    };
    &mut passes[i]
}

/// The armed entries of `epfd`'s ready list, by attachment, after
/// refilling it from the ready logs (None: the set has no offloaded entry
/// at all), and whether the set has kernel fds. Entries with nothing armed
/// leave the list unless they are sticky. O(ready), not O(interest).
fn candidates(epfd: c_int) -> (Option<Vec<Pass>>, bool) {
    let mut sets = sets();
    let Some(s) = sets.get_mut(&epfd) else {
        return (None, true);
    };
    if s.entries.is_empty() {
        return (None, true);
    }
    // After a reattach, a moved listener, a group's dead server
    // (`Set::refresh`).
    s.refresh();
    s.refill();
    COUNTERS.epoll_passes.fetch_add(1, Ordering::Relaxed);
    COUNTERS
        .epoll_looks
        .fetch_add(s.ready.len() as u64, Ordering::Relaxed);
    let mut passes = Vec::new();
    let Set { entries, ready, .. } = s;
    ready.retain(|&fd| {
        let Some(e) = entries.get_mut(&fd).filter(|e| set::live(e.epoch)) else {
            return false;
        };
        let Some(c) = crate::state::client_at(e.epoch) else {
            return false;
        };
        let x = e.look(c);
        let w = e.wanted(&x);
        if w != 0 {
            let pass = pass_for(&mut passes, c);
            pass.cands.push(Cand {
                fd,
                epoch: e.epoch,
                id: e.id,
                x,
                fired: w,
                extra: e.sibling_events(w),
            });
            pass.pfds.push(PollFd {
                sock: e.id,
                events: e.asked(w) as i16,
                revents: 0,
            });
            return true; // `collect` decides
        }
        e.listed = e.sticky(&x);
        e.listed
    });
    (Some(passes), s.kernel_fds > 0)
}

/// What a doorbell sleep on `epfd` must watch, by attachment: the ready
/// log when an entry has read interest (a new arrival in any ring ends the
/// wait, fired or not), and what the log does not announce, from the
/// (sticky) entries left on the ready list: the send queue of an entry
/// that waits for room, the socket of a read side without a ring (which
/// cannot be watched this way: the sleep then falls back). Empty: nothing
/// to wait for here, or something only the server can watch (room in a
/// socket whose sends are not queued here).
fn watches(epfd: c_int) -> Vec<(&'static Client, Vec<tcps::EdgeWatch>)> {
    let sets = sets();
    let Some(s) = sets.get(&epfd) else {
        return Vec::new();
    };
    let mut w: Vec<(&'static Client, Vec<tcps::EdgeWatch>)> = Vec::new();
    let mut add = |c: &'static Client, watch: tcps::EdgeWatch| match w
        .iter_mut()
        .find(|(m, _)| std::ptr::eq(*m, c))
    {
        Some((_, v)) if !v.contains(&watch) => v.push(watch),
        Some(_) => {}
        None => w.push((c, vec![watch])),
    };
    let live = |e: &&Entry| set::live(e.epoch);
    for e in s
        .ready
        .iter()
        .filter_map(|fd| s.entries.get(fd))
        .filter(live)
    {
        let Some(c) = crate::state::client_at(e.epoch) else {
            continue;
        };
        let x = e.look(c);
        if !e.sticky(&x) {
            continue;
        }
        let wants_room = e.events & EV_OUT != 0 && (e.events & EV_ET == 0 || e.write_pending(&x));
        if wants_room && !x.queue {
            // Room that only the server's kernel socket knows of (no send
            // queue here, or asynchronous sends off: the queue never
            // moves): no doorbell announces it; the server must be asked.
            return Vec::new();
        }
        add(
            c,
            tcps::EdgeWatch {
                sock: e.id,
                read: e.events & READ_SIDE != 0 && x.rd_edge.is_none(),
                write: wants_room,
            },
        );
    }
    for e in s.entries.values().filter(live) {
        if e.disabled || e.events & READ_SIDE == 0 {
            continue;
        }
        for (ep, _) in e.sockets() {
            if let Some(m) = crate::state::client_at(ep).filter(|m| m.is_attached()) {
                add(m, tcps::EdgeWatch::READY_LOG);
            }
        }
    }
    w
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
    // A look spends the read edge it started from, as the kernel drops a
    // fired entry whose poll finds nothing; a ready entry keeps its edge
    // until it is reported (there may be no room for it in this call).
    for (c, p) in cands.iter().zip(pfds) {
        let edge = s
            .entries
            .get(&c.fd)
            .is_some_and(|e| e.is_edge(c.fired, p.revents as u16 as u32));
        if !edge {
            if let Some(e) = s.entries.get_mut(&c.fd).filter(|e| c.names(e)) {
                e.rd_edge = c.x.rd_edge.or(e.rd_edge);
            }
        }
    }
    let mut order: Vec<usize> = (0..pfds.len()).filter(|&i| pfds[i].revents != 0).collect();
    order.sort_by_key(|&i| ranks[i]);
    let mut reported = vec![false; cands.len()];
    for i in order {
        let (c, p) = (&cands[i], &pfds[i]);
        if out.len() >= room {
            break;
        }
        let Some(e) = s.entries.get_mut(&c.fd) else {
            continue;
        };
        if !c.names(e) {
            continue; // closed and reused meanwhile
        }
        let ev = (p.revents as u16 as u32) & (e.events | EV_ERR | EV_HUP);
        if ev == 0 || !e.is_edge(c.fired, ev) {
            e.rd_edge = c.x.rd_edge.or(e.rd_edge);
            continue;
        }
        if e.events & EV_ET != 0 {
            e.rd_edge = c.x.rd_edge.or(e.rd_edge);
            if ev & (READ_SIDE | EV_ERR | EV_HUP) != 0 {
                e.reported_rd = c.x.rd;
            }
            if ev & (EV_OUT | EV_ERR | EV_HUP) != 0 {
                e.reported_wr = c.x.wr;
                e.reported_full = c.x.full;
            }
            e.reported_state = c.x.state;
        }
        if e.events & EV_ONESHOT != 0 {
            e.disabled = true;
        }
        out.push(epoll_event {
            events: ev,
            u64: e.data,
        });
        reported[i] = true;
    }
    relist(s, cands, pfds, &reported);
}

/// Which looked-at entries stay on the ready list, as the kernel's: a
/// level-triggered entry that was reported (it is looked at again next
/// time), a ready one there was no room to report, a sticky one.
fn relist(s: &mut Set, cands: &[Cand], pfds: &[PollFd], reported: &[bool]) {
    for (i, c) in cands.iter().enumerate() {
        let Some(e) = s.entries.get_mut(&c.fd).filter(|e| c.names(e)) else {
            continue;
        };
        let ready = e.is_edge(c.fired, pfds[i].revents as u16 as u32);
        e.listed = if reported[i] {
            e.events & EV_ET == 0 || e.sticky(&c.x)
        } else {
            ready || e.sticky(&c.x)
        };
    }
    let Set { entries, ready, .. } = s;
    ready.retain(|fd| entries.get(fd).is_some_and(|e| e.listed));
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

/// Whether `epfd` is a set with offloaded entries.
fn has_offloaded(epfd: c_int) -> bool {
    sets().get(&epfd).is_some_and(|s| !s.entries.is_empty())
}

unsafe fn wait_impl(epfd: c_int, events: *mut epoll_event, max: c_int, timeout: c_int) -> c_int {
    if !has_offloaded(epfd) {
        return real::epoll_wait()(epfd, events, max, timeout);
    }
    if max <= 0 || events.is_null() {
        return fail(libc::EINVAL);
    }
    let max = max as usize;
    let deadline = Deadline::after(timeout);
    loop {
        let Some(c) = attach::for_existing() else {
            return real::epoll_wait()(epfd, events, max as c_int, deadline.left());
        };
        // The server died (now or during a wait that failed): `gone.rs`;
        // None: a new server was attached meanwhile (`--reattach`). A
        // group waits on while one of its servers lives (`group.rs`).
        let mut all_gone = crate::gone::gone(c);
        if crate::state::is_group() {
            // (Each is looked at: a dead one's listeners move now.)
            let dead: Vec<bool> = crate::state::members()
                .map(|(_, m)| crate::gone::gone(m))
                .collect();
            all_gone = dead.iter().all(|&d| d);
        }
        if all_gone {
            match gone_wait(epfd, events, max, deadline.left()) {
                Some(n) => return n,
                None => continue,
            }
        }
        match live_pass(epfd, events, max, deadline.left()) {
            Ok(Some(n)) => return n,
            Ok(None) => {}
            Err(_) if crate::state::members().any(|(_, m)| crate::gone::gone(m)) => {}
            Err(e) => return fail(e),
        }
    }
}

/// One pass of a wait on live attachments: the events ready now (of the
/// offloaded entries, the stale ones of a dead attachment, the kernel
/// side), else a sleep until something may be ready (`Ok(None)`: look
/// again) or `remaining` ms pass.
unsafe fn live_pass(
    epfd: c_int,
    events: *mut epoll_event,
    max: usize,
    remaining: c_int,
) -> Result<Option<c_int>, i32> {
    let (offloaded, has_kernel) = candidates(epfd);
    let Some(mut passes) = offloaded else {
        return Ok(Some(real::epoll_wait()(
            epfd,
            events,
            max as c_int,
            remaining,
        )));
    };
    let mut out = Vec::new();
    // Offloaded events leave the kernel side at least one slot.
    let off_room = if has_kernel && max > 1 { max - 1 } else { max };
    for p in passes.iter_mut().filter(|p| !p.pfds.is_empty()) {
        // Non-blocking pass over both sides.
        let mut ranks = vec![0u16; p.pfds.len()];
        crate::poll::poll_offloaded(p.c, &mut p.pfds, &mut ranks, 0)
            .map_err(|e| crate::errno::errno_of(&e))?;
        for (f, cand) in p.pfds.iter_mut().zip(&p.cands) {
            f.revents |= cand.extra & f.events;
        }
        // Also when nothing is ready: the look spends the edges.
        collect(epfd, &p.cands, &p.pfds, &ranks, &mut out, off_room);
    }
    report_stale(epfd, &mut out, off_room);
    let mut n = out.len();
    std::ptr::copy_nonoverlapping(out.as_ptr(), events, n);
    if has_kernel && n < max && (n == 0 || kernel_turn()) {
        let k = real::epoll_wait()(epfd, events.add(n), (max - n) as c_int, 0);
        if k > 0 {
            n += k as usize;
        } else if k < 0 && n == 0 {
            return Ok(Some(-1));
        }
    }
    if n > 0 || remaining == 0 {
        return Ok(Some(n as c_int));
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
    if edge_sleep(epfd, &mut kernel, remaining)? {
        return Ok(None);
    }
    // The old way: a parked poll at each server, on every armed entry
    // and every ring an entry watches (an arrival into any of them must
    // end this wait, as it ends the doorbell sleep: `fallback.rs`).
    let (mut parts, slice) = sets()
        .get(&epfd)
        .map(fallback::all_watched)
        .unwrap_or_default();
    let remaining = fallback::sliced(remaining, slice);
    match parts.as_mut_slice() {
        // Nothing armed (or nothing offloaded to watch): sleep like
        // epoll_wait on the kernel side alone (a slice of it: look again).
        [] => match real::epoll_wait()(epfd, events, max as c_int, remaining) {
            0 if slice => Ok(None),
            n => Ok(Some(n)),
        },
        [one] if !crate::state::is_group() => {
            poll::wait_mixed(one.c, &mut one.fds, &mut kernel, remaining)?;
            Ok(None)
        }
        parts => {
            crate::group_wait::wait(parts, &mut kernel, remaining)?;
            Ok(None)
        }
    }
}

/// The stale entries of `epfd` (a dead attachment's, after a reattach):
/// each reports EPOLLERR|EPOLLHUP once (per socket, `gone.rs`) into `out`
/// (up to `room`), and is not looked at again.
fn report_stale(epfd: c_int, out: &mut Vec<epoll_event>, room: usize) {
    let mut sets = sets();
    let Some(s) = sets.get_mut(&epfd) else { return };
    while out.len() < room {
        let Some(fd) = s.stale.pop() else { break };
        let Some(e) = s.entries.get_mut(&fd) else {
            continue;
        };
        if let Some(c) = crate::state::client_at(e.epoch) {
            if !e.disabled && crate::gone::report_in_wait(c, e.id) {
                out.push(epoll_event {
                    events: EV_ERR | EV_HUP,
                    u64: e.data,
                });
                e.disabled = e.events & EV_ONESHOT != 0;
            }
        }
    }
}

/// `epoll_wait` after the server died: each offloaded entry reports
/// EPOLLERR|EPOLLHUP once (per socket, `gone.rs`), then the set waits on
/// its kernel fds alone (with nothing else, it sleeps for `timeout`).
/// With `--reattach` it sleeps in slices and tries to attach a server
/// that came back between them: None when one was (look again).
unsafe fn gone_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: usize,
    timeout: c_int,
) -> Option<c_int> {
    let mut out = Vec::new();
    if let Some(s) = sets().get_mut(&epfd) {
        for e in s.entries.values_mut() {
            let Some(c) = crate::state::client_at(e.epoch) else {
                continue;
            };
            if out.len() < max && !e.disabled && crate::gone::report_in_wait(c, e.id) {
                out.push(epoll_event {
                    events: EV_ERR | EV_HUP,
                    u64: e.data,
                });
                e.disabled = e.events & EV_ONESHOT != 0;
            }
        }
    }
    let n = out.len();
    std::ptr::copy_nonoverlapping(out.as_ptr(), events, n);
    if n == max {
        return Some(n as c_int);
    }
    let deadline = Deadline::after(timeout);
    loop {
        let left = if n > 0 { 0 } else { deadline.left() };
        let k = real::epoll_wait()(
            epfd,
            events.add(n),
            (max - n) as c_int,
            crate::reattach::slice(left),
        );
        match k {
            k if k > 0 => return Some((n + k as usize) as c_int),
            k if k < 0 && n == 0 => return Some(-1),
            _ if left == 0 || n > 0 => return Some(n as c_int),
            _ if crate::reattach::try_now() => return None,
            _ => {}
        }
    }
}

/// Sleeps on the host doorbells until a ring or queue of `epfd`'s entries
/// moves, a kernel fd of the set is ready, or `timeout` (see the module
/// docs). `Ok(false)`: the set cannot be watched that way.
fn edge_sleep(epfd: c_int, kernel: &mut [libc::pollfd], timeout: c_int) -> Result<bool, i32> {
    if !crate::ring_sleep::enabled() {
        return Ok(false);
    }
    let watch = watches(epfd);
    if watch.is_empty() {
        return Ok(false);
    }
    let mut ready = || -> std::io::Result<bool> {
        let Some(passes) = candidates(epfd).0 else {
            return Ok(true);
        };
        for mut p in passes.into_iter().filter(|p| !p.pfds.is_empty()) {
            if p.cands.iter().any(|c| c.extra != 0) {
                return Ok(true);
            }
            let mut r = vec![0u16; p.pfds.len()];
            if crate::poll::poll_offloaded(p.c, &mut p.pfds, &mut r, 0)? > 0
                && p.cands.iter().zip(&p.pfds).any(|(c, f)| {
                    // The look asked for all the entry watches; only a
                    // direction that fired ends the sleep.
                    let ev = f.revents as u16 as u32;
                    ev & (c.fired | EV_ERR | EV_HUP) != 0
                })
            {
                return Ok(true);
            }
        }
        Ok(false)
    };
    let parts: Vec<(&Client, &[tcps::EdgeWatch])> =
        watch.iter().map(|(c, w)| (*c, &w[..])).collect();
    // A group's sleep ends every slice, for a look at its servers' health.
    let timeout =
        if crate::state::is_group() && !(0..=crate::group_wait::SLICE_MS).contains(&timeout) {
            crate::group_wait::SLICE_MS
        } else {
            timeout
        };
    let slept = tcps::sleep_on_many(&parts, kernel, timeout, &mut ready)
        .map_err(|e| crate::errno::errno_of(&e))?;
    if slept && crate::state::is_group() {
        crate::gone::check_members();
    }
    Ok(slept)
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
    if !has_offloaded(epfd) {
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
    if !has_offloaded(epfd) {
        return real::epoll_pwait()(epfd, events, max, ms, mask);
    }
    poll::with_sigmask(mask, || wait_impl(epfd, events, max, ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_side_checked_every_few_passes() {
        let turns = (0..KERNEL_EVERY * 4).filter(|_| kernel_turn()).count();
        assert_eq!(turns, 4);
    }
}
