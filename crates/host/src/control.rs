//! The attachment's control socket after the handshake: one request and
//! its reply at a time for the whole process (memory registration, socket
//! adoption, and the preload library's fork/exec/sendfile messages all go
//! through [`Control::exchange`]), so one thread never reads another's reply.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};

/// How long the server may take to answer a control message.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

pub(crate) struct Control {
    fd: OwnedFd,
    lock: Mutex<()>,
}

impl Control {
    pub fn new(fd: OwnedFd) -> Control {
        Control {
            fd,
            lock: Mutex::new(()),
        }
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The exchange lock (held across fork(2) by the preload library, so a
    /// child never inherits it held).
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `msg` (with `fds`) and returns the server's answer naming the
    /// same handle, with the descriptors it carried. An answer to an earlier
    /// message that timed out is skipped.
    pub fn exchange(
        &self,
        msg: &ControlMsg,
        fds: &[RawFd],
    ) -> io::Result<(ControlMsg, Vec<OwnedFd>)> {
        let _g = self.lock();
        let ctl = self.raw();
        fdpass::send_with_fds(ctl, &msg.encode(), fds)?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd: ctl,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) };
            if rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if rc <= 0 {
                return Err(errno(libc::ETIMEDOUT));
            }
            let mut b = [0u8; CONTROL_MSG_LEN + 1];
            let (n, got) = match fdpass::recv_with_fds(ctl, &mut b, libc::MSG_DONTWAIT) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                r => r?,
            };
            if n == 0 {
                return Err(errno(libc::ECONNRESET));
            }
            let reply = ControlMsg::decode(&b[..n]).ok_or(errno(libc::EPROTO))?;
            let is_answer = matches!(reply, ControlMsg::Reply { .. } | ControlMsg::Adopted { .. });
            if !is_answer {
                return Err(errno(libc::EPROTO));
            }
            if reply.handle() == msg.handle() {
                return Ok((reply, got));
            }
        }
    }

    /// A message answered by `Reply { handle, errno }`: the descriptors the
    /// reply carried on errno 0, else the errno.
    pub fn call(&self, msg: &ControlMsg, fds: &[RawFd]) -> io::Result<Vec<OwnedFd>> {
        match self.exchange(msg, fds)? {
            (ControlMsg::Reply { errno: 0, .. }, got) => Ok(got),
            (ControlMsg::Reply { errno: e, .. }, _) => Err(errno(e)),
            _ => Err(errno(libc::EPROTO)),
        }
    }
}
