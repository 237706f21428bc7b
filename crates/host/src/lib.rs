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
//! Modules: [`attach`](Client::attach) does the control-socket handshake and
//! maps the region; `channel` owns the channel pool and the wait loop;
//! `client` encodes each call; `memory` registers memory with the server;
//! `asyncsend` queues asynchronous sends; `ahead` receives and accepts
//! from the rings the server fills ahead (process-ahead).

mod ahead;
mod asyncsend;
mod attach;
pub mod capi;
mod capi_async;
mod channel;
mod client;
mod control;
mod kernelfd;
mod memory;
mod table;

pub use asyncsend::IoHandle;
pub use attach::{attach as attach_raw, default_path, last_attach_error, Attached};
pub use channel::HostStats;
pub use client::{Client, PollFd};
