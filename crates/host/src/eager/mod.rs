//! Eager receive and eager accept on the host (`docs/PROTOCOL.md` §10):
//! receiving from a socket's receive ring and accepting from a listener's
//! accept ring with no request. The ring handshakes are proto's
//! ([`tcps_proto::eager::RecvRingConsumer`],
//! [`tcps_proto::eager::AcceptRingConsumer`]); the per-socket state is the
//! receive side of the socket's record (`crate::socket::RecvSide`):
//!
//! * **mode**: `Unknown` until the server said how the socket receives:
//!   at accept (`SETUP_RECV_RING`), at `listen` (`aux == RECV_MODE_RING`),
//!   or by `RecvBind` on the first `recv`/`accept` (sockets inherited over
//!   fork, connected sockets). `Plain` sockets (mode none or pull) use
//!   ordinary requests; `Bytes` and `Accept` sockets their ring `s`.
//! * the ring cursor (consumed, kicks posted), whether the host told the
//!   server it wants connections (accept rings start accepting eagerly
//!   only then);
//! * SO_RCVTIMEO and SO_RCVLOWAT as this library tracks them (the mark of
//!   a socket with a ring is the library's alone), and O_NONBLOCK (in the record:
//!   a socket accepted eagerly is blocking at the server whatever
//!   `accept4`'s flags say);
//! * whether an `END_ERROR` was reported (once; later recvs return 0).
//!
//! **Consuming** (under the receive side's lock, which serializes threads
//! that receive or accept on one socket): copy from the cursor up to
//! `tail`, then `RecvRingConsumer::consume` (store `head`, fence, and a
//! kick if the server paused the ring and no kick of ours is unseen).
//! **Waiting** on an empty ring: `RecvRingConsumer::wait` in 100 ms slices
//! (server liveness), bounded by SO_RCVTIMEO (EAGAIN).
//!
//! A fork child attaches anew (`crates/preload/src/fork.rs`), so its
//! `Client` starts with every socket `Unknown`: rings it inherited live in
//! the parent's region, and its first recv/accept asks the server again.
//!
//! Files: `setup` (learning and tracking a socket's mode, options and
//! flags; kicks and waits), `recv` (receive rings, zero-copy views),
//! `accept` (accept rings), `poll` (readiness answered from the rings).

mod accept;
mod poll;
mod recv;
mod setup;
