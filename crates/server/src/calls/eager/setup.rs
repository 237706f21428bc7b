//! Setup with accept (a connection accepted ahead or by request takes its
//! listener's policy and gets its send queue and receive ring bound at
//! once) and the eager policy as `SOL_TCPS` socket options.

use super::pull::{fill_pull, start_pull};
use super::recv::{bind_recv, stop_ring};
use super::ring::Eager;
use super::ringop::fill_ring;
use crate::calls::common::{rearm, Ctx, Res};
use crate::calls::sendq::queue;
use crate::config::{EagerPolicy, EagerRecv};
use crate::host::Host;
use std::time::Instant;
use tcps_proto::eager::{
    RECV_MODE_NONE, RECV_MODE_PULL, RECV_MODE_RING, SETUP_RECV_PLAIN, SETUP_RECV_RING, SETUP_SENDQ,
    SOL_TCPS, TCPS_BALANCE, TCPS_EAGER_ACCEPT, TCPS_EAGER_RECV, TCPS_EAGER_RECV_SIZE,
    TCPS_SETUP_WITH_ACCEPT,
};

/// Smallest and largest pull buffer (`TCPS_EAGER_RECV_SIZE`).
pub const MIN_RECV_SIZE: u32 = 4096;

pub const MAX_RECV_SIZE: u32 = 16 << 20;

/// A connection was just accepted (ahead or by an `Accept` request) into
/// socket `id`: it takes its listener's policy and, with setup on, gets its
/// send queue and receive ring bound and starts reading ahead. Returns the
/// `SETUP_*` flags.
pub(crate) fn setup_accepted(
    cx: &mut Ctx<'_>,
    host: &mut Host,
    id: u32,
    policy: EagerPolicy,
) -> u32 {
    let Some(s) = host.socket_mut(id) else {
        return 0;
    };
    s.policy = policy;
    // Readiness is ordered by the kernel's arrival times (the worker's
    // harvest, `poll::arrival_ranks`): stamped from the start. Only
    // connections the server accepted (their description is the server's;
    // one handed back at exec is unstamped, `close::take_for_export`).
    // Set by an operation in the pass's batch where the engine can.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&s.fd);
    if !cx
        .engine
        .set_option_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
    {
        crate::sys::stamp_arrivals(fd, true);
    }
    if !policy.setup_with_accept {
        // Nothing is bound, but a mode that needs no ring is settled now:
        // pull reads ahead from the start, off never does.
        return match policy.recv {
            EagerRecv::Off => SETUP_RECV_PLAIN,
            EagerRecv::Pull => {
                start_pull(host, id);
                fill_new(cx, host, id);
                let hkey = cx.hkey;
                if let Some(s) = host.any_socket_mut(id) {
                    rearm(cx.engine, hkey, id, s);
                }
                SETUP_RECV_PLAIN
            }
            EagerRecv::Push => 0,
        };
    }
    let mut flags = 0;
    if queue::bind_with_accept(host, id, Instant::now()) {
        flags |= SETUP_SENDQ;
    }
    flags |= match start_receiving(host, id, policy.recv) {
        RECV_MODE_RING => SETUP_RECV_RING,
        _ => SETUP_RECV_PLAIN,
    };
    if policy.recv != EagerRecv::Off {
        fill_new(cx, host, id);
        let hkey = cx.hkey;
        if let Some(s) = host.any_socket_mut(id) {
            rearm(cx.engine, hkey, id, s);
        }
    }
    flags
}

/// Push with a ring (else pull) or pull; the mode set up.
pub(crate) fn start_receiving(host: &mut Host, sid: u32, recv: EagerRecv) -> u64 {
    match recv {
        EagerRecv::Off => RECV_MODE_NONE,
        EagerRecv::Push if bind_recv(host, sid) => RECV_MODE_RING,
        EagerRecv::Push | EagerRecv::Pull => {
            start_pull(host, sid);
            RECV_MODE_PULL
        }
    }
}

/// `setsockopt(SOL_TCPS, ...)`.
pub(crate) fn setsockopt(host: &mut Host, sid: u32, name: i32, value: &[u8]) -> Res {
    let s = host.socket_mut(sid).ok_or(libc::EBADF)?;
    let v = int_value(value)?;
    match name {
        TCPS_EAGER_RECV => {
            let recv = match v {
                0 => EagerRecv::Off,
                1 => EagerRecv::Pull,
                2 => EagerRecv::Push,
                _ => return Err(libc::EINVAL),
            };
            if recv == EagerRecv::Off && matches!(s.eager, Eager::Recv(_)) {
                // A socket about to cross exec(2) must not leave data
                // behind in this process's ring.
                stop_ring(host, sid);
                return Ok((0, 0));
            }
            if matches!(s.eager, Eager::Recv(_) | Eager::Pull(_)) && recv != s.policy.recv {
                return Err(libc::EBUSY);
            }
            s.policy.recv = recv;
        }
        TCPS_EAGER_ACCEPT => {
            if v < 0 {
                return Err(libc::EINVAL);
            }
            if v == 0 {
                if matches!(s.eager, Eager::Accept(_)) {
                    return Err(libc::EBUSY);
                }
                s.policy.accept = false;
            } else {
                s.policy.accept = true;
                s.policy.accept_size = v as u32;
            }
        }
        TCPS_SETUP_WITH_ACCEPT => match v {
            0 | 1 => s.policy.setup_with_accept = v == 1,
            _ => return Err(libc::EINVAL),
        },
        TCPS_EAGER_RECV_SIZE => {
            if !(MIN_RECV_SIZE as i32..=MAX_RECV_SIZE as i32).contains(&v) {
                return Err(libc::EINVAL);
            }
            s.policy.recv_size = v as u32;
            if let Eager::Pull(p) = &mut s.eager {
                p.cap = v as usize;
            }
        }
        TCPS_BALANCE => match v {
            0 | 1 => s.policy.balance = v == 1,
            _ => return Err(libc::EINVAL),
        },
        _ => return Err(libc::ENOPROTOOPT),
    }
    Ok((0, 0))
}

pub(crate) fn int_value(value: &[u8]) -> Result<i32, i32> {
    let b: [u8; 4] = value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(libc::EINVAL)?;
    Ok(i32::from_ne_bytes(b))
}

/// `getsockopt(SOL_TCPS, ...)`: the value as a C `int`.
pub(crate) fn getsockopt(host: &Host, sid: u32, name: i32) -> Result<i32, i32> {
    let s = host.socket(sid).ok_or(libc::EBADF)?;
    let p = s.policy;
    Ok(match name {
        TCPS_EAGER_RECV => match p.recv {
            EagerRecv::Off => 0,
            EagerRecv::Pull => 1,
            EagerRecv::Push => 2,
        },
        TCPS_EAGER_ACCEPT => {
            if p.accept {
                p.accept_size.min(i32::MAX as u32) as i32
            } else {
                0
            }
        }
        TCPS_SETUP_WITH_ACCEPT => i32::from(p.setup_with_accept),
        TCPS_BALANCE => i32::from(p.balance),
        TCPS_EAGER_RECV_SIZE => {
            let push_ring = p.recv == EagerRecv::Push && sid < host.layout.recv_rings
                || matches!(s.eager, Eager::Recv(_));
            if push_ring {
                host.layout.rq_bytes as i32
            } else {
                p.recv_size as i32
            }
        }
        _ => return Err(libc::ENOPROTOOPT),
    })
}

/// Whether `level` is tcps' own option level.
pub(crate) fn is_tcps_level(level: i32) -> bool {
    level == SOL_TCPS
}

/// Receives ahead on a connection just set up: into its receive ring or
/// its pull buffer (a new connection has no accept ring).
fn fill_new(cx: &mut Ctx<'_>, host: &mut Host, id: u32) -> bool {
    match host.sockets.get(id as usize).map(|s| &s.eager) {
        Some(Eager::Recv(_)) => fill_ring(cx, host, id),
        Some(Eager::Pull(_)) => fill_pull(host, id),
        _ => false,
    }
}
