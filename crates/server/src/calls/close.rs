//! Closing sockets: the host's `Close` (which waits for queued
//! asynchronous sends), closing for real, export for `exec`, and a host
//! going away.

use super::common::{Ctx, Res};
use super::eager::handover;
use super::finish::finish;
use super::poll;
use super::sendq::queue;
use crate::engine::Engine;
use crate::host::{Host, SPARE_QUEUES};
use std::os::fd::{AsRawFd, OwnedFd};
use tracing::debug;

pub(crate) fn close_socket(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) -> Res {
    host.socket(sock).ok_or(libc::EBADF)?;
    if super::eager::recv::has_unread(host, sock) {
        // Bytes read ahead and never read by the host are, for the peer,
        // unread data at the close: the kernel then resets the connection
        // (RST, not FIN), and so must this close.
        if let Some(s) = host.socket(sock) {
            reset_at_close(s.fd.as_raw_fd());
        }
    }
    // The host reads no more: unbind its ring (or stop pulling) now.
    unbind_eager(cx, host, sock);
    let s = host.socket_mut(sock).ok_or(libc::EBADF)?;
    if !s.has_jobs() {
        finalize_close(cx, host, sock);
        return Ok((0, 0));
    }
    // Asynchronous sends still queued: like close(2) with data in the send
    // buffer, the call returns now and the data still goes out; the socket
    // closes for real when its last job finished. Other parked calls end.
    s.closing = true;
    let pollers = std::mem::take(&mut s.pollers);
    // Its other parked calls (reads, and a shutdown or send parked among
    // the jobs) end, one at a time (no list of them: nothing allocated);
    // the jobs keep their order and their queue.
    while let Some(p) = take_non_job(host, sock) {
        finish(host, &p, Err(libc::EBADF));
    }
    for (pkey, _) in pollers {
        poll::recheck(host, pkey);
    }
    Ok((0, 0))
}

/// Makes the close of `fd` send an RST (SO_LINGER {1, 0}).
fn reset_at_close(fd: std::os::fd::RawFd) {
    // struct linger { int l_onoff; int l_linger; } = { 1, 0 }
    let mut bytes = [0u8; std::mem::size_of::<libc::linger>()];
    bytes[..4].copy_from_slice(&1i32.to_ne_bytes());
    let _ = crate::sys::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &bytes);
}

/// Socket `sock`'s first parked call that is not a send-queue job.
fn take_non_job(host: &mut Host, sock: u32) -> Option<crate::host::Parked> {
    // `any_`: the socket is `closing` already.
    let s = host.any_socket_mut(sock)?;
    if let Some(p) = s.readers.pop_front() {
        return Some(p);
    }
    let i = s.writers.iter().position(|p| p.job.is_none())?;
    s.writers.remove(i)
}

/// Closes a socket now: answers its parked calls with EBADF, frees its
/// send queue and its slot.
pub(crate) fn finalize_close(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) {
    // Its ring is unbound before its id can be reused.
    unbind_eager(cx, host, sock);
    let Some(s) = host.sockets.remove(sock as usize) else {
        return;
    };
    crate::admission::release(host, &cx.shared.conns_per_addr, &s.admitted);
    for p in s.readers.iter().chain(s.writers.iter()) {
        finish(host, p, Err(libc::EBADF));
    }
    let (mut readers, mut writers) = (s.readers, s.writers);
    if readers.capacity() + writers.capacity() > 0 && host.spare_queues.len() < SPARE_QUEUES {
        readers.clear();
        writers.clear();
        host.spare_queues.push((readers, writers));
    }
    // Its waits and operations end with it (`Engine::close`).
    crate::closer::close_socket(cx.engine, s.fd, s.may_linger);
    if let Some(q) = s.queue {
        queue::unbind(host, q);
    }
    for (pkey, _) in s.pollers {
        poll::recheck(host, pkey);
    }
}

/// `ControlMsg::Export`: takes socket `sock` out of the host's table and
/// releases what `finalize_close` releases (its engine registration, its
/// admission count, its send queue), without closing it: the kernel socket
/// is returned for the host. The caller checked nothing is parked on it.
pub(crate) fn take_for_export(cx: &mut Ctx<'_>, host: &mut Host, sock: u32) -> Option<OwnedFd> {
    let s = host.sockets.remove(sock as usize)?;
    // Also a disarmed epoll registration stays until removed: a later
    // descriptor with the same number could never be armed.
    cx.engine.forget(s.fd.as_raw_fd(), 0);
    crate::admission::release(host, &cx.shared.conns_per_addr, &s.admitted);
    if let Some(q) = s.queue {
        queue::unbind(host, q);
    }
    // The program gets the socket as it would have had it: unstamped.
    crate::sys::stamp_arrivals(s.fd.as_raw_fd(), false);
    Some(s.fd)
}

/// Closes every socket of a host that is going away. Parked calls are not
/// answered: the host is dead or being cut off.
pub fn close_all(engine: &mut dyn Engine, shared: &crate::shared::Shared, host: &mut Host) {
    for k in host.sockets.keys() {
        if let Some(s) = host.sockets.remove(k) {
            crate::admission::release(host, &shared.conns_per_addr, &s.admitted);
            crate::closer::close_socket(engine, s.fd, s.may_linger);
        }
    }
}

/// Unbinds socket `sid`'s receive or accept ring (`eager::handover`) and
/// closes the connections its accept ring published and the host never took.
fn unbind_eager(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) {
    for (_, id, gen) in handover::unbind(host, sid) {
        if host.sockets.get(id as usize).is_some_and(|s| s.gen == gen) {
            debug!(
                host = host.id,
                listener = sid,
                sock = id,
                "closing a connection accepted ahead and never taken"
            );
            // The kernel resets the connections still in a listener's
            // queue when it closes: the peer sees an RST, not a FIN.
            if let Some(s) = host.socket(id) {
                reset_at_close(s.fd.as_raw_fd());
            }
            finalize_close(cx, host, id);
        } else if gen == crate::balance::DIRECT_GEN && host.balance.claim(id).is_some() {
            debug!(
                host = host.id,
                listener = sid,
                handle = id,
                "closing a direct connection never taken"
            );
        }
    }
}
