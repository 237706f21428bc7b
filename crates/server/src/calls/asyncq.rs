//! Asynchronous sends: the server side of the send queues (see
//! `tcps_proto::sendq`).
//!
//! A bound queue's descriptors are *ingested* — copied out, in order, into
//! the socket's `writers` queue as jobs — whenever the server looks at the
//! queue: on a kick, on every pass while the queue is hot, before any
//! write-side call on the socket (so that call lands after them), and in a
//! periodic sweep. Jobs are then driven like parked sends: sent straight
//! from registered memory as the socket takes data, with no help from the
//! host. Finishing a job (sent, or failed) publishes `done` in the queue's
//! control block, and the first failure also `error`/`error_seq`; later jobs
//! of the queue fail with the same errno, so the stream never has a hole.
//!
//! The jobs a socket holds at the server never exceed its queue's
//! capacity: descriptors are taken only while `head - done <= entries`. A
//! host that publishes more than its credits allow has *overrun* its
//! queue: it fails for good (EPROTO), the jobs already taken fail in order,
//! and nothing more is taken from it until the socket closes (a new queue
//! of the same id starts clean). Resetting the queue instead and going on
//! would let a host behind a parked send grow the jobs without bound.

use super::blocking::{drive_writers, rearm};
use super::{Ctx, Res};
use crate::host::{Host, Job, Parked, QueueState};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use tcps_proto::msg::{Call, MemRange};
use tcps_proto::sendq::{self, DESC_CHECKSUM, DESC_FLAGS, DESC_MORE};
use tcps_proto::{futex, Op};
use tracing::debug;

/// A hot queue with no new descriptor for this long goes cold (the host
/// kicks it again).
const COOL_AFTER: Duration = Duration::from_micros(200);
/// A queue that went cold is looked at once more this much later: a host
/// store of `head` that raced with clearing `active` has long been visible.
const RECHECK_AFTER: Duration = Duration::from_micros(100);

/// `Op::AsyncBind`: binds send queue `queue` to socket `sid`, starting at
/// descriptor `start`.
pub(super) fn bind(host: &mut Host, sid: u32, queue: u32, start: u32, now: Instant) -> Res {
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

/// `Op::AsyncKick`: the host published descriptors while the queue was cold.
pub(super) fn kick(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, now: Instant) {
    let Some(q) = host.socket(sid).and_then(|s| s.queue) else {
        return;
    };
    host.stats.kicks += 1;
    let st = &mut host.queues[q as usize];
    st.kicks = st.kicks.wrapping_add(1);
    let kicks = st.kicks;
    if let Some(sq) = host.region.send_queue(q) {
        sq.ctl().kicks_seen.store(kicks, Ordering::Release);
    }
    make_hot(host, q, now);
    ingest(cx, host, sid);
}

fn make_hot(host: &mut Host, q: u32, now: Instant) {
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

/// Takes every descriptor the host published on the socket's queue into its
/// write queue, then drives it. Returns how many were taken.
pub fn ingest(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> usize {
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
    drive_writers(cx, host, sid);
    let hkey = cx.hkey;
    if let Some(s) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, s);
    }
    n as usize
}

/// The host published beyond its credits on queue `q`: EPROTO in `error`
/// (the jobs already taken fail with it, in order), and the queue is taken
/// off every watch list for good.
fn fail_overrun(host: &mut Host, q: u32, head: u32) {
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
fn publish_done(ctl: &sendq::SendQueueCtl, done: u32) {
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
fn has_new(host: &Host, q: u32) -> bool {
    let st = &host.queues[q as usize];
    !st.overrun
        && host
            .region
            .send_queue(q)
            .is_some_and(|sq| sq.ctl().head.load(Ordering::Acquire) != st.ingested)
}

/// One pass over a host's hot queues (and cooled ones due for their second
/// look): takes new descriptors; lets queues idle for `COOL_AFTER` go cold.
/// Returns how many descriptors were taken.
pub fn poll_queues(cx: &mut Ctx<'_>, host: &mut Host, now: Instant) -> usize {
    let mut work = 0;
    let mut i = 0;
    while i < host.hot.len() {
        let q = host.hot[i];
        let Some(sid) = host.queues[q as usize].owner else {
            host.queues[q as usize].hot = false;
            host.hot.swap_remove(i);
            continue;
        };
        if has_new(host, q) {
            host.queues[q as usize].last_activity = Some(now);
            work += ingest(cx, host, sid);
            i += 1;
            continue;
        }
        let idle = host.queues[q as usize]
            .last_activity
            .is_none_or(|t| now.duration_since(t) >= COOL_AFTER);
        if idle && !cool(host, q, now) {
            continue; // removed from the hot list
        }
        i += 1;
    }
    if !host.cooling.is_empty() {
        let due: Vec<u32> = host
            .cooling
            .iter()
            .filter(|&&(_, at)| now >= at)
            .map(|&(q, _)| q)
            .collect();
        host.cooling.retain(|&(_, at)| now < at);
        for q in due {
            if let Some(sid) = host.queues[q as usize].owner {
                if has_new(host, q) {
                    make_hot(host, q, now);
                    work += ingest(cx, host, sid);
                }
            }
        }
    }
    work
}

/// Takes hot queue `q` off the watch list unless the host published
/// meanwhile: clear `active`, fence, re-read `head` (the host stores `head`
/// and then loads `active`). Returns true if it stays hot.
fn cool(host: &mut Host, q: u32, now: Instant) -> bool {
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

/// The backstop: takes what any bound queue holds, hot or not.
pub fn sweep(cx: &mut Ctx<'_>, host: &mut Host, now: Instant) -> usize {
    let mut work = 0;
    for q in 0..host.queues.len() as u32 {
        if let Some(sid) = host.queues[q as usize].owner {
            if has_new(host, q) {
                make_hot(host, q, now);
                work += ingest(cx, host, sid);
            }
        }
    }
    work
}
