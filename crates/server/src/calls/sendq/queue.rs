//! A send queue's state at the server and its control-block handshakes:
//! binding, the hot/cold watch (`active`), taking descriptors, failing on
//! overrun, and publishing finished jobs (`done`, `error`). Below
//! `blocking`, which finishes jobs; `sendq` (mod) drives what it takes.

use crate::calls::common::Res;
use crate::host::{Host, Job, Parked, QueueState};
use crate::registry::Registry;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps_proto::msg::{Call, MemRange};
use tcps_proto::sendq::{
    self, Entry, Overrun, SendDesc, SendQueueConsumer, DESC_CHECKSUM, DESC_MORE,
};
use tcps_proto::Op;
use tracing::debug;

/// A hot queue with no new descriptor for this long goes cold (the host
/// kicks it again).
pub(crate) const COOL_AFTER: Duration = Duration::from_micros(200);

/// A queue that went cold is looked at once more this much later: a host
/// store of `head` that raced with clearing `active` has long been visible.
pub(crate) const RECHECK_AFTER: Duration = Duration::from_micros(100);

/// `Op::AsyncBind`: binds send queue `queue` to socket `sid`, starting at
/// descriptor `start`.
pub(crate) fn bind(host: &mut Host, sid: u32, queue: u32, start: u32, now: Instant) -> Res {
    let sock = host.socket(sid).ok_or(libc::EBADF)?;
    if queue != sid {
        // A socket's queue is the one with its id (PROTOCOL §10).
        return Err(libc::EINVAL);
    }
    let sq = host.region.send_queue(queue).ok_or(libc::EINVAL)?;
    if sock.queue.is_some() || host.queues[queue as usize].owner.is_some() {
        return Err(libc::EBUSY);
    }
    if !may_send(sock.fd.as_raw_fd()) {
        return Err(libc::ENOTCONN);
    }
    if host.remote {
        // Over a fabric `head` is the host pump's to ship, and it ships a
        // new binding's from 0 (`host::remote::pump`): an old binding's
        // head left in this copy must not count as descriptors.
        if start != 0 {
            return Err(libc::EINVAL);
        }
        SendQueueConsumer::new(sq).reset_head();
    }
    SendQueueConsumer::new(sq).bind(sid, start);
    let kicks = host.queues[queue as usize].kicks;
    host.queues[queue as usize] = QueueState {
        owner: Some(sid),
        ingested: start,
        done: start,
        kicks,
        ..QueueState::default()
    };
    host.bound_queues.push(queue);
    let mut nonblocking = 0;
    if let Some(s) = host.socket_mut(sid) {
        s.queue = Some(queue);
        nonblocking = u64::from(s.nonblocking);
    }
    make_hot(host, queue, now);
    // aux: O_NONBLOCK, which decides EAGAIN on the host's side of the queue.
    Ok((0, nonblocking))
}

/// Whether the kernel socket `fd` takes a send now: connected (or closed
/// by the peer) and not shut down for writing. Only such a socket may
/// queue sends: a queued send returns at once, so on any other (never
/// connected, listening, connecting, shut down, reset) it would take bytes
/// the kernel refuses at the call (EPIPE, EAGAIN). The host then sends
/// synchronously and gets the kernel's answer, and binds again later
/// (a connect in progress completes).
fn may_send(fd: RawFd) -> bool {
    // SAFETY: a zeroed tcp_info is valid; the kernel writes at most `len`
    // bytes into it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt on the server's own fd into `info` of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // TCP_ESTABLISHED and TCP_CLOSE_WAIT (include/net/tcp_states.h).
    r == 0 && len >= 1 && matches!(info.tcpi_state, 1 | 8)
}

pub(crate) fn make_hot(host: &mut Host, q: u32, now: Instant) {
    let st = &mut host.queues[q as usize];
    st.last_activity = Some(now);
    if !st.hot && !st.overrun {
        st.hot = true;
        host.hot.push(q);
        if let Some(sq) = host.region.send_queue(q) {
            SendQueueConsumer::new(sq).activate();
        }
    }
}

/// The host published beyond its credits on queue `q`: EPROTO in `error`
/// (the jobs already taken fail with it, in order), and the queue is taken
/// off every watch list for good.
pub(crate) fn fail_overrun(host: &mut Host, q: u32, head: u32) {
    debug!(
        host = host.id,
        queue = q,
        head,
        "send queue overrun: failed for good"
    );
    let st = &mut host.queues[q as usize];
    st.overrun = true;
    st.hot = false;
    let first_error = st.error == 0;
    if first_error {
        st.error = libc::EPROTO;
    }
    let ingested = st.ingested;
    host.hot.retain(|&h| h != q);
    host.cooling.retain(|&(h, _)| h != q);
    if let Some(sq) = host.region.send_queue(q) {
        // Stops the watch, publishes EPROTO (the queue's first error) and
        // wakes host threads waiting for credits: they find the error.
        SendQueueConsumer::new(sq).fail_overrun(first_error.then_some(ingested));
    }
}

/// Whether a job may be sent: its descriptor was valid and no earlier one
/// of its queue failed. Otherwise the errno it fails with.
pub fn job_error(host: &Host, job: &Job) -> Option<i32> {
    let e = host
        .queues
        .get(job.queue as usize)
        .map_or(libc::EBADF, |q| q.error);
    if e != 0 {
        Some(e)
    } else if !job.held {
        Some(libc::EINVAL)
    } else {
        None
    }
}

/// A job finished: publish it in its queue (in order: jobs of a queue
/// finish front to back of one socket's write queue). `len`: the bytes it
/// was to send; `data`: its registered range (none for a file range).
pub fn finish_job(host: &mut Host, job: &Job, data: Option<MemRange>, len: u32, res: Res) {
    let Some(sq) = host.region.send_queue(job.queue) else {
        return;
    };
    let c = SendQueueConsumer::new(sq);
    if let (Some(expected), true, Some(data)) = (job.checksum, job.held, data) {
        if let Ok(p) = host.registry.resolve(data) {
            // SAFETY: a registered range (bounds checked), mapped while held.
            let bytes = unsafe { std::slice::from_raw_parts(p, data.len as usize) };
            if sendq::checksum(bytes) != expected {
                c.count_misuse();
            }
        }
    }
    if let (true, Some(data)) = (job.held, data) {
        host.registry.release(data.mem);
    }
    let st = &mut host.queues[job.queue as usize];
    match res {
        Ok((n, _)) if n as u64 == u64::from(len) => {
            host.stats.async_sends += 1;
            c.add_bytes_done(n as u64);
        }
        other => {
            host.stats.async_failed += 1;
            let e = other.err().unwrap_or(libc::EPIPE);
            debug!(
                host = host.id,
                queue = job.queue,
                seq = job.seq,
                errno = e,
                file = job.file.is_some(),
                "asynchronous send failed"
            );
            if st.error == 0 {
                st.error = e;
                c.set_error(job.seq, e);
            }
        }
    }
    st.done = job.seq.wrapping_add(1);
    // Stores `done` and wakes a host thread sleeping on it (the lost
    // wake-up handshake, `SendQueueConsumer::publish_done`).
    let woke = c.publish_done(st.done);
    host.stats.count_woke(woke);
}

/// The socket was closed and its jobs are done: the queue is free again.
pub fn unbind(host: &mut Host, q: u32) {
    let Some(st) = host.queues.get_mut(q as usize) else {
        return;
    };
    st.owner = None;
    st.hot = false;
    host.bound_queues.retain(|&b| b != q);
    host.hot.retain(|&h| h != q);
    host.cooling.retain(|&(h, _)| h != q);
    if let Some(sq) = host.region.send_queue(q) {
        SendQueueConsumer::new(sq).unbind();
    }
}

/// Whether the host published descriptors the server would take (never
/// for an overrun queue: it takes nothing more).
pub(crate) fn has_new(host: &Host, q: u32) -> bool {
    let st = &host.queues[q as usize];
    !st.overrun
        && host
            .region
            .send_queue(q)
            .is_some_and(|sq| SendQueueConsumer::new(sq).has_new(st.ingested))
}

/// Takes hot queue `q` off the watch list unless the host published
/// meanwhile: clear `active`, fence, re-read `head` (the host stores `head`
/// and then loads `active`). Returns true if it stays hot.
pub(crate) fn cool(host: &mut Host, q: u32, now: Instant) -> bool {
    let Some(sq) = host.region.send_queue(q) else {
        return false;
    };
    let c = SendQueueConsumer::new(sq);
    c.deactivate();
    if has_new(host, q) {
        c.reactivate();
        host.queues[q as usize].last_activity = Some(now);
        return true;
    }
    host.queues[q as usize].hot = false;
    host.hot.retain(|&h| h != q);
    host.cooling.push((q, now + RECHECK_AFTER));
    false
}

/// Before the worker sleeps: every hot queue goes cold (the host kicks,
/// which rings the doorbell). Returns whether one has new descriptors after
/// all (do not sleep) and the earliest second look due.
pub fn prepare_sleep(host: &mut Host, now: Instant) -> (bool, Option<Instant>) {
    let mut pending = false;
    // By index (no copy of the list): `cool` takes a queue that goes cold
    // out of `hot`, keeping the order of the others.
    let mut i = 0;
    while let Some(&q) = host.hot.get(i) {
        if cool(host, q, now) {
            pending = true;
        }
        if host.hot.get(i) == Some(&q) {
            i += 1;
        }
    }
    let next = host.cooling.iter().map(|&(_, at)| at).min();
    (pending, next)
}

/// Takes every descriptor the host published on the socket's queue into its
/// write queue (as jobs). Returns how many were taken.
pub(crate) fn take(host: &mut Host, sid: u32) -> usize {
    let Some(q) = host.sockets.get(sid as usize).and_then(|s| s.queue) else {
        return 0;
    };
    let Some(sq) = host.region.send_queue(q) else {
        return 0;
    };
    let st = host.queues[q as usize];
    if st.overrun {
        return 0;
    }
    let n = match SendQueueConsumer::new(sq).pending(st.ingested, st.done) {
        Ok(n) => n,
        Err(Overrun { head }) => {
            // More than the credits allow: the host overwrote descriptors it
            // had no credit for. Only its own stream suffers: the queue
            // fails for good (see the module comment).
            fail_overrun(host, q, head);
            return 0;
        }
    };
    if n == 0 {
        return 0;
    }
    // Straight into the socket's write queue (disjoint fields of `host`:
    // no temporary allocation on this path).
    let Host {
        sockets,
        registry,
        region,
        files,
        ..
    } = &mut *host;
    let Some(sq) = region.send_queue(q).map(SendQueueConsumer::new) else {
        return 0;
    };
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return 0;
    };
    for i in 0..n {
        let seq = st.ingested.wrapping_add(i);
        // Copied out once: the copy is what gets checked and used.
        let d = sq.take_desc(seq);
        // More of the stream is already queued behind this send (nginx's
        // headers, then the file): MSG_MORE lets the kernel put them in
        // one segment instead of pushing the headers alone.
        let more = i + 1 < n;
        sock.writers
            .push_back(job_of(sid, q, seq, &d, more, registry, files));
    }
    host.queues[q as usize].ingested = st.ingested.wrapping_add(n);
    n as usize
}

/// The job of descriptor `seq` (copied out once: `d`) of socket `sid`'s
/// queue `q`: a file range holding its file (only one this host handed
/// over), or a byte range holding its registration (sent with MSG_MORE
/// when the host asked for it or `more` of the stream is queued behind
/// it). A malformed descriptor
/// or an unknown handle or range makes a job that fails (`held == false`).
fn job_of(
    sid: u32,
    q: u32,
    seq: u32,
    d: &SendDesc,
    more: bool,
    registry: &mut Registry,
    files: &HashMap<u32, Arc<OwnedFd>>,
) -> Parked {
    let job = Job {
        queue: q,
        seq,
        checksum: (d.flags & DESC_CHECKSUM != 0).then_some(d.checksum),
        held: false,
        file: None,
    };
    let mut flags = libc::MSG_NOSIGNAL;
    if d.flags & DESC_MORE != 0 || more {
        flags |= libc::MSG_MORE;
    }
    let (op, call, job) = match d.entry() {
        Some(Entry::File { file, off, len }) => {
            let f = files.get(&file).cloned();
            let job = Job {
                held: f.is_some(),
                file: f,
                ..job
            };
            let call = Call::SendFile {
                sock: sid,
                file,
                offset: off,
                count: len,
            };
            (Op::SendFile, call, job)
        }
        entry => {
            let data = MemRange {
                mem: d.mem,
                off: d.off,
                len: d.len,
            };
            let valid =
                matches!(entry, Some(Entry::Bytes { .. })) && registry.resolve(data).is_ok();
            if valid {
                registry.hold(d.mem);
            }
            let call = Call::SendReg {
                sock: sid,
                data,
                flags,
            };
            (Op::SendReg, call, Job { held: valid, ..job })
        }
    };
    Parked {
        ch: 0,
        user_data: 0,
        op,
        call,
        progress: 0,
        nonblocking: false,
        serial: 0,
        job: Some(job),
    }
}

/// `Op::AsyncKick` on queue `q`: counts the kick and publishes it
/// (`kicks_seen`), so the host knows it was taken.
pub(crate) fn note_kick(host: &mut Host, q: u32) {
    host.stats.kicks += 1;
    let st = &mut host.queues[q as usize];
    st.kicks = st.kicks.wrapping_add(1);
    let kicks = st.kicks;
    if let Some(sq) = host.region.send_queue(q) {
        SendQueueConsumer::new(sq).set_kicks_seen(kicks);
    }
}

/// Setup with accept: binds socket `sid`'s queue with no `AsyncBind` from
/// the host, whose side of the queue starts at 0 too (so `head` is reset
/// first). Whether it is bound.
pub(crate) fn bind_with_accept(host: &mut Host, sid: u32, now: Instant) -> bool {
    let Some(sq) = host.region.send_queue(sid) else {
        return false;
    };
    SendQueueConsumer::new(sq).reset_head();
    bind(host, sid, sid, 0, now).is_ok()
}
