//! What both engines implement and the worker sees: the [`Engine`] trait
//! and its [`Event`] (in a file of their own, so `epoll` and `uring` need
//! not import the module that chooses between them).

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
    /// Submits arms still queued, without collecting: the worker calls it
    /// at the end of every pass, so a socket it re-armed is watched again
    /// at once, not only at the next `wait` (up to 200 µs later when idle).
    /// Readiness that arrives while a socket is not watched is seen only
    /// when the arm is submitted, after readiness of sockets that were
    /// watched although it arrived first: events out of arrival order
    /// (issue 14 item 7). Engines that arm at once have nothing to do.
    fn flush(&mut self) {}
    /// Whether urgent (MSG_OOB) data only wakes a wait that includes
    /// POLLIN (io_uring's poll is not woken for POLLPRI alone; epoll is).
    fn urgent_needs_pollin(&self) -> bool {
        false
    }
}
