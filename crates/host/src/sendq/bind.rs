//! Binding a socket's send queue (on its first asynchronous send, or by the
//! server at accept) and handing it to the orphans at close.

use crate::client::Client;
use crate::socket::{SendSide, Socket};
use crate::table::SpinGuard;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use tcps_proto::sendq::SendQueueProducer;
use tcps_proto::Call;

use super::shared::Orphan;

impl Client {
    /// The socket's send side, locked; binds its send queue (`queue == s`)
    /// on first use (one round trip). A socket that cannot have one (an id
    /// beyond the region's queues, or the server refused), or may not now
    /// (not connected, or shut down for writing), has `queue == None`.
    pub(super) fn send_side<'a>(
        &'a self,
        s: u32,
        sock: &'a Socket,
    ) -> io::Result<SpinGuard<'a, SendSide>> {
        let mut g = sock.send.lock();
        if g.queue.is_some() || g.no_queue || g.write_shut {
            return Ok(g);
        }
        let Some(sq) = self.conn.region_send_queue(s) else {
            return Ok(g);
        };
        sq.reset_head();
        let bind = Call::AsyncBind {
            sock: s,
            queue: s,
            start: 0,
        };
        match self.simple_call(bind) {
            Ok(c) => {
                // O_NONBLOCK as this library tracks it (an eagerly accepted
                // socket made non-blocking by accept4 is blocking at the
                // server), else as the server reports it.
                sock.learn_nonblocking(c.aux != 0);
                self.bound(&mut g, s, &sq);
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EINVAL)) => {
                g.no_queue = true;
            }
            // Not connected (yet): this send runs synchronously and gets
            // the kernel's answer; a later one asks again.
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {}
            Err(e) => return Err(e),
        }
        Ok(g)
    }

    /// The send side after queue `s` was bound (`head == done == 0`).
    fn bound(&self, g: &mut SendSide, s: u32, sq: &SendQueueProducer<'_>) {
        let gen = self.conn.sendq.gens[s as usize].fetch_add(1, Ordering::AcqRel) + 1;
        *g = SendSide {
            queue: Some(s),
            gen,
            kicks_sent: sq.kicks_seen(),
            ..SendSide::default()
        };
    }

    /// The server handed out socket id `s` (`Socket`, `Accept`, an accept
    /// ring): whatever was kept of an earlier socket `s` is stale, since
    /// the server frees an id only after unbinding its queue. With
    /// `setup_sendq` (`SETUP_SENDQ`) the queue is bound already, with
    /// `head == done == 0`.
    pub(crate) fn sendq_new_socket(&self, s: u32, sock: &Socket, setup_sendq: bool) {
        self.forget_orphan(s);
        let mut g = sock.send.lock();
        self.conn.sendq.fold_counts(&g);
        // Descriptors of an earlier binding finished when the server freed it.
        let all = g.head.wrapping_add(1 << 30);
        self.forget_done(&mut g.pending, all);
        *g = SendSide::default();
        if setup_sendq {
            if let Some(sq) = self.conn.region_send_queue(s) {
                self.bound(&mut g, s, &sq);
            }
        }
    }

    /// Frees the staging of the orphaned queue `q`: its socket id is in use
    /// again, so the server released it.
    fn forget_orphan(&self, q: u32) {
        let mut orphans = self
            .conn
            .sendq
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        orphans.retain_mut(|o| {
            if o.queue != q {
                return true;
            }
            let done = self.conn.send_queue(q).done();
            self.forget_done(&mut o.pending, done.wrapping_add(1 << 30));
            false
        });
    }

    /// The socket was shut down for writing: its later sends run
    /// synchronously, so the kernel refuses them at the call (a queued
    /// send would return at once and fail later).
    pub(crate) fn sendq_write_shut(&self, s: u32) {
        if let Ok(sock) = self.conn.socks.get_or_insert(s) {
            sock.send.lock().write_shut = true;
        }
    }

    /// The socket is being closed: its queue (with sends in flight) goes to
    /// the orphans until the server releases it.
    pub(crate) fn sendq_close(&self, s: u32) {
        let Some(sock) = self.conn.socks.get(s) else {
            return;
        };
        let st = &self.conn.sendq;
        let mut g = sock.send.lock();
        st.fold_counts(&g);
        if let Some(q) = g.queue {
            let pending = std::mem::take(&mut g.pending);
            st.orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Orphan { queue: q, pending });
        }
        *g = SendSide::default();
    }
}
