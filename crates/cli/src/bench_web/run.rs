//! Running the suite: what to run and for how long, then every curve
//! (its servers, an unpaced point, then paced points stepped from Regular's
//! saturation), the `--repeat` rounds of saturation points over every
//! variant in turn, and the report. Measuring one point is `point.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::env::Env;
use super::measure;
use super::netns::Netns;
use super::point;
use super::report;
use super::results::{fill_ratios, median, Curve};
use super::servers;
use super::types::{Error, WebArgs};
use super::variants::{self, Features, Net, Variant};
use super::workload::{self, Workload};
use crate::harness::{self, TempDir};

/// Load points of a curve as fractions of Regular's saturation throughput
/// in the same workload (measured first); `None` = unpaced (wrk as fast as
/// the server answers: the saturation point).
const FULL_STEPS: &[f64] = &[0.3, 0.6, 0.9, 1.2];
const QUICK_STEPS: &[f64] = &[0.5];
/// `--quick` without `--workloads`: three workloads of different shapes
/// (static, static + dynamic, keep-alive), so six variants fit in a minute.
const QUICK_WORKLOADS: &[&str] = &["static-16k", "combined", "http11"];
/// The full run's time budget, from which the per-point duration is fitted.
const FULL_BUDGET_S: f64 = 540.0;
/// Measured cost of a point beyond its duration (wrk start/stop, perf) and
/// of a curve (starting and stopping the servers).
const POINT_OVERHEAD_S: f64 = 0.5;
const CURVE_OVERHEAD_S: f64 = 1.0;

/// Progress on stderr: "[ 7/54  1:02 elapsed, ~3:40 left] …".
struct Progress {
    total: usize,
    done: usize,
    start: Instant,
    per_point_s: f64,
}

impl Progress {
    fn line(&self, what: &str) {
        let el = self.start.elapsed().as_secs();
        let left = ((self.total - self.done) as f64 * self.per_point_s) as u64;
        eprintln!(
            "[{:>3}/{} {}:{:02} elapsed, ~{}:{:02} left] {what}",
            self.done + 1,
            self.total,
            el / 60,
            el % 60,
            left / 60,
            left % 60
        );
    }
}

/// The directory of the generated files and the paths lists.
fn prepare_site(
    tmp: &Path,
    wl: &[Workload],
    seed: u64,
) -> Result<Option<workload::TraceStats>, Error> {
    let trace = wl
        .iter()
        .any(|w| w.id == "trace")
        .then(|| workload::forth_trace(seed));
    let stats = trace.as_ref().map(|t| t.stats(seed));
    if let Some(s) = &stats {
        eprintln!(
            "trace (seed {}): {} files, average file {:.1} KB, average request {:.1} KB \
             (thesis Table 6.6, Forth: 11931 files, 19.3 KB, 8.8 KB); {} requests, largest file {} KB",
            s.seed,
            s.files,
            s.avg_file_bytes / 1024.0,
            s.avg_request_bytes / 1024.0,
            s.requests,
            s.largest_file_bytes / 1024
        );
    }
    workload::make_site(tmp, trace.as_ref(), seed)?;
    for w in wl {
        let paths = workload::request_paths(w, trace.as_ref(), seed)?;
        fs::write(tmp.join(format!("{}.paths", w.id)), paths)?;
    }
    Ok(stats)
}

/// wrk and the other tools are installed, we are root, and the two CPUs
/// exist and differ. Returns wrk's path and the number of CPUs.
fn check_prerequisites(args: &WebArgs) -> Result<(PathBuf, usize), Error> {
    let wrk = harness::which("wrk").ok_or("wrk not found: apt-get install wrk")?;
    for tool in ["ip", "taskset"] {
        harness::which(tool)
            .ok_or_else(|| format!("{tool} not found (packages iproute2, util-linux)"))?;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("tcps bench web needs root (it creates network namespaces)".into());
    }
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    check_cpus(args, ncpu)?;
    Ok((wrk, ncpu))
}

/// The CPU sets: host and server non-empty and disjoint, every CPU below
/// `ncpu` (clients may share either).
fn check_cpus(a: &WebArgs, ncpu: usize) -> Result<(), Error> {
    let all = a
        .host_cpus
        .iter()
        .chain(&a.server_cpus)
        .chain(&a.client_cpus);
    if let Some(c) = all.into_iter().find(|&&c| c >= ncpu) {
        return Err(format!(
            "CPU {c} does not exist (this machine has CPUs 0-{})",
            ncpu - 1
        )
        .into());
    }
    if a.host_cpus.is_empty() || a.server_cpus.is_empty() {
        return Err("--host-cpus and --server-cpus need at least one CPU each".into());
    }
    if let Some(c) = a.host_cpus.iter().find(|c| a.server_cpus.contains(c)) {
        return Err(format!("CPU {c} is in both --host-cpus and --server-cpus").into());
    }
    Ok(())
}

/// `--variants`, with Regular always among them (the ratios need it).
fn select_variants(args: &WebArgs, features: &Features) -> Result<Vec<Variant>, Error> {
    let mut wanted = args.variants.clone();
    if !wanted.is_empty() && !wanted.iter().any(|v| v == "regular") {
        wanted.insert(0, "regular".into());
    }
    Ok(variants::select(variants::all(features), &wanted)?)
}

/// `--workloads`, or all of them (three with `--quick`).
fn select_workloads(args: &WebArgs) -> Result<Vec<Workload>, Error> {
    let all_wl = workload::all();
    for w in &args.workloads {
        if !all_wl.iter().any(|x| x.id == w) {
            let ids: Vec<&str> = all_wl.iter().map(|x| x.id).collect();
            return Err(format!("unknown workload '{w}' (known: {})", ids.join(", ")).into());
        }
    }
    Ok(all_wl
        .into_iter()
        .filter(|w| {
            if !args.workloads.is_empty() {
                args.workloads.iter().any(|x| x == w.id)
            } else {
                !args.quick || QUICK_WORKLOADS.contains(&w.id)
            }
        })
        .collect())
}

/// Seconds per load point: `--duration`, 1 with `--quick`, else fitted so
/// that `curves` curves of `points_per_curve` points take the full budget.
fn fit_duration(args: &WebArgs, curves: usize, points_per_curve: usize) -> u64 {
    args.duration.unwrap_or_else(|| {
        if args.quick {
            return 1;
        }
        let curves = curves.max(1) as f64;
        let per_point = (FULL_BUDGET_S / curves - CURVE_OVERHEAD_S) / points_per_curve as f64
            - POINT_OVERHEAD_S;
        per_point.floor().clamp(1.0, 5.0) as u64
    })
}

/// How busy the machine is before the run (printed, and recorded in the
/// summary): the busy share of all CPUs and /proc/loadavg.
fn machine_before(
    ncpu: usize,
    workloads: usize,
    runnable: usize,
    points_per_curve: usize,
    duration: u64,
) -> Result<(f64, String), Error> {
    let load_before = measure::background_load()?;
    let loadavg = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "machine: {ncpu} CPUs, {load_before:.0}% busy before the run (load average {}); \
         {} workloads × {runnable} variants × {points_per_curve} points of {duration} s",
        loadavg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        workloads
    );
    Ok((load_before, loadavg))
}

/// All points of one variant in one workload. `calib` is Regular's
/// saturation throughput in this workload (None while measuring Regular).
fn curve(
    env: &Env,
    w: &Workload,
    v: &Variant,
    calib: Option<f64>,
    prog: &mut Progress,
) -> Result<Curve, Error> {
    let mut servers = servers::start(env, w, v)?;
    let mut c = Curve::empty(w, v, None);
    let mut loads: Vec<Option<f64>> = vec![None];
    let mut first_paced = true;
    let mut i = 0;
    while i < loads.len() {
        let offered = loads[i];
        prog.line(&format!(
            "{} · {} · {}",
            w.id,
            v.label,
            offered.map_or("unpaced (saturation)".to_string(), |r| format!(
                "offered {r:.0} req/s"
            ))
        ));
        let p = point::measure(
            env,
            w,
            v,
            &mut servers,
            offered,
            offered.is_some() && first_paced,
        )?;
        prog.done += 1;
        eprintln!(
            "      {:.0} req/s, {:.1} MB/s, p50 {:.0} µs, p99 {:.0} µs, host CPU {:.1} µs/req{}",
            p.rps,
            p.mb_per_s,
            p.p50_us,
            p.p99_us,
            p.host_cpu_us_per_req,
            p.server_cpu_us_per_req
                .map_or(String::new(), |s| format!(", TCP server {s:.1} µs/req"))
        );
        if offered.is_some() {
            first_paced = false;
        }
        if i == 0 {
            let base = calib.unwrap_or(p.rps);
            loads.extend(env.steps.iter().map(|f| Some((f * base).max(10.0))));
        }
        c.points.push(p);
        i += 1;
    }
    let web_log = servers.web_log.clone();
    servers.stop();
    c.sum_up_points();
    if v.net == Net::Tcps {
        let text = fs::read_to_string(&web_log).unwrap_or_default();
        c.bytes_copied_per_network_byte = measure::copies_per_network_byte(&text);
        c.round_trips_per_req = measure::round_trips_per_request(&text);
    }
    Ok(c)
}

/// Every curve, workload by workload, Regular first in each (its
/// saturation paces the others' load points). A curve that fails is
/// recorded with its error and the run goes on.
fn all_curves(
    env: &Env,
    wl: &[Workload],
    vars: &[Variant],
    prog: &mut Progress,
) -> Result<Vec<Curve>, Error> {
    let mut curves = Vec::new();
    for w in wl {
        let mut calib = None;
        for v in vars {
            harness::check_interrupted()?;
            if !v.available {
                curves.push(Curve::empty(w, v, None));
                continue;
            }
            if v.nginx && w.id == "combined" {
                let mut c = Curve::empty(w, v, None);
                c.available = false;
                c.note =
                    "nginx serves no /dynamic/N (the example web server's CGI-like pages)".into();
                curves.push(c);
                continue;
            }
            match curve(env, w, v, calib, prog) {
                Ok(c) => {
                    if v.id == "regular" {
                        calib = c.saturation_rps;
                    }
                    curves.push(c);
                }
                Err(e) => {
                    harness::check_interrupted()?;
                    eprintln!("  {} · {}: FAILED: {e}", w.id, v.id);
                    curves.push(Curve::empty(w, v, Some(e.to_string())));
                }
            }
        }
    }
    Ok(curves)
}

/// One more unpaced point of a curve (a `--repeat` round), with servers
/// started afresh as for the curve itself.
fn saturation_again(
    env: &Env,
    w: &Workload,
    v: &Variant,
    round: u32,
    prog: &mut Progress,
) -> Result<f64, Error> {
    prog.line(&format!(
        "{} · {} · unpaced (saturation), round {}",
        w.id,
        v.label,
        round + 1
    ));
    let mut servers = servers::start(env, w, v)?;
    let p = point::measure(env, w, v, &mut servers, None, false);
    prog.done += 1;
    servers.stop();
    let p = p?;
    eprintln!("      {:.0} req/s", p.rps);
    Ok(p.rps)
}

/// The `--repeat` rounds: one more saturation sample of every measured
/// curve per round, variants in turn (a drift of the machine hits all
/// alike); then each curve's saturation is the median of its samples.
fn repeat_rounds(
    env: &Env,
    wl: &[Workload],
    vars: &[Variant],
    curves: &mut [Curve],
    prog: &mut Progress,
) -> Result<(), Error> {
    for round in 1..env.args.repeat {
        for c in curves.iter_mut() {
            harness::check_interrupted()?;
            if c.saturation_samples.is_empty() || c.error.is_some() {
                continue;
            }
            let (Some(w), Some(v)) = (
                wl.iter().find(|w| w.id == c.workload),
                vars.iter().find(|v| v.id == c.variant),
            ) else {
                continue;
            };
            match saturation_again(env, w, v, round, prog) {
                Ok(rps) => c.saturation_samples.push(rps),
                Err(e) => {
                    harness::check_interrupted()?;
                    eprintln!("  {} · {} round {}: FAILED: {e}", w.id, v.id, round + 1);
                    c.error = Some(format!("round {}: {e}", round + 1));
                }
            }
        }
    }
    for c in curves.iter_mut() {
        if !c.saturation_samples.is_empty() {
            c.saturation_rps = Some(median(&c.saturation_samples));
        }
    }
    Ok(())
}

pub fn run(args: WebArgs) -> Result<(), Error> {
    harness::install_signal_handlers();
    let started = Instant::now();
    let (wrk, ncpu) = check_prerequisites(&args)?;
    let exe = std::env::current_exe()?;
    let webserver = harness::find_webserver(&exe)?;
    let perf = harness::which("perf");
    let features = Features::detect(&webserver, &exe);
    let vars = select_variants(&args, &features)?;
    let wl = select_workloads(&args)?;
    let runnable = vars.iter().filter(|v| v.available).count();
    let steps = if args.quick { QUICK_STEPS } else { FULL_STEPS };
    let points_per_curve = steps.len() + args.repeat as usize;
    let duration = fit_duration(&args, wl.len() * runnable, points_per_curve);
    for v in vars.iter().filter(|v| !v.available) {
        eprintln!("variant {} ({}): n/a — {}", v.id, v.label, v.note);
    }
    let (load_before, loadavg) =
        machine_before(ncpu, wl.len(), runnable, points_per_curve, duration)?;
    let tmp = TempDir::new()?;
    let trace_stats = prepare_site(&tmp.0, &wl, args.seed)?;
    let ns = Netns::create()?;
    let env = Env {
        args: &args,
        ns: &ns,
        tmp: &tmp.0,
        exe: &exe,
        webserver: &webserver,
        wrk: &wrk,
        perf,
        duration,
        steps,
    };
    let mut prog = Progress {
        total: wl.len() * runnable * points_per_curve,
        done: 0,
        start: Instant::now(),
        per_point_s: duration as f64
            + POINT_OVERHEAD_S
            + CURVE_OVERHEAD_S / points_per_curve as f64,
    };
    let mut curves = all_curves(&env, &wl, &vars, &mut prog)?;
    repeat_rounds(&env, &wl, &vars, &mut curves, &mut prog)?;
    drop(ns);
    fill_ratios(&mut curves);
    let meta = report::Meta::collect(
        &args,
        duration,
        load_before,
        &loadavg,
        started.elapsed(),
        &features_note(&vars),
    );
    report::write(&args, &meta, &wl, &vars, &curves, trace_stats.as_ref())?;
    let failed = curves.iter().filter(|c| c.error.is_some()).count();
    if failed > 0 {
        return Err(format!(
            "{failed} curve(s) failed; see {}/summary.md",
            args.out.display()
        )
        .into());
    }
    Ok(())
}

fn features_note(vars: &[Variant]) -> String {
    let na: Vec<&str> = vars.iter().filter(|v| !v.available).map(|v| v.id).collect();
    if na.is_empty() {
        "all variants available".into()
    } else {
        format!("n/a: {}", na.join(", "))
    }
}
