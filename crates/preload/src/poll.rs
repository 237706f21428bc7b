//! poll, ppoll, select, pselect over a mix of offloaded sockets and kernel
//! fds, and the one primitive they and epoll share: [`wait_mixed`].
//!
//! Offloaded sockets are polled at the server (`tcps_poll`, which parks
//! there until a socket is ready), kernel fds with the real poll(2). When a
//! call must block on both, the calling thread parks in `tcps_poll` and a
//! helper thread (one per calling thread, made on first need) blocks in the
//! real poll(2) on the kernel fds; whichever side fires first wakes the
//! other: the helper by sending one byte on a private tcps connection (the
//! *wake pair*) that is part of the parked `tcps_poll`, the caller by
//! writing the helper's cancel eventfd. Nothing spins.

use crate::deadline::Deadline;
use crate::errno::fail;
use crate::log::debug;
use crate::{attach, fdtable, real, state};
use libc::{c_int, nfds_t, pollfd};
use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex};
use tcps::{Client, PollFd};

#[derive(PartialEq)]
enum Phase {
    Idle,
    Posted,
    Done,
    Quit,
}

struct Job {
    phase: Phase,
    fds: Vec<pollfd>,
}

struct Shared {
    job: Mutex<Job>,
    cv: Condvar,
}

/// A calling thread's helper: its thread, cancel eventfd and wake pair.
struct Waiter {
    generation: u64,
    /// The attachment of the wake pair.
    client: &'static Client,
    shared: Arc<Shared>,
    cancel: c_int,
    /// The caller's end of the wake pair (the helper sends on the other).
    rx: u32,
}

impl Waiter {
    fn new(c: &'static Client) -> Result<Waiter, i32> {
        let (tx, rx) = wake_pair(c)?;
        // SAFETY: plain syscall.
        let cancel = unsafe { real::eventfd()(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if cancel < 0 {
            return Err(crate::errno::last_errno());
        }
        let shared = Arc::new(Shared {
            job: Mutex::new(Job {
                phase: Phase::Idle,
                fds: Vec::new(),
            }),
            cv: Condvar::new(),
        });
        let s2 = shared.clone();
        std::thread::Builder::new()
            .name("tcps-poll-helper".into())
            .spawn(move || {
                crate::signals::block_all_here();
                helper(c, s2, cancel, tx)
            })
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
        debug!("poll helper thread started (wake pair {tx}->{rx})");
        Ok(Waiter {
            generation: state::generation(),
            client: c,
            shared,
            cancel,
            rx,
        })
    }

    /// Blocks until a tcps entry or a kernel entry may be ready, or the
    /// timeout. Readiness itself is collected by the caller's next pass.
    fn wait(
        &self,
        c: &Client,
        tcps: &[PollFd],
        kernel: &[pollfd],
        timeout: c_int,
    ) -> Result<(), i32> {
        {
            let mut j = lock(&self.shared.job);
            j.fds.clear();
            j.fds
                .extend(kernel.iter().map(|p| pollfd { revents: 0, ..*p }));
            j.phase = Phase::Posted;
        }
        self.shared.cv.notify_all();
        let mut entries: Vec<PollFd> = tcps.to_vec();
        entries.push(PollFd {
            sock: self.rx,
            events: libc::POLLIN,
            revents: 0,
        });
        let r = crate::sendq::poll(c, &mut entries, timeout);
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes from a local buffer to our eventfd.
        unsafe { real::write()(self.cancel, one.as_ptr() as *const libc::c_void, 8) };
        {
            let mut j = lock(&self.shared.job);
            while j.phase == Phase::Posted {
                j = self.shared.cv.wait(j).unwrap_or_else(|p| p.into_inner());
            }
            j.phase = Phase::Idle;
        }
        let mut drain = [0u8; 8];
        // SAFETY: reading 8 bytes into a local buffer from our eventfd.
        unsafe { real::read()(self.cancel, drain.as_mut_ptr() as *mut libc::c_void, 8) };
        if entries.last().is_some_and(|e| e.revents != 0) {
            let mut b = [0u8; 64];
            let _ = c.recv(self.rx, &mut b, libc::MSG_DONTWAIT);
        }
        r.map(drop).map_err(|e| crate::errno::errno_of(&e))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.generation != state::generation() {
            return; // a forked child's copy: the helper thread is not ours
        }
        lock(&self.shared.job).phase = Phase::Quit;
        self.shared.cv.notify_all();
        let one = 1u64.to_ne_bytes();
        // SAFETY: as in `wait`.
        unsafe { real::write()(self.cancel, one.as_ptr() as *const libc::c_void, 8) };
        let _ = self.client.close(self.rx);
        // The helper closes `tx` and the cancel eventfd on its way out.
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn helper(c: &'static Client, s: Arc<Shared>, cancel: c_int, tx: u32) {
    let mut fds: Vec<pollfd> = Vec::new();
    loop {
        {
            let mut j = lock(&s.job);
            while j.phase != Phase::Posted && j.phase != Phase::Quit {
                j = s.cv.wait(j).unwrap_or_else(|p| p.into_inner());
            }
            if j.phase == Phase::Quit {
                break;
            }
            fds.clear();
            fds.extend_from_slice(&j.fds);
        }
        fds.push(pollfd {
            fd: cancel,
            events: libc::POLLIN,
            revents: 0,
        });
        loop {
            // SAFETY: `fds` is a valid array of pollfds.
            let n = unsafe { real::poll()(fds.as_mut_ptr(), fds.len() as nfds_t, -1) };
            if n >= 0 || crate::errno::last_errno() != libc::EINTR {
                break;
            }
        }
        let kernel_ready = fds[..fds.len() - 1].iter().any(|p| p.revents != 0);
        let cancelled = fds[fds.len() - 1].revents != 0;
        if kernel_ready && !cancelled {
            let _ = c.send(tx, &[1], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        }
        lock(&s.job).phase = Phase::Done;
        s.cv.notify_all();
    }
    let _ = c.close(tx);
    // SAFETY: the cancel eventfd is ours; the Waiter no longer uses it.
    unsafe { real::close()(cancel) };
}

/// A connected pair of tcps sockets on the loopback, through the server.
fn wake_pair(c: &Client) -> Result<(u32, u32), i32> {
    let e = |e: std::io::Error| crate::errno::errno_of(&e);
    let lst = c
        .tcp_listen("127.0.0.1:0".parse().map_err(|_| libc::EINVAL)?, 1)
        .map_err(e)?;
    let r = (|| {
        let addr = c.getsockname(lst).map_err(e)?;
        let tx = c.tcp_connect(addr).map_err(e)?;
        let _ = c.setsockopt_int(tx, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
        match c.accept(lst, 0) {
            Ok((rx, _)) => Ok((tx, rx)),
            Err(err) => {
                let _ = c.close(tx);
                Err(e(err))
            }
        }
    })();
    let _ = c.close(lst);
    r
}

thread_local! {
    static WAITER: RefCell<Option<Waiter>> = const { RefCell::new(None) };
}

/// Fills `revents` of both sets; returns how many entries are ready, after
/// waiting up to `timeout_ms` (<0: forever) for the first.
pub fn wait_mixed(
    c: &'static Client,
    tcps: &mut [PollFd],
    kernel: &mut [pollfd],
    timeout_ms: c_int,
) -> Result<usize, i32> {
    let deadline = Deadline::after(timeout_ms);
    loop {
        let n1 = if tcps.is_empty() {
            0
        } else {
            tcps_poll(c, tcps, 0)?
        };
        let n2 = if kernel.is_empty() {
            0
        } else {
            real::poll_fds(kernel, 0)?
        };
        let remaining = deadline.left();
        if n1 + n2 > 0 || remaining == 0 {
            return Ok(n1 + n2);
        }
        if crate::ring_sleep::sleep(c, tcps, kernel, remaining)? {
            continue;
        }
        if kernel.is_empty() {
            return tcps_poll(c, tcps, remaining);
        }
        if tcps.is_empty() {
            return real::poll_fds(kernel, remaining);
        }
        WAITER.with(|w| -> Result<(), i32> {
            let mut w = w.borrow_mut();
            if w.as_ref()
                .is_some_and(|w| w.generation != state::generation())
            {
                // Inherited through fork: its thread lives in the parent.
                std::mem::forget(w.take());
            }
            if w.as_ref().is_some_and(|w| !std::ptr::eq(w.client, c)) {
                // Its wake pair is a dead attachment's (`--reattach`).
                w.take();
            }
            if w.is_none() {
                *w = Some(Waiter::new(c)?);
            }
            let w = w.as_ref().ok_or(libc::EIO)?;
            w.wait(c, tcps, kernel, remaining)
        })?;
    }
}

/// `Client::poll_ranked` (readiness with its arrival order) with POLLOUT
/// meaning room in the send queue too.
pub fn poll_offloaded(
    c: &Client,
    fds: &mut [PollFd],
    ranks: &mut [u16],
    timeout: c_int,
) -> std::io::Result<usize> {
    crate::sendq::poll_ranked(c, fds, ranks, timeout)
}

fn tcps_poll(c: &Client, fds: &mut [PollFd], timeout: c_int) -> Result<usize, i32> {
    crate::sendq::poll(c, fds, timeout).map_err(|e| crate::errno::errno_of(&e))
}

/// The offloaded entries of a wait that belong to a dead attachment (the
/// server died; or an older one, after a reattach): each reports
/// POLLERR|POLLHUP once (`gone.rs`), then is quiet. How many report now.
fn report_dead(dead: &mut [(PollFd, u32)]) -> usize {
    let mut n = 0;
    for (e, epoch) in dead.iter_mut() {
        e.revents = 0;
        if let Some(c) = state::client_at(*epoch) {
            if crate::gone::report_in_wait(c, e.sock) {
                e.revents = libc::POLLERR | libc::POLLHUP;
                n += 1;
            }
        }
    }
    n
}

/// A wait with no live offloaded entry: the kernel fds alone (with none,
/// the wait sleeps for `timeout`). When the server died (`retry`), with
/// `--reattach` in slices, trying to attach a server that came back
/// between them: None when one was (look again).
fn dead_wait(
    kernel: &mut [pollfd],
    reported: usize,
    timeout: c_int,
    retry: bool,
) -> Option<Result<usize, i32>> {
    let deadline = Deadline::after(timeout);
    loop {
        let left = if reported > 0 { 0 } else { deadline.left() };
        let wait = if retry {
            crate::reattach::slice(left)
        } else {
            left
        };
        match real::poll_fds(kernel, wait) {
            Ok(0) if left != 0 && retry && crate::reattach::try_now() => return None,
            Ok(0) if left != 0 => {}
            r => return Some(r.map(|k| k + reported)),
        }
    }
}

/// The dead and kernel entries' `revents` back into the caller's `all`
/// (each with where it came from), the offloaded ones being there already;
/// how many entries of `all` are ready.
fn answer(
    all: &mut [pollfd],
    (dead, dead_at): (&[(PollFd, u32)], &[usize]),
    (kernel, kernel_at): (&[pollfd], &[usize]),
) -> c_int {
    for ((e, _), &i) in dead.iter().zip(dead_at) {
        all[i].revents = e.revents;
    }
    for (k, &i) in kernel.iter().zip(kernel_at) {
        all[i].revents = k.revents;
    }
    all.iter().filter(|p| p.revents != 0).count() as c_int
}

/// poll(2) over any mix of fds.
unsafe fn poll_impl(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    let all: &mut [pollfd] = if fds.is_null() || n == 0 {
        &mut []
    } else {
        std::slice::from_raw_parts_mut(fds, n as usize)
    };
    if !all.iter().any(|p| fdtable::lookup(p.fd).is_some()) {
        return real::poll()(fds, n, timeout);
    }
    let deadline = Deadline::after(timeout);
    loop {
        let Some(c) = attach::for_existing() else {
            return fail(libc::EBADF);
        };
        if state::is_group() {
            return poll_group(all, deadline);
        }
        let left = deadline.left();
        let live_epoch = if crate::gone::gone(c) {
            0
        } else {
            state::epoch()
        };
        let (mut tcps, mut dead, mut kernel) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tcps_at, mut dead_at, mut kernel_at) = (Vec::new(), Vec::new(), Vec::new());
        for (i, p) in all.iter_mut().enumerate() {
            p.revents = 0;
            let entry = |sock| PollFd {
                sock,
                events: p.events,
                revents: 0,
            };
            match fdtable::lookup_at(p.fd) {
                Some((e, id)) if e == live_epoch => {
                    tcps.push(entry(id));
                    tcps_at.push(i);
                }
                Some((e, id)) => {
                    dead.push((entry(id), e));
                    dead_at.push(i);
                }
                None => {
                    kernel.push(*p);
                    kernel_at.push(i);
                }
            }
        }
        let reported = report_dead(&mut dead);
        let r = if tcps.is_empty() {
            match dead_wait(&mut kernel, reported, left, live_epoch == 0) {
                Some(r) => r,
                None => continue,
            }
        } else {
            let wait = if reported > 0 { 0 } else { left };
            match wait_mixed(c, &mut tcps, &mut kernel, wait) {
                Err(_) if crate::gone::gone(c) => continue,
                r => r,
            }
        };
        if let Err(e) = r {
            return fail(e);
        }
        for (e, &i) in tcps.iter().zip(&tcps_at) {
            all[i].revents = e.revents;
        }
        return answer(all, (&dead, &dead_at), (&kernel, &kernel_at));
    }
}

/// poll(2) for a host that uses several servers (`group.rs`): the entries
/// sorted by server (a listener's siblings are asked too, their events
/// added to its entry), waited on together (`group_wait.rs`).
fn poll_group(all: &mut [pollfd], deadline: Deadline) -> c_int {
    use crate::group_wait::{part_for, wait, Part};
    loop {
        // A server that died is noticed first: its listeners move to
        // their siblings before the entries are sorted.
        let live = |e: u32| state::client_at(e).filter(|c| !crate::gone::gone(c));
        state::members().for_each(|(_, c)| {
            crate::gone::gone(c);
        });
        let left = deadline.left();
        let (mut parts, mut dead, mut kernel) = (Vec::<Part>::new(), Vec::new(), Vec::new());
        let (mut dead_at, mut kernel_at) = (Vec::new(), Vec::new());
        for (i, p) in all.iter_mut().enumerate() {
            p.revents = 0;
            let entry = |sock| PollFd {
                sock,
                events: p.events,
                revents: 0,
            };
            let Some((e, id)) = fdtable::lookup_at(p.fd) else {
                kernel.push(*p);
                kernel_at.push(i);
                continue;
            };
            let Some(c) = live(e) else {
                dead.push((entry(id), e));
                dead_at.push(i);
                continue;
            };
            let sibs = crate::group::siblings(e, id).unwrap_or_default();
            for (c, sock) in std::iter::once((c, id)).chain(
                sibs.into_iter()
                    .filter_map(|(se, sid)| live(se).map(|m| (m, sid))),
            ) {
                let part = part_for(&mut parts, c);
                part.fds.push(entry(sock));
                part.at.push(i);
            }
        }
        let reported = report_dead(&mut dead);
        let r = if parts.is_empty() {
            dead_wait(&mut kernel, reported, left, false).unwrap_or(Ok(0))
        } else {
            match wait(&mut parts, &mut kernel, if reported > 0 { 0 } else { left }) {
                Ok(None) => continue,
                r => r.map(|n| n.unwrap_or(0)),
            }
        };
        if let Err(e) = r {
            return fail(e);
        }
        for p in &parts {
            for (e, &i) in p.fds.iter().zip(&p.at) {
                all[i].revents |= e.revents;
            }
        }
        return answer(all, (&dead, &dead_at), (&kernel, &kernel_at));
    }
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    poll_impl(fds, n, timeout)
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    _len: libc::size_t,
) -> c_int {
    poll_impl(fds, n, timeout)
}

fn ts_ms(ts: *const libc::timespec) -> c_int {
    // SAFETY: a non-null timespec from the caller.
    match unsafe { ts.as_ref() } {
        None => -1,
        Some(t) => {
            (t.tv_sec.max(0) * 1000 + (t.tv_nsec + 999_999) / 1_000_000).min(i32::MAX as i64)
                as c_int
        }
    }
}

/// Runs `f` with `mask` as the signal mask (when given), as the p-variants
/// do (not atomically, but a handler that runs as the mask changes makes
/// the call return EINTR, as the kernel's would).
pub fn with_sigmask(mask: *const libc::sigset_t, f: impl FnOnce() -> c_int) -> c_int {
    if mask.is_null() {
        return f();
    }
    // SAFETY: a zeroed sigset_t is a valid buffer for the old mask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    let before = crate::signals::generation();
    // SAFETY: `mask` is the caller's sigset; `old` is ours.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, &mut old) };
    // A signal the new mask let in ran its handler already: the wait is
    // interrupted before it began (the kernel's p-variants see it so).
    let r = if crate::signals::generation() != before {
        fail(libc::EINTR)
    } else {
        f()
    };
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let all: &[pollfd] = if fds.is_null() || n == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(fds, n as usize)
    };
    if !all.iter().any(|p| fdtable::lookup(p.fd).is_some()) {
        return real::ppoll()(fds, n, ts, mask);
    }
    with_sigmask(mask, || poll_impl(fds, n, ts_ms(ts)))
}

/// select/pselect: converted to poll over the fds named in the sets.
unsafe fn select_impl(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    timeout_ms: c_int,
) -> c_int {
    let mut pfds = Vec::new();
    let isset = |s: *mut libc::fd_set, fd| !s.is_null() && libc::FD_ISSET(fd, s);
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0;
        if isset(r, fd) {
            ev |= libc::POLLIN;
        }
        if isset(w, fd) {
            ev |= libc::POLLOUT;
        }
        if isset(x, fd) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            pfds.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let n = poll_impl(pfds.as_mut_ptr(), pfds.len() as nfds_t, timeout_ms);
    if n < 0 {
        return n;
    }
    for s in [r, w, x] {
        if !s.is_null() {
            libc::FD_ZERO(s);
        }
    }
    let mut count = 0;
    for p in &pfds {
        if p.revents & libc::POLLNVAL != 0 {
            return fail(libc::EBADF);
        }
        let mut set = |s: *mut libc::fd_set, hit: bool| {
            if hit && !s.is_null() {
                libc::FD_SET(p.fd, s);
                count += 1;
            }
        };
        let err = p.revents & (libc::POLLERR | libc::POLLHUP) != 0;
        set(
            r,
            p.events & libc::POLLIN != 0 && (p.revents & libc::POLLIN != 0 || err),
        );
        set(
            w,
            p.events & libc::POLLOUT != 0 && (p.revents & libc::POLLOUT != 0 || err),
        );
        set(
            x,
            p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0,
        );
    }
    count
}

unsafe fn any_offloaded(nfds: c_int, sets: [*mut libc::fd_set; 3]) -> bool {
    (0..nfds.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
        fdtable::lookup(fd).is_some() && sets.iter().any(|s| !s.is_null() && libc::FD_ISSET(fd, *s))
    })
}

/// select(2) itself, straight to the kernel (the time left written back
/// to `tv`, as Linux does).
#[cfg(target_arch = "x86_64")]
unsafe fn kernel_select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    libc::syscall(libc::SYS_select, nfds, r, w, x, tv) as c_int
}

/// select(2) where the kernel has only pselect6 (aarch64): the timeval as
/// a timespec, the time left written back.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel_select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let mut ts = tv.as_ref().map(|t| libc::timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_usec * 1000,
    });
    let tsp = ts
        .as_mut()
        .map_or(std::ptr::null_mut(), |t| t as *mut libc::timespec);
    let n = libc::syscall(
        libc::SYS_pselect6,
        nfds,
        r,
        w,
        x,
        tsp,
        std::ptr::null::<u8>(),
    ) as c_int;
    if let (Some(t), Some(left)) = (tv.as_mut(), ts) {
        t.tv_sec = left.tv_sec;
        t.tv_usec = left.tv_nsec / 1000;
    }
    n
}

#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    if !any_offloaded(nfds, [r, w, x]) {
        return kernel_select(nfds, r, w, x, tv);
    }
    let ms = match tv.as_ref() {
        None => -1,
        Some(t) => {
            (t.tv_sec.max(0) * 1000 + (t.tv_usec + 999) / 1000).min(i32::MAX as i64) as c_int
        }
    };
    select_impl(nfds, r, w, x, ms)
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !any_offloaded(nfds, [r, w, x]) {
        // The kernel's pselect6 takes {sigset, size} by pointer.
        let data: [usize; 2] = [mask as usize, 8];
        let dp = if mask.is_null() {
            std::ptr::null()
        } else {
            data.as_ptr()
        };
        return libc::syscall(libc::SYS_pselect6, nfds, r, w, x, ts, dp) as c_int;
    }
    with_sigmask(mask, || select_impl(nfds, r, w, x, ts_ms(ts)))
}
