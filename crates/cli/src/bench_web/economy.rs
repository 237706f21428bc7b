//! The TCP server's own economy around a load point, from its counters
//! (`tcps stat --json`, issue 15 item 2): system calls its workers made,
//! host threads it woke (futex wakes and doorbell rings) and heap
//! allocations its workers' passes made — each per request served.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// The server's cumulative counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerCounters {
    pub syscalls: u64,
    pub wakes: u64,
    pub heap_allocations: u64,
}

/// Per request, between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Economy {
    pub syscalls_per_req: f64,
    pub wakes_per_req: f64,
    pub heap_allocations_per_req: f64,
}

impl ServerCounters {
    /// `tcps stat --json` of the server at `socket` (None if it does not
    /// answer, or is older than these counters).
    pub fn read(exe: &Path, socket: &Path) -> Option<ServerCounters> {
        let out = Command::new(exe)
            .args(["stat", "--json", "--socket"])
            .arg(socket)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Self::from_report(&serde_json::from_slice(&out.stdout).ok()?)
    }

    fn from_report(v: &Value) -> Option<ServerCounters> {
        let total = &v["total"]["counters"];
        Some(ServerCounters {
            syscalls: v["server"]["syscalls"].as_u64()?,
            wakes: total["wakes"].as_u64()? + total["doorbell_rings"].as_u64()?,
            heap_allocations: v["server"]["heap_allocations"].as_u64()?,
        })
    }

    /// What `self` (before) to `after` cost per request of `requests`.
    pub fn per_request(&self, after: &ServerCounters, requests: u64) -> Option<Economy> {
        if requests == 0 {
            return None;
        }
        let n = requests as f64;
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64 / n;
        Some(Economy {
            syscalls_per_req: d(self.syscalls, after.syscalls),
            wakes_per_req: d(self.wakes, after.wakes),
            heap_allocations_per_req: d(self.heap_allocations, after.heap_allocations),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_from_a_report_and_per_request() {
        let v = serde_json::json!({
            "server": { "syscalls": 1000, "heap_allocations": 7 },
            "total": { "counters": { "wakes": 30, "doorbell_rings": 20 } },
        });
        let a = ServerCounters::from_report(&v).unwrap();
        assert_eq!(a.wakes, 50);
        let b = ServerCounters {
            syscalls: 1600,
            wakes: 250,
            heap_allocations: 7,
        };
        let e = a.per_request(&b, 200).unwrap();
        assert_eq!(e.syscalls_per_req, 3.0);
        assert_eq!(e.wakes_per_req, 1.0);
        assert_eq!(e.heap_allocations_per_req, 0.0);
        assert!(a.per_request(&b, 0).is_none());
        // A server without the counters (an older one): nothing.
        assert!(ServerCounters::from_report(&serde_json::json!({})).is_none());
    }
}
