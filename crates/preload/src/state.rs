//! The process's attachment to the TCP server and its mode (offloading,
//! falling back to the kernel, failing), the state every interposed call
//! reads. Making the attachment is `attach.rs`; this module only holds it,
//! so that everything above can read it without reaching up.
//!
//! The client lives behind a raw pointer that is never freed: reads are one
//! atomic load on every call, and a forked child simply replaces it with its
//! own attachment (`fork.rs`) without touching the parent's.
//!
//! Attachments are numbered (*epochs*, from 1): after the server died and
//! a new one was attached (`--reattach`, `reattach.rs`) the dead one stays
//! in [`CLIENTS`] under its epoch, valid memory for the sockets that still
//! name it (`fdtable.rs` records each fd's epoch), which fail as the dead
//! server's sockets do (`gone.rs`) and never reach the new server.

use crate::log;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use tcps::Client;

/// What a new TCP socket becomes (`attach::for_new_socket`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// No attach tried yet in this process (or a forked child).
    Untried,
    /// A thread is attaching now.
    Attaching,
    /// Attached: TCP sockets are offloaded.
    Offload,
    /// No server: TCP sockets go to the kernel (`TCPS_FALLBACK=kernel`).
    Kernel,
    /// No server and `TCPS_FALLBACK=fail`: TCP socket() fails.
    Failed,
}

const UNTRIED: u8 = 0;
const ATTACHING: u8 = 1;
const OFFLOAD: u8 = 2;
const KERNEL: u8 = 3;
const FAILED: u8 = 4;

static MODE: AtomicU8 = AtomicU8::new(UNTRIED);

/// How many attachments one process can make in its life (the first and
/// the reattaches after a server died).
pub const MAX_EPOCHS: usize = 1024;
/// The attachment of each epoch (null: none, or a forked child's before it
/// attached).
static CLIENTS: [AtomicPtr<Client>; MAX_EPOCHS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_EPOCHS];
/// The current epoch: new sockets belong to its attachment.
static EPOCH: AtomicU32 = AtomicU32::new(1);
/// The first epoch of the current *group*: a host that uses several
/// servers (`TCPS_REMOTE=a,b`) attaches to each at once, in epochs
/// `GROUP_FIRST..=EPOCH`, all live together (`group.rs`). With one server
/// the group is the current epoch alone.
static GROUP_FIRST: AtomicU32 = AtomicU32::new(1);
/// The servers one host uses at most at once.
pub const MAX_GROUP: usize = 8;
/// Where the next new socket's server is picked from (round robin).
static NEXT_MEMBER: AtomicU32 = AtomicU32::new(0);

pub fn mode() -> Mode {
    match MODE.load(Ordering::Acquire) {
        UNTRIED => Mode::Untried,
        ATTACHING => Mode::Attaching,
        OFFLOAD => Mode::Offload,
        KERNEL => Mode::Kernel,
        _ => Mode::Failed,
    }
}

/// Claims the attach for this thread: true if the mode was untried (the
/// caller attaches now and settles the mode), false if another thread was
/// first.
pub fn begin_attach() -> bool {
    MODE.compare_exchange(UNTRIED, ATTACHING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// After a failed attach: TCP sockets go to the kernel from now on.
pub fn fall_back_to_kernel() {
    MODE.store(KERNEL, Ordering::Release);
}

/// After a failed attach with `TCPS_FALLBACK=fail`: TCP socket() fails.
pub fn fail_tcp_sockets() {
    MODE.store(FAILED, Ordering::Release);
}

/// The current attachment, if this process has one.
pub fn client() -> Option<&'static Client> {
    client_at(epoch())
}

/// The current epoch (the attachment new sockets belong to).
pub fn epoch() -> u32 {
    EPOCH.load(Ordering::Acquire)
}

/// The attachment of `epoch`, if any.
pub fn client_at(epoch: u32) -> Option<&'static Client> {
    let p = CLIENTS.get(epoch as usize)?.load(Ordering::Acquire);
    // SAFETY: a non-null pointer in CLIENTS came from Box::into_raw and is
    // never freed.
    unsafe { p.as_ref() }
}

/// The first epoch of the current group.
pub fn group_first() -> u32 {
    GROUP_FIRST.load(Ordering::Acquire)
}

/// Whether `epoch` is one of the current group's (live together: with one
/// server, the current epoch).
pub fn in_group(epoch: u32) -> bool {
    epoch >= GROUP_FIRST.load(Ordering::Acquire) && epoch <= self::epoch()
}

/// Whether this process uses several servers at once.
pub fn is_group() -> bool {
    GROUP_FIRST.load(Ordering::Acquire) < epoch()
}

/// The current group's attachments (epoch, client), first to last;
/// servers that did not answer (no client) are left out.
pub fn members() -> impl Iterator<Item = (u32, &'static Client)> {
    (GROUP_FIRST.load(Ordering::Acquire)..=epoch()).filter_map(|e| client_at(e).map(|c| (e, c)))
}

/// The place of `epoch` in a group of several (0 for any other epoch): per
/// socket state is kept per place, because every server of a group hands
/// out the same ids (`fdtable.rs`).
pub fn slot(epoch: u32) -> usize {
    let first = GROUP_FIRST.load(Ordering::Acquire);
    if first < self::epoch() && in_group(epoch) {
        (epoch - first) as usize
    } else {
        0
    }
}

/// [`slot`] of attachment `c` (one load without a group).
pub fn slot_of(c: &Client) -> usize {
    if is_group() {
        slot(epoch_of(c))
    } else {
        0
    }
}

/// The attachment a new socket goes to: the next member of the group
/// (round robin) that `usable` accepts; with one server, that one.
pub fn pick_member(usable: impl Fn(&Client) -> bool) -> Option<&'static Client> {
    if !is_group() {
        return client().filter(|c| usable(c));
    }
    let all: Vec<&'static Client> = members().map(|(_, c)| c).collect();
    let start = NEXT_MEMBER.fetch_add(1, Ordering::Relaxed) as usize;
    (0..all.len())
        .map(|i| all[(start + i) % all.len()])
        .find(|&c| usable(c))
}

/// The epoch of attachment `c` (0: not one of this process's).
pub fn epoch_of(c: &Client) -> u32 {
    let cur = epoch().min(MAX_EPOCHS as u32 - 1);
    (1..=cur)
        .rev()
        .find(|&e| client_at(e).is_some_and(|x| std::ptr::eq(x, c)))
        .unwrap_or(0)
}

/// Installs `c` as this process's attachment in the current epoch
/// (leaking any previous one there, which after a fork belongs to the
/// parent).
pub fn install(c: Client) {
    CLIENTS[epoch() as usize].store(Box::into_raw(Box::new(c)), Ordering::Release);
    MODE.store(OFFLOAD, Ordering::Release);
}

/// Installs the attachments of a group of servers (`TCPS_REMOTE=a,b`),
/// one per epoch from the group's first (None: that server did not
/// answer). A forked child installs its own in the same epochs.
pub fn install_group(cs: Vec<Option<Client>>) {
    let first = GROUP_FIRST.load(Ordering::Acquire);
    let n = cs.len().clamp(1, MAX_GROUP) as u32;
    for (e, c) in (first..).zip(cs.into_iter().take(MAX_GROUP)) {
        let p = c.map_or(std::ptr::null_mut(), |c| Box::into_raw(Box::new(c)));
        CLIENTS[e as usize].store(p, Ordering::Release);
    }
    EPOCH.store(first + n - 1, Ordering::Release);
    MODE.store(OFFLOAD, Ordering::Release);
}

/// Installs `c` in a new epoch (a reattach); the dead attachments keep
/// theirs. Refused (c returned) once [`MAX_EPOCHS`] are used.
pub fn install_next(c: Client) -> Result<u32, Client> {
    let next = epoch() + 1;
    if next as usize >= MAX_EPOCHS || is_group() {
        return Err(c);
    }
    CLIENTS[next as usize].store(Box::into_raw(Box::new(c)), Ordering::Release);
    // The group's start first: meanwhile no epoch is live (never two).
    GROUP_FIRST.store(next, Ordering::Release);
    EPOCH.store(next, Ordering::Release);
    MODE.store(OFFLOAD, Ordering::Release);
    Ok(next)
}

/// Forgets the attachment without touching it (a forked child: the
/// parent's channels are not ours). The next TCP call attaches anew, in
/// the same epoch (the inherited sockets keep their ids).
pub fn forget() {
    for e in GROUP_FIRST.load(Ordering::Acquire)..=epoch() {
        CLIENTS[e as usize].store(std::ptr::null_mut(), Ordering::Release);
    }
    MODE.store(UNTRIED, Ordering::Release);
}

/// `TCPS_REATTACH` (`tcps run --reattach`; off unless 1/on/yes/true):
/// after the server died, a new one at the same socket path is attached
/// when it comes (`reattach.rs`).
pub fn reattach_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = tcps::setting_str("TCPS_REATTACH")
            .is_some_and(|v| v.is_ok_and(|v| matches!(v.trim(), "1" | "on" | "yes" | "true")));
        if on && tcps::remote::addresses().len() > 1 {
            log::emit("--reattach does not apply to several servers (TCPS_REMOTE=a,b): a server that dies fails its own sockets, the others carry on");
            return false;
        }
        on
    })
}

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Changes in every forked child: per-thread state made before the fork
/// (poll helpers, sendfile's file handles) belongs to the parent.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// A forked child starts its own generation (`fork.rs`).
pub fn new_generation() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The process (pid) that wants its summary even without an attach: the
/// one `tcps run` started (0: none). A forked child inherits the atexit
/// registration but not this wish (a shell's subshells write no lines).
static SUMMARY_PID: AtomicU32 = AtomicU32::new(0);

/// Registers the summary at exit for this process, attached or not.
pub fn summary_for_this_process() {
    SUMMARY_PID.store(std::process::id(), Ordering::Relaxed);
    at_exit_once();
}

/// Whether this process writes its summary at exit: it attached (or fell
/// back) itself, or it asked for it (`summary_for_this_process`).
fn summary_wanted() -> bool {
    MODE.load(Ordering::Acquire) != UNTRIED
        || SUMMARY_PID.load(Ordering::Relaxed) == std::process::id()
}

/// The summary at exit, registered once per process image (a forked child
/// inherits the registration).
pub fn at_exit_once() {
    static DONE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a plain extern "C" fn with atexit.
    DONE.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
}

/// atexit hook: the summary line and the stats file, if wanted.
extern "C" fn at_exit() {
    if summary_wanted() {
        log::write_exit_summary();
    }
}

/// The process this library's memory belongs to (0: not noted yet): set
/// when the library loads and in a forked child (`fork.rs`).
static OWN_PID: AtomicU32 = AtomicU32::new(0);

/// Notes this process as the owner of the library's memory.
pub fn note_own_process() {
    // SAFETY: getpid(2) takes no arguments and cannot fail.
    let pid = unsafe { libc::syscall(libc::SYS_getpid) } as u32;
    OWN_PID.store(pid, Ordering::Release);
}

/// The pid noted by [`note_own_process`] (0: none).
pub fn own_pid() -> u32 {
    OWN_PID.load(Ordering::Acquire)
}

/// Whether this is a child that shares its parent's memory (made by
/// clone(CLONE_VM), vfork(2) as a system call, or anything else that did
/// not go through this library's fork): every table here is the parent's,
/// so such a child must change none of them, nor talk to the server on the
/// parent's attachment. It makes one system call; callers use it only on
/// paths that touch offloaded sockets or exec.
pub fn in_shared_child() -> bool {
    let own = OWN_PID.load(Ordering::Acquire);
    // SAFETY: as in `note_own_process`.
    own != 0 && own != unsafe { libc::syscall(libc::SYS_getpid) } as u32
}
