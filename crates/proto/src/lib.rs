//! The tcps channel: what a host and a TCP server share, and nothing else.
//!
//! A host attaches over a Unix control socket ([`handshake`]) and receives a
//! shared-memory region ([`layout`]) that holds a pool of channels. Each
//! channel is a request ring, a completion ring and a data arena ([`ring`]).
//! Requests and completions are fixed-size records ([`msg`]); every field a
//! host writes is checked by [`msg::Call::decode`] before the server acts on
//! it. Socket addresses travel as raw `sockaddr` bytes ([`addr`]).
//! Asynchronous sends from registered memory go through per-socket send
//! queues ([`sendq`]) instead of request/completion pairs; bytes received
//! and connections accepted eagerly arrive in receive and accept rings
//! ([`eager`]).
//!
//! Every ring has one type per role, owning its atomics, fences and
//! wake/kick handshakes (in the style of io-uring's `squeue`/`cqueue`):
//!
//! | ring | producer | consumer |
//! |------|----------|----------|
//! | channel requests / completions | [`ring::HostCursor`] / [`ring::ServerCursor`] | [`ring::ServerCursor`] / [`ring::HostCursor`] |
//! | receive ring | [`eager::RecvRingProducer`] (server) | [`eager::RecvRingConsumer`] (host) |
//! | accept ring | [`eager::AcceptRingProducer`] (server) | [`eager::AcceptRingConsumer`] (host) |
//! | send queue | [`sendq::SendQueueProducer`] (host) | [`sendq::SendQueueConsumer`] (server) |
//!
//! This crate does no I/O on sockets or memory of its own. The OS primitives
//! the protocol needs live in two small modules: the futex a waiting host
//! sleeps on ([`futex`]) and passing descriptors on the control socket
//! ([`fdpass`]).

pub mod addr;
pub mod eager;
pub mod fdpass;
pub mod futex;
pub mod handshake;
pub mod layout;
pub mod mirror;
pub mod msg;
pub mod ready_log;
pub mod region;
pub mod ring;
pub mod sendq;
mod sync;
pub mod wake;
pub mod wake_batch;
pub mod watch;

#[cfg(all(test, loom))]
mod loom_tests;

pub use layout::{Layout, MAGIC, VERSION};
pub use msg::{Call, Completion, Op, Request};
pub use region::Region;
