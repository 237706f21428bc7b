//! Pull sockets: receiving ahead into a pull buffer at the server (sockets
//! without a receive ring, or `TCPS_EAGER_RECV` 1), and answering `Recv`
//! requests from it.

use super::pullbuf::{PullBuf, PullEnd, PullTake, PULL_PROBE};
use super::ring::{note_paused, Eager};
use crate::host::Host;
use std::os::fd::AsRawFd;

pub(crate) fn start_pull(host: &mut Host, sid: u32) {
    let account = host.pull.clone();
    if let Some(s) = host.socket_mut(sid) {
        s.eager = Eager::Pull(PullBuf::new(s.policy.recv_size as usize, account));
    }
}

pub(crate) fn fill_pull(host: &mut Host, sid: u32) -> bool {
    let Host {
        sockets,
        stats,
        eager_paused,
        arrivals,
        ..
    } = host;
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return false;
    };
    let fd = sock.fd.as_raw_fd();
    let Eager::Pull(pb) = &mut sock.eager else {
        return false;
    };
    if pb.end.is_some() {
        return false;
    }
    let start = pb.len();
    pb.throttled = false;
    loop {
        if pb.lo == pb.hi {
            pb.lo = 0;
            pb.hi = 0;
        }
        let want = pb.cap.saturating_sub(pb.len());
        if want == 0 {
            break;
        }
        if pb.hi == pb.buf.len() && pb.lo > 0 {
            pb.buf.copy_within(pb.lo..pb.hi, 0);
            pb.hi -= pb.lo;
            pb.lo = 0;
        }
        // Room allocated; or a buffer holding bytes (data is flowing)
        // grows first; an empty one reads into a probe first.
        let step = if pb.hi < pb.buf.len() || (pb.hi > 0 && pb.grow(PULL_PROBE.min(want))) {
            pb.recv_into(fd, want)
        } else if pb.account.room() < PULL_PROBE.min(want) {
            // At the host's budget: read ahead no more (see `PullBuf`).
            pb.throttled = true;
            note_paused(eager_paused, sid);
            break;
        } else {
            pb.probe_into(fd, want)
        };
        match step {
            Ok((k, asked)) => {
                stats.bytes_eager += k as u64;
                stats.bytes_received += k as u64;
                if k < asked {
                    break; // a short read: drained (see above FILL_BUDGET_RINGS)
                }
            }
            Err(None) => break,
            Err(Some(end)) => {
                pb.end = Some(end);
                break;
            }
        }
    }
    let moved = pb.len() != start || pb.end.is_some();
    if moved && start == 0 {
        pb.since = crate::arrival::Arrival::next(arrivals);
    }
    moved
}

/// Takes up to `len` bytes of socket `sid`'s pull buffer into `dst`.
///
/// # Safety
/// `dst..dst+len` must be memory the server may write (a checked arena or
/// registered range).
pub(crate) unsafe fn pull_take(
    host: &mut Host,
    sid: u32,
    dst: *mut u8,
    len: usize,
    flags: i32,
) -> PullTake {
    let Some(Eager::Pull(pb)) = host.sockets.get_mut(sid as usize).map(|s| &mut s.eager) else {
        return PullTake::Empty;
    };
    if flags & libc::MSG_OOB != 0 {
        return PullTake::Empty;
    }
    if pb.len() == 0 {
        return match pb.end {
            None => PullTake::Empty,
            Some(e) => {
                if let PullEnd::Error(_) = e {
                    // Reported once; later recvs see end of file.
                    pb.end = Some(PullEnd::Eof);
                }
                PullTake::End(e)
            }
        };
    }
    let n = pb.len().min(len);
    if flags & libc::MSG_TRUNC == 0 {
        // SAFETY: the caller guarantees dst..dst+len; n <= len and
        // lo..lo+n is inside buf.
        unsafe { std::ptr::copy_nonoverlapping(pb.buf.as_ptr().add(pb.lo), dst, n) };
    }
    if flags & libc::MSG_PEEK == 0 {
        pb.lo += n;
        pb.free_if_drained();
    }
    PullTake::Data(n)
}

/// Whether socket `sid` is a pull socket the kernel serves meanwhile (empty
/// and stopped by its host's budget): a `Recv` goes to the kernel.
pub(crate) fn pull_deferring(host: &Host, sid: u32) -> bool {
    matches!(host.sockets.get(sid as usize).map(|s| &s.eager), Some(Eager::Pull(p)) if p.deferring())
}
