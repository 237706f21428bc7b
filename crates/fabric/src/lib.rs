//! `tcps-fabric`: a thin, safe wrapper of the UCX ucp C API (libucp), the
//! fabric a host and a TCP server on different nodes talk over
//! (`docs/ARCHITECTURE.md`, "The channel over a fabric").
//!
//! What it wraps, one type each: [`Context`] (`ucp_context`), [`Memory`]
//! (memory mapped and registered with `ucp_mem_map`, its packed rkey),
//! [`Worker`] (`ucp_worker`: progress, active-message receive queues, the
//! event fd an idle side sleeps on), [`Listener`] and [`ConnRequest`]
//! (`ucp_listener`), [`Endpoint`] (`ucp_ep`, always with error handling
//! mode PEER: a dead peer is reported, never waited for) and
//! [`RemoteRegion`] (an unpacked rkey with the base and length it covers:
//! `ucp_put_nbx`/`ucp_get_nbx` are bounds-checked against it).
//!
//! Threading: a worker and everything made from it (`Rc`) stay on the
//! thread that made them; a [`Context`] and [`Memory`] may be shared.
//! Operations are non-blocking; buffers they read or write are kept alive
//! by the worker until UCX completes them (`Worker::progress` reaps them).
//! `unsafe` is confined to this crate (`sys.rs` are the declarations).
//!
//! Two modules are tcps' own, shared by the server's and the host's
//! fabric sides: [`auth`] (the shared secret, challenge and HMAC answer)
//! and [`wire`] (message ids, the attach answer, span batches).

mod addr;
pub mod auth;
mod context;
mod endpoint;
mod error;
mod listener;
mod memory;
pub mod sys;
pub mod wire;
mod worker;

#[cfg(test)]
mod tests;

pub use context::{Context, ContextOptions};
pub use endpoint::{Endpoint, Flushing, RemoteRegion};
pub use error::{Error, Result};
pub use listener::{ConnRequest, Listener};
pub use memory::Memory;
pub use worker::{AmMessage, Worker};
