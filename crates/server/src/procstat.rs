//! A process's CPU time and run delay from /proc, read into buffers kept
//! between reads (balancing reads them every 250 ms per host: nothing
//! allocated per read once the buffers have grown). The run delay of a
//! process is the sum over its threads (`/proc/PID/task/TID/schedstat`);
//! the list of threads is read again only every [`RELIST`], since
//! listing a directory allocates per entry.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// How often the thread list is read again.
const RELIST: Duration = Duration::from_secs(2);
/// Most threads read per look (a look costs the worker a bounded number
/// of reads).
const MAX_THREADS: usize = 256;

#[derive(Default)]
pub struct ProcStat {
    path: String,
    buf: String,
    threads: Vec<u32>,
    listed: Option<(u32, Instant)>,
}

impl ProcStat {
    /// utime + stime of process `pid`, in clock ticks.
    pub fn ticks(&mut self, pid: u32) -> Option<u64> {
        self.path.clear();
        let _ = write!(self.path, "/proc/{pid}/stat");
        read_into(&self.path, &mut self.buf)?;
        let s = &self.buf;
        // After the command name (which may hold anything, up to the last ')').
        let rest = &s[s.rfind(')')? + 1..];
        // Fields 14 and 15 of proc(5); `rest` starts at field 3.
        let mut f = rest.split_whitespace().skip(11);
        Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
    }

    /// The run delay of process `pid`'s threads, summed, in ns.
    pub fn run_delay_ns(&mut self, pid: u32, now: Instant) -> u64 {
        let stale = self
            .listed
            .is_none_or(|(p, at)| p != pid || now.saturating_duration_since(at) >= RELIST);
        if stale {
            self.list_threads(pid);
            self.listed = Some((pid, now));
        }
        let mut sum = 0;
        for i in 0..self.threads.len() {
            self.path.clear();
            let _ = write!(self.path, "/proc/{pid}/task/{}/schedstat", self.threads[i]);
            if read_into(&self.path, &mut self.buf).is_some() {
                sum += schedstat_delay(&self.buf).unwrap_or(0);
            }
        }
        sum
    }

    fn list_threads(&mut self, pid: u32) {
        self.threads.clear();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        self.threads.extend(
            dir.flatten()
                .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
                .take(MAX_THREADS),
        );
    }
}

/// Nanoseconds a thread waited runnable for a CPU: the second field of a
/// `schedstat` file.
pub fn schedstat_delay(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The text of file `path` into `buf` (cleared first; its room kept).
/// Plain reads: `read_to_string` would first ask the file's size (statx
/// and lseek, two system calls more per file; /proc files have none).
pub fn read_into(path: &str, buf: &mut String) -> Option<()> {
    buf.clear();
    read_at_start(&std::fs::File::open(path).ok()?, buf)
}

/// The text of the open /proc file `f`, read again from its start, into
/// `buf` (cleared first; its room kept). A /proc file makes its text anew
/// for a read at offset 0.
pub fn read_at_start(f: &std::fs::File, buf: &mut String) -> Option<()> {
    use std::os::unix::fs::FileExt;
    buf.clear();
    let mut chunk = [0u8; 512];
    let mut bytes = std::mem::take(buf).into_bytes();
    let ok = loop {
        match f.read_at(&mut chunk, bytes.len() as u64) {
            Ok(0) => break true,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    *buf = String::from_utf8(bytes).unwrap_or_default();
    ok.then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let mut p = ProcStat::default();
        let pid = std::process::id();
        assert!(p.ticks(pid).is_some());
        let _spin: u64 = (0..1_000_000u64).sum();
        let now = Instant::now();
        p.run_delay_ns(pid, now);
        assert!(!p.threads.is_empty(), "the thread list");
        assert!(p.threads.contains(&pid), "the main thread is a task");
        assert_eq!(schedstat_delay("100 200 3\n"), Some(200));
        assert_eq!(schedstat_delay("100"), None);
    }
}
