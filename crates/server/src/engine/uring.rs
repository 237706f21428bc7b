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

use super::event::{Engine, Event, Keep, SendOp};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// user_data of cancel requests; their completions are ignored.
const CANCEL_TAG: u64 = u64::MAX;

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
        Ok(UringEngine {
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
        })
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
                // The kernel is done with the memory: the `Keep` may go.
                drop(keep);
                if let Some(n) = self.ops_on.get_mut(&fd) {
                    *n -= 1;
                    if *n == 0 {
                        self.ops_on.remove(&fd);
                    }
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
        if cancelled {
            // Submit now (while `fd` is still open) so the file reference
            // is dropped promptly.
            let _ = self.enter(0);
        }
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

    fn ops_in_flight(&self) -> usize {
        self.ops.len() + self.stash.len() + self.polls.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Engine, EpollEngine, SendOp};
    use super::UringEngine;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::time::Duration;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Reaps until `token`'s completion (bounded).
    fn completion(eng: &mut UringEngine, token: u64) -> i32 {
        let mut out = Vec::new();
        for _ in 0..100 {
            eng.wait(Some(Duration::from_millis(10)), &mut out).unwrap();
            if let Some(e) = out.iter().find(|e| e.token == token) {
                return e.res;
            }
        }
        panic!("no completion for {token}");
    }

    /// A receive waiting for data holds its `Keep` until `forget` cancelled
    /// it and the cancellation was reaped; a send's completion reports the
    /// bytes and lets its `Keep` go.
    #[test]
    fn operations_hold_their_memory_until_reaped() {
        let (a, b) = pair();
        let mut eng = UringEngine::new().unwrap();
        let mut buf = vec![0u8; 64];
        let keep = Arc::new(());
        // SAFETY: `buf` outlives the operation (reaped below).
        let ok = unsafe {
            eng.submit_recv(
                a.as_raw_fd(),
                buf.as_mut_ptr(),
                64,
                1,
                Box::new(keep.clone()),
            )
        };
        assert!(ok);
        eng.flush();
        assert_eq!(Arc::strong_count(&keep), 2, "held while in flight");
        eng.forget(a.as_raw_fd(), 0);
        assert_eq!(completion(&mut eng, 1), -libc::ECANCELED);
        assert_eq!(Arc::strong_count(&keep), 1, "released once reaped");
        assert_eq!(eng.ops_in_flight(), 0);
        // A send of two buffers (SENDMSG).
        let (x, y) = (b"hello ".to_vec(), b"world".to_vec());
        let mut iov = [x.as_slice(), y.as_slice()].map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        });
        // SAFETY: zeroed msghdr, then its iovecs.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = 2;
        let op = SendOp {
            fd: b.as_raw_fd(),
            msg: &msg,
            flags: libc::MSG_NOSIGNAL | libc::MSG_WAITALL,
        };
        // SAFETY: msg, iov and the buffers outlive the operation.
        assert!(unsafe { eng.submit_send(op, 2, Box::new(keep.clone())) });
        eng.flush();
        assert_eq!(completion(&mut eng, 2), 11);
        assert_eq!(Arc::strong_count(&keep), 1);
        let mut got = [0u8; 11];
        std::io::Read::read_exact(&mut &a, &mut got).unwrap();
        assert_eq!(&got, b"hello world");
    }

    /// `settle` hands back what a receive got before it was cancelled, and
    /// `wait` never reports it again.
    #[test]
    fn settle_returns_what_arrived() {
        let (a, b) = pair();
        let mut eng = UringEngine::new().unwrap();
        let mut buf = vec![0u8; 64];
        // SAFETY: `buf` outlives the operation (settled below).
        assert!(unsafe { eng.submit_recv(a.as_raw_fd(), buf.as_mut_ptr(), 64, 9, Box::new(())) });
        eng.flush();
        std::io::Write::write_all(&mut &b, b"abc").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(eng.settle(9), Some(3));
        assert_eq!(&buf[..3], b"abc");
        let mut out = Vec::new();
        eng.wait(Some(Duration::from_millis(10)), &mut out).unwrap();
        assert!(out.iter().all(|e| e.token != 9), "{out:?}");
        assert_eq!(eng.settle(9), None, "nothing in flight");
        // Settling a receive that got nothing cancels it.
        // SAFETY: as above.
        assert!(unsafe { eng.submit_recv(a.as_raw_fd(), buf.as_mut_ptr(), 64, 10, Box::new(())) });
        eng.flush();
        assert_eq!(eng.settle(10), Some(-libc::ECANCELED));
    }

    /// What `Engine::urgent_needs_pollin` says: urgent (MSG_OOB) data wakes
    /// an io_uring poll for POLLIN|POLLPRI but not one for POLLPRI alone;
    /// epoll reports POLLPRI alone.
    #[test]
    fn urgent_data_wakes_as_documented() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let engines: [Box<dyn Engine>; 2] = [
            Box::new(UringEngine::new().unwrap()),
            Box::new(EpollEngine::new().unwrap()),
        ];
        for mut eng in engines {
            let mut mask = libc::POLLPRI as u32;
            if eng.urgent_needs_pollin() {
                mask |= libc::POLLIN as u32;
            }
            eng.arm(a.as_raw_fd(), 7, mask).unwrap();
            let mut out = Vec::new();
            eng.wait(Some(Duration::from_millis(20)), &mut out).unwrap();
            assert!(out.is_empty(), "{}: {out:?}", eng.name());
            // SAFETY: one byte from a valid buffer.
            unsafe {
                libc::send(
                    b.as_raw_fd(),
                    b"!".as_ptr() as *const libc::c_void,
                    1,
                    libc::MSG_OOB,
                )
            };
            eng.wait(Some(Duration::from_millis(1000)), &mut out)
                .unwrap();
            assert_eq!(out.len(), 1, "{}: urgent data not reported", eng.name());
            let mut x = [0u8; 1];
            // SAFETY: one byte into a valid buffer.
            unsafe {
                libc::recv(
                    a.as_raw_fd(),
                    x.as_mut_ptr() as *mut libc::c_void,
                    1,
                    libc::MSG_OOB,
                )
            };
            eng.forget(a.as_raw_fd(), 7);
        }
    }
}
