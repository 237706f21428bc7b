//! Calls that may have to wait for their socket: accept, recv, send and
//! connect. Each is tried at once; one that would block on a blocking
//! socket is parked on the socket's `readers` (accept, recv) or `writers`
//! (send, connect) queue, in issue order, and the socket is armed in the
//! engine. On readiness the queue is retried front to back.

use super::{arena_bytes, check_quota, complete, insert_socket, write_arena, Ctx, Res, TimerKey};
use crate::engine::Engine;
use crate::host::{Host, Parked, Sock};
use crate::sys::{self, RawAddr};
use crate::token::Token;
use std::cmp::Reverse;
use std::os::fd::AsRawFd;
use std::time::Instant;
use tcps_proto::msg::{ArenaRange, Call};
use tcps_proto::{addr, Op};
use tracing::warn;

enum Step {
    Done(Res),
    /// Would block: park (or stay parked) and wait for readiness.
    Again,
}

const RECV_FLAGS: i32 =
    libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_DONTWAIT | libc::MSG_OOB | libc::MSG_TRUNC;
const SEND_FLAGS: i32 = libc::MSG_DONTWAIT
    | libc::MSG_MORE
    | libc::MSG_NOSIGNAL
    | libc::MSG_OOB
    | libc::MSG_DONTROUTE
    | libc::MSG_EOR;

pub(super) fn start(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    op: Op,
    call: Call,
    sid: u32,
) {
    let (flags, is_reader) = match call {
        Call::Recv { flags, .. } => (flags, true),
        Call::Send { flags, .. } => (flags, false),
        Call::Accept { .. } => (0, true),
        _ => (0, false),
    };
    let allowed = match call {
        Call::Recv { .. } => RECV_FLAGS,
        Call::Send { .. } => SEND_FLAGS,
        _ => 0,
    };
    if flags & !allowed != 0 {
        return complete(host, ch, user_data, op, Err(libc::EINVAL));
    }
    let Some(sock) = host.socket(sid) else {
        return complete(host, ch, user_data, op, Err(libc::EBADF));
    };
    let nonblocking = sock.nonblocking || flags & libc::MSG_DONTWAIT != 0;
    let queued = if is_reader {
        !sock.readers.is_empty()
    } else {
        !sock.writers.is_empty()
    };
    let mut p = Parked {
        ch,
        user_data,
        op,
        call,
        progress: 0,
        nonblocking,
        serial: 0,
    };
    let step = if queued {
        // Earlier calls on this socket wait: keep the issue order.
        if nonblocking {
            Step::Done(Err(libc::EAGAIN))
        } else {
            Step::Again
        }
    } else if let Call::Connect { addr, .. } = call {
        start_connect(host, sid, &mut p, addr)
    } else {
        attempt(cx, host, sid, &mut p)
    };
    match step {
        Step::Done(res) => complete(host, ch, user_data, op, res),
        Step::Again => park(cx, host, sid, p, is_reader),
    }
}

/// Tells the host's waiting thread that its call is parked (it stops spinning).
pub(super) fn announce_parked(host: &Host, ch: u32, user_data: u64) {
    if let Some(c) = host.region.channel(ch) {
        host.cursors[ch as usize].mark_parked(&c, user_data);
    }
}

fn park(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, mut p: Parked, is_reader: bool) {
    host.stats.parked += 1;
    announce_parked(host, p.ch, p.user_data);
    let hkey = cx.hkey;
    let Some(sock) = host.socket_mut(sid) else {
        return;
    };
    *cx.next_serial += 1;
    p.serial = *cx.next_serial;
    let timeout = if is_reader {
        sock.rcv_timeout
    } else {
        sock.snd_timeout
    };
    if let Some(t) = timeout {
        cx.timers.push(Reverse((
            Instant::now() + t,
            hkey,
            p.serial,
            TimerKey::Call { sock: sid },
        )));
    }
    if is_reader {
        sock.readers.push_back(p);
    } else {
        sock.writers.push_back(p);
    }
    rearm(cx.engine, hkey, sid, sock);
}

/// Arms the socket for what its parked calls wait on, unless already armed.
pub(super) fn rearm(engine: &mut dyn Engine, hkey: usize, sid: u32, sock: &mut Sock) {
    let want = sock.wanted_mask();
    if want == 0 || sock.armed_mask & want == want {
        return;
    }
    let mask = want | sock.armed_mask;
    sock.arm_seq = sock.arm_seq.wrapping_add(1);
    let token = Token::Socket {
        host: hkey,
        sock: sid as usize,
        gen: sock.gen,
        seq: sock.arm_seq,
    };
    match engine.arm(sock.fd.as_raw_fd(), token.encode(), mask) {
        Ok(()) => sock.armed_mask = mask,
        Err(e) => warn!(error = %e, "engine could not arm a socket"),
    }
}

fn would_block(p: &Parked) -> Step {
    if p.nonblocking {
        Step::Done(Err(libc::EAGAIN))
    } else {
        Step::Again
    }
}

fn start_connect(host: &Host, sid: u32, p: &mut Parked, a: ArenaRange) -> Step {
    let Some(s) = host.socket(sid) else {
        return Step::Done(Err(libc::EBADF));
    };
    let bytes = arena_bytes(host, p.ch, a);
    if let Err(e) = addr::parse(&bytes) {
        return Step::Done(Err(match e {
            addr::AddrError::TooShort => libc::EINVAL,
            addr::AddrError::UnsupportedFamily(_) => libc::EAFNOSUPPORT,
        }));
    }
    match sys::connect(s.fd.as_raw_fd(), &RawAddr::from_bytes(&bytes)) {
        Ok(()) => Step::Done(Ok((0, 0))),
        Err(libc::EINPROGRESS) if p.nonblocking => Step::Done(Err(libc::EINPROGRESS)),
        Err(libc::EINPROGRESS) => {
            p.progress = 1;
            Step::Again
        }
        Err(e) => Step::Done(Err(e)),
    }
}

/// Tries a parked (or new) accept, recv, send or connect once more.
fn attempt(cx: &Ctx<'_>, host: &mut Host, sid: u32, p: &mut Parked) -> Step {
    let Some(fd) = host.socket(sid).map(|s| s.fd.as_raw_fd()) else {
        return Step::Done(Err(libc::EBADF));
    };
    match p.call {
        Call::Accept { addr, flags, .. } => {
            // Refuse before accepting: the connection stays in the backlog.
            if let Err(e) = check_quota(cx, host) {
                return Step::Done(Err(e));
            }
            match sys::accept(fd) {
                Ok((nfd, peer)) => {
                    let id = match insert_socket(cx, host, nfd, flags & libc::SOCK_NONBLOCK != 0) {
                        Ok(id) => id,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let len = write_arena(host, p.ch, addr, peer.as_bytes());
                    Step::Done(Ok((id as i64, len)))
                }
                Err(libc::EAGAIN) | Err(libc::ECONNABORTED) | Err(libc::EINTR) => would_block(p),
                Err(e) => Step::Done(Err(e)),
            }
        }
        Call::Recv { data, flags, .. } => {
            let Some(base) = host.region.channel(p.ch).and_then(|c| c.arena_ptr(data)) else {
                return Step::Done(Err(libc::EFAULT));
            };
            let total = data.len as usize;
            if total == 0 {
                return Step::Done(Ok((0, 0)));
            }
            let waitall = flags & libc::MSG_WAITALL != 0 && flags & libc::MSG_PEEK == 0;
            loop {
                // SAFETY: base..base+total is a checked range of the host's
                // arena, mapped for the life of `host`; progress < total.
                let r = unsafe {
                    sys::recv(
                        fd,
                        base.add(p.progress),
                        total - p.progress,
                        flags & !libc::MSG_WAITALL,
                    )
                };
                match r {
                    Ok(0) => return Step::Done(Ok((p.progress as i64, 0))),
                    Ok(n) => {
                        p.progress += n;
                        host.stats.bytes_received += n as u64;
                        if p.progress == total || !waitall {
                            return Step::Done(Ok((p.progress as i64, 0)));
                        }
                    }
                    Err(libc::EINTR) => {}
                    Err(libc::EAGAIN) if p.progress > 0 && (p.nonblocking || !waitall) => {
                        return Step::Done(Ok((p.progress as i64, 0)))
                    }
                    Err(libc::EAGAIN) => return would_block(p),
                    Err(_) if p.progress > 0 => return Step::Done(Ok((p.progress as i64, 0))),
                    Err(e) => return Step::Done(Err(e)),
                }
            }
        }
        Call::Send { data, flags, .. } => {
            let Some(base) = host.region.channel(p.ch).and_then(|c| c.arena_ptr(data)) else {
                return Step::Done(Err(libc::EFAULT));
            };
            let total = data.len as usize;
            loop {
                if p.progress == total {
                    return Step::Done(Ok((total as i64, 0)));
                }
                // SAFETY: as for recv; the kernel only reads the range.
                match unsafe { sys::send(fd, base.add(p.progress), total - p.progress, flags) } {
                    Ok(n) => {
                        p.progress += n;
                        host.stats.bytes_sent += n as u64;
                    }
                    Err(libc::EINTR) => {}
                    Err(libc::EAGAIN) if p.nonblocking && p.progress > 0 => {
                        return Step::Done(Ok((p.progress as i64, 0)))
                    }
                    Err(libc::EAGAIN) => return would_block(p),
                    Err(_) if p.progress > 0 => return Step::Done(Ok((p.progress as i64, 0))),
                    Err(e) => return Step::Done(Err(e)),
                }
            }
        }
        Call::Connect { .. } => match sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) if sys::getpeername(fd).is_ok() => Step::Done(Ok((0, 0))),
            Ok(0) => Step::Again,
            Ok(e) | Err(e) => Step::Done(Err(e)),
        },
        _ => Step::Done(Err(libc::EINVAL)),
    }
}

/// Retries the parked calls of one queue in order until one would block.
fn drive(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, readers: bool) {
    loop {
        let Some(sock) = host.socket_mut(sid) else {
            return;
        };
        let q = if readers {
            &mut sock.readers
        } else {
            &mut sock.writers
        };
        let Some(mut p) = q.pop_front() else { return };
        match attempt(cx, host, sid, &mut p) {
            Step::Done(res) => complete(host, p.ch, p.user_data, p.op, res),
            Step::Again => {
                if let Some(sock) = host.socket_mut(sid) {
                    let q = if readers {
                        &mut sock.readers
                    } else {
                        &mut sock.writers
                    };
                    q.push_front(p);
                }
                return;
            }
        }
    }
}

/// The engine reported readiness on a socket.
pub fn on_socket_ready(cx: &mut Ctx<'_>, host: &mut Host, sid: usize, gen: u16, seq: u8) {
    let sid32 = sid as u32;
    let Some(sock) = host.socket_mut(sid32) else {
        return;
    };
    if sock.gen != gen || sock.arm_seq != seq {
        return; // stale: the socket was closed or re-armed since
    }
    sock.armed_mask = 0;
    drive(cx, host, sid32, true);
    drive(cx, host, sid32, false);
    let pollers: Vec<usize> = host
        .socket(sid32)
        .map(|s| s.pollers.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    for pkey in pollers {
        super::poll::recheck(host, pkey);
    }
    let hkey = cx.hkey;
    if let Some(sock) = host.socket_mut(sid32) {
        rearm(cx.engine, hkey, sid32, sock);
    }
}

/// SO_RCVTIMEO / SO_SNDTIMEO expired for a parked call: it returns what it
/// moved so far, or EAGAIN (as a blocking kernel socket with a timeout does).
pub fn on_call_timeout(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, serial: u64) {
    let Some(sock) = host.socket_mut(sid) else {
        return;
    };
    let found = [&mut sock.readers, &mut sock.writers]
        .into_iter()
        .find_map(|q| {
            q.iter()
                .position(|p| p.serial == serial)
                .and_then(|i| q.remove(i))
        });
    let Some(p) = found else {
        return; // completed meanwhile
    };
    let res = match p.call {
        Call::Send { .. } | Call::Recv { .. } if p.progress > 0 => Ok((p.progress as i64, 0)),
        Call::Connect { .. } => Err(libc::EINPROGRESS),
        _ => Err(libc::EAGAIN),
    };
    complete(host, p.ch, p.user_data, p.op, res);
    let hkey = cx.hkey;
    if let Some(sock) = host.socket_mut(sid) {
        rearm(cx.engine, hkey, sid, sock);
    }
}
