//! A host that uses several TCP servers at once (`TCPS_REMOTE=a,b`): the
//! process attaches to each (one attachment per server, each in an epoch
//! of its own: `state.rs`), new sockets go to them in turn, and a listener
//! is opened on every one of them, so that connections arriving at any
//! server node reach the program.
//!
//! The program's listener fd names the socket it made (the *main* one);
//! the same listener at the other servers are its *siblings*, made by
//! [`open_siblings`] when the program calls listen: same address and port,
//! same options. `accept` takes from any of them (`sock.rs`), waits watch
//! all of them (`poll.rs`, `epoll`), options set later and the final close
//! reach all of them.
//!
//! A server that dies (or whose link is cut) fails only its own sockets,
//! each reporting a reset once as after a single server's death
//! (`gone.rs`); a listener whose main socket was there moves to its first
//! live sibling (its fds name that socket from then on, `fdtable::rebind`),
//! and new sockets go to the servers that are left.

use crate::log::{self, debug};
use crate::{fdtable, state};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tcps::Client;

/// A listener opened on several servers: its main socket and its siblings
/// (epoch, id).
struct Listener {
    main: (u32, u32),
    others: Vec<(u32, u32)>,
}

static LISTENERS: Mutex<Vec<Listener>> = Mutex::new(Vec::new());

fn listeners() -> std::sync::MutexGuard<'static, Vec<Listener>> {
    LISTENERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Held across fork (`fork.rs`): the child must not inherit it locked.
pub fn lock_for_fork() -> impl Sized {
    listeners()
}

/// Bumped whenever a socket's fds moved to another server's socket or a
/// member died: waits look at their entries again (`epoll`).
static MOVES: AtomicU32 = AtomicU32::new(0);

pub fn moves() -> u32 {
    MOVES.load(Ordering::Acquire)
}

/// The members whose death was announced (bit per group place).
static ANNOUNCED: AtomicU32 = AtomicU32::new(0);

/// The fabric address of the group's member in `epoch`.
fn address_of(epoch: u32) -> String {
    tcps::remote::addresses()
        .get(state::slot(epoch))
        .cloned()
        .unwrap_or_else(|| format!("#{epoch}"))
}

/// Options a listener's siblings copy from its main socket at listen (the
/// ones that shape the listener and what it accepts).
const COPIED: [(i32, i32); 6] = [
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
    (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
];

/// Listener `id` of `c` listens now: opens it on every other live member
/// too (same address, port and options; non-blocking there, as is the main
/// socket from now on: the preload does the blocking, `sock.rs`). A member
/// that refuses (the address does not exist on its node, the port is
/// taken) is left out and logged.
pub fn open_siblings(c: &Client, id: u32, backlog: i32) {
    let mut addr = [0u8; 128];
    let Ok(len) = c.getsockname_raw(id, &mut addr) else {
        return;
    };
    let addr = &addr[..len.min(addr.len())];
    let [f0, f1, ..] = *addr else {
        return;
    };
    let family = i32::from(u16::from_ne_bytes([f0, f1]));
    let opts: Vec<(i32, i32, i32)> = COPIED
        .iter()
        .filter(|&&(level, _)| level != libc::IPPROTO_IPV6 || family == libc::AF_INET6)
        .filter_map(|&(l, n)| c.getsockopt_int(id, l, n).ok().map(|v| (l, n, v)))
        .collect();
    let main = state::epoch_of(c);
    let mut others = Vec::new();
    for (e, m) in state::members().filter(|&(e, m)| e != main && m.is_attached()) {
        match open_one(m, family, addr, &opts, backlog) {
            Ok(sid) => {
                fdtable::id_state_at(e, sid).siblings.store(1, Ordering::Relaxed);
                others.push((e, sid));
            }
            Err(err) => log::emit(&format!(
                "listen: the TCP server at {} refused this listener ({err}); it listens on the others",
                address_of(e)
            )),
        }
    }
    if others.is_empty() {
        return;
    }
    if let Err(e) = c.set_nonblocking(id, true) {
        debug!("listen: socket {id} stays blocking at its server: {e}");
    }
    fdtable::id_state_at(main, id)
        .siblings
        .store(1, Ordering::Relaxed);
    debug!("listen: tcps socket {id} also listens as {others:?} (epoch, id)");
    listeners().push(Listener {
        main: (main, id),
        others,
    });
}

/// The sibling of a listener at member `m`: socket, options, bind, listen.
fn open_one(
    m: &Client,
    family: i32,
    addr: &[u8],
    opts: &[(i32, i32, i32)],
    backlog: i32,
) -> std::io::Result<u32> {
    let sid = m.socket(family, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)?;
    let made = (|| {
        for &(l, n, v) in opts {
            if let Err(e) = m.setsockopt_int(sid, l, n, v) {
                debug!("listen: option {l}/{n} not copied to a sibling: {e}");
            }
        }
        m.bind_raw(sid, addr)?;
        m.listen(sid, backlog)
    })();
    match made {
        Ok(()) => Ok(sid),
        Err(e) => {
            let _ = m.close(sid);
            Err(e)
        }
    }
}

/// The siblings of socket `id` of attachment `epoch`, if it is a listener
/// opened on several servers (None for any other socket: one load). Its
/// main socket is non-blocking at its server: the preload blocks for it.
pub fn siblings(epoch: u32, id: u32) -> Option<Vec<(u32, u32)>> {
    if fdtable::id_state_at(epoch, id)
        .siblings
        .load(Ordering::Relaxed)
        == 0
    {
        return None;
    }
    listeners()
        .iter()
        .find(|l| l.main == (epoch, id))
        .map(|l| l.others.clone())
}

/// The last fd of listener `id` of `epoch` closed: its siblings close too.
pub fn close_siblings(epoch: u32, id: u32) {
    if fdtable::id_state_at(epoch, id)
        .siblings
        .load(Ordering::Relaxed)
        == 0
    {
        return;
    }
    let gone = {
        let mut all = listeners();
        let Some(i) = all.iter().position(|l| l.main == (epoch, id)) else {
            return;
        };
        all.swap_remove(i)
    };
    for (e, sid) in gone.others {
        if let Some(m) = state::client_at(e) {
            let _ = m.close(sid);
        }
    }
}

/// An option set on listener `id` of `epoch` after it listened: its
/// siblings get it too (best effort, as at listen).
pub fn set_option(epoch: u32, id: u32, level: i32, name: i32, value: &[u8]) {
    for (e, sid) in siblings(epoch, id).unwrap_or_default() {
        if let Some(m) = state::client_at(e) {
            if let Err(err) = m.setsockopt(sid, level, name, value) {
                debug!("setsockopt {level}/{name} not copied to sibling {sid}: {err}");
            }
        }
    }
}

/// The member in `epoch` died (noticed by `gone::gone`): said once; each
/// listener whose main socket was there moves to its first live sibling.
pub fn member_gone(epoch: u32) {
    let bit = 1u32 << (state::slot(epoch) % 32);
    if ANNOUNCED.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
        return;
    }
    let left = state::members().any(|(_, m)| m.is_attached());
    log::emit(&format!(
        "the tcps server at {} is gone: its sockets report a reset once; {}",
        address_of(epoch),
        if left {
            "the other servers carry on"
        } else {
            "no server is left: new sockets follow --fallback"
        }
    ));
    let mut all = listeners();
    for l in all.iter_mut() {
        l.others.retain(|&(e, _)| e != epoch);
        if l.main.0 != epoch {
            continue;
        }
        let live = l
            .others
            .iter()
            .position(|&(e, _)| state::client_at(e).is_some_and(Client::is_attached));
        let Some(i) = live else { continue };
        let (ne, nid) = l.others.remove(i);
        let moved = fdtable::rebind(l.main.0, l.main.1, ne, nid);
        debug!(
            "listener {:?} moved to sibling ({ne}, {nid}) at {}: {moved} fds",
            l.main,
            address_of(ne)
        );
        l.main = (ne, nid);
    }
    for l in all.iter() {
        // (A sibling that became main was counted afresh by the rebind.)
        let st = fdtable::id_state_at(l.main.0, l.main.1);
        st.siblings.store(1, Ordering::Relaxed);
    }
    MOVES.fetch_add(1, Ordering::AcqRel);
}
