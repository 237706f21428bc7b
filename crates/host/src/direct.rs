//! Balancing at the host (`docs/ARCHITECTURE.md` "Balancing"): when the
//! server is the bottleneck it hands some new connections to the host as
//! kernel sockets (*direct*), and the host makes their calls itself with
//! ordinary system calls.
//!
//! Only a process that said it can take them gets any
//! ([`Client::take_direct_connections`]: the preload library, whose
//! program simply gets a kernel fd from `accept`); a direct connection is
//! announced by `SETUP_DIRECT` in its accept record or `Accept` completion,
//! with a handle in place of a socket id, and its kernel socket fetched
//! over the control socket (`ControlMsg::Direct { handle }`, SCM_RIGHTS).
//! Through the native API ([`Client::accept_raw`]) a direct connection,
//! which only a process that asked for them sees, is handed back to the
//! server (`SocketAdopt`) and so stays a tcps socket id.

use crate::client::Client;
use crate::sys::errno;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use tcps_proto::eager::SETUP_DIRECT;
use tcps_proto::handshake::ControlMsg;

/// What an accept gave.
#[derive(Debug)]
pub enum Accepted {
    /// A tcps socket id (offloaded: the server runs its calls).
    Offloaded(u32),
    /// A kernel socket of this process's own, with accept4's flags applied
    /// (O_NONBLOCK, FD_CLOEXEC).
    Direct(OwnedFd),
}

impl Client {
    /// Tells the server this process takes direct connections: from now on
    /// [`Client::accept_any`] may return [`Accepted::Direct`] (listeners
    /// with `TCPS_BALANCE` 0, or a server run with `--balance off`, give
    /// none).
    pub fn take_direct_connections(&self) -> io::Result<()> {
        self.conn
            .control()
            .call(&ControlMsg::Direct { handle: 0 }, &[])
            .map(drop)
    }

    /// The kernel socket of direct connection `handle`. A connection the
    /// server no longer holds is ECONNABORTED, as for a connection reset
    /// before `accept` took it (the program accepts the next one).
    fn claim_direct(&self, handle: u32) -> io::Result<OwnedFd> {
        if handle == 0 {
            return Err(errno(libc::EPROTO));
        }
        let mut got = self
            .conn
            .control()
            .call(&ControlMsg::Direct { handle }, &[])
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => errno(libc::ECONNABORTED),
                _ => e,
            })?;
        if got.len() != 1 {
            return Err(errno(libc::EPROTO));
        }
        Ok(got.remove(0))
    }

    /// accept4(2) that may give a direct connection (`flags`:
    /// SOCK_NONBLOCK, SOCK_CLOEXEC). Returns the connection and the peer
    /// address's full length (written to `addr_out` as by `accept_raw`).
    pub fn accept_any(
        &self,
        s: u32,
        flags: i32,
        addr_out: &mut [u8],
    ) -> io::Result<(Accepted, usize)> {
        let (id, len, setup) = self.accept_setup(s, flags, addr_out)?;
        if setup & SETUP_DIRECT == 0 {
            return Ok((Accepted::Offloaded(id), len));
        }
        let fd = self.claim_direct(id)?;
        set_accept_flags(&fd, flags)?;
        Ok((Accepted::Direct(fd), len))
    }

    /// accept4(2) for the native API: a direct connection is adopted by
    /// the server again, so the caller always gets a socket id.
    pub(crate) fn accept_offloaded(
        &self,
        s: u32,
        flags: i32,
        addr_out: &mut [u8],
    ) -> io::Result<(u32, usize)> {
        match self.accept_any(s, flags, addr_out)? {
            (Accepted::Offloaded(id), len) => Ok((id, len)),
            (Accepted::Direct(fd), len) => {
                let id = self.adopt_kernel_socket(fd, flags & libc::SOCK_NONBLOCK != 0)?;
                Ok((id, len))
            }
        }
    }
}

/// O_NONBLOCK and FD_CLOEXEC as accept4's `flags` ask (the server accepted
/// non-blocking, and the descriptor arrived close-on-exec).
fn set_accept_flags(fd: &OwnedFd, flags: i32) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own, integer arguments.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        let want = if flags & libc::SOCK_NONBLOCK != 0 {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        if want != fl && libc::fcntl(fd, libc::F_SETFL, want) < 0 {
            return Err(io::Error::last_os_error());
        }
        let fdfl = if flags & libc::SOCK_CLOEXEC != 0 {
            libc::FD_CLOEXEC
        } else {
            0
        };
        if libc::fcntl(fd, libc::F_SETFD, fdfl) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
