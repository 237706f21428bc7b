//! Sleeping on many rings at once, and on kernel fds beside them.
//!
//! A thread that waits for readability of several sockets whose receive or
//! accept rings answer for them needs nothing from the server but to be
//! woken when one of those rings moves. It registers as a sleeper on every
//! ring (the rings' own lost-wake-up handshake: `host_waiting`, then a
//! fence, then a re-check), and sleeps in poll(2) on the attachment's *host
//! doorbell*, an eventfd the server rings at the end of a pass in which it
//! woke a sleeper of this host (`ControlMsg::HostDoorbell`). Kernel fds can
//! be in the same poll(2), so a mixed set needs no helper thread, and no
//! call is parked at the server: blocking costs no round trip.

use crate::client::Client;
use crate::socket::Mode;
use crate::sys::move_high;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use tcps_proto::eager::END_STOPPED;
use tcps_proto::handshake::ControlMsg;
use tcps_proto::msg::PollEntry;

/// Poll events a ring can wait for alone (errors and hang-ups are always
/// reported, so asking for them changes nothing).
const RING_EVENTS: i16 =
    libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP;

/// Registered as a sleeper on the rings of a poll set; unregisters when
/// dropped. Made by [`Client::ring_wait`].
pub struct RingWait<'a> {
    client: &'a Client,
    rings: Vec<u32>,
}

impl Drop for RingWait<'_> {
    fn drop(&mut self) {
        for &s in &self.rings {
            if let Some(ring) = self.client.conn.recv_ring(s) {
                ring.bell_wait_done();
            }
        }
    }
}

impl Client {
    /// The attachment's host doorbell (an eventfd, non-blocking, readable
    /// when the server woke one of this host's ring sleepers), asked from
    /// the server once. Read it empty after waking.
    pub fn host_doorbell(&self) -> io::Result<RawFd> {
        if let Some(fd) = self.conn.host_doorbell.get() {
            return Ok(fd.as_raw_fd());
        }
        let mut got = self
            .conn
            .control()
            .call(&ControlMsg::HostDoorbell { handle: 0 }, &[])?;
        if got.len() != 1 {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        // SAFETY: `move_high` returns a descriptor we own (the received one,
        // or a close-on-exec duplicate of it that replaced it).
        let fd = unsafe { OwnedFd::from_raw_fd(move_high(got.remove(0).into_raw_fd())) };
        // Two threads asking at once: the loser's copy is closed here.
        Ok(self.conn.host_doorbell.get_or_init(|| fd).as_raw_fd())
    }

    /// Registers the calling thread as a sleeper on the rings of `fds`, if
    /// every entry's readiness can come from its ring alone (it asks only
    /// for readability, and its socket has a bound receive or accept ring
    /// that has not handed the rest back to the kernel). `None`: some entry
    /// needs the server (`Client::poll` asks it).
    ///
    /// Then re-check with `Client::poll(fds, 0)` (answered from the rings),
    /// and only if nothing is ready sleep on [`host_doorbell`]: a ring that
    /// moves after this call rings it.
    ///
    /// [`host_doorbell`]: Client::host_doorbell
    pub fn ring_wait(&self, fds: &[PollEntry]) -> Option<RingWait<'_>> {
        let mut rings = Vec::with_capacity(fds.len());
        for f in fds {
            if f.events & !RING_EVENTS != 0 {
                return None;
            }
            let sock = self.conn.socks.get(f.sock)?;
            let g = sock.recv.lock();
            if !matches!(g.mode, Mode::Bytes | Mode::Accept) {
                return None;
            }
            let ring = self.conn.recv_ring(f.sock)?;
            if ring.end() == END_STOPPED {
                return None;
            }
            rings.push(f.sock);
        }
        for &s in &rings {
            if let Some(ring) = self.conn.recv_ring(s) {
                ring.bell_wait_prepare();
            }
        }
        Some(RingWait {
            client: self,
            rings,
        })
    }
}
