//! The tcps host library.
//!
//! An application's socket calls are executed by a separate TCP server
//! process (`tcps server`). The host writes a request into a shared-memory
//! channel and waits for the completion, spinning briefly and then sleeping
//! on a futex; on the common path no system call is made.
//!
//! * [`Client`] is the Rust API: BSD socket calls on tcps socket ids.
//! * [`capi`] is the C ABI of `include/tcps.h` (`libtcps.so`).
//!
//! Modules, bottom up (each uses only those before it): `table`, `sys` and
//! `settings` (building blocks; `settings` holds the `TCPS_*` variables), `interrupt` (signals
//! that interrupt waits), `socket` (the per-socket record), `control`,
//! `attach` and `memory` (the control socket, the handshake, registered
//! memory), `sendq::shared` (the attachment's send-queue state),
//! `channel` (the attachment: channel pool and the wait loop), `client`
//! (encodes each call), and the calls that extend `Client`: `kernelfd`
//! (the host's own kernel descriptors), `direct` (connections balancing
//! hands over as kernel sockets), `optcache` (options answered from
//! the per-socket record), `eager` (receiving and accepting
//! from the rings the server fills eagerly), the rest of `sendq`
//! (asynchronous send queues and registered memory), then `capi`.

mod attach;
pub mod capi;
mod capi_async;
mod capi_direct;
mod capi_events;
mod channel;
mod client;
mod control;
mod direct;
mod eager;
mod elf;
mod events;
pub mod interrupt;
mod kernelfd;
mod memory;
mod optcache;
pub mod remote;
mod ring_wait;
mod sendq;
mod settings;
mod socket;
mod sys;
mod table;

pub use attach::{
    attach as attach_raw, attach_error_lock_for_fork, default_path, last_attach_error, Attached,
};
pub use channel::HostStats;
pub use client::{Client, PollFd};
pub use direct::Accepted;
pub use elf::{go_program_fd, statically_linked_fd};
pub use events::{ConnEvent, EventQueue, EV_ACCEPT, EV_ALL, EV_CLOSED, EV_DATA, EV_ERROR, EV_ROOM};
pub use ring_wait::{sleep_on_many, sleep_on_rings_many, EdgeWatch};
pub use sendq::{IoHandle, SendBacklog};
pub use settings::{pin_settings, pinned_settings, setting, setting_str, Switch};
