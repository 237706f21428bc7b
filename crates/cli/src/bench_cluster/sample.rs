//! One measurement of a running configuration: wrk on the client node
//! for the run's duration (`load`), and around it the CPU time of the
//! application (with its fabric-pump helpers), of the TCP servers, and
//! the TCP servers' fabric counters (`tcps stat`'s `fabric.total`; with two
//! servers, both summed).

use serde::Serialize;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::args::Error;
use super::configs::{Config, Net};
use super::load;
use super::start::{Env, Running};
use crate::harness;

/// Fabric traffic per request, as the TCP servers counted it.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FabricPerReq {
    pub messages_to_host: f64,
    pub messages_from_host: f64,
    pub bytes_to_host: f64,
    pub bytes_from_host: f64,
}

/// What one measurement got.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub rps: f64,
    /// With two wrk processes (remote2): the requests/s of each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub each_rps: Option<Vec<f64>>,
    pub mb_per_s: f64,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: Vec<String>,
    /// CPU µs per request: the application (its process tree and its
    /// fabric-pump helpers), the helpers alone, the TCP servers, the
    /// application node (the application and a local TCP server), all.
    pub host_cpu_us_per_req: f64,
    pub pump_cpu_us_per_req: Option<f64>,
    pub server_cpu_us_per_req: Option<f64>,
    pub app_node_cpu_us_per_req: f64,
    pub total_cpu_us_per_req: f64,
    pub fabric: Option<FabricPerReq>,
    /// Channel round trips the web server waited on per request it
    /// served (its library's counters at exit; tcps configurations).
    pub round_trips_per_req: Option<f64>,
}

/// `tcps fabric-pump` processes on the application node (the helpers of
/// remote hosts: the library detaches them from the program).
fn pumps(app_ns: u64) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let ns = fs::metadata(format!("/proc/{pid}/ns/net")).map(|m| m.ino());
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ns.ok() == Some(app_ns) && cmd.split(|&b| b == 0).any(|a| a == b"fabric-pump")
        })
        .collect()
}

/// CPU time (µs) at one moment; `server` that of all TCP servers.
struct Cpu {
    app: f64,
    pumps: f64,
    server: Option<f64>,
}

fn cpu(run: &Running, app_ns: u64) -> Result<Cpu, Error> {
    // A helper that exits meanwhile is not counted (nor was it before).
    let pumps = pumps(app_ns)
        .into_iter()
        .filter_map(|p| harness::cpu_us(p).ok())
        .sum();
    Ok(Cpu {
        app: harness::tree_cpu_us(run.app.pid())?,
        pumps,
        server: match run.servers.len() {
            0 => None,
            _ => Some(
                run.servers
                    .iter()
                    .map(|s| harness::cpu_us(s.pid()))
                    .sum::<Result<f64, Error>>()?,
            ),
        },
    })
}

/// The fabric counters the totals are taken of.
const FABRIC_KEYS: [&str; 4] = [
    "messages_sent",
    "messages_received",
    "bytes_sent",
    "bytes_received",
];

/// The TCP servers' fabric totals (`messages_sent`, …), summed.
fn fabric_total(sockets: &[PathBuf]) -> Result<[u64; 4], Error> {
    let mut sum = [0u64; 4];
    for socket in sockets {
        let v: Value = crate::stat_cmd::query(socket)?;
        for (s, k) in sum.iter_mut().zip(FABRIC_KEYS) {
            *s += v["fabric"]["total"][k].as_u64().unwrap_or(0);
        }
    }
    Ok(sum)
}

/// Measures the running configuration `c` once (wrk's output in
/// `tmp/wrk-ID-ROUND.txt`, or `-1.txt`, `-2.txt` with two wrk processes).
pub fn measure(env: &Env, c: &Config, run: &mut Running, round: u32) -> Result<Sample, Error> {
    let app_ns = fs::metadata(format!("/run/netns/{}", env.nodes.app))?.ino();
    let urls = env.urls(c)?;
    let fabric = |run: &Running| -> Result<Option<[u64; 4]>, Error> {
        match c.net.remote() {
            true => Ok(Some(fabric_total(&run.sockets)?)),
            false => Ok(None),
        }
    };
    let (f0, c0) = (fabric(run)?, cpu(run, app_ns)?);
    let r = load::run(env, &urls, &format!("wrk-{}-{round}", c.id))?;
    let (c1, f1) = (cpu(run, app_ns)?, fabric(run)?);
    run.app.check_alive()?;
    let n = r.requests as f64;
    let pump = (c1.pumps - c0.pumps) / n;
    let host = (c1.app - c0.app) / n + pump;
    let server = c0.server.zip(c1.server).map(|(x, y)| (y - x) / n);
    let local = if c.net == Net::Local { server } else { None };
    let d = |x: &[u64; 4], y: &[u64; 4], i: usize| y[i].saturating_sub(x[i]) as f64 / n;
    Ok(Sample {
        rps: r.rps,
        each_rps: r.each_rps,
        mb_per_s: r.mb_per_s,
        requests: r.requests,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        errors: r.errors,
        host_cpu_us_per_req: host,
        pump_cpu_us_per_req: c.net.remote().then_some(pump),
        server_cpu_us_per_req: server,
        app_node_cpu_us_per_req: host + local.unwrap_or(0.0),
        total_cpu_us_per_req: host + server.unwrap_or(0.0),
        fabric: f0.zip(f1).map(|(x, y)| FabricPerReq {
            messages_to_host: d(&x, &y, 0),
            messages_from_host: d(&x, &y, 1),
            bytes_to_host: d(&x, &y, 2),
            bytes_from_host: d(&x, &y, 3),
        }),
        round_trips_per_req: None,
    })
}
