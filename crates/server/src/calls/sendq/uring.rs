//! Asynchronous sends executed by the engine (io_uring's `IORING_OP_SEND`)
//! instead of a `send(2)` per try: the front job of a socket's write queue
//! is handed to the kernel straight from the host's registered memory, and
//! its completion (`sendq::sent`) moves it on. At most one send per socket
//! is in flight (`Sock::send_op`): the next one is submitted from the
//! completion of the one before, so the stream keeps its order and a short
//! send continues where it stopped.
//!
//! What the kernel reads stays mapped until the completion is reaped: the
//! submission holds the registration's mapping (`Registry::keep`), also
//! when the host goes away meanwhile (closing the socket cancels the send:
//! `Engine::forget`). Where the engine executes no sends (epoll) the
//! job is sent with a system call on readiness, as before
//! (`attempt::try_send`): the same semantics, the completion emulated.

use crate::calls::common::{Ctx, Res};
use crate::engine::SendOp;
use crate::host::{Host, Parked};
use crate::token::Token;
use std::os::fd::AsRawFd;
use tcps_proto::msg::Call;

/// What became of a job handed to the engine.
pub(crate) enum Submit {
    /// The engine executes no sends: send with a system call.
    Syscall,
    /// A send is in flight for it: it stays at the front of the queue.
    InFlight,
    /// Finished without the kernel (nothing left, or a bad range).
    Done(Res),
}

/// Hands the rest of send job `p` (the front of socket `sid`'s write
/// queue; `flags`: its send flags) to the engine.
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
    let total = data.len as usize;
    if p.progress >= total {
        return Submit::Done(Ok((total as i64, 0)));
    }
    let (Ok(base), Some(keep)) = (host.registry.resolve(data), host.registry.keep(data.mem)) else {
        return Submit::Done(Err(libc::EFAULT));
    };
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
        // SAFETY: progress < total: inside the resolved range.
        buf: unsafe { base.add(p.progress) },
        len: (total - p.progress) as u32,
        // Not MSG_DONTWAIT: a full socket makes the kernel wait for room
        // (its own poll), not fail the send. MSG_WAITALL: io_uring goes on
        // after a short send by itself (one completion per job, however
        // slow the reader); an error after some bytes completes with the
        // bytes, and the resubmitted rest gets the error.
        flags: (flags | libc::MSG_NOSIGNAL | libc::MSG_WAITALL) & !libc::MSG_DONTWAIT,
    };
    // SAFETY: `keep` holds the registration's mapping, which contains
    // `op.buf..+op.len` (resolved above), until the completion is reaped.
    if !unsafe { cx.engine.submit_send(op, token.encode(), keep) } {
        return Submit::Syscall;
    }
    s.op_seq = seq;
    s.send_op = Some(seq);
    Submit::InFlight
}
