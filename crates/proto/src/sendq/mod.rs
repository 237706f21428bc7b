//! Asynchronous send queues: the thesis' `SendCtl`.
//!
//! A socket that sends asynchronously is bound (`Op::AsyncBind`, one round
//! trip, once) to one of the region's send queues. Each queue is a ring of
//! [`SendDesc`] descriptors, each naming bytes in *registered memory* (a
//! memfd the host registered on the control socket, mapped by the server)
//! or, with [`DESC_FILE`], a range of a file the host handed over
//! (`FileOpen`: an asynchronous sendfile, sent by the server from its own
//! copy of the file):
//!
//! * the host writes descriptor `head % entries`, then stores `head + 1`
//!   (release) — no fence, no system call;
//! * the server takes descriptors up to `head` into the socket's queue of
//!   pending writes, sends each straight from the mapped memory, and
//!   publishes `done` (descriptors finished) and, for a failure, `error` and
//!   `error_seq`. So the host learns completions by reading memory: no
//!   round trip, and the server keeps sending on its own while the
//!   application does something else.
//!
//! **Credits.** The host may publish descriptor `s` only while
//! `s - done < entries`: the queue itself is the credit window, so nothing is
//! ever dropped or overwritten; a host out of credits waits (blocking socket)
//! or gets `EAGAIN` (non-blocking).
//!
//! **Order.** Descriptors of a queue complete in order. A later write-side
//! call on the socket (send, shutdown, close) makes the server first take
//! every descriptor up to the `head` it sees, and `head` was stored before
//! that call's request was published, so the call lands after them.
//!
//! **Finding new descriptors without a fence.** While the server watches a
//! queue it sets `active`; the host then only stores `head`. When `active`
//! is clear (and no kick of its own is still unseen: `kicks_seen`) the host
//! publishes an `Op::AsyncKick` request, which fences and rings the doorbell
//! like any request. The server leaves a queue only after it was idle for a
//! while: it clears `active`, fences, re-reads `head`, and looks once more a
//! little later (a host store that raced with the clear is still in that
//! host's store buffer for at most microseconds), and it sweeps every bound
//! queue periodically as a backstop.
//!
//! Everything here is host-writable except what the server keeps privately:
//! the server copies each descriptor out and checks it against its own
//! table of registrations before touching memory.

//!
//! **Types.** [`SendQueueProducer`] (host) and [`SendQueueConsumer`]
//! (server) own every atomic access, fence and wake/kick handshake of the
//! protocol above; the layout and the pure arithmetic are in [`ctl`].

pub mod ctl;
pub(crate) mod queue;

pub use ctl::*;
pub use queue::{Overrun, SendQueueConsumer, SendQueueProducer};
