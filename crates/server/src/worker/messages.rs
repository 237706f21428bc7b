//! A worker's side of a host's control socket: the registration messages
//! it answers (registered memory, fork/exec, sendfile's files, adopted
//! sockets) and the replies it owes, queued in the host's outbox when the
//! socket is full.

use crate::calls::Ctx;
use crate::host::{Host, Outgoing};
use crate::registry::Budget;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};
use tracing::{debug, warn};

/// Executes one registration message of a host and queues its reply
/// (`send_reply`). An error is a host cut off (its outbox overflowed).
fn on_control_msg(
    host: &mut Host,
    cx: &mut Ctx<'_>,
    m: ControlMsg,
    fds: Vec<OwnedFd>,
) -> Result<(), String> {
    if crate::adopt::handles(&m) {
        let (reply, fd) = crate::adopt::on_control(cx.cfg, host, m, fds);
        return send_reply(host, reply, fd);
    }
    if let ControlMsg::Export { handle } = m {
        let (reply, fd) = crate::inherit::export(host, cx, handle);
        return send_reply(host, reply, fd);
    }
    if let ControlMsg::HostDoorbell { handle } = m {
        let (errno, fd) = match host.host_doorbell.get(handle) {
            Ok(fd) => (0, Some(fd)),
            Err(e) => (e, None),
        };
        return send_reply(host, ControlMsg::Reply { handle, errno }, fd);
    }
    if let ControlMsg::Direct { handle } = m {
        let (errno, fd) = direct(host, cx.cfg, handle);
        return send_reply(host, ControlMsg::Reply { handle, errno }, fd);
    }
    let handle = m.handle();
    let res = match m {
        ControlMsg::Register { handle, len } => register(host, cx.cfg, handle, len, fds),
        ControlMsg::Deregister { handle } => host.registry.deregister(handle),
        ControlMsg::Fork { handle } => fork(host, cx, handle),
        ControlMsg::Forked { handle, child } => crate::inherit::forked(host, handle, child),
        ControlMsg::Inherit { handle } => crate::inherit::claim(host, handle),
        ControlMsg::Reply { .. } | ControlMsg::Adopted { .. } => Err(libc::EINVAL),
        // Answered above.
        ControlMsg::Export { .. }
        | ControlMsg::SocketAdopt { .. }
        | ControlMsg::SocketDup { .. }
        | ControlMsg::HostDoorbell { .. }
        | ControlMsg::Direct { .. } => Err(libc::EINVAL),
        ControlMsg::FileOpen { handle } => crate::sendfile::open(host, handle, fds),
        ControlMsg::FileClose { handle } => crate::calls::sendq::file_close(cx, host, handle),
    };
    debug!(host = host.id, ?m, ?res, "registration");
    let reply = ControlMsg::Reply {
        handle,
        errno: res.err().unwrap_or(0),
    };
    send_reply(host, reply, None)
}

/// `ControlMsg::Fork`: refused before any work on the host's sockets if
/// the snapshot is not admitted (its cost is charged to the user's rate).
fn fork(host: &mut Host, cx: &mut Ctx<'_>, nonce: u32) -> Result<(), i32> {
    let budget = crate::inherit::Budget::of(cx.cfg);
    crate::inherit::admit_fork(host, nonce, budget)?;
    let settled = crate::calls::eager::ringop::settle_all(cx, host);
    let r = crate::inherit::snapshot(host, nonce, budget);
    // Rings the snapshot did not stop receive again.
    for sid in settled {
        crate::calls::eager::sweep::advance(cx, host, sid);
    }
    r
}

/// `ControlMsg::Direct`: handle 0 says the host takes direct connections;
/// any other hands it that direct connection's kernel socket (ENOENT: no
/// such handle, e.g. taken already or closed as too old).
fn direct(host: &mut Host, cfg: &crate::config::Config, handle: u32) -> (i32, Option<OwnedFd>) {
    if handle == 0 {
        host.balance.set_takes_direct(&cfg.balance);
        return (0, None);
    }
    match host.balance.claim(handle) {
        Some(fd) => (0, Some(fd)),
        None => (libc::ENOENT, None),
    }
}

/// Maps the memfd that came with `Register` as registration `handle`,
/// within the host's budget (a refusal is logged on the 1st, 2nd, 4th, ...).
fn register(
    host: &mut Host,
    cfg: &crate::config::Config,
    handle: u32,
    len: u64,
    mut fds: Vec<OwnedFd>,
) -> Result<(), i32> {
    if fds.len() != 1 {
        return Err(libc::EINVAL);
    }
    let res = host
        .registry
        .register(handle, fds.remove(0), len, Budget::of(cfg));
    if let Err(e @ (libc::ENOSPC | libc::ENOMEM)) = res {
        if host.note_budget_refusal() {
            warn!(
                host = host.id,
                pid = host.pid,
                uid = host.uid,
                len,
                registrations = host.registry.count(),
                mapped = host.registry.mapped(),
                errno = e,
                refusals = host.budget_refusals,
                "registration refused: the host is at its budget \
                 (--max-registrations-per-host, --max-registered-bytes-per-host)"
            );
        }
    }
    res
}

/// Most control replies a host may leave unread beyond what its socket
/// buffer holds; one more and it is cut off (it floods without reading).
pub const OUTBOX_MAX: usize = 64;

/// Most control messages taken from one host per engine event, so a host
/// that floods its control socket cannot monopolize the worker (the rest
/// waits for the next event).
const CONTROL_MSGS_PER_EVENT: usize = 32;

/// Sends a control reply without blocking (the server's end of the control
/// socket is non-blocking): at once if nothing waits before it, else it
/// joins the host's outbox, flushed when the socket is writable.
fn send_reply(host: &mut Host, reply: ControlMsg, fd: Option<OwnedFd>) -> Result<(), String> {
    host.outbox.push_back(Outgoing {
        bytes: reply.encode(),
        fd,
    });
    flush_outbox(host)?;
    if host.outbox.len() > OUTBOX_MAX {
        return Err(format!(
            "left {} control replies unread (outbox limit {OUTBOX_MAX})",
            host.outbox.len()
        ));
    }
    Ok(())
}

/// Whether a control socket error is the host's hang-up.
fn hung_up(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET))
}

/// Sends queued control replies until the socket would block.
fn flush_outbox(host: &mut Host) -> Result<(), String> {
    while let Some(out) = host.outbox.front() {
        let fds: Vec<RawFd> = out.fd.iter().map(|f| f.as_raw_fd()).collect();
        match fdpass::send_with_fds(host.control.as_raw_fd(), &out.bytes, &fds) {
            Ok(()) => {
                host.outbox.pop_front();
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(()),
            // The host hung up with replies still queued (a process that
            // detaches at once, as `tcps run`'s probe): gone, not rogue.
            Err(e) if hung_up(&e) => return Err("detached".to_string()),
            Err(e) => return Err(format!("control socket: {e}")),
        }
    }
    Ok(())
}

/// Flushes a host's outbox and takes up to `CONTROL_MSGS_PER_EVENT` of its
/// control messages. `Some(why)`: the host is to be cut off.
pub(super) fn read_control(host: &mut Host, cx: &mut Ctx<'_>) -> Option<String> {
    if let Err(why) = flush_outbox(host) {
        return Some(why);
    }
    let fd = host.control.as_raw_fd();
    for _ in 0..CONTROL_MSGS_PER_EVENT {
        let mut b = [0u8; CONTROL_MSG_LEN + 1];
        match fdpass::recv_with_fds(fd, &mut b, libc::MSG_DONTWAIT) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return None,
            Err(e) if hung_up(&e) => return Some("detached".to_string()),
            Err(e) => return Some(format!("control socket: {e}")),
            Ok((0, _)) => return Some("detached".to_string()),
            Ok((n, fds)) => match ControlMsg::decode(&b[..n]) {
                Some(m) => {
                    if let Err(why) = on_control_msg(host, cx, m, fds) {
                        return Some(why);
                    }
                }
                None => return Some("sent garbage on the control socket".to_string()),
            },
        }
    }
    // More may wait: the re-armed socket reports them on the next pass,
    // after the other hosts had their turn.
    None
}
