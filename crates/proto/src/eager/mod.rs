//! Eager receive and eager accept: receive rings (eager receive, *push*)
//! and accept rings (eager accept). The thesis' §4.6.2–4.6.4, without its extra `poll`.
//!
//! A socket with id `s < recv_rings` may have receive ring `s` of the region
//! bound to it (the index is the socket id, so binding needs no allocation
//! and the host knows the ring of every socket it names). A ring is a
//! [`RecvRingCtl`] followed by `rq_bytes` bytes (a power of two):
//!
//! * **Byte rings** (`kind == KIND_BYTES`, a connected socket): the server
//!   `recv(2)`s straight into the ring at `tail % rq_bytes` whenever the
//!   socket is readable and the ring has room, then stores `tail` (release).
//!   The host copies bytes from `head` to `tail` out and stores `head`. A
//!   host `recv` is therefore a local copy: no request, no round trip.
//! * **Accept rings** (`kind == KIND_ACCEPT`, a listener): the server
//!   accepts ahead and writes one 64-byte [`AcceptRecord`] per connection
//!   (records never straddle the wrap, `rq_bytes` being a multiple of 64),
//!   at most `eager_accept_size` records outstanding. Several connections
//!   ready together are published with one store of `tail`.
//!
//! **End of stream.** When `recv(2)` returns 0 or an error, the server
//! stores `end_errno` and then `end` (release) *after* the `tail` of the
//! last data: a host that sees `end` and has consumed up to `tail` reports
//! end-of-file (or the error) — in order, after the data before it. The
//! server writes no more data after `end`.
//!
//! **Backpressure.** The server reads only into free room
//! (`rq_bytes - (tail - head)`, with `head` clamped to `[consumed, tail]`:
//! the host may write anything there). With the ring (nearly) full it stops
//! reading and sets `paused`; the kernel socket buffer fills and TCP's window
//! stops the peer, so memory stays bounded by `rq_bytes` per socket however
//! slow the reader. A host that consumed bytes while `paused` is set posts an
//! `Op::RecvKick` (no completion) unless a kick of its own is still unseen
//! (`kicks_seen`); both sides fence between their store and their load
//! (`paused` / `head`) so a resume is never lost, and the server also
//! re-checks paused rings in its periodic sweep.
//!
//! **Waiting.** A host thread that finds a ring empty and blocks increments
//! `host_waiting`, fences, re-reads `tail`/`end` and futex-waits on `tail`;
//! the server wakes `tail` after publishing when `host_waiting != 0`.

//!
//! **Types.** [`RecvRingProducer`] / [`RecvRingConsumer`] (byte rings) and
//! [`AcceptRingProducer`] / [`AcceptRingConsumer`] (accept rings) own every
//! atomic access, fence and wake/kick handshake of the protocol above; the
//! layout and the pure position arithmetic are in [`ctl`].

mod accept;
pub mod ctl;
pub(crate) mod recv;

pub use accept::{AcceptRingConsumer, AcceptRingProducer};
pub use ctl::*;
pub use recv::{RecvCursor, RecvRingConsumer, RecvRingProducer, RingSnapshot, Woke};
