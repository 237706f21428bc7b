//! Asynchronous sends and registered memory on the host (the protocol and
//! its handshakes are `tcps_proto::sendq`; the host's side is
//! [`tcps_proto::sendq::SendQueueProducer`]).
//!
//! A socket's first asynchronous send binds it to its send queue (one
//! round trip; queue `s` belongs to socket id `s`, PROTOCOL §10, so sockets
//! with ids beyond the region's queues send synchronously). A connection
//! the server set up at accept (`SETUP_SENDQ`) is bound already. After
//! that a send is: lock the send side of the socket's record (a spin lock
//! in host memory), check credits against the cached `done`, write one
//! 32-byte descriptor, store `head`, and kick the server only if it is not
//! watching the queue. No system call, no fence, no wait: the call returns
//! the full length as sent (thesis §5.5.1).
//!
//! * **Credits**: a queue holds `sq_entries` descriptors; a sender out of
//!   credits refreshes `done` and, if still out, waits on the futex `done`
//!   (blocking socket) or gets EAGAIN (non-blocking socket or MSG_DONTWAIT).
//! * **Completion tracking**: `done` and the first failure (`error`,
//!   `error_seq`) are in shared memory; an [`IoHandle`] names one
//!   descriptor, and `Client::io_done`/`Client::io_wait` read them.
//! * **Errors**: a failed asynchronous send is reported once on a later call
//!   on the socket (thesis semantics), and every later asynchronous send of
//!   the socket fails (the stream has a hole).
//! * **Copying sends** stage the bytes in a registered pool, freed as
//!   descriptors finish.
//! * **Closing** a socket with sends in flight hands its queue to the
//!   orphans: the server sends the rest and then closes; the staged bytes
//!   are freed once the server released the queue, or at the latest when
//!   the socket id is handed out again (the server frees an id only after
//!   its queue is unbound).
//! * **Debug mode** (`TCPS_DEBUG_REGISTERED=1`): each registered send
//!   carries a checksum of its bytes; the server counts a mismatch (the
//!   buffer was written while in flight), which the library reports.
//!
//! Files: `shared` (the attachment's send-queue state: io handles,
//! orphans, counters), `submit` (the producer side: one descriptor),
//! `bind` (binding a socket's queue, closing it), `credits` (completions,
//! credits and waiting), `registered` (registered memory and its
//! synchronous calls), `pool` (the staging pool of copying sends).

mod bind;
mod credits;
mod pool;
mod registered;
pub(crate) mod shared;
mod submit;

pub use credits::SendBacklog;
pub use shared::IoHandle;
