//! accept on a listener opened on several servers (`group.rs`): a
//! connection from whichever server has one, in turn, so that no server's
//! backlog starves; a blocking accept sleeps on every server's accept ring
//! at once (`tcps::sleep_on_many`). The listener's sockets are all
//! non-blocking at their servers; the blocking is done here.

use crate::{fdtable, gone, group, state};
use libc::c_int;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use tcps::Client;

/// How long one sleep lasts before the servers are looked at again (a
/// server that died without a word is noticed by then).
const SLICE_MS: i32 = 100;

/// Where the next accept starts looking (round robin over the servers).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// What an accept took: from which server, the connection, the address's
/// full length.
type Took = (&'static Client, u32, tcps::Accepted, usize);

/// The live sockets of listener `id` of `c` (its main socket and its
/// siblings), starting at the next in turn.
fn live_sockets(c: &'static Client, id: u32) -> Vec<(&'static Client, u32)> {
    let sibs = group::siblings(state::epoch_of(c), id).unwrap_or_default();
    let mut all: Vec<(&'static Client, u32)> = std::iter::once((c, id))
        .chain(
            sibs.into_iter()
                .filter_map(|(e, s)| state::client_at(e).map(|m| (m, s))),
        )
        .filter(|(m, _)| !gone::gone(m))
        .collect();
    if !all.is_empty() {
        let n = all.len();
        all.rotate_left(NEXT.fetch_add(1, Ordering::Relaxed) as usize % n);
    }
    all
}

/// One try at each live socket; `Ok(None)`: none had a connection.
fn try_each(
    socks: &[(&'static Client, u32)],
    flags: c_int,
    buf: &mut [u8],
) -> io::Result<Option<Took>> {
    for &(m, s) in socks {
        match m.accept_any(s, flags, buf) {
            Ok((a, full)) => return Ok(Some((m, s, a, full))),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            // Its server died meanwhile: the others may still have one.
            Err(_) if gone::gone(m) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Sleeps until an accept ring of `socks` moves (or a slice passes).
fn sleep(socks: &[(&'static Client, u32)]) -> io::Result<()> {
    let mut fds: Vec<[tcps::PollFd; 1]> = socks
        .iter()
        .map(|&(_, sock)| {
            [tcps::PollFd {
                sock,
                events: libc::POLLIN,
                revents: 0,
            }]
        })
        .collect();
    let mut parts: Vec<(&Client, &mut [tcps::PollFd])> = socks
        .iter()
        .zip(fds.iter_mut())
        .map(|(&(m, _), f)| (m, &mut f[..]))
        .collect();
    // (No POLLOUT here: no room to judge.)
    if !tcps::sleep_on_rings_many(&mut parts, &mut [], SLICE_MS, &|_, _| false)? {
        // Cannot sleep on the rings (no doorbell slot free): a short nap.
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(())
}

/// accept4 on listener `id` of `c` (placeholder `fd`), opened on several
/// servers: the server and listener socket that had the connection, the
/// connection, the address's full length (in `buf`). Err(ERESTART) when
/// the listener's fd moved to another server's socket meanwhile (its
/// server died: `group.rs`): accept again.
pub fn take(
    fd: c_int,
    c: &'static Client,
    id: u32,
    flags: c_int,
    buf: &mut [u8],
) -> io::Result<Took> {
    let epoch = state::epoch_of(c);
    // SAFETY: F_GETFL on the placeholder, which carries O_NONBLOCK.
    let fl = unsafe { crate::real::fcntl()(fd, libc::F_GETFL) };
    let nonblock = flags & libc::SOCK_NONBLOCK != 0 || (fl >= 0 && fl & libc::O_NONBLOCK != 0);
    crate::signals::restarting(c, id, libc::SO_RCVTIMEO, || loop {
        if fdtable::lookup_at(fd) != Some((epoch, id)) {
            return Err(io::Error::from_raw_os_error(libc::ERESTART));
        }
        let socks = live_sockets(c, id);
        if socks.is_empty() {
            // Every server of the listener is gone: as after one's death.
            // A blocking one sleeps until a signal.
            let e = match gone::accept_error(fd, c, id, nonblock) {
                Some(e) => e,
                None => match crate::reattach::wait_taken_over(fd, epoch, id) {
                    Ok(()) => continue,
                    Err(e) => e,
                },
            };
            return Err(io::Error::from_raw_os_error(e));
        }
        if let Some(t) = try_each(&socks, flags, buf)? {
            return Ok(t);
        }
        if nonblock {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        sleep(&socks)?;
    })
}
