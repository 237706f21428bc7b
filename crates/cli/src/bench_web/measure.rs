//! What is measured around each load point, without hardware counters:
//! per-core user/system/idle from /proc/stat, per-process CPU from
//! /proc/PID/stat, and system calls counted by `perf stat` on the
//! `raw_syscalls:sys_enter` tracepoint (a counter, not a trace).

use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::types::Error;

/// Jiffies of one CPU: (user+nice, system+irq+softirq, idle+iowait, steal).
#[derive(Clone, Copy, Default, Debug)]
struct Jiffies {
    user: u64,
    sys: u64,
    idle: u64,
    steal: u64,
}

/// /proc/stat, per CPU.
#[derive(Clone, Debug)]
pub struct CpuSnapshot(Vec<Jiffies>);

pub fn cpu_snapshot() -> Result<CpuSnapshot, Error> {
    let text = fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let mut cpus = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let Some(Ok(idx)) = it.next().map(str::parse::<usize>) else {
            continue; // the aggregate "cpu " line
        };
        let v: Vec<u64> = it.map(|f| f.parse().unwrap_or(0)).collect();
        let f = |i: usize| v.get(i).copied().unwrap_or(0);
        if cpus.len() <= idx {
            cpus.resize(idx + 1, Jiffies::default());
        }
        cpus[idx] = Jiffies {
            user: f(0) + f(1),
            sys: f(2) + f(5) + f(6),
            idle: f(3) + f(4),
            steal: f(7),
        };
    }
    Ok(CpuSnapshot(cpus))
}

/// Utilisation of a group of cores over an interval, in percent of the
/// group's capacity (so 100 = every core of the group busy).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuSplit {
    pub user_pct: f64,
    pub sys_pct: f64,
    pub idle_pct: f64,
    pub steal_pct: f64,
}

pub fn cpu_split(a: &CpuSnapshot, b: &CpuSnapshot, cores: &[usize]) -> CpuSplit {
    let mut d = Jiffies::default();
    for &c in cores {
        let (Some(x), Some(y)) = (a.0.get(c), b.0.get(c)) else {
            continue;
        };
        d.user += y.user.saturating_sub(x.user);
        d.sys += y.sys.saturating_sub(x.sys);
        d.idle += y.idle.saturating_sub(x.idle);
        d.steal += y.steal.saturating_sub(x.steal);
    }
    let total = (d.user + d.sys + d.idle + d.steal).max(1) as f64;
    let pct = |x: u64| 100.0 * x as f64 / total;
    CpuSplit {
        user_pct: pct(d.user),
        sys_pct: pct(d.sys),
        idle_pct: pct(d.idle),
        steal_pct: pct(d.steal),
    }
}

/// `perf stat -e raw_syscalls:sys_enter -p PID`, stopped with SIGINT.
pub struct SyscallCounter {
    child: Child,
    out: PathBuf,
}

impl SyscallCounter {
    /// None if perf is missing or cannot attach (the caller reports n/a).
    pub fn start(perf: &Path, pid: u32, out: PathBuf) -> Option<SyscallCounter> {
        let child = Command::new(perf)
            .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        // perf needs a moment to attach to every thread.
        std::thread::sleep(std::time::Duration::from_millis(150));
        Some(SyscallCounter { child, out })
    }

    /// The count, or None if perf could not count.
    pub fn finish(mut self) -> Option<u64> {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let _ = self.child.wait();
        parse_perf_count(&fs::read_to_string(&self.out).ok()?)
    }
}

impl Drop for SyscallCounter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `478204,,raw_syscalls:sys_enter,…` → 478204 (`<not counted>` → None).
fn parse_perf_count(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.contains("raw_syscalls:sys_enter"))
        .and_then(|l| l.split(',').next())
        .and_then(|v| v.trim().parse().ok())
}

/// The host library's counters, if the web server printed them at exit as
/// a line `tcps_stats: … bytes_copied=N bytes_sent=N bytes_received=N …`.
/// Returns bytes copied per network byte.
pub fn copies_per_network_byte(log: &str) -> Option<f64> {
    let net = stats_field(log, "bytes_sent")? + stats_field(log, "bytes_received")?;
    (net > 0.0).then(|| stats_field(log, "bytes_copied").map(|c| c / net))?
}

/// Channel round trips the host waited on per request the web server
/// answered (`round_trips=N requests=N` in its `tcps_stats` line).
pub fn round_trips_per_request(log: &str) -> Option<f64> {
    let requests = stats_field(log, "requests")?;
    (requests > 0.0).then(|| stats_field(log, "round_trips").map(|r| r / requests))?
}

/// Field `k` of the last `tcps_stats: k=v …` line of a log.
fn stats_field(log: &str, k: &str) -> Option<f64> {
    let line = log.lines().rev().find(|l| l.contains("tcps_stats"))?;
    line.split(|c: char| c.is_whitespace() || c == ',')
        .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
}

/// Busy share of all CPUs over one second before the run: how loaded the
/// machine is by others (recorded in the summary).
pub fn background_load() -> Result<f64, Error> {
    let a = cpu_snapshot()?;
    std::thread::sleep(std::time::Duration::from_secs(1));
    let b = cpu_snapshot()?;
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let s = cpu_split(&a, &b, &(0..n).collect::<Vec<_>>());
    Ok(s.user_pct + s.sys_pct + s.steal_pct)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_output() {
        let t = "# started on …\n\n478204,,raw_syscalls:sys_enter,956606405,100.00,,\n";
        assert_eq!(parse_perf_count(t), Some(478204));
        assert_eq!(
            parse_perf_count("<not counted>,,raw_syscalls:sys_enter,0,100.00,,"),
            None
        );
    }

    #[test]
    fn stats_line() {
        let log = "listening on 10.77.0.1:8080\ntcps_stats: calls=10 bytes_copied=50 bytes_sent=90 bytes_received=10\n";
        assert_eq!(copies_per_network_byte(log), Some(0.5));
        assert_eq!(copies_per_network_byte("nothing"), None);
        assert_eq!(round_trips_per_request(log), None);
        let log = "webserver: tcps_stats: mode=sync round_trips=30 requests=10 bytes_copied=1\n";
        assert_eq!(round_trips_per_request(log), Some(3.0));
    }

    #[test]
    fn cpu_split_sums_to_100() {
        let a = cpu_snapshot().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = cpu_snapshot().unwrap();
        let s = cpu_split(&a, &b, &[0]);
        let sum = s.user_pct + s.sys_pct + s.idle_pct + s.steal_pct;
        assert!(sum == 0.0 || (sum - 100.0).abs() < 1e-6, "{s:?}");
    }
}
