//! Signals interrupt blocking calls on offloaded sockets as the kernel's
//! signals interrupt blocking socket calls.
//!
//! The library interposes `sigaction`, `signal`, `bsd_signal`,
//! `sysv_signal`, `sigset` and `siginterrupt` (glibc's `signal` does not
//! call the interposable `sigaction`). A caught signal's handler is
//! installed behind a *trampoline* that counts a per-thread generation and
//! notes the signal, then calls the program's handler with the arguments
//! it asked for (`SA_SIGINFO` or not); `sigaction` reports the program's
//! own handler as the old action, and `SIG_IGN`/`SIG_DFL` pass through
//! untouched. The host library's waits watch the generation
//! (`tcps::interrupt`): an interrupted wait cancels a call parked at the
//! server and returns EINTR (or the bytes the call already moved). Here the
//! kernel's rule decides what the program sees ([`restarting`]): the call
//! runs again when the handler that ran has `SA_RESTART` and the socket has
//! no `SO_RCVTIMEO`/`SO_SNDTIMEO` for that direction; otherwise EINTR. The
//! poll family never restarts (`poll.rs`, `epoll/`), and `connect` neither
//! (the connection goes on; the program polls for it). A blocked signal
//! (a `signalfd` program's) runs no handler and so interrupts nothing.
//!
//! The library's own threads (the poll helpers) block every signal, so a
//! signal meant for the process reaches one of the program's threads.

use crate::real;
use libc::{c_int, c_void, sighandler_t, siginfo_t};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use tcps::Client;

/// Signal numbers 1..NSIG (the kernel's 64 and realtime signals).
const NSIG: usize = 65;

/// The program's handler of each signal installed behind the trampoline.
static HANDLERS: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
/// Whether that handler takes `(sig, info, context)` (`SA_SIGINFO`).
static SIGINFO: [AtomicBool; NSIG] = [const { AtomicBool::new(false) }; NSIG];
/// Signals `siginterrupt` made interrupting (bit n: signal n), for
/// `signal`/`bsd_signal`, which install with `SA_RESTART` otherwise.
static INTERRUPTING: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Handlers that ran on this thread.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
    /// The signal of the last one.
    static LAST: Cell<c_int> = const { Cell::new(0) };
}

/// The calling thread's signal generation (`tcps::interrupt`).
pub fn generation() -> u64 {
    GENERATION.with(|g| g.get())
}

extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
    LAST.with(|l| l.set(sig));
    let Some(i) = index(sig) else { return };
    let h = HANDLERS[i].load(Ordering::Acquire);
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if SIGINFO[i].load(Ordering::Acquire) {
        // SAFETY: the program installed `h` as an SA_SIGINFO handler.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed `h` as a plain handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// The trampoline's address, as `sa_sigaction` holds it.
fn tramp() -> usize {
    trampoline as *const () as usize
}

fn index(sig: c_int) -> Option<usize> {
    (sig > 0 && (sig as usize) < NSIG).then_some(sig as usize)
}

/// sigaction(2) with the program's handlers behind the trampoline.
unsafe fn install(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let Some(i) = index(sig) else {
        return real::sigaction()(sig, act, old);
    };
    let (prev, prev_info) = (
        HANDLERS[i].load(Ordering::Acquire),
        SIGINFO[i].load(Ordering::Acquire),
    );
    let mut was: libc::sigaction = std::mem::zeroed();
    let r = match act.as_ref() {
        Some(a) if a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN => {
            // Stored first: a signal arriving meanwhile finds it.
            HANDLERS[i].store(a.sa_sigaction, Ordering::Release);
            SIGINFO[i].store(a.sa_flags & libc::SA_SIGINFO != 0, Ordering::Release);
            let mut t = *a;
            t.sa_sigaction = tramp();
            t.sa_flags |= libc::SA_SIGINFO;
            real::sigaction()(sig, &t, &mut was)
        }
        _ => real::sigaction()(sig, act, &mut was),
    };
    if r == 0 {
        if let Some(o) = old.as_mut() {
            *o = was;
            if was.sa_sigaction == tramp() {
                o.sa_sigaction = prev;
                if !prev_info {
                    o.sa_flags &= !libc::SA_SIGINFO;
                }
            }
        }
    }
    r
}

/// A handler installed the `signal` way: `flags`, the signal itself
/// blocked while it runs unless `SA_NODEFER`. Returns the old handler.
unsafe fn install_simple(sig: c_int, h: sighandler_t, flags: c_int) -> sighandler_t {
    let mut a: libc::sigaction = std::mem::zeroed();
    a.sa_sigaction = h;
    a.sa_flags = flags;
    libc::sigemptyset(&mut a.sa_mask);
    if flags & libc::SA_NODEFER == 0 && index(sig).is_some() {
        libc::sigaddset(&mut a.sa_mask, sig);
    }
    let mut old: libc::sigaction = std::mem::zeroed();
    if install(sig, &a, &mut old) < 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// BSD semantics (glibc's `signal`): `SA_RESTART` unless `siginterrupt`
/// said otherwise.
unsafe fn bsd(sig: c_int, h: sighandler_t) -> sighandler_t {
    let interrupting =
        index(sig).is_some_and(|i| INTERRUPTING.load(Ordering::Relaxed) >> i & 1 == 1);
    install_simple(sig, h, if interrupting { 0 } else { libc::SA_RESTART })
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    install(sig, act, old)
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, h: sighandler_t) -> sighandler_t {
    bsd(sig, h)
}

#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, h: sighandler_t) -> sighandler_t {
    bsd(sig, h)
}

/// System V semantics: one-shot, not blocked while it runs, no restart.
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(sig: c_int, h: sighandler_t) -> sighandler_t {
    install_simple(sig, h, libc::SA_RESETHAND | libc::SA_NODEFER)
}

#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(sig: c_int, h: sighandler_t) -> sighandler_t {
    sysv_signal(sig, h)
}

/// `sigset`: `SIG_HOLD` blocks the signal (libc's own); any other
/// disposition is installed with no flags and unblocks it.
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: c_int, h: sighandler_t) -> sighandler_t {
    const SIG_HOLD: sighandler_t = 2;
    if h == SIG_HOLD {
        return real::sigset()(sig, h);
    }
    let mut set: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    libc::sigaddset(&mut set, sig);
    let mut was: libc::sigset_t = std::mem::zeroed();
    libc::sigprocmask(libc::SIG_UNBLOCK, &set, &mut was);
    let old = install_simple(sig, h, 0);
    if old != libc::SIG_ERR && libc::sigismember(&was, sig) == 1 {
        return SIG_HOLD;
    }
    old
}

#[no_mangle]
pub unsafe extern "C" fn siginterrupt(sig: c_int, interrupt: c_int) -> c_int {
    let Some(i) = index(sig) else {
        crate::errno::set_errno(libc::EINVAL);
        return -1;
    };
    let mut a: libc::sigaction = std::mem::zeroed();
    if install(sig, std::ptr::null(), &mut a) < 0 {
        return -1;
    }
    if interrupt != 0 {
        INTERRUPTING.fetch_or(1 << i, Ordering::Relaxed);
        a.sa_flags &= !libc::SA_RESTART;
    } else {
        INTERRUPTING.fetch_and(!(1 << i), Ordering::Relaxed);
        a.sa_flags |= libc::SA_RESTART;
    }
    install(sig, &a, std::ptr::null_mut())
}

/// Whether the last handler that ran on this thread restarts calls
/// (`SA_RESTART`), as its signal's action says now (glibc's own
/// `siginterrupt` changes the flags without the interposed `sigaction`).
fn last_restarts() -> bool {
    let sig = LAST.with(|l| l.get());
    if index(sig).is_none() {
        return false;
    }
    // SAFETY: reading the current action into a local.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        real::sigaction()(sig, std::ptr::null(), &mut a) == 0 && a.sa_flags & libc::SA_RESTART != 0
    }
}

/// Whether socket `id` has a timeout `name` (SO_RCVTIMEO, SO_SNDTIMEO)
/// set: calls with one are not restarted (the kernel's rule).
fn has_timeout(c: &Client, id: u32, name: c_int) -> bool {
    let mut tv = [0u8; std::mem::size_of::<libc::timeval>()];
    match c.getsockopt(id, libc::SOL_SOCKET, name, &mut tv) {
        Ok(n) if n == tv.len() => tv.iter().any(|&b| b != 0),
        _ => false,
    }
}

/// Runs blocking call `f` on socket `id` as the kernel would after a
/// caught signal: EINTR runs it again when the handler has `SA_RESTART`
/// and the socket has no timeout `timeo` (SO_RCVTIMEO, SO_SNDTIMEO) set;
/// any other result is returned.
pub fn restarting<T>(
    c: &Client,
    id: u32,
    timeo: c_int,
    mut f: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    loop {
        match f() {
            Err(e)
                if e.raw_os_error() == Some(libc::EINTR)
                    && last_restarts()
                    && !has_timeout(c, id, timeo) => {}
            r => return r,
        }
    }
}

/// Blocks every signal in the calling thread (the library's own threads).
pub fn block_all_here() {
    // SAFETY: a full set into a local, then this thread's mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}
