//! What both engines implement and the worker sees: the [`Engine`] trait
//! and its [`Event`] (in a file of their own, so `epoll` and `uring` need
//! not import the module that chooses between them).

use super::keep::{AcceptSlot, Keep};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// Which engine to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Uring,
    Epoll,
}

/// A readiness event: the token given to `arm` and the ready mask; or the
/// completion of an operation (`Engine::submit_send`): its token and the
/// kernel's result in `res` (bytes, or `-errno`; `revents` is 0).
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub token: u64,
    pub revents: u32,
    pub res: i32,
}

/// A send the kernel executes after submission (io_uring `IORING_OP_SEND`,
/// or `IORING_OP_SENDMSG` for more than one buffer): the buffers `msg`
/// names on socket `fd`, waiting for room if need be.
#[derive(Clone, Copy, Debug)]
pub struct SendOp {
    pub fd: RawFd,
    pub msg: *const libc::msghdr,
    pub flags: i32,
}

/// `futex(2)` wakes for `wakes` (see `Engine::wake_futexes`), one system
/// call each.
pub fn wake_now(wakes: &[(usize, i32)]) {
    for &(addr, n) in wakes {
        crate::sys::count(1);
        tcps_proto::wake_batch::wake_now(addr, n);
    }
}

pub trait Engine: Send {
    fn arm(&mut self, fd: RawFd, token: u64, mask: u32) -> io::Result<()>;
    /// Drops any armed wait on `fd` (armed with `token`) and cancels its
    /// operations in flight (their completions still come, `-ECANCELED`
    /// or their result, and until then their `Keep`s live); call before
    /// close. Whatever is queued is submitted first, so an operation meets
    /// its own socket, never a later one that reuses the number.
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
    /// Wakes the futex waiters `wakes` lists — (address of a word in a
    /// host's region, how many) — the wakes the worker deferred
    /// (`tcps_proto::wake_batch::defer`): io_uring queues them as
    /// `FUTEX_WAKE` operations submitted with the pass's batch (no system
    /// call of their own); elsewhere one `futex(2)` each. Memory: a wake
    /// only uses the address as a key (the worker makes them before it
    /// unmaps a region).
    fn wake_futexes(&mut self, wakes: &[(usize, i32)]) {
        wake_now(wakes)
    }
    /// Whether urgent (MSG_OOB) data only wakes a wait that includes
    /// POLLIN (io_uring's poll is not woken for POLLPRI alone; epoll is).
    fn urgent_needs_pollin(&self) -> bool {
        false
    }
    /// Whether this engine executes sends itself (`submit_send`): io_uring
    /// yes, epoll no (the worker then sends with a system call on
    /// readiness: the same semantics, completion emulated by readiness).
    fn submits_ops(&self) -> bool {
        false
    }
    /// Queues `op` (submitted with the next batch); its completion comes
    /// back from `wait` as an [`Event`] with `token` and `res`. `keep` is
    /// dropped only after that. Returns `false` (nothing queued) where
    /// `submits_ops` is false.
    ///
    /// # Safety
    /// `op.msg`, its iovecs and the buffers they name must stay valid
    /// while `keep` lives.
    unsafe fn submit_send(&mut self, _op: SendOp, _token: u64, _keep: Keep) -> bool {
        false
    }
    /// Queues a receive of at most `len` bytes into `buf` on socket `fd`
    /// (io_uring `IORING_OP_RECV`; the kernel waits for data), completed
    /// as `submit_send`'s. `false` where `submits_ops` is false.
    ///
    /// # Safety
    /// `buf..buf + len` must stay mapped and be written by nobody who
    /// relies on it while `keep` lives.
    unsafe fn submit_recv(
        &mut self,
        _fd: RawFd,
        _buf: *mut u8,
        _len: u32,
        _token: u64,
        _keep: Keep,
    ) -> bool {
        false
    }
    /// Cancels operation `token` and waits (briefly: a receive waiting for
    /// data is cancelled at once) for its completion, which is returned
    /// here instead of from `wait`: `Some(res)` (`-ECANCELED`, or what it
    /// did before the cancel reached it), `None` if it was not in flight
    /// or did not complete in time. For a state change that must not race
    /// with the kernel writing (a receive ring about to stop). `wait` hands
    /// out the completions of operations before readiness events, so one
    /// reaped but not yet handled is never what a handler settles.
    fn settle(&mut self, _token: u64) -> Option<i32> {
        None
    }
    /// Operations submitted and not yet completed.
    fn ops_in_flight(&self) -> usize {
        0
    }
    /// Submits what is queued and hands back, without waiting, the
    /// completions already there of operations `tokens` (those that
    /// completed at submission: an accept that found a connection
    /// waiting); other completions stay for `wait`.
    fn complete_now(&mut self, _tokens: &[u64]) -> Vec<Event> {
        Vec::new()
    }
    /// Closes socket `fd`, dropping its armed wait and cancelling its
    /// operations first (as `forget`). io_uring: an `IORING_OP_CLOSE`
    /// queued behind the cancels, submitted with the pass's batch (no
    /// system call of its own); elsewhere forget, then close(2).
    fn close(&mut self, fd: OwnedFd) {
        self.forget(fd.as_raw_fd(), 0);
        crate::sys::count(1);
        drop(fd);
    }
    /// Queues a shutdown(2) of socket `fd` (`IORING_OP_SHUTDOWN`),
    /// completed as `submit_send`'s (`res`: 0 or `-errno`). `false` where
    /// `submits_ops` is false: shut down with a system call.
    fn submit_shutdown(&mut self, _fd: RawFd, _how: i32, _token: u64) -> bool {
        false
    }
    /// Queues an accept on listener `fd` (`IORING_OP_ACCEPT`, the new
    /// descriptor `SOCK_NONBLOCK | SOCK_CLOEXEC`) into `slot`, run with
    /// the credentials of `personality` (`register_personality`) if any;
    /// completed as `submit_send`'s (`res`: the descriptor, also in the
    /// slot, or `-errno`). `false` where `submits_ops` is false.
    fn submit_accept(
        &mut self,
        _fd: RawFd,
        _slot: Arc<AcceptSlot>,
        _personality: Option<u16>,
        _token: u64,
    ) -> bool {
        false
    }
    /// Queues a connect of socket `fd` to the address `addr..addr+len`
    /// (`IORING_OP_CONNECT`: the kernel waits for the handshake), completed
    /// as `submit_send`'s (`res`: 0 or `-errno`). `false` where
    /// `submits_ops` is false.
    ///
    /// # Safety
    /// The address must stay valid while `keep` lives.
    unsafe fn submit_connect(
        &mut self,
        _fd: RawFd,
        _addr: *const libc::sockaddr,
        _len: libc::socklen_t,
        _token: u64,
        _keep: Keep,
    ) -> bool {
        false
    }
    /// The personality registered for `uid` (`register_personality`).
    fn personality(&self, _uid: u32) -> Option<u16> {
        None
    }
    /// Registers the calling thread's credentials now (its fsuid: what a
    /// socket accepted under them is owned by) as `uid`'s personality.
    fn register_personality(&mut self, _uid: u32) -> Option<u16> {
        None
    }
    /// Sets an int socket option without waiting for it
    /// (`SOCKET_URING_OP_SETSOCKOPT`, queued with the batch; SOL_SOCKET
    /// options only). `false` where the engine cannot: set it with a
    /// system call.
    fn set_option_int(&mut self, _fd: RawFd, _level: i32, _name: i32, _value: i32) -> bool {
        false
    }
}
