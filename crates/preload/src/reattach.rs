//! `tcps run --reattach` (`TCPS_REATTACH=1`): after the TCP server died, a
//! server that comes back at the same socket path is attached again, and
//! the program goes on with only the connections of the moment lost.
//!
//! Attempts are made when the program makes a new TCP socket and from the
//! waits that found their sockets dead (a blocked `accept`, `epoll_wait`,
//! `poll`/`select`, which then sleep in slices of [`EVERY`]), at most one
//! every [`EVERY`] in the process (every [`REFUSED_EVERY`] while a server
//! answers and refuses): no busy loop while no server answers, and new
//! sockets follow `--fallback` meanwhile.
//!
//! The new attachment is a new epoch (`state.rs`). The dead one's sockets
//! keep it, report their reset once and never reach the new server
//! (`gone.rs`). Its **listeners** are taken over: the process holds its own
//! descriptor of each (`tcps::Client::kernel_fds`), so the kernel socket
//! outlived the server with its address, options (SO_REUSEADDR,
//! SO_REUSEPORT, ...), backlog and the connections waiting in its queue;
//! the new server adopts it (`tcps::Client::readopt_listener`) and every fd
//! naming it moves to the new socket id (`fdtable::rebind`), so epoll sets
//! and blocked accepts watching it see connections again. A forked child
//! (an nginx worker) holds its own descriptor of an inherited listener and
//! takes it over in its own attachment: the server then accepts on one
//! kernel listener for several processes, as the kernel shares it between
//! them.

use crate::log::{debug, warning};
use crate::{attach, fdtable, real, state};
use libc::c_int;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two attempts, and the longest slice a dead
/// wait sleeps before it tries.
pub const EVERY: Duration = Duration::from_millis(200);

/// The time between attempts while a server answers and refuses.
const REFUSED_EVERY: Duration = Duration::from_secs(5);

/// Milliseconds (since [`start`]) before which no attempt is made.
static NEXT_TRY: AtomicU64 = AtomicU64::new(0);
/// One attempt at a time.
static BUSY: Mutex<()> = Mutex::new(());

fn start() -> Instant {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *T0.get_or_init(Instant::now)
}

/// Whether this process has a live attachment now (after attaching a
/// server that came back, if `--reattach` and it is time to try).
pub fn try_now() -> bool {
    if !state::reattach_enabled() {
        return false;
    }
    match state::client() {
        Some(c) if c.is_attached() => return true,
        // Never attached yet: `attach.rs`'s first attach.
        None if matches!(state::mode(), state::Mode::Untried | state::Mode::Attaching) => {
            return false
        }
        _ => {}
    }
    let now = start().elapsed().as_millis() as u64;
    let next = NEXT_TRY.load(Ordering::Relaxed);
    if now < next
        || NEXT_TRY
            .compare_exchange(
                next,
                now + EVERY.as_millis() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return false;
    }
    let Ok(_one) = BUSY.try_lock() else {
        return false;
    };
    if state::client().is_some_and(|c| c.is_attached()) {
        return true;
    }
    match attach::attach_again() {
        Ok(c) => adopt(c),
        Err(e) => {
            if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
                refused_warning(&e);
            }
            debug!("reattach: no TCP server yet ({e})");
            if !matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) {
                // A server answered and refused (full, permissions): ask
                // it less often, its log is not to be flooded.
                let later = start().elapsed() + REFUSED_EVERY;
                NEXT_TRY.store(later.as_millis() as u64, Ordering::Relaxed);
            }
            false
        }
    }
}

/// Once per process: the server that is back refuses this process's user
/// (a program that dropped privileges after it attached, as nginx's
/// workers do: they inherited their parent's attachment, and must attach
/// on their own now).
fn refused_warning(e: &std::io::Error) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        warning!(
            "reattach: the TCP server that is back refuses this process (uid {uid}): {e}; \
             a program that runs as another user than it started as (nginx's workers) \
             needs the socket open to that user: tcps server --socket-group GROUP (or --socket-mode 666)"
        );
    });
}

/// Installs `c` as the new attachment and takes the dead one's listeners
/// over.
fn adopt(c: tcps::Client) -> bool {
    let first = state::client().is_none();
    let epoch = if first {
        state::install(c);
        state::epoch()
    } else {
        match state::install_next(c) {
            Ok(e) => e,
            Err(c) => {
                warning!(
                    "reattach: {} attachments made already; no more",
                    state::MAX_EPOCHS - 1
                );
                c.detach();
                return false;
            }
        }
    };
    state::at_exit_once();
    let Some(new) = state::client_at(epoch) else {
        return false;
    };
    let (mut taken, mut lost) = (0, 0);
    let mut seen = BTreeSet::new();
    for (fd, e, id) in fdtable::all_at() {
        if e == epoch || !seen.insert((e, id)) {
            continue;
        }
        let Some(old) = state::client_at(e).filter(|o| !o.is_attached()) else {
            continue;
        };
        let Some(backlog) = old.listener_backlog(id) else {
            continue;
        };
        // SAFETY: F_GETFL on the placeholder, which carries O_NONBLOCK.
        let fl = unsafe { real::fcntl()(fd, libc::F_GETFL) };
        let nonblocking = fl >= 0 && fl & libc::O_NONBLOCK != 0;
        match new.readopt_listener(old, id, backlog, nonblocking) {
            Ok(nid) if fdtable::fits(fd, nid) && fdtable::rebind(e, id, epoch, nid) > 0 => {
                debug!("reattach: listener fd {fd} (socket {id} of attachment {e}) is socket {nid} now");
                taken += 1;
            }
            Ok(nid) => {
                let _ = new.close(nid);
            }
            Err(err) => {
                warning!("reattach: listener fd {fd} cannot be taken over: {err}");
                lost += 1;
            }
        }
    }
    fdtable::note_rescan();
    // One line per reattach, as for the death (`gone.rs`).
    if first {
        crate::log::emit("a tcps server answers now: new sockets are offloaded (--reattach)");
        return true;
    }
    crate::log::emit(&format!(
        "a tcps server is back (attachment {epoch}): {taken} listeners taken over{}; new sockets are offloaded",
        if lost > 0 { format!(", {lost} lost") } else { String::new() }
    ));
    true
}

/// The longest a dead wait sleeps before it tries again: `timeout_ms`
/// (<0: forever) capped at [`EVERY`] with `--reattach`.
pub fn slice(timeout_ms: c_int) -> c_int {
    if !state::reattach_enabled() {
        return timeout_ms;
    }
    let every = EVERY.as_millis() as c_int;
    if timeout_ms < 0 {
        every
    } else {
        timeout_ms.min(every)
    }
}

/// A blocking `accept` on dead listener `fd` (socket `id` of attachment
/// `epoch`): sleeps until a new attachment took it over (`Ok`), or a
/// signal (EINTR). Without `--reattach`, until a signal.
pub fn wait_taken_over(fd: c_int, epoch: u32, id: u32) -> Result<(), i32> {
    loop {
        if fdtable::lookup_at(fd) != Some((epoch, id)) {
            return Ok(());
        }
        // SAFETY: a poll on no descriptors: sleeps for the slice or until
        // a signal.
        let r = unsafe { real::poll()(std::ptr::null_mut(), 0, slice(-1)) };
        if r < 0 && crate::errno::last_errno() == libc::EINTR {
            return Err(libc::EINTR);
        }
        try_now();
    }
}
