//! The completion of a send the engine executed (`sendq::uring`): the
//! front job of the socket's write queue moves on by what the kernel sent;
//! finished (all sent, or failed: `finish_job` as for a system call's
//! error) it leaves the queue and the next one is submitted; short, the
//! rest is submitted at once.

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
    let Some(mut p) = s.writers.pop_front() else {
        return;
    };
    let total = match p.call {
        Call::SendReg { data, .. } => data.len as usize,
        _ => 0,
    };
    let outcome = match res {
        n if n > 0 => {
            p.progress += n as usize;
            host.stats.bytes_sent += n as u64;
            (p.progress >= total).then_some(Ok((total as i64, 0)))
        }
        // Not expected without MSG_DONTWAIT: wait for readiness, then
        // submit again (never a loop of failing submissions).
        e if e == 0 || e == -libc::EAGAIN || e == -libc::EINTR => {
            if let Some(s) = host.any_socket_mut(sid) {
                s.writers.push_front(p);
                rearm(cx.engine, cx.hkey, sid, s);
            }
            return;
        }
        e => Some(Err(-e)),
    };
    match outcome {
        Some(r) => finish(host, &p, r),
        None => {
            if let Some(s) = host.any_socket_mut(sid) {
                s.writers.push_front(p);
            }
        }
    }
    // The next job (or the rest of this one) goes now; a closing socket
    // whose queue is empty closes.
    drive_writers(cx, host, sid);
    let hkey = cx.hkey;
    if let Some(s) = host.any_socket_mut(sid) {
        rearm(cx.engine, hkey, sid, s);
    }
}
