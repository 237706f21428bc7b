//! A send queue's state at the server and its control-block handshakes:
//! binding, the hot/cold watch (`active`), taking descriptors, failing on
//! overrun, and publishing finished jobs (`done`, `error`). Below
//! `blocking`, which finishes jobs; `sendq` (mod) drives what it takes.

use crate::calls::common::Res;
use crate::host::{Host, Job, Parked, QueueState};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use tcps_proto::msg::{Call, MemRange};
use tcps_proto::sendq::{self, DESC_CHECKSUM, DESC_FLAGS, DESC_MORE};
use tcps_proto::{futex, Op};
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
    let ctl = sq.ctl();
    ctl.error_seq.store(0, Ordering::Relaxed);
    ctl.error.store(0, Ordering::Relaxed);
    ctl.misuse.store(0, Ordering::Relaxed);
    ctl.bytes_done.store(0, Ordering::Relaxed);
    ctl.done.store(start, Ordering::Relaxed);
    ctl.owner.store(sid + 1, Ordering::Release);
    let kicks = host.queues[queue as usize].kicks;
    host.queues[queue as usize] = QueueState {
        owner: Some(sid),
        ingested: start,
        done: start,
        kicks,
        ..QueueState::default()
    };
    let mut nonblocking = 0;
    if let Some(s) = host.socket_mut(sid) {
        s.queue = Some(queue);
        nonblocking = u64::from(s.nonblocking);
    }
    make_hot(host, queue, now);
    // aux: O_NONBLOCK, which decides EAGAIN on the host's side of the queue.
    Ok((0, nonblocking))
}

pub(crate) fn make_hot(host: &mut Host, q: u32, now: Instant) {
    let st = &mut host.queues[q as usize];
    st.last_activity = Some(now);
    if !st.hot && !st.overrun {
        st.hot = true;
        host.hot.push(q);
        if let Some(sq) = host.region.send_queue(q) {
            sq.ctl().active.store(1, Ordering::Release);
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
        let ctl = sq.ctl();
        ctl.active.store(0, Ordering::Relaxed);
        if first_error {
            ctl.error_seq.store(ingested, Ordering::Relaxed);
            ctl.error.store(libc::EPROTO, Ordering::Release);
        }
        // Wake host threads waiting for credits: they find the error.
        fence(Ordering::SeqCst);
        if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
            futex::wake_all(&ctl.done);
        }
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
/// finish front to back of one socket's write queue).
pub fn finish_job(host: &mut Host, job: &Job, data: MemRange, res: Res) {
    let Some(sq) = host.region.send_queue(job.queue) else {
        return;
    };
    let ctl = sq.ctl();
    if let (Some(expected), true) = (job.checksum, job.held) {
        if let Ok(p) = host.registry.resolve(data) {
            // SAFETY: a registered range (bounds checked), mapped while held.
            let bytes = unsafe { std::slice::from_raw_parts(p, data.len as usize) };
            if sendq::checksum(bytes) != expected {
                let m = ctl.misuse.load(Ordering::Relaxed);
                ctl.misuse.store(m.wrapping_add(1), Ordering::Release);
            }
        }
    }
    if job.held {
        host.registry.release(data.mem);
    }
    let st = &mut host.queues[job.queue as usize];
    match res {
        Ok((n, _)) if n as u64 == u64::from(data.len) => {
            host.stats.async_sends += 1;
            let b = ctl.bytes_done.load(Ordering::Relaxed);
            ctl.bytes_done.store(b + n as u64, Ordering::Relaxed);
        }
        other => {
            host.stats.async_failed += 1;
            let e = other.err().unwrap_or(libc::EPIPE);
            if st.error == 0 {
                st.error = e;
                ctl.error_seq.store(job.seq, Ordering::Relaxed);
                ctl.error.store(e, Ordering::Release);
            }
        }
    }
    st.done = job.seq.wrapping_add(1);
    publish_done(ctl, st.done);
}

/// Stores `done` and wakes a host thread sleeping on it (Dekker against
/// the host's "set host_waiting; fence; load done").
pub(crate) fn publish_done(ctl: &sendq::SendQueueCtl, done: u32) {
    ctl.done.store(done, Ordering::Release);
    fence(Ordering::SeqCst);
    if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
        futex::wake_all(&ctl.done);
    }
}

/// The socket was closed and its jobs are done: the queue is free again.
pub fn unbind(host: &mut Host, q: u32) {
    let Some(st) = host.queues.get_mut(q as usize) else {
        return;
    };
    st.owner = None;
    st.hot = false;
    host.hot.retain(|&h| h != q);
    host.cooling.retain(|&(h, _)| h != q);
    if let Some(sq) = host.region.send_queue(q) {
        sq.ctl().active.store(0, Ordering::Relaxed);
        sq.ctl().owner.store(0, Ordering::Release);
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
            .is_some_and(|sq| sq.ctl().head.load(Ordering::Acquire) != st.ingested)
}

/// Takes hot queue `q` off the watch list unless the host published
/// meanwhile: clear `active`, fence, re-read `head` (the host stores `head`
/// and then loads `active`). Returns true if it stays hot.
pub(crate) fn cool(host: &mut Host, q: u32, now: Instant) -> bool {
    let Some(sq) = host.region.send_queue(q) else {
        return false;
    };
    sq.ctl().active.store(0, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    if has_new(host, q) {
        sq.ctl().active.store(1, Ordering::Relaxed);
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
    for q in host.hot.clone() {
        if cool(host, q, now) {
            pending = true;
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
    let head = sq.ctl().head.load(Ordering::Acquire);
    let st = host.queues[q as usize];
    let n = head.wrapping_sub(st.ingested);
    if n == 0 || st.overrun {
        return 0;
    }
    if n > sq.entries() || head.wrapping_sub(st.done) > sq.entries() {
        // More than the credits allow: the host overwrote descriptors it had
        // no credit for. Only its own stream suffers: the queue fails for
        // good (see the module comment).
        fail_overrun(host, q, head);
        return 0;
    }
    // Straight into the socket's write queue (disjoint fields of `host`:
    // no temporary allocation on this path).
    let Host {
        sockets,
        registry,
        region,
        ..
    } = &mut *host;
    let Some(sq) = region.send_queue(q) else {
        return 0;
    };
    let Some(sock) = sockets.get_mut(sid as usize) else {
        return 0;
    };
    for i in 0..n {
        let seq = st.ingested.wrapping_add(i);
        let d = sq.read_desc(seq);
        let data = MemRange {
            mem: d.mem,
            off: d.off,
            len: d.len,
        };
        let valid = d.flags & !DESC_FLAGS == 0
            && d.len > 0
            && u32::from(d.mem) < sendq::MAX_REGISTRATIONS
            && registry.resolve(data).is_ok();
        if valid {
            registry.hold(d.mem);
        }
        let mut flags = libc::MSG_NOSIGNAL;
        if d.flags & DESC_MORE != 0 {
            flags |= libc::MSG_MORE;
        }
        sock.writers.push_back(Parked {
            ch: 0,
            user_data: 0,
            op: Op::SendReg,
            call: Call::SendReg {
                sock: sid,
                data,
                flags,
            },
            progress: 0,
            nonblocking: false,
            serial: 0,
            job: Some(Job {
                queue: q,
                seq,
                checksum: (d.flags & DESC_CHECKSUM != 0).then_some(d.checksum),
                held: valid,
            }),
        });
    }
    host.queues[q as usize].ingested = head;
    n as usize
}

/// `Op::AsyncKick` on queue `q`: counts the kick and publishes it
/// (`kicks_seen`), so the host knows it was taken.
pub(crate) fn note_kick(host: &mut Host, q: u32) {
    host.stats.kicks += 1;
    let st = &mut host.queues[q as usize];
    st.kicks = st.kicks.wrapping_add(1);
    let kicks = st.kicks;
    if let Some(sq) = host.region.send_queue(q) {
        sq.ctl().kicks_seen.store(kicks, Ordering::Release);
    }
}

/// Setup with accept: binds socket `sid`'s queue with no `AsyncBind` from
/// the host, whose side of the queue starts at 0 too (so `head` is reset
/// first). Whether it is bound.
pub(crate) fn bind_with_accept(host: &mut Host, sid: u32, now: Instant) -> bool {
    let Some(sq) = host.region.send_queue(sid) else {
        return false;
    };
    sq.ctl().head.store(0, Ordering::Relaxed);
    bind(host, sid, sid, 0, now).is_ok()
}
