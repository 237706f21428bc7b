//! recv(2) from a socket's receive ring, and the zero-copy view of it
//! (`recv_view`/`recv_consume`): no request, a copy out of shared memory.

use crate::client::{Client, PollFd};
use crate::socket::{Mode, RecvSide, Socket};
use crate::sys::errno;
use crate::table::SpinGuard;
use std::io;
use std::time::{Duration, Instant};
use tcps_proto::eager::{RecvRingConsumer, END_ERROR, END_NONE, END_STOPPED};

/// recv flags a ring acts on. Of the other flags the kernel's TCP receive
/// acts on, `MSG_ERRQUEUE` is answered in `Client::recv` (EAGAIN) and
/// `MSG_OOB` by a request (the ring carries no urgent data); the rest the
/// kernel accepts and ignores on TCP (`MSG_NOSIGNAL`, `MSG_CMSG_CLOEXEC`,
/// `MSG_MORE`, ...), and so does the ring.
const RING_RECV_FLAGS: i32 =
    libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_DONTWAIT | libc::MSG_TRUNC;

/// What one look at the ring decided.
enum Next {
    /// The call's answer (`Ok(None)`: go on with a plain request).
    Answer(io::Result<Option<usize>>),
    /// Look again at once.
    Again,
    /// Nothing there: wait for `tail` to move from this, within SO_RCVTIMEO.
    Wait(u32, Option<Duration>),
}

/// One `recv` on a ring: its flags and what it got so far.
struct RecvCall<'b> {
    buf: &'b mut [u8],
    flags: i32,
    got: usize,
    /// SO_RCVLOWAT (read at each look).
    lowat: usize,
    /// No more waiting (SO_RCVTIMEO passed, or a non-blocking call found
    /// fewer bytes than it waits for): take what there is.
    last: bool,
}

impl RecvCall<'_> {
    fn peek(&self) -> bool {
        self.flags & libc::MSG_PEEK != 0
    }

    /// MSG_WAITALL that consumes: takes bytes as they come until the
    /// buffer is full.
    fn waitall_consuming(&self) -> bool {
        self.flags & libc::MSG_WAITALL != 0 && !self.peek()
    }

    /// Bytes that must be in the ring before this call copies any (at most
    /// `size`, the ring's): as the kernel wakes a waiting reader, the whole
    /// length for `MSG_PEEK|MSG_WAITALL`, else SO_RCVLOWAT (at most the
    /// length); none for a zero-length receive, which then returns 0 once
    /// anything is there.
    fn need(&self, size: usize) -> usize {
        let want = self.buf.len() - self.got;
        let n = if want == 0 {
            0
        } else if self.waitall_consuming() {
            1
        } else if self.flags & libc::MSG_WAITALL != 0 {
            want
        } else {
            self.lowat.clamp(1, want)
        };
        n.min(size)
    }

    /// What was got, else `e`.
    fn got_or(&self, e: i32) -> io::Result<Option<usize>> {
        if self.got > 0 {
            Ok(Some(self.got))
        } else {
            Err(errno(e))
        }
    }
}

impl Client {
    /// recv(2) from the socket's receive ring: `Ok(None)` if it has none
    /// (the caller sends a plain request).
    pub(crate) fn ring_recv(
        &self,
        s: u32,
        sock: &Socket,
        buf: &mut [u8],
        flags: i32,
    ) -> io::Result<Option<usize>> {
        match self.recv_mode(s, sock)? {
            Mode::Bytes => {}
            // A listener (with its accept ring) receives nothing.
            Mode::Accept => return Err(errno(libc::ENOTCONN)),
            _ => return Ok(None),
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return Ok(None);
        };
        if flags & libc::MSG_OOB != 0 {
            // The ring has no urgent data: a request reads it from the
            // server's kernel socket (it never waits there either).
            return Ok(None);
        }
        self.conn.check_open(libc::ENOTCONN)?;
        let flags = flags & RING_RECV_FLAGS;
        let mut call = RecvCall {
            buf,
            flags,
            got: 0,
            lowat: 1,
            last: false,
        };
        let mut deadline = None;
        loop {
            let (tail, timeo) = match self.recv_look(s, sock, &ring, &mut call)? {
                Next::Answer(r) => return r,
                Next::Again => continue,
                Next::Wait(tail, timeo) => (tail, timeo),
            };
            let deadline = *deadline.get_or_insert_with(|| timeo.map(|t| Instant::now() + t));
            match self.wait_ring(&ring, tail, deadline) {
                Ok(true) => {}
                // SO_RCVTIMEO passed: what there is, else EAGAIN.
                Ok(false) => call.last = true,
                Err(_) if call.got > 0 => return Ok(Some(call.got)),
                Err(e) => return Err(e),
            }
        }
    }

    /// One look at the ring under the receive side's lock: copy what is
    /// there, or report the end, or say what to wait for.
    fn recv_look(
        &self,
        s: u32,
        sock: &Socket,
        ring: &RecvRingConsumer<'_>,
        call: &mut RecvCall<'_>,
    ) -> io::Result<Next> {
        let mut g = sock.recv.lock();
        if g.mode != Mode::Bytes {
            // Closed (and maybe reused) meanwhile.
            return Ok(Next::Answer(call.got_or(libc::EBADF)));
        }
        call.lowat = g.rcvlowat;
        let tail = ring.tail();
        let avail = ring.available(tail, g.cur.consumed) as usize;
        // A paused ring gets no more bytes until some are consumed (the
        // server pauses it short of full): what it holds is all there is.
        let enough = avail >= call.need(ring.size() as usize) || ring.paused();
        if avail > 0 && (enough || call.last || ring.end() != END_NONE) {
            return self.recv_take(s, g, ring, tail, avail, call);
        }
        if avail == 0 {
            if let Some(next) = recv_end(&mut g, ring, tail, call.got) {
                return Ok(next);
            }
        }
        if call.last {
            return Ok(Next::Answer(call.got_or(libc::EAGAIN)));
        }
        let timeo = g.rcvtimeo;
        drop(g);
        if call.flags & libc::MSG_DONTWAIT != 0 || self.nonblocking_of(s, sock)? {
            if avail > 0 {
                // Fewer than it would wait for: take them.
                call.last = true;
                return Ok(Next::Again);
            }
            if call.got > 0 {
                sock.recv.lock().recvs += 1;
            }
            return Ok(Next::Answer(call.got_or(libc::EAGAIN)));
        }
        Ok(Next::Wait(tail, timeo))
    }

    /// Copies (or, with `MSG_TRUNC`, counts) up to `avail` published bytes
    /// and consumes them unless peeking; kicks a paused ring.
    fn recv_take(
        &self,
        s: u32,
        mut g: SpinGuard<'_, RecvSide>,
        ring: &RecvRingConsumer<'_>,
        tail: u32,
        avail: usize,
        call: &mut RecvCall<'_>,
    ) -> io::Result<Next> {
        let want = call.buf.len() - call.got;
        let n = if call.flags & libc::MSG_TRUNC != 0 {
            avail.min(want)
        } else {
            let n = ring.copy_out(g.cur.consumed, tail, &mut call.buf[call.got..]);
            g.copied += n as u64;
            n
        };
        call.got += n;
        let mut kick = false;
        if !call.peek() && n > 0 {
            g.bytes += n as u64;
            kick = ring.consume(&mut g.cur, n as u32);
        }
        let finished = !call.waitall_consuming() || call.got == call.buf.len() || call.last;
        if finished {
            g.recvs += 1;
        }
        drop(g);
        if kick {
            self.post_kick(s)?;
        }
        Ok(if finished {
            Next::Answer(Ok(Some(call.got)))
        } else {
            Next::Again
        })
    }

    /// A blocking receive by request under SO_RCVLOWAT: the server's
    /// receive does not wait for the mark, so first wait for POLLIN, which
    /// its kernel socket reports only at the mark (or at the end or an
    /// error), for at most SO_RCVTIMEO. `true`: the time passed, the
    /// receive must not wait (it takes what is there, as the kernel's).
    /// Not for a receive of `len` below the mark (the kernel waits for
    /// `len` bytes then, which POLLIN does not tell).
    pub(crate) fn plain_rcvlowat_wait(
        &self,
        s: u32,
        sock: &Socket,
        len: usize,
        flags: i32,
    ) -> io::Result<bool> {
        let (lowat, timeo) = {
            let g = sock.recv.lock();
            (g.rcvlowat, g.rcvtimeo)
        };
        let skip = libc::MSG_DONTWAIT | libc::MSG_OOB | libc::MSG_WAITALL;
        if lowat <= 1 || len < lowat || flags & skip != 0 || self.nonblocking_of(s, sock)? {
            return Ok(false);
        }
        let ms = timeo.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
        let mut fds = [PollFd {
            sock: s,
            events: libc::POLLIN,
            revents: 0,
        }];
        Ok(self.poll(&mut fds, ms)? == 0)
    }

    /// FIONREAD (SIOCINQ) from the socket's receive ring: the bytes it
    /// holds, what the server read ahead (more may still wait in the
    /// server's kernel socket beyond the ring's size). `Ok(None)`: no ring
    /// (the caller peeks); EINVAL for a listener, as the kernel's.
    pub fn ring_pending(&self, s: u32) -> io::Result<Option<usize>> {
        let sock = self.conn.socks.get_or_insert(s)?;
        match self.recv_mode(s, sock)? {
            Mode::Accept => return Err(errno(libc::EINVAL)),
            Mode::Bytes => {}
            _ => return Ok(None),
        }
        let Some(ring) = self.conn.recv_ring(s) else {
            return Ok(None);
        };
        let g = sock.recv.lock();
        if g.mode != Mode::Bytes {
            return Ok(None);
        }
        Ok(Some(ring.available(ring.tail(), g.cur.consumed) as usize))
    }

    /// A zero-copy view of the bytes at the front of the socket's receive
    /// ring: a pointer and a length (at most `max`, contiguous, so possibly
    /// less than what is pending at the ring's wrap). Waits like `recv`
    /// (O_NONBLOCK / `MSG_DONTWAIT`: EAGAIN, SO_RCVTIMEO); `(null, 0)` at
    /// end of stream; an error of the connection once. The bytes stay
    /// valid and unchanged until [`recv_consume`](Self::recv_consume)
    /// releases them. EOPNOTSUPP if the socket has no receive ring.
    pub fn recv_view(&self, s: u32, max: usize, flags: i32) -> io::Result<(*const u8, usize)> {
        let sock = self.conn.socks.get_or_insert(s)?;
        self.async_error_of(sock)?;
        if flags & !libc::MSG_DONTWAIT != 0 {
            return Err(errno(libc::EINVAL));
        }
        // Waits, and reports the end, exactly as a recv that neither copies
        // nor consumes.
        let mut probe = [0u8; 1];
        let flags = flags | libc::MSG_PEEK | libc::MSG_TRUNC;
        let got = match self.ring_recv(s, sock, &mut probe, flags) {
            // A listener has an accept ring, no receive ring (recv gets
            // ENOTCONN there, as from the kernel).
            Err(_) if sock.recv.lock().mode == Mode::Accept => {
                return Err(errno(libc::EOPNOTSUPP));
            }
            r => r?,
        };
        match got {
            None => return Err(errno(libc::EOPNOTSUPP)),
            Some(0) => return Ok((std::ptr::null(), 0)),
            Some(_) => {}
        }
        let ring = self.conn.recv_ring(s).ok_or(errno(libc::EOPNOTSUPP))?;
        let g = sock.recv.lock();
        if g.mode != Mode::Bytes {
            return Err(errno(libc::EBADF));
        }
        let n = ring
            .available(ring.tail(), g.cur.consumed)
            .min(u32::try_from(max).unwrap_or(u32::MAX));
        let (p, n) = ring.span_ptr(g.cur.consumed, n);
        Ok((p as *const u8, n))
    }

    /// Releases the first `n` bytes of the socket's receive ring (after
    /// [`recv_view`](Self::recv_view)): EINVAL if fewer are pending.
    pub fn recv_consume(&self, s: u32, n: usize) -> io::Result<()> {
        let ring = self.conn.recv_ring(s).ok_or(errno(libc::EOPNOTSUPP))?;
        let mut g = self.conn.socks.get_or_insert(s)?.recv.lock();
        if g.mode != Mode::Bytes {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let n = u32::try_from(n).map_err(|_| errno(libc::EINVAL))?;
        if n > ring.available(ring.tail(), g.cur.consumed) {
            return Err(errno(libc::EINVAL));
        }
        if n == 0 {
            return Ok(());
        }
        // Received, and copied by nobody.
        g.bytes += u64::from(n);
        let kick = ring.consume(&mut g.cur, n);
        drop(g);
        if kick {
            self.post_kick(s)?;
        }
        Ok(())
    }
}

/// The ring is empty up to `tail`: its end, if the server set one (`None`:
/// no end, the caller waits).
fn recv_end(
    g: &mut SpinGuard<'_, RecvSide>,
    ring: &RecvRingConsumer<'_>,
    tail: u32,
    got: usize,
) -> Option<Next> {
    let end = ring.end();
    if end == END_NONE {
        return None;
    }
    // `end` is stored after the last `tail`: look once more.
    if ring.tail() != tail {
        return Some(Next::Again);
    }
    if end == END_STOPPED {
        // The server stopped receiving eagerly: from now on plain requests
        // (after the bytes returned here).
        g.mode = Mode::Plain;
        return Some(Next::Answer(Ok((got > 0).then_some(got))));
    }
    g.recvs += 1;
    if got > 0 {
        return Some(Next::Answer(Ok(Some(got))));
    }
    if end == END_ERROR && !g.end_reported {
        // Reported once, also by MSG_PEEK (the kernel's sock_error clears
        // the error either way).
        g.end_reported = true;
        let e = ring.end_errno();
        return Some(Next::Answer(Err(errno(if e > 0 { e } else { libc::EIO }))));
    }
    Some(Next::Answer(Ok(Some(0))))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::Ordering;
    use tcps_proto::{Layout, Region};

    pub(in crate::eager) fn region() -> Region {
        let layout = Layout {
            n_channels: 1,
            ring_entries: 2,
            arena_size: 4096,
            send_queues: 0,
            recv_rings: 2,
            rq_bytes: 4096,
            ..Layout::default()
        };
        // SAFETY: memfd_create with a valid C string; checked.
        let fd = unsafe { libc::memfd_create(c"tcps-eager-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: valid descriptor and size.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), layout.region_size() as i64) },
            0
        );
        Region::map(fd.as_fd(), layout).unwrap()
    }

    #[test]
    fn copy_out_wraps_and_stops_at_tail() {
        let r = region();
        let ring = r.recv_ring(1).unwrap();
        let c = RecvRingConsumer::new(ring);
        let size = ring.size();
        let start = size - 10; // 10 bytes before the wrap
        let data: Vec<u8> = (0..100u8).collect();
        ring.write_at(start, &data);
        let tail = start.wrapping_add(100);
        let mut out = [0u8; 64];
        assert_eq!(c.copy_out(start, tail, &mut out), 64);
        assert_eq!(&out[..], &data[..64]);
        let mut out = [0u8; 64];
        assert_eq!(c.copy_out(start + 64, tail, &mut out), 36);
        assert_eq!(&out[..36], &data[64..]);
        // Nothing published.
        assert_eq!(c.copy_out(tail, tail, &mut out), 0);
        // Free-running positions across the u32 wrap.
        let p = u32::MAX - 5;
        ring.write_at(p, &data[..20]);
        let mut out = [0u8; 20];
        assert_eq!(c.copy_out(p, p.wrapping_add(20), &mut out), 20);
        assert_eq!(&out[..], &data[..20]);
    }

    #[test]
    fn a_receive_waits_for_what_the_kernel_wakes_it_for() {
        let need = |len: usize, flags: i32, lowat: usize| {
            let mut b = vec![0u8; len];
            let call = RecvCall {
                buf: &mut b,
                flags,
                got: 0,
                lowat,
                last: false,
            };
            call.need(4096)
        };
        let (peek, waitall) = (libc::MSG_PEEK, libc::MSG_WAITALL);
        assert_eq!(need(100, 0, 1), 1);
        assert_eq!(need(1000, 0, 600), 600); // SO_RCVLOWAT
        assert_eq!(need(100, 0, 600), 100); // ... at most the length
        assert_eq!(need(1000, peek, 600), 600);
        assert_eq!(need(1000, waitall, 600), 1); // takes bytes as they come
        assert_eq!(need(1000, peek | waitall, 1), 1000); // the whole length
        assert_eq!(need(10_000, peek | waitall, 1), 4096); // ... at most a ring
        assert_eq!(need(0, 0, 600), 0); // zero length: anything
    }

    #[test]
    fn forged_tail_reads_at_most_a_ring() {
        let r = region();
        let c = RecvRingConsumer::new(r.recv_ring(0).unwrap());
        assert_eq!(c.available(10, 20), 4096);
        assert_eq!(c.available(5000, 0), 4096);
        assert_eq!(c.available(100, 40), 60);
    }

    #[test]
    fn consume_stores_head_and_kicks_once_while_paused() {
        let r = region();
        let ring = r.recv_ring(0).unwrap();
        let ctl = ring.ctl();
        let c = RecvRingConsumer::new(ring);
        let mut g = RecvSide::default();
        g.bind(Mode::Bytes, &c);
        assert!(!c.consume(&mut g.cur, 100));
        assert_eq!(ctl.head.load(Ordering::Relaxed), 100);
        ctl.paused.store(1, Ordering::Relaxed);
        assert!(c.consume(&mut g.cur, 1)); // a kick
        assert!(!c.consume(&mut g.cur, 1)); // ours is still unseen
        ctl.kicks_seen.store(1, Ordering::Relaxed);
        assert!(c.consume(&mut g.cur, 1)); // seen: kick again
        ctl.paused.store(0, Ordering::Relaxed);
        assert!(!c.consume(&mut g.cur, 1));
        assert_eq!(ctl.head.load(Ordering::Relaxed), 104);
    }

    #[test]
    fn kicks_of_an_earlier_binding_do_not_block_ours() {
        use tcps_proto::eager::kick_pending;
        assert!(!kick_pending(5, 5));
        assert!(kick_pending(4, 5));
        assert!(!kick_pending(7, 5)); // stale kicks counted: nothing pending
        assert!(kick_pending(u32::MAX, 0)); // across the wrap
    }
}
