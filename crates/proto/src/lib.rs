//! The tcps channel: what a host and a TCP server share, and nothing else.
//!
//! A host attaches over a Unix control socket ([`handshake`]) and receives a
//! shared-memory region ([`layout`]) that holds a pool of channels. Each
//! channel is a request ring, a completion ring and a data arena ([`ring`]).
//! Requests and completions are fixed-size records ([`msg`]); every field a
//! host writes is checked by [`msg::Call::decode`] before the server acts on
//! it. Socket addresses travel as raw `sockaddr` bytes ([`addr`]).
//! Asynchronous sends from registered memory go through per-socket send
//! queues ([`sendq`]) instead of request/completion pairs; received bytes
//! and accepted connections processed ahead arrive in receive and accept
//! rings ([`recvq`]).
//!
//! This crate does no I/O on sockets or memory of its own. The OS primitives
//! the protocol needs live in two small modules: the futex a waiting host
//! sleeps on ([`futex`]) and passing descriptors on the control socket
//! ([`fdpass`]).

pub mod addr;
pub mod fdpass;
pub mod futex;
pub mod handshake;
pub mod layout;
pub mod msg;
pub mod recvq;
pub mod region;
pub mod ring;
pub mod sendq;

pub use layout::Layout;
pub use msg::{Call, Completion, Op, Request};
pub use region::Region;

/// Identifies a tcps channel region and control message ("TCPSCHN1").
pub const MAGIC: u64 = u64::from_le_bytes(*b"TCPSCHN1");
/// Protocol version; bumped on any change to the shared layout or messages.
pub const VERSION: u32 = 5;
