//! Running programs for `tcps demo` and `tcps bench web`: child processes
//! stopped on every path out, a temp dir, Ctrl-C that cleans up, finding
//! wrk and the example web server, CPU time of a process, and wrk's output.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

/// Set by SIGINT/SIGTERM: the demo or benchmark stops at the next step
/// and cleans up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub(crate) fn check_interrupted() -> Result<(), Error> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

/// SIGINT and SIGTERM set [`check_interrupted`]'s flag instead of killing
/// the process, so every guard (children, temp dirs, namespaces) cleans up.
pub(crate) fn install_signal_handlers() {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// A child process that is stopped (SIGTERM, then SIGKILL) and reaped when
/// dropped.
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the end of its log if the process has exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), Error> {
        if let Some(status) = self.child.try_wait()? {
            return Err(format!(
                "{} exited ({status}); the end of its log:\n{}",
                self.name,
                log_tail(&self.log)
            )
            .into());
        }
        Ok(())
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Idempotent.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// A temp dir (`tcps-demo-PID-N`), removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<Self, Error> {
        let base = std::env::temp_dir();
        for i in 0..100u32 {
            let p = base.join(format!("tcps-demo-{}-{i}", std::process::id()));
            match fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("cannot create {}: {e}", p.display()).into()),
            }
        }
        Err(format!("cannot create a temp dir in {}", base.display()).into())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(15);
    let tail = lines[start..].join("\n");
    if tail.is_empty() {
        "(empty)".to_string()
    } else {
        tail
    }
}

/// Finds `name` in $PATH.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// `$TCPS_EXAMPLES/webserver`, else `<exe_dir>/../../examples/build/webserver`.
pub(crate) fn find_webserver(exe: &Path) -> Result<PathBuf, Error> {
    let candidate = match std::env::var_os("TCPS_EXAMPLES") {
        Some(dir) => PathBuf::from(dir).join("webserver"),
        None => {
            let dir = exe
                .parent()
                .ok_or("cannot locate the tcps executable's directory")?;
            dir.join("../../examples/build/webserver")
        }
    };
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(format!(
            "web server not found at {} — build it with `make` in the repository \
             (or set TCPS_EXAMPLES to the directory that holds it)",
            candidate.display()
        )
        .into())
    }
}

/// CPU time (user + system) of a process so far, in µs.
pub(crate) fn cpu_us(pid: u32) -> Result<f64, Error> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| format!("unexpected format of {path}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': field 3 (state) is fields[0]; utime is field 14, stime 15.
    let get = |n: usize| -> Result<u64, Error> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("unexpected format of {path} (field {n})").into())
    };
    let ticks = get(14)? + get(15)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return Err("sysconf(_SC_CLK_TCK) failed".into());
    }
    Ok(ticks as f64 * 1e6 / hz as f64)
}

pub(crate) fn wait_for<F: FnMut() -> Result<bool, Error>>(
    what: &str,
    timeout: Duration,
    mut ready: F,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        check_interrupted()?;
        if ready()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What wrk reported.
#[derive(Debug, Default, Clone)]
pub(crate) struct WrkResult {
    pub(crate) requests: u64,
    pub(crate) rps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) errors: Vec<String>,
}

/// "559.00us", "1.18ms", "2.01s", "1.50m" → µs.
fn parse_latency(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600e6)
    } else {
        return None;
    };
    num.trim().parse::<f64>().ok().map(|v| v * mult)
}

pub(crate) fn parse_wrk(out: &str) -> Result<WrkResult, Error> {
    let mut r = WrkResult::default();
    let (mut rps, mut p50, mut p99, mut reqs) = (None, None, None, None);
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            rps = v.trim().parse::<f64>().ok();
        } else if let Some(v) = t.strip_prefix("50%") {
            p50 = parse_latency(v);
        } else if let Some(v) = t.strip_prefix("99%") {
            p99 = parse_latency(v);
        } else if t.contains(" requests in ") {
            reqs = t
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
        } else if t.starts_with("Socket errors:") || t.starts_with("Non-2xx or 3xx responses:") {
            r.errors.push(t.to_string());
        }
    }
    let missing = |what: &str| format!("could not find {what} in wrk's output:\n{out}");
    r.rps = rps.ok_or_else(|| missing("Requests/sec"))?;
    r.p50_us = p50.ok_or_else(|| missing("the 50% latency"))?;
    r.p99_us = p99.ok_or_else(|| missing("the 99% latency"))?;
    r.requests = reqs.ok_or_else(|| missing("the request count"))?;
    Ok(r)
}

/// Writes `<dir>/nginx.conf` (and `<dir>/tmp`): one worker, in the
/// foreground, `sendfile on`, no access log, serving `root` on `listen`
/// (`ADDR:PORT`); its pid file is `<dir>/nginx.pid`. Returns the
/// configuration's path. `tcps demo` and `tcps bench web` run nginx with it,
/// through `tcps run` and on kernel sockets alike.
pub(crate) fn write_nginx_conf(dir: &Path, listen: &str, root: &Path) -> Result<PathBuf, Error> {
    write_nginx_conf_workers(dir, listen, root, 1)
}

/// [`write_nginx_conf`] with `workers` worker processes.
pub(crate) fn write_nginx_conf_workers(
    dir: &Path,
    listen: &str,
    root: &Path,
    workers: usize,
) -> Result<PathBuf, Error> {
    fs::create_dir_all(dir.join("tmp"))?;
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    fs::write(
        &conf,
        format!(
            "worker_processes {workers};\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n access_log off;\n sendfile on;\n tcp_nodelay on;\n keepalive_requests 100000;\n\
             client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
             server {{ listen {listen} reuseport backlog=4096; root {}; }}\n}}\n",
            root.display()
        ),
    )?;
    Ok(conf)
}

/// The direct children of `pid` (/proc/PID/task/*/children).
pub(crate) fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// CPU time (µs) of `pid` and its descendants alive now: the example web
/// server is one process, nginx a master and its workers.
pub(crate) fn tree_cpu_us(pid: u32) -> Result<f64, Error> {
    let mut total = cpu_us(pid)?;
    let mut todo = children_of(pid);
    while let Some(p) = todo.pop() {
        // A child that exited meanwhile is not counted (nor was it before).
        if let Ok(t) = cpu_us(p) {
            total += t;
        }
        todo.extend(children_of(p));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK_OUT: &str = "Running 3s test @ http://127.0.0.1:18090/index.html
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   572.13us  180.00us   5.10ms   80.00%
    Req/Sec     3.49k   200.00     3.80k    70.00%
  Latency Distribution
     50%  559.00us
     75%  600.00us
     90%  700.00us
     99%    1.18ms
  21505 requests in 3.10s, 338.37MB read
  Socket errors: connect 0, read 0, write 0, timeout 4
Requests/sec:   6937.30
Transfer/sec:    109.15MB
";

    #[test]
    fn parses_wrk_output() {
        let r = parse_wrk(WRK_OUT).unwrap();
        assert_eq!(r.requests, 21505);
        assert!((r.rps - 6937.30).abs() < 1e-6);
        assert!((r.p50_us - 559.0).abs() < 1e-6);
        assert!((r.p99_us - 1180.0).abs() < 1e-6);
        assert_eq!(r.errors.len(), 1);
        assert!(parse_wrk("garbage").is_err());
    }

    #[test]
    fn latency_units() {
        assert_eq!(parse_latency("62.00us"), Some(62.0));
        assert_eq!(parse_latency("2.00s"), Some(2e6));
        assert_eq!(parse_latency("1.50m"), Some(90e6));
        assert_eq!(parse_latency("x"), None);
    }

    #[test]
    fn own_cpu_time() {
        assert!(cpu_us(std::process::id()).unwrap() >= 0.0);
    }
}
