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

//!
//! `queue` holds a queue's state and handshakes; `file` runs file ranges
//! (`DESC_FILE`, an asynchronous sendfile, kept a synchronous sendfile(2)
//! per try); `uring` hands byte ranges to the engine and `sent` takes its
//! completions (where the engine executes sends); this file takes what the
//! host published and drives it (above `blocking`, whose write queue the
//! jobs join).

pub(crate) mod file;
pub(crate) mod queue;
pub(crate) mod sent;
pub(crate) mod uring;

use super::blocking::drive_writers;
use super::common::{rearm, Ctx};
use crate::host::Host;
use queue::{has_new, make_hot, COOL_AFTER};
use std::time::Instant;

/// `Op::AsyncKick`: the host published descriptors while the queue was cold.
pub(crate) fn kick(cx: &mut Ctx<'_>, host: &mut Host, sid: u32, now: Instant) {
    let Some(q) = host.socket(sid).and_then(|s| s.queue) else {
        return;
    };
    queue::note_kick(host, q);
    make_hot(host, q, now);
    ingest(cx, host, sid);
}

/// Takes every descriptor the host published on the socket's queue into its
/// write queue, then drives it. Returns how many were taken.
pub(crate) fn ingest(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> usize {
    let n = queue::take(host, sid);
    if n == 0 {
        return 0;
    }
    drive_writers(cx, host, sid);
    let hkey = cx.hkey;
    if let Some(s) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, s);
    }
    n
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
        if idle && !queue::cool(host, q, now) {
            continue; // removed from the hot list
        }
        i += 1;
    }
    // Second looks that are due, taken out one by one (no list of them:
    // no allocation per pass).
    let mut k = 0;
    while let Some(&(q, at)) = host.cooling.get(k) {
        if now < at {
            k += 1;
            continue;
        }
        host.cooling.swap_remove(k);
        if let Some(sid) = host.queues[q as usize].owner {
            if has_new(host, q) {
                make_hot(host, q, now);
                work += ingest(cx, host, sid);
            }
        }
    }
    work
}

/// The backstop: takes what any bound queue holds, hot or not (only the
/// bound ones are looked at: `Host::bound_queues`).
pub fn sweep(cx: &mut Ctx<'_>, host: &mut Host, now: Instant) -> usize {
    let mut work = 0;
    // A copy: ingesting may finish a close, which unbinds its queue.
    for q in host.bound_queues.clone() {
        host.queues_swept += 1;
        if let Some(sid) = host.queues[q as usize].owner {
            if has_new(host, q) {
                make_hot(host, q, now);
                work += ingest(cx, host, sid);
            }
        }
    }
    work
}

/// `ControlMsg::FileClose`. Every bound send queue of the host is ingested
/// first: a file range the host queued before it closed the handle becomes
/// a job holding the file (`Job::file`), which keeps it open until it ran.
pub(crate) fn file_close(cx: &mut Ctx<'_>, host: &mut Host, handle: u32) -> Result<(), i32> {
    sweep(cx, host, Instant::now());
    crate::sendfile::close(host, handle)
}
