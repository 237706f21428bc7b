//! accept4(2) from a listener's accept ring: connections the server
//! accepted eagerly, taken with no request.

use crate::client::Client;
use crate::socket::Mode;
use crate::sys::errno;
use std::io;
use std::time::{Duration, Instant};
use tcps_proto::eager::{AcceptRecord, AcceptRingConsumer, ACCEPT_ERROR, END_NONE, SETUP_DIRECT};
use tcps_proto::Call;

impl Client {
    /// accept4(2) from the listener's accept ring: `Ok(None)` if it has
    /// none (the caller sends a plain request).
    pub(crate) fn ring_accept(
        &self,
        s: u32,
        flags: i32,
        addr_out: &mut [u8],
    ) -> io::Result<Option<(u32, usize, u32)>> {
        let sock = self.conn.socks.get_or_insert(s)?;
        if self.recv_mode(s, sock)? != Mode::Accept {
            return Ok(None);
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return Ok(None);
        };
        self.conn.check_open(libc::ENOTCONN)?;
        let acc = AcceptRingConsumer::new(ring.ring());
        let mut deadline = None;
        loop {
            let mut g = sock.recv.lock();
            if g.mode != Mode::Accept {
                return Ok(None); // closed meanwhile: the server will say so
            }
            // One read of `tail` for the look and the wait below (which
            // sleeps only while `tail` is still this).
            let tail = ring.tail();
            if let Some((rec, kick)) = acc.take_before(&mut g.cur, tail) {
                if rec.flags & ACCEPT_ERROR != 0 {
                    // The server stopped accepting eagerly at this error;
                    // the next accept that finds the ring empty asks again.
                    g.demand = false;
                    drop(g);
                    if kick {
                        let _ = self.post_kick(s);
                    }
                    let e = i32::try_from(rec.reserved).unwrap_or(libc::EIO);
                    return Err(errno(if e > 0 { e } else { libc::EIO }));
                }
                g.accepts += 1;
                let rcvtimeo = g.rcvtimeo;
                drop(g);
                if kick {
                    // The connection is ours already: a dead server shows
                    // on the next call.
                    let _ = self.post_kick(s);
                }
                return self.adopt_record(&rec, flags, rcvtimeo, addr_out).map(Some);
            }
            if acc.end() != END_NONE {
                // The server stopped accepting eagerly: ask it directly.
                return Ok(None);
            }
            // Empty: tell the server we want connections (first time), or
            // that it may go on (paused).
            let paused = acc.paused();
            let first = !g.demand;
            let timeo = g.rcvtimeo;
            let Some(nonblocking) = sock.nonblocking() else {
                // Learn it from the server once, then look again.
                drop(g);
                self.nonblocking_of(s, sock)?;
                continue;
            };
            if first && nonblocking {
                // A non-blocking accept must see connections already in the
                // kernel's backlog: the server accepts eagerly before it
                // answers this (one round trip, once per listener).
                g.demand = true;
                drop(g);
                self.simple_call(Call::RecvBind { sock: s })?;
                continue;
            }
            let kick = (first || paused) && acc.take_kick(&mut g.cur);
            g.demand |= kick;
            drop(g);
            if kick {
                self.post_kick(s)?;
            }
            if nonblocking {
                return Err(errno(libc::EAGAIN));
            }
            let deadline = *deadline.get_or_insert_with(|| timeo.map(|t| Instant::now() + t));
            if !self.wait_ring(&ring, tail, deadline)? {
                return Err(errno(libc::EAGAIN));
            }
        }
    }

    /// A connection from an accept ring: the new socket's record (none for
    /// a direct connection: `crate::direct`), the peer's address (up to
    /// `addr_out.len()` bytes). Returns the socket id (or direct handle),
    /// the address's full length and the record's `SETUP_*` flags.
    fn adopt_record(
        &self,
        rec: &AcceptRecord,
        flags: i32,
        rcvtimeo: Option<Duration>,
        addr_out: &mut [u8],
    ) -> io::Result<(u32, usize, u32)> {
        let len = (rec.addr_len as usize).min(rec.addr.len());
        let n = len.min(addr_out.len());
        addr_out[..n].copy_from_slice(&rec.addr[..n]);
        if rec.flags & SETUP_DIRECT != 0 {
            return Ok((rec.sock, len, rec.flags));
        }
        // Like the kernel, an accepted socket inherits the listener's
        // SO_RCVTIMEO; O_NONBLOCK comes from accept4's flags.
        self.new_socket_record(
            rec.sock,
            flags & libc::SOCK_NONBLOCK != 0,
            rec.flags,
            rcvtimeo,
            true,
        );
        Ok((rec.sock, len, rec.flags))
    }
}
