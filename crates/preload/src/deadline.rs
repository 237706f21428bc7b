//! The end of a wait given in milliseconds, as poll(2) and epoll_wait(2)
//! take it, for waits made of several shorter ones: what is left of it
//! after each.

use libc::c_int;
use std::time::{Duration, Instant};

/// A wait of `timeout` ms: < 0 forever, 0 a look without waiting.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Option<Instant>,
    forever: bool,
}

impl Deadline {
    /// The end of a wait of `timeout_ms` from now.
    pub fn after(timeout_ms: c_int) -> Deadline {
        Deadline {
            at: (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64)),
            forever: timeout_ms < 0,
        }
    }

    /// What is left, as a timeout: -1 forever, 0 when it has passed.
    pub fn left(&self) -> c_int {
        match self.at {
            None if self.forever => -1,
            None => 0,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as c_int,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left() {
        assert_eq!(Deadline::after(-1).left(), -1);
        assert_eq!(Deadline::after(0).left(), 0);
        let d = Deadline::after(60_000).left();
        assert!(d > 59_000 && d <= 60_000, "{d}");
    }
}
