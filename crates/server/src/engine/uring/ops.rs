//! The io_uring engine's operations beyond sends and receives: closes
//! (`IORING_OP_CLOSE`, queued behind the descriptor's cancels, nothing
//! reported), shutdowns (`IORING_OP_SHUTDOWN`, reported; the closes of
//! their sockets held back until they completed), personalities (the
//! credentials accepts run with), and int socket options set without waiting
//! (`SOCKET_URING_OP_SETSOCKOPT`, a quiet operation that holds its value).

use super::{Keep, UringEngine, CANCEL_TAG, QUIET_TAG};
use io_uring::{opcode, types};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};

impl UringEngine {
    /// `Engine::close`: the descriptor's waits and operations cancelled,
    /// then closed, both queued for the pass's batch (with the data path
    /// off: forget and close(2), as the epoll engine).
    pub(super) fn close_op(&mut self, fd: OwnedFd) {
        if !self.data_path {
            crate::engine::Engine::forget(self, std::os::fd::AsRawFd::as_raw_fd(&fd), 0);
            crate::sys::count(1);
            return drop(fd);
        }
        let raw = fd.into_raw_fd();
        // The cancels go first in the same submission, while the number
        // still names this socket: nothing queued before the close meets
        // a later socket that reuses it.
        self.drop_waits(raw);
        if self.late_ops.values().any(|&f| f == raw) {
            // A shutdown in flight looks the number up only when one of
            // io_uring's worker threads starts it: the close waits for its
            // completion (`release_held_closes`), so it never meets a
            // later socket with this number.
            // SAFETY: `raw` is ours (taken from the OwnedFd above).
            self.held_closes
                .insert(raw, unsafe { OwnedFd::from_raw_fd(raw) });
            return;
        }
        let sqe = opcode::Close::new(types::Fd(raw))
            .build()
            .user_data(CANCEL_TAG);
        // SAFETY: a close names no memory.
        if unsafe { self.push(sqe) }.is_err() {
            crate::sys::count(1);
            // SAFETY: `raw` is ours (taken from the OwnedFd above), closed once.
            drop(unsafe { OwnedFd::from_raw_fd(raw) });
        }
    }

    pub(super) fn shutdown_op(&mut self, fd: RawFd, how: i32, token: u64) -> bool {
        let sqe = opcode::Shutdown::new(types::Fd(fd), how).build();
        // SAFETY: a shutdown names no memory.
        let queued = unsafe { self.push_op(fd, sqe, token, Keep::Nothing) };
        if queued {
            self.late_ops.insert(token, fd);
        }
        queued
    }

    /// Queues the closes held back for shutdowns that have completed
    /// since (`close_op`).
    pub(super) fn release_held_closes(&mut self) {
        if self.late_ops.is_empty() && self.held_closes.is_empty() {
            return;
        }
        let ops = &self.ops;
        self.late_ops.retain(|t, _| ops.contains_key(t));
        // One at a time (no list of them: nothing allocated per reap); a
        // close whose shutdowns are done is not held again.
        while let Some(fd) = self
            .held_closes
            .keys()
            .copied()
            .find(|fd| !self.late_ops.values().any(|f| f == fd))
        {
            if let Some(fd) = self.held_closes.remove(&fd) {
                self.close_op(fd);
            }
        }
    }

    pub(super) fn add_personality(&mut self, uid: u32) -> Option<u16> {
        crate::sys::count(1);
        let id = self.ring.submitter().register_personality().ok()?;
        self.personalities.insert(uid, id);
        Some(id)
    }

    pub(super) fn sockopt_op(&mut self, fd: RawFd, level: i32, name: i32, value: i32) -> bool {
        // Flags (0 and 1, the options set per connection) point at
        // constants: nothing to keep, nothing allocated; other values are
        // boxed and held as the `Keep`.
        static FLAGS: [i32; 2] = [0, 1];
        let (ptr, keep) = match value {
            0 | 1 => (&FLAGS[value as usize] as *const i32, Keep::Nothing),
            _ => {
                let v = Box::new(value);
                (&*v as *const i32, Keep::Boxed(v))
            }
        };
        let sqe = opcode::SetSockOpt::new(
            types::Fd(fd),
            level as u32,
            name as u32,
            ptr as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
        .build();
        self.next_quiet = (self.next_quiet + 1) & !(0xf << 60);
        // SAFETY: the value is static or boxed in `keep`, held until the
        // completion is reaped.
        unsafe { self.push_op(fd, sqe, QUIET_TAG | self.next_quiet, keep) }
    }

    /// Queues a wake of at most `n` waiters on the futex word at `addr` (a
    /// shared one: not `FUTEX2_PRIVATE`, so it reaches the host process
    /// sleeping on its own mapping of the word, as `futex(2)`'s
    /// `FUTEX_WAKE` does). Its completion is ignored.
    pub(super) fn futex_wake_op(&mut self, addr: usize, n: i32) {
        /// futex2 flags: a 32-bit word.
        const FUTEX2_SIZE_U32: u32 = 0x02;
        /// Wakes whatever bitset the waiter gave (`FUTEX_WAIT` waits with all).
        const FUTEX_BITSET_MATCH_ANY: u64 = 0xffff_ffff;
        let sqe = opcode::FutexWake::new(
            addr as *const u32,
            n.max(1) as u64,
            FUTEX_BITSET_MATCH_ANY,
            FUTEX2_SIZE_U32,
        )
        .build()
        .user_data(CANCEL_TAG);
        // SAFETY: a futex wake only uses the address as a key (EFAULT for
        // an address no longer mapped); it names no memory it reads.
        let _ = unsafe { self.push(sqe) };
    }

    /// Whether this kernel has operation `code` (`IORING_REGISTER_PROBE`).
    pub(super) fn probe_op(&mut self, code: u8) -> bool {
        let mut probe = io_uring::Probe::new();
        crate::sys::count(1);
        self.ring.submitter().register_probe(&mut probe).is_ok() && probe.is_supported(code)
    }

    /// Whether this kernel sets socket options by operation: one try on a
    /// socket of our own, at start.
    pub(super) fn probe_sockopt(&mut self) -> bool {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return false;
        }
        // SAFETY: a fresh descriptor we own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let v: i32 = 0;
        let sqe = opcode::SetSockOpt::new(
            types::Fd(fd),
            libc::SOL_SOCKET as u32,
            libc::SO_TIMESTAMPNS as u32,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
        .build()
        .user_data(QUIET_TAG);
        // SAFETY: `v` outlives the wait below, which reaps the completion.
        if unsafe { self.ring.submission().push(&sqe) }.is_err()
            || self.ring.submit_and_wait(1).is_err()
        {
            return false;
        }
        let ok = self
            .ring
            .completion()
            .find(|c| c.user_data() == QUIET_TAG)
            .is_some_and(|c| c.result() >= 0);
        drop(sock);
        ok
    }
}
