//! Guards around system calls on a socket whose open file description the
//! host holds too (an adopted socket, or one it got a duplicate of with
//! `ControlMsg::SocketDup`).
//!
//! **Blocking.** O_NONBLOCK, SO_RCVTIMEO and SO_SNDTIMEO belong to the open
//! file description, which the host shares: it may clear O_NONBLOCK on its
//! copy at any moment. recv and send pass MSG_DONTWAIT and never block, but
//! accept4, connect and sendfile follow the description's flag, so a host
//! could make one of them sleep in the worker (an accept on an empty
//! listener) and stall every other host. Checking the flag first would race
//! with the host flipping it. Instead, while a [`Guard`] lives, a per-thread
//! POSIX timer sends this thread a real-time signal every [`TICK_NS`]; its
//! handler does nothing and is installed without SA_RESTART, so a call that
//! went to sleep returns EINTR within a tick, and the caller treats that as
//! EAGAIN (accept, sendfile) or EINPROGRESS (connect). The timer repeats
//! (a tick that lands while the thread runs in user space does nothing, and
//! a call that starts sleeping after it is still cut short by the next). It
//! targets the worker thread by its id (SIGEV_THREAD_ID): no other thread
//! sees the signal. Arming and disarming are one `timer_settime` each, once
//! per accept batch (not per accept). A host caught clearing O_NONBLOCK is
//! detached after a few strikes ([`interrupted`]).
//!
//! **Ownership.** accept(2) gives the new socket the accepting thread's
//! fsuid (the socket inode's uid, which the kernel copies into `sk_uid`,
//! and the file's credentials): what `iptables -m owner`, `ip rule
//! uidrange`, `/proc/net/tcp` and reuseport see. A connection accepted on a
//! host's listener belongs to the host, so around an accept batch the
//! worker thread takes the listener owner's fsuid (setfsuid(2) is per
//! thread in the kernel) and puts its own back afterwards. Only the batch
//! (accepting and setting up connections: no file is opened) runs under
//! the borrowed fsuid: the guard is dropped at its end, also on an early
//! return.

use std::cell::Cell;
use std::sync::OnceLock;
use tracing::warn;

/// A socket whose open file description a host holds as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostHeld {
    /// The socket inode's owner (`st_uid`): the uid of the process that
    /// created it, which connections accepted on it get as well.
    pub owner: u32,
}

impl HostHeld {
    /// The owner of socket `fd`, which a host holds too (None: fstat failed,
    /// which does not happen for a descriptor we own).
    pub fn of(fd: libc::c_int) -> Option<HostHeld> {
        // SAFETY: fstat into a zeroed stat we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; fd is a descriptor the caller owns.
        if unsafe { libc::fstat(fd, &mut st) } < 0 {
            return None;
        }
        Some(HostHeld { owner: st.st_uid })
    }
}

/// How often the guard's timer interrupts a call that went to sleep: the
/// longest a host can hold a worker per guarded call.
pub const TICK_NS: i64 = 2_000_000;

/// The guard's signal: a real-time signal no other part of tcps uses.
fn tick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 5
}

extern "C" fn on_tick(_: libc::c_int) {
    // Nothing: the signal's only job is to interrupt a sleeping syscall.
}

/// Installs the do-nothing handler once per process; whether it is in place.
fn handler_installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: a zeroed sigaction is valid; we fill handler and mask.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_tick as *const () as libc::sighandler_t;
        // No SA_RESTART: an interrupted accept4/connect/sendfile must
        // return EINTR instead of sleeping again.
        sa.sa_flags = 0;
        // SAFETY: sa_mask is ours; installing an async-signal-safe handler.
        let ok = unsafe {
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(tick_signal(), &sa, std::ptr::null_mut()) == 0
        };
        if !ok {
            warn!(
                errno = crate::sys::errno(),
                "could not install the guard signal handler"
            );
        }
        ok
    })
}

/// This thread's interval timer that signals only this thread.
struct ThreadTimer(libc::timer_t);

impl ThreadTimer {
    fn create() -> Option<ThreadTimer> {
        if !handler_installed() {
            return None;
        }
        // SAFETY: sigset_t is plain data; unblocking one signal for this
        // thread only (it is ours: no one else sends it).
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, tick_signal());
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
        // SAFETY: a zeroed sigevent is valid; we fill the fields we use.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = tick_signal();
        // SAFETY: gettid has no side effects.
        sev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: sev and id are valid for the call.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) } < 0 {
            warn!(
                errno = crate::sys::errno(),
                "could not create the guard timer"
            );
            return None;
        }
        Some(ThreadTimer(id))
    }

    /// Fires every `ns` nanoseconds from now (0: disarmed).
    fn set(&self, ns: i64) {
        let t = libc::timespec {
            tv_sec: 0,
            tv_nsec: ns,
        };
        let its = libc::itimerspec {
            it_interval: t,
            it_value: t,
        };
        // SAFETY: our timer; its is valid for the call.
        unsafe { libc::timer_settime(self.0, 0, &its, std::ptr::null_mut()) };
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: our timer, deleted once as the thread ends.
        unsafe { libc::timer_delete(self.0) };
    }
}

thread_local! {
    static TIMER: Option<ThreadTimer> = ThreadTimer::create();
    /// This thread's own fsuid, and whether switching it works (it needs
    /// CAP_SETUID: an unprivileged server accepts as itself).
    static OWN_FSUID: Cell<Option<(u32, bool)>> = const { Cell::new(None) };
}

/// setfsuid(2), the raw system call (glibc may broadcast set*id calls to
/// every thread; this one must change only the calling thread). Returns the
/// fsuid before the call; `u32::MAX` only reads it.
fn setfsuid(uid: u32) -> u32 {
    // SAFETY: setfsuid has no memory effects.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid) as u32 }
}

fn own_fsuid() -> (u32, bool) {
    OWN_FSUID.with(|c| {
        let v = c.get().unwrap_or_else(|| (setfsuid(u32::MAX), true));
        c.set(Some(v));
        v
    })
}

/// While alive, blocking calls of this thread on a host-held description
/// return EINTR within [`TICK_NS`] (and, from [`Guard::accept`], sockets it
/// accepts belong to the listener's owner). Dropping it undoes both.
#[must_use]
pub struct Guard {
    timer: bool,
    /// The owner whose fsuid the thread took (None: its own).
    borrowed_fsuid: Option<u32>,
}

impl Guard {
    /// For a connect or sendfile on a socket (nothing if `held` is None).
    pub fn call(held: Option<HostHeld>) -> Guard {
        let timer = held.is_some() && TIMER.with(|t| t.as_ref().map(|t| t.set(TICK_NS)).is_some());
        Guard {
            timer,
            borrowed_fsuid: None,
        }
    }

    /// For a batch of accepts on listener `held`.
    pub fn accept(held: Option<HostHeld>) -> Guard {
        let mut g = Guard::call(held);
        if let Some(h) = held {
            let (own, works) = own_fsuid();
            if works && h.owner != own {
                setfsuid(h.owner);
                g.borrowed_fsuid = Some(h.owner);
            }
        }
        g
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.timer {
            TIMER.with(|t| {
                if let Some(t) = t {
                    t.set(0);
                }
            });
        }
        if let Some(owner) = self.borrowed_fsuid {
            let (own, _) = own_fsuid();
            if setfsuid(own) != owner {
                // The switch did not happen (no CAP_SETUID): stop trying.
                warn!(
                    owner,
                    "cannot accept as the listener's owner (setfsuid failed): \
                     accepted connections belong to the server's uid"
                );
                OWN_FSUID.with(|c| c.set(Some((own, false))));
            }
        }
    }
}

/// Strikes after which a host is detached (`interrupted`): a host that
/// keeps clearing O_NONBLOCK costs the worker at most this many ticks.
pub const MAX_BLOCKING_STRIKES: u32 = 8;

/// A guarded call on `fd` returned EINTR: if the host had cleared
/// O_NONBLOCK on the description it shares (the library never does), sets
/// it again and says so (`Host::interrupted` counts the strike). A tick
/// that merely landed during a call that was not sleeping leaves the flag
/// set and returns false.
pub fn restore_nonblocking(fd: libc::c_int) -> bool {
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller owns.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 || fl & libc::O_NONBLOCK != 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    fn blocking_listener() -> OwnedFd {
        // SAFETY: plain syscalls on a fresh socket.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as u16;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            assert_eq!(
                libc::bind(fd, &a as *const _ as *const libc::sockaddr, len),
                0
            );
            assert_eq!(libc::listen(fd, 4), 0);
            OwnedFd::from_raw_fd(fd)
        }
    }

    #[test]
    fn a_blocking_accept_returns_eintr_under_the_guard() {
        let l = blocking_listener();
        let held = HostHeld::of(l.as_raw_fd());
        assert!(held.is_some());
        let t0 = Instant::now();
        let r = {
            let _g = Guard::accept(held);
            crate::sys::accept(l.as_raw_fd()).map(drop)
        };
        assert_eq!(r, Err(libc::EINTR));
        assert!(t0.elapsed() < Duration::from_secs(1));
        // Disarmed: no tick arrives afterwards.
        // SAFETY: sleeping; a signal would cut it short.
        let left = unsafe { libc::usleep(20_000) };
        assert_eq!(left, 0, "a tick arrived after the guard was dropped");
    }
}
