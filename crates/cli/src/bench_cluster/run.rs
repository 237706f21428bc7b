//! The whole run: prerequisites, the site and the wrk script, the fabric
//! secret, the nodes (the second server node only for remote2; deleted at
//! the end however the run ends), then
//! rounds of every configuration in turn with a progress line each, then
//! the report.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::args::{ClusterArgs, Error};
use super::configs::{self, Config};
use super::report::{self, Meta, Row};
use super::sample::{self, Sample};
use super::start::{self, Env};
use crate::bench_web::measure::{background_load, round_trips_per_request};
use crate::bench_web::workload::{self, Workload};
use crate::cluster_nodes::Nodes;
use crate::harness::{self, TempDir};

/// Namespaces of this command: `tcpsbc-app-b<pid>`, …
const PREFIX: &str = "tcpsbc-";

/// The tools the run needs, root, and the CPU lists; wrk's path.
fn check_prerequisites(a: &ClusterArgs) -> Result<PathBuf, Error> {
    let wrk = harness::which("wrk").ok_or("wrk not found: apt-get install wrk")?;
    for tool in ["ip", "taskset", "curl"] {
        harness::which(tool)
            .ok_or_else(|| format!("{tool} not found (packages iproute2, util-linux, curl)"))?;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("tcps bench cluster needs root (it creates network namespaces)".into());
    }
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpus = a.host_cpus.iter().chain(&a.server_cpus);
    if let Some(c) = cpus.into_iter().find(|&&c| c >= ncpu) {
        return Err(format!("CPU {c} does not exist (CPUs 0-{})", ncpu - 1).into());
    }
    if a.host_cpus.is_empty() || a.server_cpus.is_empty() {
        return Err("--host-cpus and --server-cpus need at least one CPU each".into());
    }
    Ok(wrk)
}

/// The workload's site, request stream and wrk script (unpaced) in `tmp`;
/// the stream's first path.
fn prepare(a: &ClusterArgs, tmp: &Path) -> Result<(Workload, String), Error> {
    let w = workload::all()
        .into_iter()
        .find(|w| w.id == a.workload)
        .ok_or_else(|| {
            let ids: Vec<&str> = workload::all().iter().map(|w| w.id).collect();
            format!(
                "unknown workload '{}' (known: {})",
                a.workload,
                ids.join(", ")
            )
        })?;
    let trace = (w.id == "trace").then(|| workload::forth_trace(a.seed));
    workload::make_site(tmp, trace.as_ref(), a.seed)?;
    let paths = workload::request_paths(&w, trace.as_ref(), a.seed)?;
    let probe = paths.lines().next().unwrap_or("/").to_string();
    let paths_file = tmp.join("paths");
    fs::write(&paths_file, paths)?;
    let script = workload::wrk_script(&paths_file, w.http, None, a.wrk_threads);
    fs::write(tmp.join("wrk.lua"), script)?;
    Ok((w, probe))
}

/// A fresh fabric secret (mode 600) in `tmp`.
fn secret(tmp: &Path) -> Result<PathBuf, Error> {
    let mut b = [0u8; 24];
    fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let p = tmp.join("fabric.key");
    fs::write(&p, hex + "\n")?;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600))?;
    Ok(p)
}

/// Starts `c`, measures it once, stops it; the web server's round trips
/// per request from the counters it prints at exit.
fn once(env: &Env, c: &Config, round: u32) -> Result<Sample, Error> {
    let mut run = start::start(env, c)?;
    let log = run.app.log.clone();
    let s = sample::measure(env, c, &mut run, round);
    run.stop();
    let mut s = s?;
    s.round_trips_per_req = round_trips_per_request(&fs::read_to_string(log).unwrap_or_default());
    Ok(s)
}

fn progress_line(s: &Sample) -> String {
    let mut line = format!(
        "      {:.0} req/s, host {:.1} µs/req, total {:.1} µs/req",
        s.rps, s.host_cpu_us_per_req, s.total_cpu_us_per_req
    );
    if let Some(each) = &s.each_rps {
        let each: Vec<String> = each.iter().map(|r| format!("{r:.0}")).collect();
        line += &format!(" ({} req/s through each server node)", each.join(" + "));
    }
    if let Some(f) = s.fabric {
        line += &format!(
            ", fabric {:.2}/{:.2} msgs/req, {:.0}/{:.0} bytes/req (to/from host)",
            f.messages_to_host, f.messages_from_host, f.bytes_to_host, f.bytes_from_host
        );
    }
    if let Some(r) = s.round_trips_per_req {
        line += &format!(", {r:.2} round trips/req");
    }
    if !s.errors.is_empty() {
        line += &format!(" [{}]", s.errors.join("; "));
    }
    line
}

/// Every round, every configuration in turn. A measurement that fails is
/// recorded with its error and the run goes on (Ctrl-C ends it).
fn rounds(env: &Env, rows: &mut [Row]) -> Result<(), Error> {
    let (n, total) = (env.args.rounds(), rows.len() * env.args.rounds() as usize);
    let start = Instant::now();
    let mut done = 0;
    for round in 0..n {
        for row in rows.iter_mut() {
            harness::check_interrupted()?;
            let el = start.elapsed().as_secs();
            // What is left, at the pace of the measurements so far.
            let left = (done > 0).then(|| el * (total - done) as u64 / done as u64);
            eprintln!(
                "[{:>2}/{total} {}:{:02} elapsed{}] {}, round {}/{n}",
                done + 1,
                el / 60,
                el % 60,
                left.map_or(String::new(), |l| format!(
                    ", ~{}:{:02} left",
                    l / 60,
                    l % 60
                )),
                row.config.label,
                round + 1
            );
            match once(env, &row.config, round) {
                Ok(s) => {
                    eprintln!("{}", progress_line(&s));
                    row.samples.push(s);
                }
                Err(e) => {
                    harness::check_interrupted()?;
                    eprintln!("      FAILED: {e}");
                    row.error = Some(format!("round {}: {e}", round + 1));
                }
            }
            done += 1;
        }
    }
    Ok(())
}

pub fn run(args: ClusterArgs) -> Result<(), Error> {
    harness::install_signal_handlers();
    let began = Instant::now();
    let wrk = check_prerequisites(&args)?;
    let exe = std::env::current_exe()?;
    let webserver = harness::find_webserver(&exe)?;
    let nginx = harness::which("nginx").is_some();
    let configs = configs::select(&args.configs, nginx, &args.workload)?;
    let busy = background_load()?;
    eprintln!(
        "{} configurations × {} rounds of {} s, workload {}; machine {busy:.0}% busy",
        configs.len(),
        args.rounds(),
        args.duration(),
        args.workload
    );
    let tmp = TempDir::new()?;
    let (w, probe) = prepare(&args, &tmp.0)?;
    let key = secret(&tmp.0)?;
    Nodes::remove_stale(PREFIX);
    // The second server node only when a configuration needs it.
    let two = configs::two_servers(&configs);
    let tag = format!("b{}", std::process::id());
    let nodes = Nodes::create_with(PREFIX, &tag, 0, true, two)?;
    let srv2 = nodes.srv2.as_ref().map_or(String::new(), |s| {
        format!(", {} ({})", s.ns, s.srv_app_addr)
    });
    eprintln!(
        "nodes: {} ({} on the fabric link), {} ({}){srv2}, {} (clients); deleted at the end",
        nodes.app, nodes.app_addr, nodes.srv, nodes.srv_app_addr, nodes.cli
    );
    let env = Env {
        args: &args,
        nodes: &nodes,
        tmp: &tmp.0,
        exe: &exe,
        webserver: &webserver,
        wrk: &wrk,
        workload: &w,
        key: &key,
        probe: &probe,
    };
    let mut rows: Vec<Row> = configs.into_iter().map(Row::new).collect();
    rounds(&env, &mut rows)?;
    drop(nodes);
    report::sum_up(&mut rows);
    eprint!("\n{}", report::table(&rows));
    let meta = Meta::collect(&args, two, busy, began.elapsed().as_secs_f64());
    report::write(&args, &meta, &rows)?;
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.config.id)
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "failed: {} (see {}/summary.md)",
            failed.join(", "),
            args.out.display()
        )
        .into());
    }
    Ok(())
}
