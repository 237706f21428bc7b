//! Answering a call that leaves its queue: a completion on its channel, or
//! for an asynchronous send an update of its send queue.

use super::common::{complete, Res};
use super::sendq::queue;
use crate::host::{Host, Parked};
use tcps_proto::msg::Call;
use tracing::debug;

/// Answers a call that left its queue: a completion on its channel, or for
/// an asynchronous send an update of its send queue. Releases the
/// registration a registered call held.
pub(crate) fn finish(host: &mut Host, p: &Parked, res: Res) {
    match (&p.job, p.call) {
        (
            _,
            Call::Shutdown {
                reply: false, sock, ..
            },
        ) => {
            if let Err(e) = res {
                debug!(
                    host = host.id,
                    sock,
                    errno = e,
                    "unanswered shutdown failed"
                );
            }
        }
        (Some(job), Call::SendReg { data, .. }) => {
            queue::finish_job(host, job, Some(data), data.len, res)
        }
        (Some(job), Call::SendFile { count, .. }) => queue::finish_job(host, job, None, count, res),
        (_, Call::SendReg { data, .. } | Call::RecvReg { data, .. }) => {
            host.registry.release(data.mem);
            complete(host, p.ch, p.user_data, p.op, res);
        }
        _ => complete(host, p.ch, p.user_data, p.op, res),
    }
}
