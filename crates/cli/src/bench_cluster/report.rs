//! The run's outputs: medians over the rounds, each configuration's ratio
//! to its baseline, `results.json` (every sample) and `summary.md` (the
//! table, as `docs/BENCHMARKS.md` shows it).

use serde::Serialize;
use std::fmt::Write as _;
use std::fs;

use super::args::{ClusterArgs, Error};
use super::configs::Config;
use super::sample::{FabricPerReq, Sample};
use crate::bench_web::report::{command_line, first_line};
use crate::bench_web::results::median;
use crate::bench_web::types::cpu_list;

/// The medians of a configuration's samples.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Medians {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub host_cpu_us_per_req: f64,
    pub pump_cpu_us_per_req: Option<f64>,
    pub server_cpu_us_per_req: Option<f64>,
    pub app_node_cpu_us_per_req: f64,
    pub total_cpu_us_per_req: f64,
    pub fabric: Option<FabricPerReq>,
    pub round_trips_per_req: Option<f64>,
}

/// One configuration's line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub config: Config,
    pub baseline: &'static str,
    pub samples: Vec<Sample>,
    pub median: Option<Medians>,
    /// `median.rps` over the baseline's.
    pub ratio_vs_baseline: Option<f64>,
    pub error: Option<String>,
}

fn med(samples: &[Sample], f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let xs: Vec<f64> = samples.iter().filter_map(f).collect();
    (!xs.is_empty()).then(|| median(&xs))
}

impl Row {
    pub fn new(config: Config) -> Row {
        Row {
            config,
            baseline: config.baseline(),
            samples: Vec::new(),
            median: None,
            ratio_vs_baseline: None,
            error: None,
        }
    }

    fn sum_up(&mut self) {
        let s = &self.samples;
        if s.is_empty() {
            return;
        }
        let m = |f: fn(&Sample) -> f64| med(s, |x| Some(f(x))).unwrap_or(0.0);
        let fab = |f: fn(&FabricPerReq) -> f64| med(s, |x| x.fabric.as_ref().map(f));
        self.median = Some(Medians {
            rps: m(|x| x.rps),
            p50_us: m(|x| x.p50_us),
            p99_us: m(|x| x.p99_us),
            host_cpu_us_per_req: m(|x| x.host_cpu_us_per_req),
            pump_cpu_us_per_req: med(s, |x| x.pump_cpu_us_per_req),
            server_cpu_us_per_req: med(s, |x| x.server_cpu_us_per_req),
            app_node_cpu_us_per_req: m(|x| x.app_node_cpu_us_per_req),
            total_cpu_us_per_req: m(|x| x.total_cpu_us_per_req),
            fabric: fab(|f| f.messages_to_host).map(|to| FabricPerReq {
                messages_to_host: to,
                messages_from_host: fab(|f| f.messages_from_host).unwrap_or(0.0),
                bytes_to_host: fab(|f| f.bytes_to_host).unwrap_or(0.0),
                bytes_from_host: fab(|f| f.bytes_from_host).unwrap_or(0.0),
            }),
            round_trips_per_req: med(s, |x| x.round_trips_per_req),
        });
    }
}

/// Medians of every row, then each row's ratio to its baseline's.
pub fn sum_up(rows: &mut [Row]) {
    rows.iter_mut().for_each(Row::sum_up);
    let rps = |rows: &[Row], id: &str| {
        rows.iter()
            .find(|r| r.config.id == id)
            .and_then(|r| r.median)
            .map(|m| m.rps)
    };
    for i in 0..rows.len() {
        let base = rps(rows, rows[i].baseline);
        let own = rows[i].median.map(|m| m.rps);
        rows[i].ratio_vs_baseline = own.zip(base.filter(|b| *b > 0.0)).map(|(a, b)| a / b);
    }
}

/// What the run was: recorded with the results.
#[derive(Serialize)]
pub struct Meta {
    pub command: String,
    pub date: String,
    pub cpus: usize,
    pub kernel: String,
    pub workload: String,
    pub seconds_per_measurement: u64,
    pub rounds: u32,
    pub connections: u32,
    pub wrk_threads: u32,
    pub topology: String,
    pub machine_busy_before_pct: f64,
    pub wall_seconds: f64,
}

impl Meta {
    /// `two`: the run has the second TCP-server node (nginx-remote2).
    pub fn collect(a: &ClusterArgs, two: bool, busy: f64, wall: f64) -> Meta {
        let (h, s) = (cpu_list(&a.host_cpus), cpu_list(&a.server_cpus));
        let second = match two {
            true => format!(
                " (nginx-remote2: a second TCP-server node, its server on CPUs {s} too, \
                 wrk as two processes through both server nodes)"
            ),
            false => String::new(),
        };
        Meta {
            command: command_line(),
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: first_line("uname", &["-r"]),
            workload: a.workload.clone(),
            seconds_per_measurement: a.duration(),
            rounds: a.rounds(),
            connections: a.connections,
            wrk_threads: a.wrk_threads,
            topology: format!(
                "three network namespaces as nodes (application, TCP server, clients; veth \
                 links; UCX over tcp between application and server node); the application \
                 (web server or nginx, and its fabric-pump helper) on CPUs {h}, the TCP server \
                 (local or remote, --poll {p}) on CPUs {s}, Regular on CPUs {h},{s}; wrk \
                 ({t} threads, {c} connections) unpinned on the client node{second}; all \
                 nodes share this machine's cores",
                p = a.poll,
                t = a.wrk_threads,
                c = a.connections
            ),
            machine_busy_before_pct: busy,
            wall_seconds: wall,
        }
    }
}

fn opt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or("–".to_string(), f)
}

/// The markdown table of the rows.
pub fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| configuration | req/s | vs base | host µs/req | app node µs/req | total µs/req \
         | fabric msgs/req to/from host | fabric bytes/req to/from host | round trips/req \
         | p50 / p99 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let Some(m) = r.median else {
            let why = r.error.as_deref().unwrap_or("not measured");
            let why = why.lines().next().unwrap_or("");
            let _ = writeln!(t, "| {} | failed: {why} | | | | | | | | |", r.config.label);
            continue;
        };
        let f = m.fabric;
        // A remote host's helper is part of the host: shown in brackets.
        let pump = m
            .pump_cpu_us_per_req
            .map_or(String::new(), |p| format!(" (pump {p:.1})"));
        let _ = writeln!(
            t,
            "| {} | {:.0} | {} | {:.1}{} | {:.1} | {:.1} | {} | {} | {} | {:.2} / {:.2} |",
            r.config.label,
            m.rps,
            opt(r.ratio_vs_baseline, |x| format!("{x:.2}×")),
            m.host_cpu_us_per_req,
            pump,
            m.app_node_cpu_us_per_req,
            m.total_cpu_us_per_req,
            opt(f.map(|f| f.messages_to_host), |x| {
                format!("{x:.2} / {:.2}", f.map_or(0.0, |f| f.messages_from_host))
            }),
            opt(f.map(|f| f.bytes_to_host), |x| {
                format!("{x:.0} / {:.0}", f.map_or(0.0, |f| f.bytes_from_host))
            }),
            opt(m.round_trips_per_req, |x| format!("{x:.2}")),
            m.p50_us / 1000.0,
            m.p99_us / 1000.0,
        );
    }
    t
}

/// `DIR/results.json` and `DIR/summary.md`.
pub fn write(a: &ClusterArgs, meta: &Meta, rows: &[Row]) -> Result<(), Error> {
    fs::create_dir_all(&a.out).map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let json = serde_json::json!({ "meta": meta, "rows": rows });
    fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let mut md = format!(
        "# tcps bench cluster — {}\n\n`{}`\n\n{}; workload {}, {} s per measurement, \
         {} round(s) (medians), machine {:.0}% busy before the run.\n\n",
        meta.date,
        meta.command,
        meta.topology,
        meta.workload,
        meta.seconds_per_measurement,
        meta.rounds,
        meta.machine_busy_before_pct
    );
    md.push_str(&table(rows));
    md.push_str(
        "\nhost: the application's CPU (with its fabric-pump helper, in brackets); app node: the host \
         plus a local TCP server; total: host plus TCP server(s) wherever they run; fabric: the \
         TCP server's fabric counters (messages of spans, keepalives) per request (nginx-remote2: \
         both servers', summed; its req/s is its two wrk processes' sum, p50 their \
         request-weighted mean, p99 the larger); round trips: \
         channel round trips the web server waited on per request (its library's counters); vs base: \
         to Regular (nginx rows: to nginx on kernel sockets). `tcps bench cluster --help` \
         explains each column.\n",
    );
    fs::write(a.out.join("summary.md"), md)?;
    eprintln!("wrote {0}/results.json and {0}/summary.md", a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_cluster::configs::ALL;

    fn sample(rps: f64, fabric: bool) -> Sample {
        Sample {
            rps,
            each_rps: None,
            mb_per_s: 1.0,
            requests: 100,
            p50_us: 1000.0,
            p99_us: 2000.0,
            errors: vec![],
            host_cpu_us_per_req: rps / 100.0,
            pump_cpu_us_per_req: fabric.then_some(2.0),
            server_cpu_us_per_req: None,
            app_node_cpu_us_per_req: rps / 100.0,
            total_cpu_us_per_req: rps / 50.0,
            fabric: fabric.then_some(FabricPerReq {
                messages_to_host: rps / 1000.0,
                messages_from_host: 1.0,
                bytes_to_host: 100.0,
                bytes_from_host: 16000.0,
            }),
            round_trips_per_req: fabric.then_some(2.5),
        }
    }

    #[test]
    fn medians_ratios_and_the_table() {
        let mut rows: Vec<Row> = ALL[..3].iter().copied().map(Row::new).collect();
        rows[0].samples = vec![
            sample(1000.0, false),
            sample(3000.0, false),
            sample(2000.0, false),
        ];
        rows[2].samples = vec![sample(500.0, true), sample(1500.0, true)];
        rows[1].error = Some("round 1: the TCP server exited\nlog".into());
        sum_up(&mut rows);
        assert_eq!(rows[0].median.map(|m| m.rps), Some(2000.0));
        assert_eq!(rows[0].ratio_vs_baseline, Some(1.0));
        assert_eq!(rows[2].median.map(|m| m.rps), Some(1000.0));
        assert_eq!(rows[2].ratio_vs_baseline, Some(0.5));
        assert!(rows[1].median.is_none() && rows[1].ratio_vs_baseline.is_none());
        let f = rows[2].median.and_then(|m| m.fabric).unwrap();
        assert_eq!((f.messages_to_host, f.bytes_from_host), (1.0, 16000.0));
        let t = table(&rows);
        assert!(t.contains("| Regular (kernel sockets) | 2000 | 1.00× | 20.0 | 20.0 | 40.0 | – | – | – | 1.00 / 2.00 |"), "{t}");
        assert!(
            t.contains("| remote tcps (UCX) | 1000 | 0.50× | 10.0 (pump 2.0) |"),
            "{t}"
        );
        assert!(
            t.contains("| 1.00 / 1.00 | 100 / 16000 | 2.50 | 1.00 / 2.00 |"),
            "{t}"
        );
        assert!(
            t.contains("| local tcps (shared memory) | failed: round 1: the TCP server exited |"),
            "{t}"
        );
    }
}
