//! The load of one measurement: wrk on the client node against every URL
//! the application is served on, and their results as one.
//!
//! One URL: one wrk with `--wrk-threads` and `--connections`. Two (remote2:
//! the application's listeners on both server nodes): two wrk processes
//! started together, each with half the connections and half the threads
//! (at least one each), the same script and duration. Combined: requests,
//! requests/s and bytes/s summed; p50 the request-weighted mean of the
//! two p50s (the median of the whole lies between them); p99 the larger
//! p99 (a bound of the whole's: neither has more than 1% of its requests
//! above it, so neither has the union); errors of each, named by URL.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use super::args::Error;
use super::start::Env;
use crate::bench_web::point::{parse_transfer, wait_wrk};
use crate::cluster_nodes::Nodes;
use crate::harness;

/// What wrk got (all of them together).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Load {
    pub rps: f64,
    pub mb_per_s: f64,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: Vec<String>,
    /// With several wrk processes: the requests/s of each.
    pub each_rps: Option<Vec<f64>>,
}

/// `total` split into `n` shares as even as can be, the first ones larger.
fn split(total: u32, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| total / n + u32::from(i < total % n))
        .collect()
}

/// wrk's (threads, connections) per URL: threads at least one and at most
/// the connections (wrk refuses fewer connections than threads).
pub fn shares(threads: u32, connections: u32, urls: usize) -> Vec<(u32, u32)> {
    let n = urls.max(1) as u32;
    split(threads, n)
        .into_iter()
        .zip(split(connections, n))
        .map(|(t, c)| (t.max(1).min(c.max(1)), c.max(1)))
        .collect()
}

/// The results of several wrk processes as one (see the module's doc).
pub fn combine(parts: &[(String, Load)]) -> Load {
    if let [(_, one)] = parts {
        return one.clone();
    }
    let requests: u64 = parts.iter().map(|(_, l)| l.requests).sum();
    let weight = requests.max(1) as f64;
    Load {
        rps: parts.iter().map(|(_, l)| l.rps).sum(),
        mb_per_s: parts.iter().map(|(_, l)| l.mb_per_s).sum(),
        requests,
        p50_us: parts
            .iter()
            .map(|(_, l)| l.p50_us * l.requests as f64 / weight)
            .sum(),
        p99_us: parts.iter().map(|(_, l)| l.p99_us).fold(0.0, f64::max),
        errors: parts
            .iter()
            .flat_map(|(u, l)| l.errors.iter().map(move |e| format!("{u}: {e}")))
            .collect(),
        each_rps: Some(parts.iter().map(|(_, l)| l.rps).collect()),
    }
}

/// One wrk on the client node against `url`, its output in `out`.
fn wrk(env: &Env, (threads, conns): (u32, u32), url: &str, out: &Path) -> Result<Load, String> {
    let mut cmd = Nodes::exec(&env.nodes.cli);
    cmd.arg(env.wrk)
        .arg(format!("-t{threads}"))
        .arg(format!("-c{conns}"))
        .arg(format!("-d{}s", env.args.duration()))
        .args(["--timeout", "5s", "--latency", "-s"])
        .arg(env.tmp.join("wrk.lua"))
        .arg(format!("{url}/"));
    let status: ExitStatus = wait_wrk(cmd, out, env.args.duration()).map_err(|e| e.to_string())?;
    let text = fs::read_to_string(out).unwrap_or_default();
    if !status.success() {
        return Err(format!("wrk failed ({status}):\n{text}"));
    }
    let r = harness::parse_wrk(&text).map_err(|e| e.to_string())?;
    if r.requests == 0 {
        return Err(format!("no request completed:\n{text}"));
    }
    Ok(Load {
        rps: r.rps,
        mb_per_s: parse_transfer(&text).unwrap_or(0.0),
        requests: r.requests,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        errors: r.errors,
        each_rps: None,
    })
}

/// wrk against every URL in `urls` at once (the connections and threads
/// shared out), for the run's duration; their results combined. wrk's
/// output goes to `{out}.txt`, or `{out}-1.txt`, `{out}-2.txt`, ….
pub fn run(env: &Env, urls: &[String], out: &str) -> Result<Load, Error> {
    let a = env.args;
    let shares = shares(a.wrk_threads, a.connections, urls.len());
    let files: Vec<PathBuf> = (1..=urls.len())
        .map(|i| match urls.len() {
            1 => env.tmp.join(format!("{out}.txt")),
            _ => env.tmp.join(format!("{out}-{i}.txt")),
        })
        .collect();
    let results: Vec<Result<Load, String>> = std::thread::scope(|sc| {
        let running: Vec<_> = urls
            .iter()
            .zip(&shares)
            .zip(&files)
            .map(|((u, &s), f)| sc.spawn(move || wrk(env, s, u, f)))
            .collect();
        running
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("wrk's thread panicked".into()))
            })
            .collect()
    });
    let mut parts = Vec::new();
    for (u, r) in urls.iter().zip(results) {
        parts.push((u.clone(), r?));
    }
    Ok(combine(&parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_and_threads_are_shared_out() {
        assert_eq!(shares(2, 64, 1), [(2, 64)]);
        assert_eq!(shares(2, 64, 2), [(1, 32), (1, 32)]);
        assert_eq!(shares(3, 65, 2), [(2, 33), (1, 32)]);
        // At least one thread each, never more than the connections.
        assert_eq!(shares(1, 16, 2), [(1, 8), (1, 8)]);
        assert_eq!(shares(8, 2, 2), [(1, 1), (1, 1)]);
    }

    #[test]
    fn two_results_are_combined() {
        let l = |rps: f64, n: u64, p50: f64, p99: f64, e: &[&str]| Load {
            rps,
            mb_per_s: rps / 100.0,
            requests: n,
            p50_us: p50,
            p99_us: p99,
            errors: e.iter().map(|s| s.to_string()).collect(),
            each_rps: None,
        };
        let a = l(1000.0, 3000, 100.0, 900.0, &[]);
        assert_eq!(combine(&[("u".into(), a.clone())]), a);
        let b = l(500.0, 1000, 300.0, 2000.0, &["Socket errors: 1"]);
        let c = combine(&[("u1".into(), a), ("u2".into(), b)]);
        assert_eq!((c.rps, c.mb_per_s, c.requests), (1500.0, 15.0, 4000));
        // 100 × 3/4 + 300 × 1/4; the larger p99.
        assert_eq!((c.p50_us, c.p99_us), (150.0, 2000.0));
        assert_eq!(c.errors, ["u2: Socket errors: 1"]);
        assert_eq!(c.each_rps, Some(vec![1000.0, 500.0]));
    }
}
