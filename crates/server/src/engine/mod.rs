//! The socket engine: tells the worker when kernel descriptors become ready.
//!
//! The worker executes socket calls itself with non-blocking syscalls (try
//! first: most calls succeed at once). Only when a call would block does it
//! *arm* the descriptor here, one-shot, for the directions it waits on; the
//! engine reports the readiness later and the worker retries. Both engines
//! implement exactly these semantics, so they pass the same tests:
//!
//! * [`Engine::arm`] arms a one-shot readiness wait for `mask` (POLLIN,
//!   POLLOUT, POLLRDHUP); arming again replaces the previous wait.
//! * After an event is delivered the descriptor is disarmed.
//! * [`Engine::forget`] must be called before the descriptor is closed.
//! * Events may be spurious; the worker always re-checks with a syscall.
//!
//! An engine may also execute the hot data path itself ([`Engine::submits_ops`]:
//! io_uring): sends, receives, accepts, shutdowns and blocking connects
//! submitted as operations, completed later as events carrying the result,
//! holding what they name ([`Keep`], [`AcceptSlot`]) until then;
//! [`Engine::forget`] and [`Engine::close`] (itself an operation there)
//! cancel them too. Where it does not (epoll), the worker does the same
//! work with a system call on readiness.

mod epoll;
mod event;
mod keep;
mod uring;

pub use epoll::EpollEngine;
pub use event::{Engine, EngineKind, Event, SendOp};
pub use keep::{AcceptSlot, Keep, Mapped, SendBuffers};
pub use uring::UringEngine;

use std::io;

/// Creates the engine asked for. Where io_uring is unavailable (an old
/// kernel, `io_uring_disabled`, a seccomp filter) the server falls back to
/// epoll and says so in the log, rather than refusing to start.
pub fn new(kind: EngineKind) -> io::Result<Box<dyn Engine>> {
    Ok(match kind {
        EngineKind::Uring => match UringEngine::new() {
            Ok(e) => Box::new(e),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; falling back to the epoll engine");
                Box::new(EpollEngine::new()?)
            }
        },
        EngineKind::Epoll => Box::new(EpollEngine::new()?),
    })
}
