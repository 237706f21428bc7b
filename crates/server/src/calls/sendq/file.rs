//! File ranges on a send queue (`DESC_FILE`): an asynchronous sendfile.
//!
//! A file descriptor of a send queue becomes a job on the socket's write
//! queue like a byte send, holding the file it names (the host's handle
//! looked up once, at ingest, among the files *this* host handed over).
//! Each try is one non-blocking sendfile(2) from the server's copy of the
//! file (`crate::sendfile::send_range`); a full socket leaves the job at
//! the front of the write queue, resumed at `progress` when the socket
//! takes data, so the worker never waits. A range the file no longer holds
//! (it shrank after the host queued it: sendfile(2) answers 0) fails the
//! job with `EIO` after sending what there was, and the queue with it, as
//! any failed asynchronous send.

use super::super::common::Res;
use crate::host::{Host, Parked};
use std::os::fd::AsRawFd;
use tcps_proto::msg::Call;

/// The errno of a file job whose file ended before its range did.
pub(crate) const SHRUNK: i32 = libc::EIO;

/// Tries a file job once more: all of its range (`Some`), or would block
/// (`None`: it stays at the front of the write queue).
pub(crate) fn attempt(host: &mut Host, sid: u32, p: &mut Parked) -> Option<Res> {
    let Call::SendFile { offset, count, .. } = p.call else {
        return Some(Err(libc::EINVAL));
    };
    let Some(f) = p.job.as_ref().and_then(|j| j.file.as_ref()) else {
        return Some(Err(libc::EINVAL));
    };
    let f = f.as_raw_fd();
    loop {
        let left = (count as usize).saturating_sub(p.progress);
        if left == 0 {
            return Some(Ok((i64::from(count), 0)));
        }
        // `offset + count` fits an off_t (`SendDesc::entry`).
        let at = offset + p.progress as u64;
        match crate::sendfile::send_range(host, sid, f, at, left as u32) {
            Ok(0) => return Some(Err(SHRUNK)),
            Ok(n) => p.progress += n,
            // A job is never non-blocking: wait for the socket.
            Err(libc::EAGAIN) => return None,
            Err(e) => return Some(Err(e)),
        }
    }
}
