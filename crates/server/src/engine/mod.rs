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

mod epoll;
mod uring;

pub use epoll::EpollEngine;
pub use uring::UringEngine;

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Which engine to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Uring,
    Epoll,
}

/// A readiness event: the token given to `arm` and the ready mask.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub token: u64,
    pub revents: u32,
}

pub trait Engine: Send {
    fn arm(&mut self, fd: RawFd, token: u64, mask: u32) -> io::Result<()>;
    /// Drops any armed wait on `fd` (armed with `token`); call before close.
    fn forget(&mut self, fd: RawFd, token: u64);
    /// Submits pending work and collects events, waiting at most `timeout`
    /// (`None`: until an event).
    fn wait(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()>;
    fn name(&self) -> &'static str;
    /// Whether urgent (MSG_OOB) data only wakes a wait that includes
    /// POLLIN (io_uring's poll is not woken for POLLPRI alone; epoll is).
    fn urgent_needs_pollin(&self) -> bool {
        false
    }
}

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
