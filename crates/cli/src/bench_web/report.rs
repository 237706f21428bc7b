//! The run's outputs: `results.json` (everything measured), `summary.md`
//! (the tables, next to the thesis' gains) and the PNG plots, drawn by
//! scripts/plot_web.py (embedded here, so the suite runs from any directory).

use serde::Serialize;
use std::fmt::Write as _;
use std::fs;
use std::process::Command;
use std::time::Duration;

use super::measure::CpuSplit;
use super::results::Curve;
use super::types::{cpu_list, Error, WebArgs};
use super::variants::{Net, Variant};
use super::workload::{TraceStats, Workload};

const PLOT_SCRIPT: &str = include_str!("../../../../scripts/plot_web.py");

#[derive(Serialize)]
pub struct Meta {
    pub command: String,
    pub date: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub kernel: String,
    pub l2_cache: String,
    pub topology: String,
    pub seconds_per_point: u64,
    pub connections: u32,
    pub wrk_threads: u32,
    pub tcp_server_poll: String,
    pub machine_busy_before_pct: f64,
    pub load_average_before: String,
    pub wall_seconds: f64,
    pub quick: bool,
    /// Saturation samples per curve (`--repeat`).
    pub repeat: u32,
    pub variants_note: String,
}

pub(crate) fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// This run's command line, as `tcps …`.
pub(crate) fn command_line() -> String {
    std::iter::once("tcps".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Meta {
    pub fn collect(
        a: &WebArgs,
        duration: u64,
        busy: f64,
        loadavg: &str,
        wall: Duration,
        variants_note: &str,
    ) -> Meta {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_default();
        Meta {
            command: command_line(),
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            cpu_model: model,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            kernel: first_line("uname", &["-r"]),
            l2_cache: fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size")
                .unwrap_or_default()
                .trim()
                .to_string(),
            topology: format!(
                "TCP server polls on CPUs {s} (--poll {p}); web server (host) pinned to CPUs {h}; \
                 Regular pinned to CPUs {h},{s} (the cores host + TCP server get together), \
                 Regular (host cores) to CPUs {h}; wrk ({t} threads, {c} connections) {w} \
                 in its own network namespace, joined by a veth pair",
                s = cpu_list(&a.server_cpus),
                h = cpu_list(&a.host_cpus),
                p = a.poll,
                t = a.wrk_threads,
                c = a.connections,
                w = if a.client_cpus.is_empty() {
                    "unpinned (it shares every core)".to_string()
                } else {
                    format!("pinned to CPUs {}", cpu_list(&a.client_cpus))
                }
            ),
            seconds_per_point: duration,
            connections: a.connections,
            wrk_threads: a.wrk_threads,
            tcp_server_poll: a.poll.clone(),
            machine_busy_before_pct: busy,
            load_average_before: loadavg
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            wall_seconds: wall.as_secs_f64(),
            quick: a.quick,
            repeat: a.repeat,
            variants_note: variants_note.to_string(),
        }
    }
}

#[derive(Serialize)]
struct Results<'a> {
    meta: &'a Meta,
    workloads: &'a [Workload],
    variants: &'a [Variant],
    trace: Option<&'a TraceStats>,
    /// Per workload, per variant.
    results: Vec<WorkloadResults<'a>>,
}

#[derive(Serialize)]
struct WorkloadResults<'a> {
    workload: &'a str,
    variants: Vec<&'a Curve>,
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.prec$}"))
}

/// " [lo–hi]" over the saturation samples when there are several.
fn spread(samples: &[f64]) -> String {
    if samples.len() < 2 {
        return String::new();
    }
    let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(" [{lo:.0}–{hi:.0}]")
}

/// summary.md, written section by section.
struct Summary<'a> {
    s: String,
    meta: &'a Meta,
    wl: &'a [Workload],
    vars: &'a [Variant],
    /// The variants that ran (the tables' columns and rows).
    run_vars: Vec<&'a Variant>,
    curves: &'a [Curve],
}

impl<'a> Summary<'a> {
    fn find(&self, w: &str, v: &str) -> Option<&'a Curve> {
        self.curves
            .iter()
            .find(|c| c.workload == w && c.variant == v)
    }

    /// Title, machine, topology and how the load was offered.
    fn header(&mut self) {
        let (s, meta) = (&mut self.s, self.meta);
        let _ = writeln!(
            s,
            "# Web server evaluation (thesis §6.4) — `tcps bench web`\n"
        );
        let _ = writeln!(
            s,
            "Generated by `{}` on {} ({:.0} s).\n",
            meta.command, meta.date, meta.wall_seconds
        );
        let _ = writeln!(
            s,
            "**Machine.** {} × {}, L2 {}, kernel {}. Busy before the run: {:.0}% of all CPUs \
             (load average {}) — other engineers' builds and tests share this machine, so figures \
             are noisy; ratios are taken within this one run.\n",
            meta.cpus,
            meta.cpu_model,
            meta.l2_cache,
            meta.kernel,
            meta.machine_busy_before_pct,
            meta.load_average_before
        );
        let _ = writeln!(s, "**Topology.** {}.\n", meta.topology);
        let _ = writeln!(
            s,
            "**Load.** wrk with a generated Lua script; each curve starts with an unpaced point \
             (saturation), then paced points at fixed fractions of Regular's saturation throughput \
             in the same workload (wrk2-style schedule, at most {} requests in flight); {} s per point. \
             {}\n",
            meta.connections,
            meta.seconds_per_point,
            if meta.repeat > 1 {
                format!(
                    "Saturation = the median of {} samples per curve: the curve's highest throughput \
                     and one unpaced point in each of {} later rounds over all variants \
                     ([lowest–highest] after it).",
                    meta.repeat,
                    meta.repeat - 1
                )
            } else {
                "Saturation = the highest throughput of a curve.".to_string()
            }
        );
    }

    /// One cell of the saturation table: throughput, ratios, spread.
    fn saturation_cell(c: Option<&Curve>, v: &Variant) -> String {
        match c {
            Some(c) if c.error.is_some() => "failed".to_string(),
            Some(c) => match (
                c.saturation_rps,
                c.ratio_vs_regular,
                c.ratio_vs_regular_host,
            ) {
                (Some(r), x, y) => {
                    let mut cell = format!("{r:.0} req/s");
                    if let (Some(x), true) = (x, v.id != "regular") {
                        let _ = write!(cell, ", **{x:.2}×**");
                    }
                    if let (Some(y), true) = (y, v.id != "regular") {
                        let _ = write!(cell, " ({y:.2}× host-core)");
                    }
                    cell.push_str(&spread(&c.saturation_samples));
                    cell
                }
                _ => "–".into(),
            },
            None => "–".into(),
        }
    }

    fn saturation_table(&mut self) {
        let _ = writeln!(
            self.s,
            "## Saturation throughput, ratio to Regular (same run)\n"
        );
        let mut head = "| workload | thesis Sync / AsyncSend |".to_string();
        let mut sep = "|---|---|".to_string();
        for v in &self.run_vars {
            let _ = write!(head, " {} |", v.label);
            sep.push_str("---:|");
        }
        let _ = writeln!(self.s, "{head}\n{sep}");
        for w in self.wl {
            let _ = write!(
                self.s,
                "| {} | +{:.0}% / +{:.0}% |",
                w.label, w.thesis_gain_pct.0, w.thesis_gain_pct.1
            );
            for &v in &self.run_vars {
                let cell = Self::saturation_cell(self.find(w.id, v.id), v);
                let _ = write!(self.s, " {cell} |");
            }
            let _ = writeln!(self.s);
        }
        let _ = writeln!(
            self.s,
            "\n(x× = saturation / Regular on both cores; in parentheses / Regular on the host's core only, \
             the thesis' comparison. The thesis' 16 KiB AsyncSend figure is AsyncSend + Setup; same-file: \
             the thesis saw no gain.)\n"
        );
    }

    /// CPU, system calls, round trips and copies per request.
    fn costs_table(&mut self) {
        let _ = writeln!(self.s, "## Costs per request at saturation\n");
        let _ = writeln!(
            self.s,
            "| workload | variant | host CPU µs/req | TCP server µs/req | total µs/req | host syscalls/req (lowest load) | host round trips/req | host bytes copied / network byte | host cores user/sys/idle % | TCP server core user/sys/idle % |\n|---|---|---:|---:|---:|---:|---:|---:|---|---|"
        );
        let split = |x: Option<&CpuSplit>| {
            x.map_or("–".into(), |x| {
                format!("{:.0}/{:.0}/{:.0}", x.user_pct, x.sys_pct, x.idle_pct)
            })
        };
        for w in self.wl {
            for &v in &self.run_vars {
                let Some(c) = self.find(w.id, v.id) else {
                    continue;
                };
                let sat = c.points.iter().max_by(|a, b| a.rps.total_cmp(&b.rps));
                let _ = writeln!(
                    self.s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    w.id,
                    v.label,
                    opt(c.host_cpu_us_per_req, 1),
                    opt(c.server_cpu_us_per_req, 1),
                    opt(c.total_cpu_us_per_req, 1),
                    opt(c.syscalls_per_req, 2),
                    opt(c.round_trips_per_req, 2),
                    opt(c.bytes_copied_per_network_byte, 2),
                    split(sat.map(|p| &p.host_cores)),
                    split(sat.and_then(|p| p.server_cores.as_ref())),
                );
            }
        }
        let _ = writeln!(
            self.s,
            "\nHost CPU = the web server process (user+system from /proc/PID/stat), so with kernel sockets it \
             includes the kernel's TCP/IP work done in its system calls; softirq work charged to no process \
             shows only in the core utilisation. System calls: `perf stat -e raw_syscalls:sys_enter -p` on \
             the web server during the lowest paced point only (counting perturbs the rest); they include \
             the ~5 file-system calls per static request (openat, 2 newfstatat, pread64, close) every \
             variant makes. Server core for Regular (host cores): the other core (wrk, softirqs). Round trips \
             (channel round trips the host waited on, over the whole curve) and bytes copied: \
             `tcps_stats()` of the host library, when the web server prints it at exit (`–` otherwise).\n"
        );
    }

    /// The TCP server's system calls, wakes and allocations per request.
    fn economy_table(&mut self) {
        let _ = writeln!(
            self.s,
            "## The TCP server's economy per request at saturation\n\n\
             | workload | variant | TCP server syscalls/req | host threads woken/req | heap allocations/req |\n\
             |---|---|---:|---:|---:|"
        );
        for w in self.wl {
            for &v in &self.run_vars {
                let Some(e) = self.find(w.id, v.id).and_then(|c| c.server_economy) else {
                    continue;
                };
                let _ = writeln!(
                    self.s,
                    "| {} | {} | {:.2} | {:.2} | {:.3} |",
                    w.id, v.label, e.syscalls_per_req, e.wakes_per_req, e.heap_allocations_per_req
                );
            }
        }
        let _ = writeln!(
            self.s,
            "\nFrom the TCP server's `tcps stat` counters around the point: `server.syscalls` (each \
             `io_uring_enter` once), futex wakes of sleeping host threads plus host doorbell rings \
             (`wakes`, `doorbell_rings`), and `server.heap_allocations` of its workers' passes.\n"
        );
    }

    /// The project targets of issue 6, per tcps variant.
    fn targets(&mut self) {
        let _ = writeln!(self.s, "## Project targets (issue 6)\n");
        for &v in &self.run_vars {
            if v.net != Net::Tcps {
                continue;
            }
            let mut host_ratios = vec![];
            let mut total_ok = vec![];
            for w in self.wl {
                if let (Some(c), Some(r)) = (self.find(w.id, v.id), self.find(w.id, "regular")) {
                    if let (Some(h), Some(rh)) = (c.host_cpu_us_per_req, r.host_cpu_us_per_req) {
                        host_ratios.push(format!("{} {:.2}", w.id, h / rh));
                    }
                    if let (Some(t), Some(rt)) = (c.total_cpu_us_per_req, r.total_cpu_us_per_req) {
                        total_ok.push(format!("{} {:.2}", w.id, t / rt));
                    }
                }
            }
            let combined = self.find("combined", v.id).and_then(|c| c.ratio_vs_regular);
            let _ = writeln!(
                self.s,
                "* **{}**: host CPU/request vs Regular (target ≤ 0.4): {}; total CPU/request vs Regular \
                 (target ≤ 1.0): {}; combined saturation vs Regular (target ≥ 1.3): {}.",
                v.label,
                if host_ratios.is_empty() { "–".into() } else { host_ratios.join(", ") },
                if total_ok.is_empty() { "–".into() } else { total_ok.join(", ") },
                opt(combined, 2)
            );
        }
    }

    /// Every variant with its status, then the curves that failed.
    fn variants_and_failures(&mut self) {
        let _ = writeln!(
            self.s,
            "\n## Variants\n\n| variant | thesis legend | status |\n|---|---|---|"
        );
        for v in self.vars {
            let _ = writeln!(
                self.s,
                "| `{}` | {} | {}{} |",
                v.id,
                v.label,
                if v.available { "" } else { "**n/a** — " },
                v.note
            );
        }
        let failed: Vec<&Curve> = self.curves.iter().filter(|c| c.error.is_some()).collect();
        if !failed.is_empty() {
            let _ = writeln!(self.s, "\n## Failures\n");
            for c in failed {
                let _ = writeln!(
                    self.s,
                    "* {} · {}: {}",
                    c.workload,
                    c.variant,
                    c.error.as_deref().unwrap_or("")
                );
            }
        }
    }

    /// The generated trace's statistics (if the trace ran) and the workloads.
    fn trace_and_workloads(&mut self, trace: Option<&TraceStats>) {
        if let Some(t) = trace {
            let _ = writeln!(
                self.s,
                "\n## Trace workload\n\nGenerated (seed {}): {} files, average file {:.1} KB, average request \
                 {:.1} KB over {} requests, largest file {} KB, {:.0} MB in all. Thesis Table 6.6 (Forth): \
                 11,931 files, 19.3 KB, 8.8 KB.",
                t.seed, t.files, t.avg_file_bytes / 1024.0, t.avg_request_bytes / 1024.0, t.requests,
                t.largest_file_bytes / 1024, t.total_file_bytes as f64 / 1e6
            );
        }
        let _ = writeln!(self.s, "\n## Workloads\n");
        for w in self.wl {
            let _ = writeln!(
                self.s,
                "* `{}` (thesis figure {}): {}.",
                w.id, w.figure, w.description
            );
        }
    }
}

fn summary(
    meta: &Meta,
    wl: &[Workload],
    vars: &[Variant],
    curves: &[Curve],
    trace: Option<&TraceStats>,
    plots: &str,
) -> String {
    let mut m = Summary {
        s: String::new(),
        meta,
        wl,
        vars,
        run_vars: vars.iter().filter(|v| v.available).collect(),
        curves,
    };
    m.header();
    m.saturation_table();
    m.costs_table();
    m.economy_table();
    m.targets();
    m.variants_and_failures();
    m.trace_and_workloads(trace);
    m.s.push_str(plots);
    m.s
}

/// Draws the PNGs with matplotlib; returns the summary's plots section.
fn plots(a: &WebArgs, wl: &[Workload]) -> String {
    if a.no_plots {
        return "\n## Plots\n\nNot drawn (--no-plots).\n".into();
    }
    let script = a.out.join(".plot_web.py");
    if let Err(e) = fs::write(&script, PLOT_SCRIPT) {
        return format!("\n## Plots\n\nNot drawn: {e}\n");
    }
    // Debian's python3-matplotlib lives in the system interpreter; a
    // python3 earlier in PATH (pyenv, venv) may not have it.
    let mut last_err = String::new();
    for py in ["/usr/bin/python3", "python3"] {
        match Command::new(py).arg(&script).arg(&a.out).output() {
            Ok(o) if o.status.success() => {
                let _ = fs::remove_file(&script);
                let mut s = "\n## Plots\n\n".to_string();
                for w in wl {
                    let _ = writeln!(s, "![{0} throughput](throughput_{0}.png)", w.id);
                }
                s.push_str("\n![CPU utilisation at saturation](cpu.png)\n\n![Saturation vs Regular](ratios.png)\n");
                return s;
            }
            Ok(o) => last_err = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => last_err = e.to_string(),
        }
    }
    let _ = fs::remove_file(&script);
    eprintln!("plots not drawn: {last_err}");
    format!(
        "\n## Plots\n\nNot drawn: {} (install python3-matplotlib).\n",
        last_err.lines().last().unwrap_or("")
    )
}

pub fn write(
    a: &WebArgs,
    meta: &Meta,
    wl: &[Workload],
    vars: &[Variant],
    curves: &[Curve],
    trace: Option<&TraceStats>,
) -> Result<(), Error> {
    fs::create_dir_all(&a.out).map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let results = Results {
        meta,
        workloads: wl,
        variants: vars,
        trace,
        results: wl
            .iter()
            .map(|w| WorkloadResults {
                workload: w.id,
                variants: curves.iter().filter(|c| c.workload == w.id).collect(),
            })
            .collect(),
    };
    let json = a.out.join("results.json");
    fs::write(&json, serde_json::to_string_pretty(&results)? + "\n")?;
    let plots = plots(a, wl);
    let md = a.out.join("summary.md");
    fs::write(&md, summary(meta, wl, vars, curves, trace, &plots))?;
    eprintln!("wrote {}, {} and the plots", json.display(), md.display());
    Ok(())
}
