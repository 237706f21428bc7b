//! The io_uring engine: one-shot `IORING_OP_POLL_ADD` per armed descriptor,
//! cancelled with `IORING_OP_POLL_REMOVE`. Submissions are batched: arming
//! only queues an SQE; `wait` submits them all and reaps completions in one
//! `io_uring_enter`.
//!
//! An in-flight poll holds a reference to the file, so `forget` must cancel
//! it, or a closed socket would keep its port until the poll fired.

use super::event::{Engine, Event};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// user_data of cancel requests; their completions are ignored.
const CANCEL_TAG: u64 = u64::MAX;

pub struct UringEngine {
    ring: IoUring,
    /// Token of the poll currently armed on each descriptor, and back.
    armed: HashMap<RawFd, u64>,
    armed_fd: HashMap<u64, RawFd>,
}

impl UringEngine {
    pub fn new() -> io::Result<UringEngine> {
        let ring = IoUring::builder().build(1024)?;
        Ok(UringEngine {
            ring,
            armed: HashMap::new(),
            armed_fd: HashMap::new(),
        })
    }

    fn push(&mut self, sqe: squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: poll and cancel SQEs reference no user memory.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?; // queue full: flush and retry
        }
    }

    fn cancel(&mut self, token: u64) -> io::Result<()> {
        self.push(opcode::PollRemove::new(token).build().user_data(CANCEL_TAG))
    }
}

impl Engine for UringEngine {
    fn arm(&mut self, fd: RawFd, token: u64, mask: u32) -> io::Result<()> {
        if let Some(old) = self.armed.insert(fd, token) {
            self.armed_fd.remove(&old);
            self.cancel(old)?;
        }
        self.armed_fd.insert(token, fd);
        self.push(
            opcode::PollAdd::new(types::Fd(fd), mask)
                .build()
                .user_data(token),
        )
    }

    fn forget(&mut self, fd: RawFd, _token: u64) {
        if let Some(old) = self.armed.remove(&fd) {
            self.armed_fd.remove(&old);
            let _ = self.cancel(old);
            // Submit now so the file reference is dropped promptly.
            let _ = self.ring.submit();
        }
    }

    fn wait(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        let res = match timeout {
            Some(d) if d.is_zero() => self.ring.submit_and_wait(0),
            None => self.ring.submit_and_wait(1),
            Some(d) => {
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
        for cqe in self.ring.completion() {
            let token = cqe.user_data();
            if token == CANCEL_TAG || cqe.result() == -libc::ECANCELED {
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
            out.push(Event { token, revents });
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn flush(&mut self) {
        if !self.ring.submission().is_empty() {
            let _ = self.ring.submit();
        }
    }

    fn urgent_needs_pollin(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Engine, EpollEngine};
    use super::UringEngine;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

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
