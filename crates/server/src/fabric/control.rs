//! A remote host's control messages (`AM_CONTROL`): the ones that make
//! sense across nodes — fork snapshots (`Fork`, `Forked`, `Inherit`) and
//! memory registrations (`Register`, `Deregister`) — are forwarded to the
//! worker on the stand-in control socket, as a local host's arrive on its
//! own, and the worker's replies go back in order. Everything else that
//! passes a descriptor (adoption, `SocketDup`, `Export`, files, direct
//! connections) is answered EOPNOTSUPP here.
//!
//! A `Register` comes without a memfd: this thread makes one of the
//! announced length (sealed, within the host's byte budget), keeps a
//! mapping of it (`RegCopy`, in the host's `ServerPump`: the host's
//! registration spans are written there) and hands the worker the memfd,
//! which maps it as a local registration. An `Inherit` is forwarded once
//! per attachment: the claim's checks (`inherit`: the same fabric peer and
//! credential) run at the worker, and a host that got the nonce wrong
//! does not get to guess again.

use super::pump::ServerPump;
use crate::config::Config;
use crate::links::LinkCounters;
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use tcps_fabric::wire::AM_CONTROL;
use tcps_fabric::Endpoint;
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};
use tcps_proto::mirror::RegCopy;
use tcps_proto::sendq::MAX_REGISTRATIONS;
use tracing::warn;

/// Most control messages a host may have waiting for the worker (the
/// library sends one and waits for its answer).
const MAX_AWAITING: usize = 8;

/// What to do with a host's control message.
pub enum Step {
    /// Send it to the worker (with this descriptor).
    Forward(ControlMsg, Option<OwnedFd>),
    /// Answer the host at once.
    Answer(ControlMsg),
}

/// One remote host's control exchange at the fabric thread.
#[derive(Default)]
pub struct Ctl {
    /// Forwarded to the worker, not answered yet (it answers in order).
    awaiting: VecDeque<ControlMsg>,
    /// An `Inherit` was forwarded.
    claimed: bool,
}

/// The stand-in control socket: a SEQPACKET pair (one message per
/// control message, as a local host's socket), this thread's end
/// non-blocking. (worker's end, this thread's end)
pub fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [0i32; 2];
    let ty = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC;
    // SAFETY: socketpair writes two descriptors into `sv`.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, sv.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors, owned from here on.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    crate::sys::set_nonblocking(b.as_raw_fd()).map_err(std::io::Error::from_raw_os_error)?;
    Ok((a, b))
}

fn answer(handle: u32, errno: i32) -> Step {
    Step::Answer(ControlMsg::Reply { handle, errno })
}

impl Ctl {
    /// A control message from the host. `Err`: a protocol violation (the
    /// host is cut off).
    pub fn on_host(
        &mut self,
        cfg: &Config,
        pump: &mut ServerPump,
        bytes: &[u8],
    ) -> Result<Step, String> {
        let m = ControlMsg::decode(bytes).ok_or("a malformed control message")?;
        if self.awaiting.len() >= MAX_AWAITING {
            return Err("too many control messages unanswered".into());
        }
        let step = match m {
            ControlMsg::Fork { .. } | ControlMsg::Forked { .. } | ControlMsg::Deregister { .. } => {
                Step::Forward(m, None)
            }
            ControlMsg::Inherit { handle } if self.claimed => answer(handle, libc::EPERM),
            ControlMsg::Inherit { .. } => {
                self.claimed = true;
                Step::Forward(m, None)
            }
            ControlMsg::Register { handle, len } => register(cfg, pump, handle, len),
            other => answer(other.handle(), libc::EOPNOTSUPP),
        };
        if let Step::Forward(m, _) = &step {
            self.awaiting.push_back(*m);
        }
        Ok(step)
    }

    /// The worker's reply to the oldest forwarded message: what the host
    /// gets. A refused `Register` or a done `Deregister` drops the copy.
    pub fn on_reply(&mut self, pump: &mut ServerPump, reply: ControlMsg) -> Option<ControlMsg> {
        let asked = self.awaiting.pop_front()?;
        let errno = match reply {
            ControlMsg::Reply { errno, .. } => errno,
            _ => libc::EPROTO,
        };
        match asked {
            ControlMsg::Register { handle, .. } if errno != 0 => pump.drop_registration(handle),
            ControlMsg::Deregister { handle } if errno == 0 => pump.drop_registration(handle),
            _ => {}
        }
        Some(ControlMsg::Reply {
            handle: asked.handle(),
            errno,
        })
    }
}

impl Ctl {
    /// Carries out a host's control message: to the worker on `control`,
    /// or answered on `ep`. False: cut the host off.
    pub fn carry_out(
        &mut self,
        cfg: &Config,
        pump: &mut ServerPump,
        control: RawFd,
        (ep, io): (&Endpoint, &mut LinkCounters),
        bytes: &[u8],
    ) -> bool {
        match self.on_host(cfg, pump, bytes) {
            Ok(Step::Forward(m, fd)) => {
                let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
                fdpass::send_with_fds(control, &m.encode(), &fds).is_ok()
            }
            Ok(Step::Answer(r)) => send_to_host(ep, io, r),
            Err(why) => {
                warn!("remote host cut off: {why}");
                false
            }
        }
    }

    /// The worker's replies waiting on `control`, to the host in order.
    /// False: the worker hung up (it cut the host off).
    pub fn relay(
        &mut self,
        pump: &mut ServerPump,
        control: RawFd,
        (ep, io): (&Endpoint, &mut LinkCounters),
    ) -> bool {
        loop {
            let mut b = [0u8; CONTROL_MSG_LEN + 1];
            let n = match fdpass::recv_with_fds(control, &mut b, libc::MSG_DONTWAIT) {
                Ok((n, _)) if n > 0 => n,
                Ok(_) => return false,
                Err(e) => return e.raw_os_error() == Some(libc::EAGAIN),
            };
            let reply = ControlMsg::decode(&b[..n]).and_then(|m| self.on_reply(pump, m));
            if let Some(r) = reply {
                // A claimed snapshot or a registration binds what no
                // request named: the next pass looks at everything.
                pump.watch_all();
                send_to_host(ep, io, r);
            }
        }
    }
}

/// Sends control message `r` to the host, counted in its link's counters.
fn send_to_host(ep: &Endpoint, io: &mut LinkCounters, r: ControlMsg) -> bool {
    let b = r.encode();
    let ok = ep.am_send(AM_CONTROL, &b, Vec::new(), false).is_ok();
    if ok {
        io.sent(b.len());
    }
    ok
}

/// A registration of `len` bytes: the server's copy (a sealed memfd,
/// mapped here) and the memfd for the worker. Refused at once beyond the
/// host's byte budget (the worker checks the rest, as for a local host).
fn register(cfg: &Config, pump: &mut ServerPump, handle: u32, len: u64) -> Step {
    if handle >= MAX_REGISTRATIONS || len == 0 {
        return answer(handle, libc::EINVAL);
    }
    if len > cfg.max_registered_bytes_per_host {
        return answer(handle, libc::ENOMEM);
    }
    if pump.has_registration(handle) {
        return answer(handle, libc::EEXIST);
    }
    let made = crate::sys::memfd(c"tcps-remote-registration", len as usize)
        .map_err(std::io::Error::from_raw_os_error)
        .and_then(|fd| Ok((RegCopy::map(fd.as_fd(), len as usize)?, fd)));
    match made {
        Ok((copy, fd)) => {
            pump.add_registration(handle, copy);
            Step::Forward(ControlMsg::Register { handle, len }, Some(fd))
        }
        Err(e) => answer(handle, e.raw_os_error().unwrap_or(libc::ENOMEM)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::test_region::layout;

    fn cfg() -> Config {
        Config {
            max_registered_bytes_per_host: 1 << 20,
            ..Config::default()
        }
    }

    #[test]
    fn forwards_forks_and_registrations_and_answers_the_rest() {
        let (cfg, mut pump, mut ctl) = (cfg(), ServerPump::new(layout(1)), Ctl::default());
        let mut host = |m: ControlMsg| ctl.on_host(&cfg, &mut pump, &m.encode()).unwrap();
        assert!(matches!(
            host(ControlMsg::Fork { handle: 9 }),
            Step::Forward(ControlMsg::Fork { handle: 9 }, None)
        ));
        let Step::Forward(_, Some(_fd)) = host(ControlMsg::Register {
            handle: 2,
            len: 8192,
        }) else {
            panic!("a registration goes to the worker with a memfd")
        };
        for (m, errno) in [
            (
                ControlMsg::Register {
                    handle: 2,
                    len: 4096,
                },
                libc::EEXIST,
            ),
            (
                ControlMsg::Register {
                    handle: 3,
                    len: 2 << 20,
                },
                libc::ENOMEM,
            ),
            (ControlMsg::FileOpen { handle: 1 }, libc::EOPNOTSUPP),
            (ControlMsg::SocketDup { handle: 1 }, libc::EOPNOTSUPP),
        ] {
            let Step::Answer(ControlMsg::Reply { errno: e, .. }) = host(m) else {
                panic!("{m:?} is answered here")
            };
            assert_eq!(e, errno, "{m:?}");
        }
        assert!(matches!(
            host(ControlMsg::Inherit { handle: 5 }),
            Step::Forward(..)
        ));
        assert!(
            matches!(
                host(ControlMsg::Inherit { handle: 6 }),
                Step::Answer(ControlMsg::Reply {
                    errno: libc::EPERM,
                    ..
                })
            ),
            "one claim per attachment"
        );
        // Replies in order; the refused registration's copy is dropped.
        let ok = ControlMsg::Reply {
            handle: 0,
            errno: 0,
        };
        assert_eq!(
            ctl.on_reply(&mut pump, ok),
            Some(ControlMsg::Reply {
                handle: 9,
                errno: 0
            })
        );
        assert!(pump.has_registration(2));
        let refused = ControlMsg::Reply {
            handle: 2,
            errno: libc::ENOSPC,
        };
        ctl.on_reply(&mut pump, refused);
        assert!(!pump.has_registration(2));
        assert!(ctl
            .on_host(&cfg, &mut pump, b"junk")
            .is_err_and(|e| e.contains("malformed")));
    }
}
