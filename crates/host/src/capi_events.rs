//! The C ABI of connection events (`include/tcps.h`, "Connection events"):
//! event queues named by small integers, like epoll fds.

use crate::capi::{errno, ffi, sock, with_client};
use crate::events::{ConnEvent, EventQueue};
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};

/// `TCPS_EV_ADD` / `TCPS_EV_DEL` of tcps.h.
const EV_ADD: c_int = 1;
const EV_DEL: c_int = 2;

/// Most event queues a process has open at once.
const MAX_QUEUES: usize = 1024;

static QUEUES: Mutex<Vec<Option<Arc<EventQueue>>>> = Mutex::new(Vec::new());

fn queues() -> MutexGuard<'static, Vec<Option<Arc<EventQueue>>>> {
    QUEUES.lock().unwrap_or_else(|p| p.into_inner())
}

fn queue(q: c_int) -> std::io::Result<Arc<EventQueue>> {
    usize::try_from(q)
        .ok()
        .and_then(|i| queues().get(i).cloned().flatten())
        .ok_or_else(|| errno(libc::EBADF))
}

/// A new, empty event queue: its number (>= 0), or -1/EMFILE.
#[no_mangle]
pub extern "C" fn tcps_events_create() -> c_int {
    ffi(|| {
        let mut qs = queues();
        let i = match qs.iter().position(Option::is_none) {
            Some(i) => i,
            None if qs.len() < MAX_QUEUES => {
                qs.push(None);
                qs.len() - 1
            }
            None => return Err(errno(libc::EMFILE)),
        };
        qs[i] = Some(Arc::new(EventQueue::new()));
        Ok(i as c_int)
    })
}

/// Adds (`TCPS_EV_ADD`: or changes) or removes (`TCPS_EV_DEL`) socket `s`.
#[no_mangle]
pub extern "C" fn tcps_events_ctl(q: c_int, op: c_int, s: c_int, events: u32, user: u64) -> c_int {
    ffi(|| {
        let (q, s) = (queue(q)?, sock(s)?);
        match op {
            EV_ADD => q.add(s, events, user)?,
            EV_DEL => q.remove(s)?,
            _ => return Err(errno(libc::EINVAL)),
        }
        Ok(0)
    })
}

/// Waits for events: how many were written to `ev` (at most `max`).
///
/// # Safety
/// `ev` is valid for writes of `max` entries.
#[no_mangle]
pub unsafe extern "C" fn tcps_events_wait(
    q: c_int,
    ev: *mut ConnEvent,
    max: c_int,
    timeout_ms: c_int,
) -> c_int {
    ffi(|| {
        let q = queue(q)?;
        let n = usize::try_from(max)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| errno(libc::EINVAL))?;
        if ev.is_null() || n > isize::MAX as usize / std::mem::size_of::<ConnEvent>() {
            return Err(errno(libc::EFAULT));
        }
        // SAFETY: non-null and valid for `n` entries by the caller's contract.
        let out = unsafe { std::slice::from_raw_parts_mut(ev, n) };
        let got = with_client(|c| c.events_wait(&q, out, timeout_ms))?;
        Ok(got as c_int)
    })
}

/// Closes event queue `q` (its number may be given out again).
#[no_mangle]
pub extern "C" fn tcps_events_close(q: c_int) -> c_int {
    ffi(|| {
        let i = usize::try_from(q).map_err(|_| errno(libc::EBADF))?;
        match queues().get_mut(i).and_then(Option::take) {
            Some(_) => Ok(0),
            None => Err(errno(libc::EBADF)),
        }
    })
}
