//! Executing host calls on kernel sockets.
//!
//! Every call is tried at once with a non-blocking syscall. A call that
//! would block on a blocking socket is *parked* on its socket (accept/recv
//! on `readers`, send/connect on `writers`, in issue order) and its
//! descriptor armed in the engine; when the engine reports readiness the
//! parked calls are retried in order. So one waiting socket never delays
//! another, and calls on one socket complete in the order they were issued.
//!
//! Data moves straight between the kernel and the host's arena: `send`
//! reads from it and `recv` writes into it, with no buffer at the server.

//! Layers, bottom up (a file imports only the ones below it): `common`
//! (context, completions, the socket table, arming); `eager::{pullbuf,
//! ring, recv, pull}`, `sendq::queue`; `eager::{setup, accept}`, `eager`
//! (`fill`); `finish`, `poll`, `options`; `eager::handover`, `close`;
//! `attempt`; `blocking`; `sendq`, `eager::sweep`; this file (the
//! dispatcher, the sweep and the timers), used by the worker.

mod attempt;
mod blocking;
mod close;
pub(crate) mod common;
pub(crate) mod eager;
mod finish;
mod options;
mod poll;
pub(crate) mod sendq;

pub use blocking::on_socket_ready;
pub(crate) use close::{close_all, take_for_export};
pub use common::{complete, wake_owed, Ctx, Res, TimerKey, Timers};
pub use eager::sweep::on_received;
pub use sendq::poll_queues;
pub use sendq::queue::prepare_sleep;
pub use sendq::sent::on_sent;
// A hot upgrade answers parked calls and polls (`upgrade::quiesce`).
pub(crate) use finish::finish;
pub(crate) use poll::finish_poll;

use crate::host::Host;
use crate::sys;
use std::time::Instant;
use tcps_proto::msg::Call;
use tcps_proto::{Op, Request};
use tracing::debug;

/// Fires an expired timer of a host.
pub fn on_timer(cx: &mut Ctx<'_>, host: &mut Host, serial: u64, key: TimerKey) {
    match key {
        TimerKey::Poll { pkey } => poll::on_poll_timeout(host, pkey, serial),
        TimerKey::Call { sock } => blocking::on_call_timeout(cx, host, sock, serial),
    }
}

/// Executes (or parks) one request a host published on channel `ch`.
pub fn dispatch(cx: &mut Ctx<'_>, host: &mut Host, ch: u32, req: Request) {
    if host.doomed.is_some() {
        // Being detached (e.g. `Host::interrupted`): not one call more,
        // also from the rest of the worker's batch for this host.
        return;
    }
    // Decoded once; an unknown op or a malformed request is answered
    // EINVAL (never left without an answer: the host would wait for it).
    let decoded = match Op::from_u16(req.op) {
        Some(op) => Call::decode(&req, host.layout.arena_size).map(|c| (op, c)),
        None => Err(tcps_proto::msg::Invalid::UnknownOp(req.op)),
    };
    let (op, call) = match decoded {
        Ok(d) => d,
        Err(why) => {
            host.stats.invalid += 1;
            debug!(host = host.id, ch, ?why, op = req.op, "invalid request");
            let op = Op::from_u16(req.op).unwrap_or(Op::Nop);
            return complete(host, ch, req.user_data, op, Err(libc::EINVAL));
        }
    };
    if let Some(n) = host.stats.calls.get_mut(op as usize) {
        *n += 1;
    }
    // A write-side call lands after the asynchronous sends the host
    // published before it: take them first.
    if let Call::Send { sock, .. }
    | Call::SendReg { sock, .. }
    | Call::Shutdown { sock, .. }
    | Call::Close { sock, .. } = call
    {
        if host.socket(sock).is_some_and(|s| s.queue.is_some()) {
            sendq::ingest(cx, host, sock);
        }
    }
    if let Some(res) = start(cx, host, ch, req.user_data, op, call) {
        complete(host, ch, req.user_data, op, res);
    }
}

/// Starts the `Poll` calls taken in this pass. The worker sweeps the
/// engine first (a non-blocking harvest, every ready socket read ahead), so
/// a poll is answered from what had reached the kernel sockets when it
/// came, not from a view up to a harvest interval old in which a socket
/// that reads ahead could miss bytes that arrived before those of a socket
/// the kernel answers for (issue 14 item 7).
pub fn start_polls(cx: &mut Ctx<'_>, host: &mut Host) {
    for (ch, user_data, entries, timeout_ms) in std::mem::take(&mut host.polls_to_start) {
        poll::start(cx, host, ch, user_data, entries, timeout_ms);
    }
}

/// Starts a call that may wait, or that is not answered (the host did not
/// wait for it): `None`, it is answered later or never. Any other call is
/// executed at once ([`execute`]) and its result returned.
fn start(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    ch: u32,
    user_data: u64,
    op: Op,
    call: Call,
) -> Option<Res> {
    match call {
        Call::Accept { sock, .. }
        | Call::Recv { sock, .. }
        | Call::Send { sock, .. }
        | Call::SendReg { sock, .. }
        | Call::RecvReg { sock, .. }
        | Call::Connect { sock, .. } => blocking::start(cx, host, ch, user_data, op, call, sock),
        Call::Shutdown { sock, reply, how } => {
            if !reply {
                // Unanswered (the host knew the connection open): its
                // completion credit is free now, and `finish` publishes
                // nothing for it.
                host.cursors[ch as usize].retire();
            }
            let Some(s) = host.socket(sock) else {
                return reply.then_some(Err(libc::EBADF));
            };
            if reply
                && !s.writers.is_empty()
                && sys::getpeername(std::os::fd::AsRawFd::as_raw_fd(&s.fd)).is_ok()
            {
                // Behind sends the peer has not taken, on a connection: the
                // kernel's shutdown does not wait for its send buffer
                // either. Answered now; the shutdown itself waits its turn
                // unanswered, so the FIN still follows every byte.
                let call = Call::Shutdown {
                    sock,
                    how,
                    reply: false,
                };
                blocking::start_shutdown(cx, host, ch, user_data, call, sock);
                return Some(Ok((0, 0)));
            }
            blocking::start_shutdown(cx, host, ch, user_data, call, sock);
        }
        Call::AsyncKick { sock } => {
            host.cursors[ch as usize].retire();
            sendq::kick(cx, host, sock, Instant::now());
        }
        Call::RecvKick { sock } => {
            host.cursors[ch as usize].retire();
            eager::sweep::kick(cx, host, sock);
        }
        Call::Cancel { sock, target } => {
            host.cursors[ch as usize].retire();
            blocking::cancel(cx, host, ch, sock, target);
        }
        Call::Close { sock, reply: false } => {
            // The host did not wait: it closes only sockets it knows are
            // open, so there is no error to tell it (EBADF here means it
            // lied, and hurts nobody else).
            host.cursors[ch as usize].retire();
            if let Err(e) = close::close_socket(cx, host, sock) {
                debug!(host = host.id, sock, errno = e, "unanswered close failed");
            }
        }
        Call::Poll {
            entries,
            timeout_ms,
            ..
        } => host
            .polls_to_start
            .push((ch, user_data, entries, timeout_ms)),
        _ => return Some(execute(cx, host, ch, call)),
    }
    None
}

/// Executes a call that never waits.
fn execute(cx: &mut Ctx<'_>, host: &mut Host, ch: u32, call: Call) -> Res {
    match call {
        Call::Nop => Ok((0, 0)),
        Call::Socket {
            domain,
            ty,
            protocol,
        } if host.remote => crate::fabric::calls::socket(cx.cfg, host, domain, ty, protocol),
        Call::Socket { .. } => options::new_socket(host),
        Call::Bind { sock, addr } if host.remote => {
            crate::fabric::calls::bind(host, ch, sock, addr)
        }
        Call::Bind { sock, .. } => options::bind(host, sock),
        Call::Listen { sock, backlog } => {
            options::with_fd(host, sock, |fd| sys::listen(fd, backlog).map(|_| (0, 0)))
                .map(|_| (0, eager::accept::on_listen(host, sock)))
        }
        Call::AsyncBind { sock, queue, start } => {
            sendq::queue::bind(host, sock, queue, start, Instant::now())
        }
        Call::RecvBind { sock } => eager::sweep::recv_bind(cx, host, sock),
        Call::Close { sock, .. } => close::close_socket(cx, host, sock),
        Call::SetSockOpt {
            sock,
            level,
            name,
            value,
        } => {
            options::note_linger(host, sock, level, name);
            // A receive ring about to stop takes what is in flight first.
            let settled =
                eager::setup::is_tcps_level(level) && eager::ringop::settle(cx, host, sock);
            let r = options::setsockopt(host, ch, sock, level, name, value);
            if settled {
                eager::sweep::advance(cx, host, sock); // still receiving
            }
            r
        }
        Call::GetSockOpt {
            sock,
            level,
            name,
            value,
        } => options::getsockopt(host, ch, sock, level, name, value),
        Call::GetSockName { sock, addr } => {
            options::sockname(host, ch, sock, addr, sys::getsockname)
        }
        Call::GetPeerName { sock, addr } => {
            options::sockname(host, ch, sock, addr, sys::getpeername)
        }
        Call::Fcntl { sock, cmd, arg } => options::fcntl(host, sock, cmd, arg),
        Call::SendFile {
            sock,
            file,
            offset,
            count,
        } => crate::sendfile::call(host, sock, file, offset, count),
        Call::FileOpen {
            handle,
            path,
            size,
            mtime_ns,
        } => {
            let dir = cx
                .cfg
                .fabric
                .as_ref()
                .and_then(|f| f.shared_files.as_deref());
            let wanted = crate::shared_files::Wanted {
                handle,
                path,
                size,
                mtime_ns,
            };
            crate::shared_files::open(dir, host, ch, wanted)
        }
        Call::FileClose { handle } => sendq::file_close(cx, host, handle).map(|()| (0, 0)),
        // Started by `start`, never here.
        Call::Accept { .. }
        | Call::Recv { .. }
        | Call::Send { .. }
        | Call::SendReg { .. }
        | Call::RecvReg { .. }
        | Call::Connect { .. }
        | Call::Shutdown { .. }
        | Call::AsyncKick { .. }
        | Call::RecvKick { .. }
        | Call::Cancel { .. }
        | Call::Poll { .. } => Err(libc::EINVAL),
    }
}

/// The backstop every 10 ms: takes what any bound send queue holds, and
/// resumes paused receive/accept rings that have room.
pub fn sweep(cx: &mut Ctx<'_>, host: &mut Host, now: Instant) -> usize {
    sendq::sweep(cx, host, now) + eager::sweep::sweep(cx, host) + blocking::rearm_deferred(cx, host)
}

/// A host hung up (its process exited or closed its channel): every
/// socket closes as close(2) at exit would. What it published on a send
/// queue is taken first, and queued sends still go out before the FIN
/// (`close_socket`); the sockets holding them close when their last job
/// finished. Returns whether some still do (the host must stay mapped).
pub fn close_for_exit(cx: &mut Ctx<'_>, host: &mut Host) -> bool {
    for k in host.sockets.keys() {
        let sock = k as u32;
        let Some(s) = host.socket(sock) else {
            continue; // closing already
        };
        if s.queue.is_some() {
            sendq::ingest(cx, host, sock);
        }
        if let Err(e) = close::close_socket(cx, host, sock) {
            debug!(host = host.id, sock, errno = e, "close at exit failed");
        }
    }
    host.sockets.len() > 0
}
