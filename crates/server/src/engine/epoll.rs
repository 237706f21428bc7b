//! The epoll engine: one-shot registrations (`EPOLLONESHOT`), re-armed with
//! `EPOLL_CTL_MOD`.

use super::event::{Engine, Event};
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub struct EpollEngine {
    epfd: OwnedFd,
    registered: HashSet<RawFd>,
    buf: Vec<libc::epoll_event>,
}

impl EpollEngine {
    pub fn new() -> io::Result<EpollEngine> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EpollEngine {
            epfd,
            registered: HashSet::new(),
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; 256],
        })
    }
}

impl Engine for EpollEngine {
    fn arm(&mut self, fd: RawFd, token: u64, mask: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: mask | libc::EPOLLONESHOT as u32,
            u64: token,
        };
        let op = if self.registered.contains(&fd) {
            libc::EPOLL_CTL_MOD
        } else {
            libc::EPOLL_CTL_ADD
        };
        crate::sys::count(1);
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        if unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        self.registered.insert(fd);
        Ok(())
    }

    fn forget(&mut self, fd: RawFd, _token: u64) {
        if self.registered.remove(&fd) {
            crate::sys::count(1);
            // SAFETY: removing a registration; the event pointer may be null for DEL.
            unsafe {
                libc::epoll_ctl(
                    self.epfd.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    fd,
                    std::ptr::null_mut(),
                )
            };
        }
    }

    fn wait(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        let ms = match timeout {
            None => -1,
            Some(d) if d.is_zero() => 0,
            // Round up so a sub-millisecond timer does not become a busy loop.
            Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        crate::sys::count(1);
        // SAFETY: buf is a valid array of its length.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                self.buf.as_mut_ptr(),
                self.buf.len() as i32,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EINTR) {
                Ok(())
            } else {
                Err(e)
            };
        }
        for ev in &self.buf[..n as usize] {
            out.push(Event {
                token: ev.u64,
                revents: ev.events,
                res: 0,
            });
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "epoll"
    }
}
