//! A panic while serving one host dooms that host only (`guarded`).

use crate::host::Host;
use tracing::error;

/// The text of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f`; a panic in it becomes its message. (The host's state may be
/// half-updated then: the caller dooms the host, so nothing reads it again
/// but the detach, which only closes and releases.)
fn catch_panic<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| panic_message(p.as_ref()))
}

/// Runs one piece of a host's work (its requests, an event or timer of
/// its sockets, its control messages). A panic in it dooms that host only:
/// logged as an internal error, the host is detached, and the worker goes
/// on serving the others. `None` when it panicked.
pub(super) fn guarded<R>(host: &mut Host, what: &str, f: impl FnOnce(&mut Host) -> R) -> Option<R> {
    match catch_panic(|| f(&mut *host)) {
        Ok(r) => Some(r),
        Err(msg) => {
            error!(host = host.id, pid = host.pid, what, panic = %msg, "internal error while serving a host; cutting it off");
            host.doomed = Some(format!("internal error ({what}): {msg}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::catch_panic;
    use std::time::{Duration, Instant};

    #[test]
    fn a_panic_becomes_its_message() {
        assert_eq!(catch_panic(|| 7), Ok(7));
        // The overflow of finding 9, as it panicked the worker.
        let far = Duration::from_secs(i64::MAX as u64);
        let msg = catch_panic(|| Instant::now() + far).unwrap_err();
        assert!(msg.contains("overflow"), "{msg}");
        let msg = catch_panic(|| -> () { panic!("host {} broke it", 3) }).unwrap_err();
        assert_eq!(msg, "host 3 broke it");
    }
}
