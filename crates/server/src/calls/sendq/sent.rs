//! The completion of a send the engine executed (`sendq::uring`): the
//! jobs at the front of the socket's write queue move on by what the kernel
//! sent, in order; finished (all sent, or failed: `finish_job` as for a
//! system call's error) they leave the queue and the next send is
//! submitted; short, the rest is submitted at once. A shutdown or a
//! blocking connect the engine executed (`attempt::try_shutdown`,
//! `attempt::connect_op`) completes here too: it was the front of the same
//! queue.

use super::super::attempt::OP_IN_FLIGHT;
use super::super::blocking::drive_writers;
use super::super::common::{rearm, Ctx};
use super::super::finish::finish;
use crate::host::Host;
use tcps_proto::msg::Call;

/// `Token::Sent`: send `seq` of socket `sid` (generation `gen`) completed
/// with `res` (bytes sent, or `-errno`).
pub fn on_sent(cx: &mut Ctx<'_>, host: &mut Host, sid: usize, gen: u16, seq: u8, res: i32) {
    let sid = sid as u32;
    let Some(s) = host.any_socket_mut(sid) else {
        return; // its host closed it (the send was cancelled)
    };
    if s.gen != gen || s.send_op != Some(seq) {
        return;
    }
    s.send_op = None;
    match s.writers.front().map(|p| (p.call, p.progress)) {
        Some((Call::Shutdown { .. } | Call::Connect { .. }, OP_IN_FLIGHT)) => {
            // A shutdown's or a connect's (`attempt::try_shutdown`,
            // `attempt::connect_op`): 0 or -errno.
            if let Some(p) = s.writers.pop_front() {
                finish(host, &p, if res < 0 { Err(-res) } else { Ok((0, 0)) });
            }
        }
        Some((Call::SendReg { .. }, _)) if res > 0 => advance_jobs(host, sid, res as usize),
        Some((Call::SendReg { .. }, _))
            if res == 0 || res == -libc::EAGAIN || res == -libc::EINTR =>
        {
            // Not expected without MSG_DONTWAIT: wait for readiness, then
            // submit again (never a loop of failing submissions).
            rearm(cx.engine, cx.hkey, sid, s);
            return;
        }
        Some((Call::SendReg { .. }, _)) => {
            // The front job fails (as a system call's error would fail
            // it); the jobs behind it fail with its queue's error when tried.
            if let Some(p) = s.writers.pop_front() {
                finish(host, &p, Err(-res));
            }
        }
        // The call it was for left meanwhile (a close ended it, or a
        // connect timed out).
        _ => {}
    }
    // The next jobs (or the rest of these) go now; a closing socket whose
    // queue is empty closes.
    drive_writers(cx, host, sid);
    let hkey = cx.hkey;
    if let Some(s) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, s);
    }
}

/// `n` bytes of socket `sid`'s stream went: they finish the byte jobs at
/// the front of its write queue in order; the last one they reach without
/// finishing it goes on from there.
fn advance_jobs(host: &mut Host, sid: u32, mut n: usize) {
    while n > 0 {
        let Some(mut p) = host.any_socket_mut(sid).and_then(|s| s.writers.pop_front()) else {
            return;
        };
        let Call::SendReg { data, .. } = p.call else {
            // Not a byte job (never in a send): untouched.
            if let Some(s) = host.any_socket_mut(sid) {
                s.writers.push_front(p);
            }
            return;
        };
        let total = data.len as usize;
        let k = n.min(total.saturating_sub(p.progress));
        p.progress += k;
        n -= k;
        host.stats.bytes_sent += k as u64;
        if p.progress >= total {
            finish(host, &p, Ok((total as i64, 0)));
        } else if let Some(s) = host.any_socket_mut(sid) {
            s.writers.push_front(p);
            return;
        }
    }
}
