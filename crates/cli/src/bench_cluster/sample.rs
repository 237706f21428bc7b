//! One measurement of a running configuration: wrk on the client node
//! for the run's duration, and around it the CPU time of the application
//! (with its fabric-pump helpers), of the TCP server, and the TCP
//! server's fabric counters (`tcps stat`'s `fabric.total`).

use serde::Serialize;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::args::Error;
use super::configs::{Config, Net};
use super::start::{Env, Running};
use crate::bench_web::point::{parse_transfer, wait_wrk};
use crate::cluster_nodes::Nodes;
use crate::harness;

/// Fabric traffic per request, as the TCP server counted it.
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
    pub mb_per_s: f64,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: Vec<String>,
    /// CPU µs per request: the application (its process tree and its
    /// fabric-pump helpers), the helpers alone, the TCP server, the
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

/// CPU time (µs) at one moment.
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
        server: run
            .server
            .as_ref()
            .map(|s| harness::cpu_us(s.pid()))
            .transpose()?,
    })
}

/// The TCP server's fabric totals (`messages_sent`, … as numbers).
fn fabric_total(socket: &Path) -> Result<Value, Error> {
    let v = crate::stat_cmd::query(socket)?;
    Ok(v["fabric"]["total"].clone())
}

fn per_req(a: &Value, b: &Value, key: &str, n: f64) -> f64 {
    let (a, b) = (a[key].as_u64().unwrap_or(0), b[key].as_u64().unwrap_or(0));
    b.saturating_sub(a) as f64 / n
}

/// Measures the running configuration `c` once (wrk's output in
/// `tmp/wrk-ID-ROUND.txt`).
pub fn measure(env: &Env, c: &Config, run: &mut Running, round: u32) -> Result<Sample, Error> {
    let a = env.args;
    let app_ns = fs::metadata(format!("/run/netns/{}", env.nodes.app))?.ino();
    let script = env.tmp.join("wrk.lua");
    let out = env.tmp.join(format!("wrk-{}-{round}.txt", c.id));
    let fabric = |run: &Running| -> Result<Option<Value>, Error> {
        match (&run.socket, c.net) {
            (Some(s), Net::Remote) => Ok(Some(fabric_total(s)?)),
            _ => Ok(None),
        }
    };
    let (f0, c0) = (fabric(run)?, cpu(run, app_ns)?);
    let mut cmd = Nodes::exec(&env.nodes.cli);
    cmd.arg(env.wrk)
        .arg(format!("-t{}", a.wrk_threads))
        .arg(format!("-c{}", a.connections))
        .arg(format!("-d{}s", a.duration()))
        .args(["--timeout", "5s", "--latency", "-s"])
        .arg(&script)
        .arg(format!("{}/", env.url(c)));
    let status = wait_wrk(cmd, &out, a.duration())?;
    let (c1, f1) = (cpu(run, app_ns)?, fabric(run)?);
    let text = fs::read_to_string(&out).unwrap_or_default();
    if !status.success() {
        return Err(format!("wrk failed ({status}):\n{text}").into());
    }
    run.app.check_alive()?;
    let r = harness::parse_wrk(&text)?;
    if r.requests == 0 {
        return Err(format!("no request completed:\n{text}").into());
    }
    let n = r.requests as f64;
    let pump = (c1.pumps - c0.pumps) / n;
    let host = (c1.app - c0.app) / n + pump;
    let server = c0.server.zip(c1.server).map(|(x, y)| (y - x) / n);
    let local = if c.net == Net::Local { server } else { None };
    Ok(Sample {
        rps: r.rps,
        mb_per_s: parse_transfer(&text).unwrap_or(0.0),
        requests: r.requests,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        errors: r.errors,
        host_cpu_us_per_req: host,
        pump_cpu_us_per_req: (c.net == Net::Remote).then_some(pump),
        server_cpu_us_per_req: server,
        app_node_cpu_us_per_req: host + local.unwrap_or(0.0),
        total_cpu_us_per_req: host + server.unwrap_or(0.0),
        fabric: f0.zip(f1).map(|(x, y)| FabricPerReq {
            messages_to_host: per_req(&x, &y, "messages_sent", n),
            messages_from_host: per_req(&x, &y, "messages_received", n),
            bytes_to_host: per_req(&x, &y, "bytes_sent", n),
            bytes_from_host: per_req(&x, &y, "bytes_received", n),
        }),
        round_trips_per_req: None,
    })
}
