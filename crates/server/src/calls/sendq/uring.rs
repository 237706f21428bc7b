//! Asynchronous sends executed by the engine (io_uring's `IORING_OP_SEND`,
//! `IORING_OP_SENDMSG` for several jobs) instead of a `send(2)` per try:
//! the front job of a socket's write queue, and the byte jobs queued right
//! behind it (up to [`MAX_BATCH`]), are handed to the kernel in one send
//! straight from the host's registered memory, and its completion
//! (`sendq::sent`) moves them on. At most one send per socket is in flight
//! (`Sock::send_op`): the next one is submitted from the completion of the
//! one before, so the stream keeps its order and a short send continues
//! where it stopped.
//!
//! What the kernel reads stays mapped until the completion is reaped: the
//! submission holds the registrations' mappings (`Registry::keep`), also
//! when the host goes away meanwhile (closing the socket cancels the send:
//! `Engine::forget`). Where the engine executes no sends (epoll) the job
//! is sent with a system call on readiness, as before
//! (`attempt::try_send`): the same semantics, the completion emulated.

use crate::calls::common::{Ctx, Res};
use crate::engine::{Keep, Mapped, SendBuffers, SendOp};
use crate::host::{Host, Parked};
use crate::token::Token;
use std::os::fd::AsRawFd;
use tcps_proto::msg::Call;

/// Most jobs one send carries.
pub(crate) const MAX_BATCH: usize = 64;

/// What became of a job handed to the engine.
pub(crate) enum Submit {
    /// The engine executes no sends: send with a system call.
    Syscall,
    /// A send is in flight for it: it stays at the front of the queue.
    InFlight,
    /// Finished without the kernel (nothing left, or a bad range).
    Done(Res),
}

/// The registered range of byte job `p` not yet sent, and what keeps it
/// mapped; `None` if it is not a byte job or its range does not resolve.
fn rest_of(host: &Host, p: &Parked) -> Option<(libc::iovec, Mapped)> {
    let Call::SendReg { data, .. } = p.call else {
        return None;
    };
    let total = data.len as usize;
    let base = host.registry.resolve(data).ok()?;
    let keep = host.registry.keep(data.mem)?;
    let iov = libc::iovec {
        // SAFETY: progress <= total: inside (or at the end of) the
        // resolved range.
        iov_base: unsafe { base.add(p.progress.min(total)) } as *mut libc::c_void,
        iov_len: total.saturating_sub(p.progress),
    };
    Some((iov, keep))
}

/// Hands the rest of send job `p` (the front of socket `sid`'s write
/// queue; `flags`: its send flags) and the byte jobs right behind it to
/// the engine.
pub(crate) fn submit(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    sid: u32,
    p: &Parked,
    flags: i32,
) -> Submit {
    if !cx.engine.submits_ops() {
        return Submit::Syscall;
    }
    let Call::SendReg { data, .. } = p.call else {
        return Submit::Syscall;
    };
    if p.progress >= data.len as usize {
        return Submit::Done(Ok((i64::from(data.len), 0)));
    }
    let Some((first, keep)) = rest_of(host, p) else {
        return Submit::Done(Err(libc::EFAULT));
    };
    // The header, vectors and mappings of one send, from the worker's
    // pool (`SendBuffers`): held as the `Keep` until the completion.
    let mut b = SendBuffers::take();
    b.parts().iov.push(first);
    b.parts().maps.push(keep);
    let mut flags = flags;
    if let Some(s) = host.sockets.get(sid as usize) {
        // Byte jobs queued behind it whose descriptors were valid (a
        // queue's error is sticky: if this one may go, so may they).
        for q in s.writers.iter().take(MAX_BATCH - 1) {
            let Call::SendReg { flags: f, .. } = q.call else {
                break;
            };
            if !q.job.as_ref().is_some_and(|j| j.held) {
                break;
            }
            let Some((iov, keep)) = rest_of(host, q) else {
                break;
            };
            b.parts().iov.push(iov);
            b.parts().maps.push(keep);
            flags = f; // MSG_MORE as the last one carried asks
        }
    }
    let msg = b.seal();
    let hkey = cx.hkey;
    let Some(s) = host.sockets.get_mut(sid as usize) else {
        return Submit::Done(Err(libc::EBADF));
    };
    let seq = s.op_seq.wrapping_add(1);
    let token = Token::Sent {
        host: hkey,
        sock: sid as usize,
        gen: s.gen,
        seq,
    };
    let op = SendOp {
        fd: s.fd.as_raw_fd(),
        msg,
        // Not MSG_DONTWAIT: a full socket makes the kernel wait for room
        // (its own poll), not fail the send. MSG_WAITALL: io_uring goes on
        // after a short send by itself (one completion per send, however
        // slow the reader); an error after some bytes completes with the
        // bytes, and the resubmitted rest gets the error.
        flags: (flags | libc::MSG_NOSIGNAL | libc::MSG_WAITALL) & !libc::MSG_DONTWAIT,
    };
    // SAFETY: `b` holds the msghdr, its iovecs and the mappings they name
    // (resolved above) at stable addresses until the completion is reaped.
    if !unsafe { cx.engine.submit_send(op, token.encode(), Keep::Send(b)) } {
        return Submit::Syscall;
    }
    s.op_seq = seq;
    s.send_op = Some(seq);
    Submit::InFlight
}
