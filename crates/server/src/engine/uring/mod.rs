//! The io_uring engine: one-shot `IORING_OP_POLL_ADD` per armed descriptor,
//! cancelled with `IORING_OP_POLL_REMOVE`; and sends executed by the kernel
//! (`IORING_OP_SEND`, `submit_send`), completed later. Submissions are
//! batched: arming or sending only queues an SQE; the worker submits them
//! all in one `io_uring_enter` per pass (`flush`, or `wait`).
//!
//! The ring is set up with `COOP_TASKRUN` and `TASKRUN_FLAG` where the
//! kernel has them: completions that wait for a socket (a poll that fires,
//! a send that waited for room) are then not pushed at the worker with an
//! interrupt but run at its next `io_uring_enter`, and the kernel flags
//! when one is due, so a look with nothing submitted and nothing due costs
//! no system call.
//!
//! An in-flight poll holds a reference to the file, so `forget` must cancel
//! it, or a closed socket would keep its port until the poll fired. An
//! in-flight send holds one too, and its memory is kept mapped by its
//! `Keep` until its completion has been reaped (also when `forget` cancelled
//! it because its socket closes or its host went away).

use super::event::{Engine, Event, SendOp};
use super::keep::{AcceptSlot, Keep};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod ops;

/// user_data of cancel requests and closes; their completions are ignored.
const CANCEL_TAG: u64 = u64::MAX;
/// user_data of operations whose completion only lets their `Keep` go
/// (options set without waiting, `ops.rs`): this bit pattern and a
/// counter; no `Token` has kind 14.
const QUIET_TAG: u64 = 0xe << 60;

/// How long dropping the engine waits for cancelled sends to complete.
const DRAIN_ON_DROP: Duration = Duration::from_secs(1);
/// user_data of the polls that head a receive's link (this bit pattern
/// and a counter; no `Token` has kind 15): their completions are ignored.
const LINK_TAG: u64 = 0xf << 60;

/// Submission and completion queue sizes.
const SQ_ENTRIES: u32 = 1024;
const CQ_ENTRIES: u32 = 16384;

/// How long `settle` waits for a cancelled operation.
const SETTLE_WAIT: Duration = Duration::from_millis(100);

pub struct UringEngine {
    ring: IoUring,
    /// Token of the poll currently armed on each descriptor, and back.
    armed: HashMap<RawFd, u64>,
    armed_fd: HashMap<u64, RawFd>,
    /// Operations in flight: their descriptor, and what each keeps mapped
    /// until it completes.
    ops: HashMap<u64, (RawFd, Keep)>,
    /// Operations in flight per descriptor (`forget` cancels them).
    ops_on: HashMap<RawFd, u32>,
    /// The peek ahead of each receive in flight (its link's head).
    links: HashMap<u64, u64>,
    /// Heads that failed (an error the peek got, e.g. ECONNRESET): the
    /// receive behind is cancelled, and its completion reports this.
    link_errors: HashMap<u64, i32>,
    next_link: u64,
    /// Completions reaped by `settle` for other operations, and polls
    /// that fired meanwhile, handed out by the next `wait` (operations
    /// first).
    stash: Vec<Event>,
    /// Fired polls of one reap (and those `settle` reaped).
    polls: Vec<Event>,
    /// The kernel flags due task work (`IORING_SQ_TASKRUN`): a look with
    /// nothing to submit enters only when flagged.
    taskrun_flag: bool,
    /// Sends and receives run as operations (`submits_ops`); off with
    /// `TCPS_URING_DATA_PATH=off` in the server's environment (readiness
    /// only, the worker's system calls: for comparisons).
    data_path: bool,
    /// Socket options can be set by operations (`set_option_int`; the
    /// kernel has `SOCKET_URING_OP_SETSOCKOPT`, probed at start).
    sockopt_ops: bool,
    /// Futex wakes are operations (`IORING_OP_FUTEX_WAKE`, 6.7; probed).
    futex_ops: bool,
    next_quiet: u64,
    /// Registered personalities (credentials accepts run with), by uid.
    personalities: HashMap<u32, u16>,
    /// Shutdowns in flight (run by io_uring's worker threads, which look
    /// their descriptor up only when they start), by token; and the
    /// closes of their sockets, held back until they completed (`ops.rs`).
    late_ops: HashMap<u64, RawFd>,
    held_closes: HashMap<RawFd, OwnedFd>,
}

impl UringEngine {
    pub fn new() -> io::Result<UringEngine> {
        // Every socket may have a receive in flight: room for a burst of
        // completions (beyond it the kernel keeps them, `must_enter`).
        let (ring, taskrun_flag) = match IoUring::builder()
            .setup_cqsize(CQ_ENTRIES)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(SQ_ENTRIES)
        {
            Ok(r) => (r, true),
            // Kernels before 5.19.
            Err(_) => (IoUring::builder().build(SQ_ENTRIES)?, false),
        };
        let mut e = UringEngine {
            ring,
            armed: HashMap::new(),
            armed_fd: HashMap::new(),
            ops: HashMap::new(),
            ops_on: HashMap::new(),
            links: HashMap::new(),
            link_errors: HashMap::new(),
            next_link: 0,
            stash: Vec::new(),
            polls: Vec::new(),
            taskrun_flag,
            data_path: std::env::var_os("TCPS_URING_DATA_PATH").is_none_or(|v| v != "off"),
            sockopt_ops: false,
            futex_ops: false,
            next_quiet: 0,
            personalities: HashMap::new(),
            late_ops: HashMap::new(),
            held_closes: HashMap::new(),
        };
        e.sockopt_ops = e.data_path && e.probe_sockopt();
        e.futex_ops = e.data_path && e.probe_op(opcode::FutexWake::CODE);
        Ok(e)
    }

    /// `io_uring_enter`: submits what is queued, waits for `want`
    /// completions (counted as the worker's system call).
    fn enter(&mut self, want: usize) -> io::Result<usize> {
        crate::sys::count(1);
        self.ring.submit_and_wait(want)
    }

    /// # Safety
    /// Memory an SQE names must stay valid until its completion (a send's
    /// `Keep`, held in `ops` until then); polls and cancels name none.
    unsafe fn push(&mut self, sqe: squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: as the caller promised.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.enter(0)?; // queue full: flush and retry
        }
    }

    /// Queues operation `sqe` on `fd` under `token`, holding `keep`.
    ///
    /// # Safety
    /// As `push`: what the SQE names stays valid while `keep` lives.
    unsafe fn push_op(&mut self, fd: RawFd, sqe: squeue::Entry, token: u64, keep: Keep) -> bool {
        if self.ops.contains_key(&token) || token == CANCEL_TAG {
            // Never two operations under one token: the first one's `Keep`
            // must live until its own completion.
            return false;
        }
        // SAFETY: `keep` is held in `ops` until the completion is reaped.
        if unsafe { self.push(sqe.user_data(token)) }.is_err() {
            return false;
        }
        self.ops.insert(token, (fd, keep));
        *self.ops_on.entry(fd).or_insert(0) += 1;
        true
    }

    /// Queues the removal of `fd`'s armed wait and the cancellation of its
    /// operations (not submitted); whether there was any.
    fn drop_waits(&mut self, fd: RawFd) -> bool {
        let mut cancelled = false;
        if let Some(old) = self.armed.remove(&fd) {
            self.armed_fd.remove(&old);
            let _ = self.cancel(old);
            cancelled = true;
        }
        if self.ops_on.contains_key(&fd) {
            // Every operation on the descriptor; queued after them, so
            // they were issued on this socket first.
            let what = types::CancelBuilder::fd(types::Fd(fd)).all();
            let sqe = opcode::AsyncCancel2::new(what)
                .build()
                .user_data(CANCEL_TAG);
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(sqe) };
            cancelled = true;
        }
        cancelled
    }

    fn cancel(&mut self, token: u64) -> io::Result<()> {
        // SAFETY: a poll removal names no memory.
        unsafe { self.push(opcode::PollRemove::new(token).build().user_data(CANCEL_TAG)) }
    }

    /// Whether a look without waiting must enter the kernel: something
    /// is queued, task work (completions) is due, or completions overflowed.
    fn must_enter(&mut self) -> bool {
        let sq = self.ring.submission();
        // An overflowed completion queue: the kernel holds completions
        // that only an enter brings in.
        !sq.is_empty() || !self.taskrun_flag || sq.taskrun() || sq.cq_overflow()
    }

    /// Reaps the completions there are into `out`: operations' first (and
    /// their `Keep`s dropped), then fired polls'. So the worker handles
    /// every operation's completion of a harvest before any readiness or
    /// control message, which may `settle` operations.
    fn reap(&mut self, out: &mut Vec<Event>) {
        let mut polls = std::mem::take(&mut self.polls);
        self.reap_apart(out, &mut polls);
        out.append(&mut polls);
        self.polls = polls;
        self.release_held_closes();
    }

    /// Reaps operations' completions into `ops`, fired polls into `polls`.
    fn reap_apart(&mut self, ops: &mut Vec<Event>, polls: &mut Vec<Event>) {
        for cqe in self.ring.completion() {
            let token = cqe.user_data();
            if token == CANCEL_TAG {
                continue;
            }
            if token & LINK_TAG == LINK_TAG {
                let r = cqe.result();
                if r < 0 && r != -libc::ECANCELED {
                    self.link_errors.insert(token, r);
                }
                continue;
            }
            if let Some((fd, keep)) = self.ops.remove(&token) {
                let mut res = cqe.result();
                if let Some(head) = self.links.remove(&token) {
                    // The head's CQE comes first: a receive cancelled
                    // because its peek failed reports the peek's error.
                    if let Some(e) = self.link_errors.remove(&head) {
                        if res == -libc::ECANCELED {
                            res = e;
                        }
                    }
                }
                if let (Keep::Accept(slot), true) = (&keep, res >= 0) {
                    // An accept's connection: the slot owns it from now
                    // (closed with it if nobody takes it).
                    // SAFETY: the kernel just returned this new descriptor.
                    slot.set_conn(unsafe { OwnedFd::from_raw_fd(res) });
                }
                // The kernel is done with the memory: the `Keep` may go.
                drop(keep);
                if let Some(n) = self.ops_on.get_mut(&fd) {
                    *n -= 1;
                    if *n == 0 {
                        self.ops_on.remove(&fd);
                    }
                }
                if token >> 60 == QUIET_TAG >> 60 {
                    continue; // nobody waits for it
                }
                ops.push(Event {
                    token,
                    revents: 0,
                    res,
                });
                continue;
            }
            if cqe.result() == -libc::ECANCELED {
                continue;
            }
            // The poll fired (or failed: report it as an error event so the
            // worker retries and sees the error from the syscall itself).
            match self.armed_fd.remove(&token) {
                Some(fd) => {
                    self.armed.remove(&fd);
                }
                None => continue, // a poll replaced before it fired
            }
            let revents = if cqe.result() < 0 {
                libc::POLLERR as u32
            } else {
                cqe.result() as u32
            };
            polls.push(Event {
                token,
                revents,
                res: 0,
            });
        }
    }
}

impl Drop for UringEngine {
    /// Operations still in flight are cancelled and waited for (at most
    /// `DRAIN_ON_DROP`), so no mapping is unmapped under the kernel; what
    /// does not complete by then is leaked rather than unmapped.
    fn drop(&mut self) {
        if self.ops.is_empty() {
            // Closes still queued go now.
            let _ = self.ring.submit();
            return;
        }
        let tokens: Vec<u64> = self.ops.keys().copied().collect();
        for t in tokens {
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(opcode::AsyncCancel::new(t).build().user_data(CANCEL_TAG)) };
        }
        let until = Instant::now() + DRAIN_ON_DROP;
        let mut sink = Vec::new();
        while !self.ops.is_empty() && Instant::now() < until {
            let ts = types::Timespec::new().nsec(10_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            self.reap(&mut sink);
        }
        for (_, (_, keep)) in self.ops.drain() {
            std::mem::forget(keep);
        }
    }
}

impl Engine for UringEngine {
    fn arm(&mut self, fd: RawFd, token: u64, mask: u32) -> io::Result<()> {
        if let Some(old) = self.armed.insert(fd, token) {
            self.armed_fd.remove(&old);
            self.cancel(old)?;
        }
        self.armed_fd.insert(token, fd);
        // SAFETY: a poll names no memory.
        unsafe {
            self.push(
                opcode::PollAdd::new(types::Fd(fd), mask)
                    .build()
                    .user_data(token),
            )
        }
    }

    fn forget(&mut self, fd: RawFd, _token: u64) {
        if self.drop_waits(fd) {
            // Submit now (while `fd` is still open) so the file reference
            // is dropped promptly.
            let _ = self.enter(0);
        }
    }

    fn close(&mut self, fd: OwnedFd) {
        self.close_op(fd);
    }

    fn submit_shutdown(&mut self, fd: RawFd, how: i32, token: u64) -> bool {
        self.data_path && self.shutdown_op(fd, how, token)
    }

    fn submit_accept(
        &mut self,
        fd: RawFd,
        slot: Arc<AcceptSlot>,
        personality: Option<u16>,
        token: u64,
    ) -> bool {
        if !self.data_path {
            return false;
        }
        let (addr, len) = slot.ptrs();
        let mut sqe = opcode::Accept::new(types::Fd(fd), addr, len)
            .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            .build();
        if let Some(p) = personality {
            sqe = sqe.personality(p);
        }
        // SAFETY: the slot's cells stay allocated while the `Keep` (a
        // clone of the slot) lives, until the completion is reaped.
        unsafe { self.push_op(fd, sqe, token, Keep::Accept(slot)) }
    }

    unsafe fn submit_connect(
        &mut self,
        fd: RawFd,
        addr: *const libc::sockaddr,
        len: libc::socklen_t,
        token: u64,
        keep: Keep,
    ) -> bool {
        let sqe = opcode::Connect::new(types::Fd(fd), addr, len).build();
        // SAFETY: the caller keeps the address valid while `keep` lives.
        self.data_path && unsafe { self.push_op(fd, sqe, token, keep) }
    }

    fn personality(&self, uid: u32) -> Option<u16> {
        self.personalities.get(&uid).copied()
    }

    fn register_personality(&mut self, uid: u32) -> Option<u16> {
        self.add_personality(uid)
    }

    fn wake_futexes(&mut self, wakes: &[(usize, i32)]) {
        if !self.futex_ops {
            return super::event::wake_now(wakes);
        }
        for &(addr, n) in wakes {
            self.futex_wake_op(addr, n);
        }
    }

    fn set_option_int(&mut self, fd: RawFd, level: i32, name: i32, value: i32) -> bool {
        self.sockopt_ops && self.sockopt_op(fd, level, name, value)
    }

    fn wait(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        let res = match timeout {
            Some(d) if d.is_zero() => {
                if self.must_enter() {
                    self.enter(0)
                } else {
                    Ok(0)
                }
            }
            None => self.enter(1),
            Some(d) => {
                crate::sys::count(1);
                let ts = types::Timespec::new()
                    .sec(d.as_secs())
                    .nsec(d.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        if let Err(e) = res {
            match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => {}
                _ => return Err(e),
            }
        }
        out.append(&mut self.stash);
        self.reap(out);
        Ok(())
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn flush(&mut self) {
        if !self.ring.submission().is_empty() {
            let _ = self.enter(0);
        }
    }

    fn urgent_needs_pollin(&self) -> bool {
        true
    }

    fn submits_ops(&self) -> bool {
        self.data_path
    }

    unsafe fn submit_send(&mut self, op: SendOp, token: u64, keep: Keep) -> bool {
        // SAFETY: the caller keeps `op.msg` and its iovecs valid.
        let (iovlen, first) = unsafe { ((*op.msg).msg_iovlen, *(*op.msg).msg_iov) };
        let sqe = if iovlen == 1 {
            opcode::Send::new(
                types::Fd(op.fd),
                first.iov_base as *const u8,
                first.iov_len as u32,
            )
            .flags(op.flags)
            .build()
        } else {
            opcode::SendMsg::new(types::Fd(op.fd), op.msg)
                .flags(op.flags as u32)
                .build()
        };
        // SAFETY: the caller keeps the buffers mapped while `keep` lives.
        unsafe { self.push_op(op.fd, sqe, token, keep) }
    }

    unsafe fn submit_recv(
        &mut self,
        fd: RawFd,
        buf: *mut u8,
        len: u32,
        token: u64,
        keep: Keep,
    ) -> bool {
        // A one-byte MSG_PEEK receive linked ahead: the receive runs only
        // once a byte of the normal stream (or the end) is there. A
        // receive that waits by itself, or behind a POLL_ADD (io_uring
        // trusts the wake-up's mask, and a socket wakes with POLLIN for an
        // urgent byte too), would start at an urgent byte waiting alone at
        // the mark and step over it, and TCP then drops the mark: the
        // program's MSG_OOB receive would find nothing. A peek steps over
        // it without consuming it and keeps waiting. The peek writes the
        // byte the receive then overwrites. Its completion is ignored
        // unless it failed (`link_errors`); both go in one submission.
        if self.ops.contains_key(&token) {
            return false;
        }
        let free = {
            let sq = self.ring.submission();
            sq.capacity() - sq.len()
        };
        if free < 2 && self.enter(0).is_err() {
            return false;
        }
        self.next_link = (self.next_link + 1) & !(0xf << 60);
        let tag = LINK_TAG | self.next_link;
        // IORING_RECVSEND_POLL_FIRST (5.19, like `taskrun_flag`): a ring
        // is re-armed right after its receive took what there was, so the
        // peek goes straight to waiting instead of trying (and failing)
        // first; the submission costs one TCP receive less (issue 15 item 4).
        let poll_first = if self.taskrun_flag { 1 } else { 0 };
        let peek = opcode::Recv::new(types::Fd(fd), buf, 1)
            .flags(libc::MSG_PEEK)
            .ioprio(poll_first)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(tag);
        // SAFETY: the peek writes at most one byte at `buf`, which the
        // caller keeps mapped with the receive (`keep`): the receive is
        // cancelled or completes only after its head.
        if unsafe { self.push(peek) }.is_err() {
            return false;
        }
        let sqe = opcode::Recv::new(types::Fd(fd), buf, len).build();
        // SAFETY: the caller keeps the buffer mapped while `keep` lives.
        if !unsafe { self.push_op(fd, sqe, token, keep) } {
            return false;
        }
        self.links.insert(token, tag);
        true
    }

    fn settle(&mut self, token: u64) -> Option<i32> {
        if let Some(i) = self.stash.iter().position(|e| e.token == token) {
            return Some(self.stash.remove(i).res);
        }
        if !self.ops.contains_key(&token) {
            return None;
        }
        // The peek ahead of it (a receive still waiting there is then
        // cancelled with it), and the operation itself.
        let head = self.links.get(&token).copied();
        for t in head.into_iter().chain([token]) {
            // SAFETY: a cancel names no memory.
            let _ = unsafe { self.push(opcode::AsyncCancel::new(t).build().user_data(CANCEL_TAG)) };
        }
        let until = Instant::now() + SETTLE_WAIT;
        let mut got = Vec::new();
        let mut polls = std::mem::take(&mut self.polls);
        let res = loop {
            crate::sys::count(1);
            let ts = types::Timespec::new().nsec(1_000_000);
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            self.reap_apart(&mut got, &mut polls);
            if let Some(i) = got.iter().position(|e| e.token == token) {
                break Some(got.remove(i).res);
            }
            if Instant::now() >= until {
                break None;
            }
        };
        // Handed out by the next `wait`: the polls stay in `polls`,
        // after the operations.
        self.stash.append(&mut got);
        self.polls = polls;
        res
    }

    fn complete_now(&mut self, tokens: &[u64]) -> Vec<Event> {
        let _ = self.enter(0);
        let mut got = std::mem::take(&mut self.stash);
        let mut polls = std::mem::take(&mut self.polls);
        self.reap_apart(&mut got, &mut polls);
        self.polls = polls;
        let (mine, rest) = got.into_iter().partition(|e| tokens.contains(&e.token));
        self.stash = rest;
        mine
    }

    fn ops_in_flight(&self) -> usize {
        self.ops.len() + self.stash.len() + self.polls.len()
    }
}

#[cfg(test)]
mod tests;
