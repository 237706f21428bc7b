//! Measuring one load point: wrk in the client namespace at an offered
//! rate (or unpaced), with the CPU time of the servers and the cores, and
//! the web server's system calls, read around it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::economy::ServerCounters;
use super::env::{Env, PORT};
use super::measure::{self, CpuSnapshot};
use super::netns::{Netns, SERVER_ADDR};
use super::results::Point;
use super::servers::{core_groups, Servers};
use super::types::{cpu_list, Error};
use super::variants::Variant;
use super::workload::{self, Workload};
use crate::harness::{self, Proc};

/// CPU time read before and after a point: per core, of the web server's
/// process tree, and of the TCP server.
struct CpuReading {
    cores: CpuSnapshot,
    host_us: f64,
    server_us: Option<f64>,
}

impl CpuReading {
    fn take(s: &Servers) -> Result<CpuReading, Error> {
        Ok(CpuReading {
            cores: measure::cpu_snapshot()?,
            host_us: crate::harness::tree_cpu_us(s.web.pid())?,
            server_us: s
                .tcps
                .as_ref()
                .map(|t| harness::cpu_us(t.pid()))
                .transpose()?,
        })
    }
}

/// "Transfer/sec:    109.15MB" → MB/s.
pub(crate) fn parse_transfer(out: &str) -> Option<f64> {
    let v = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Transfer/sec:"))?
        .trim();
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = v.split_at(split);
    let num: f64 = num.trim().parse().ok()?;
    let mult = match unit.trim() {
        "B" => 1e-6,
        "KB" => 1024.0 / 1e6,
        "MB" => 1024.0 * 1024.0 / 1e6,
        "GB" => 1024.0 * 1024.0 * 1024.0 / 1e6,
        _ => return None,
    };
    Some(num * mult)
}

/// Runs wrk with `script` in the client namespace for the point's duration,
/// its output to `out_path`; waits for it (a deadline past the duration,
/// and Ctrl-C, end the wait).
fn run_wrk(env: &Env, script: &Path, out_path: &Path) -> Result<ExitStatus, Error> {
    let a = env.args;
    let mut cmd = Netns::exec(&env.ns.client);
    if !a.client_cpus.is_empty() {
        cmd.args(["taskset", "-c", &cpu_list(&a.client_cpus)]);
    }
    cmd.arg(env.wrk)
        .arg(format!("-t{}", a.wrk_threads))
        .arg(format!("-c{}", a.connections))
        .arg(format!("-d{}s", env.duration))
        .args(["--timeout", "5s", "--latency", "-s"])
        .arg(script)
        .arg(format!("http://{SERVER_ADDR}:{PORT}/"));
    wait_wrk(cmd, out_path, env.duration)
}

/// Runs wrk (`cmd`, for `duration` s), its output to `out_path`, and waits
/// for it: a deadline 30 s past the duration, and Ctrl-C, end the wait.
/// (`tcps bench cluster` runs its wrk with it too.)
pub(crate) fn wait_wrk(
    mut cmd: Command,
    out_path: &Path,
    duration: u64,
) -> Result<ExitStatus, Error> {
    let out = fs::File::create(out_path)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let mut wrk = Proc {
        name: "wrk",
        child,
        log: out_path.to_path_buf(),
    };
    let deadline = Instant::now() + Duration::from_secs(duration + 30);
    loop {
        if let Some(st) = wrk.child.try_wait()? {
            return Ok(st);
        }
        harness::check_interrupted()?;
        if Instant::now() > deadline {
            return Err("wrk did not finish in time".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One load point: wrk in the client namespace, CPU and system calls around it.
pub fn measure(
    env: &Env,
    w: &Workload,
    v: &Variant,
    servers: &mut Servers,
    offered: Option<f64>,
    count_syscalls: bool,
) -> Result<Point, Error> {
    let tag = format!(
        "{}-{}-{}",
        w.id,
        v.id,
        offered.map_or("max".into(), |r| format!("{r:.0}"))
    );
    let script = env.tmp.join(format!("{tag}.lua"));
    let paths = env.tmp.join(format!("{}.paths", w.id));
    fs::write(
        &script,
        workload::wrk_script(&paths, w.http, offered, env.args.wrk_threads),
    )?;
    // perf -p counts one process: nginx's work is in its worker.
    let mut sys = if count_syscalls && !v.nginx {
        env.perf.as_ref().and_then(|p| {
            measure::SyscallCounter::start(
                p,
                servers.web.pid(),
                env.tmp.join(format!("{tag}.perf")),
            )
        })
    } else {
        None
    };
    let (host_cores, server_cores) = core_groups(env.args, v);
    let out_path: PathBuf = env.tmp.join(format!("{tag}.wrk"));
    // A point in which not one request completed is retried once: on a
    // machine shared with builds wrk can lose a whole short point to a
    // scheduling stall (seen with kernel sockets too); twice is an error.
    let mut attempt = 0;
    let counters = |s: &Servers| {
        s.tcps_socket
            .as_ref()
            .and_then(|sock| ServerCounters::read(env.exe, sock))
    };
    let (before, after, syscalls, economy, text, r) = loop {
        attempt += 1;
        let counted = counters(servers);
        let before = CpuReading::take(servers)?;
        let status = run_wrk(env, &script, &out_path)?;
        let after = CpuReading::take(servers)?;
        let economy = counted.zip(counters(servers));
        let text = fs::read_to_string(&out_path).unwrap_or_default();
        if !status.success() {
            return Err(format!("wrk failed ({status}):\n{text}").into());
        }
        servers.web.check_alive()?;
        let r = harness::parse_wrk(&text)?;
        if r.requests > 0 {
            let syscalls = sys.take().and_then(|s| s.finish());
            break (before, after, syscalls, economy, text, r);
        }
        // Its count would span both attempts: none for this point.
        sys = None;
        if attempt == 2 {
            return Err(format!("no request completed, twice:\n{text}").into());
        }
        eprintln!(
            "      no request completed in {} s; measuring the point again",
            env.duration
        );
    };
    let n = r.requests as f64;
    let host_us = (after.host_us - before.host_us) / n;
    let srv_us = match (before.server_us, after.server_us) {
        (Some(a), Some(b)) => Some((b - a) / n),
        _ => None,
    };
    Ok(Point {
        offered_rps: offered,
        rps: r.rps,
        mb_per_s: parse_transfer(&text).unwrap_or(0.0),
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        requests: r.requests,
        errors: r.errors,
        host_cpu_us_per_req: host_us,
        server_cpu_us_per_req: srv_us,
        total_cpu_us_per_req: host_us + srv_us.unwrap_or(0.0),
        host_cores: measure::cpu_split(&before.cores, &after.cores, &host_cores),
        server_cores: (!server_cores.is_empty())
            .then(|| measure::cpu_split(&before.cores, &after.cores, &server_cores)),
        syscalls_per_req: syscalls.map(|c| c as f64 / n),
        server_economy: economy.and_then(|(a, b)| a.per_request(&b, r.requests)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_units() {
        assert_eq!(
            parse_transfer("Transfer/sec:      1.00MB\n"),
            Some(1.048576)
        );
        assert_eq!(parse_transfer("Transfer/sec:    512.00KB"), Some(0.524288));
        assert_eq!(parse_transfer("nothing"), None);
    }
}
