//! Running the suite: servers per curve, wrk per load point, measurements
//! around each point.

use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::measure::{self, CpuSplit};
use super::netns::{Netns, SERVER_ADDR};
use super::report;
use super::variants::{self, Features, Net, Variant};
use super::workload::{self, Workload};
use super::{Error, WebArgs};
use crate::demo::{self, Proc, TempDir};

const PORT: u16 = 8080;
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

/// One load point.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Requests/s offered (None: unpaced, as fast as the server answers).
    pub offered_rps: Option<f64>,
    pub rps: f64,
    pub mb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub requests: u64,
    pub errors: Vec<String>,
    pub host_cpu_us_per_req: f64,
    pub server_cpu_us_per_req: Option<f64>,
    pub total_cpu_us_per_req: f64,
    /// Utilisation of the host's cores (both cores for Regular).
    pub host_cores: CpuSplit,
    /// Utilisation of the TCP server's cores (tcps variants).
    pub server_cores: Option<CpuSplit>,
    pub syscalls_per_req: Option<f64>,
}

/// One variant in one workload.
#[derive(Clone, Debug, Serialize)]
pub struct Curve {
    pub workload: String,
    pub variant: String,
    pub available: bool,
    pub note: String,
    pub error: Option<String>,
    pub points: Vec<Point>,
    /// The median of `saturation_samples`.
    pub saturation_rps: Option<f64>,
    /// The curve's highest throughput, then one unpaced point per later
    /// round (`--repeat`).
    pub saturation_samples: Vec<f64>,
    pub ratio_vs_regular: Option<f64>,
    pub ratio_vs_regular_host: Option<f64>,
    /// At the saturation point.
    pub host_cpu_us_per_req: Option<f64>,
    pub server_cpu_us_per_req: Option<f64>,
    pub total_cpu_us_per_req: Option<f64>,
    /// At the lowest paced load point (perf's counting perturbs the others).
    pub syscalls_per_req: Option<f64>,
    /// From the host library's counters (tcps variants), if the web server reports them.
    pub bytes_copied_per_network_byte: Option<f64>,
    /// Channel round trips the host waited on per request served, over the
    /// whole curve (the web server's counters at exit).
    pub round_trips_per_req: Option<f64>,
}

struct Env<'a> {
    args: &'a WebArgs,
    ns: &'a Netns,
    tmp: &'a Path,
    exe: &'a Path,
    webserver: &'a Path,
    wrk: &'a Path,
    perf: Option<PathBuf>,
    duration: u64,
    steps: &'a [f64],
}

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

/// Runs the TCP server (if the variant uses one) and the web server for one
/// curve; both are stopped when the returned guards drop.
fn start_servers(
    env: &Env,
    w: &Workload,
    v: &Variant,
) -> Result<(Option<Proc>, Proc, PathBuf), Error> {
    let a = env.args;
    let sock = env.tmp.join("tcps.sock");
    let _ = fs::remove_file(&sock);
    let server = if v.net == Net::Tcps {
        let log = env.tmp.join(format!("tcps-server-{}-{}.log", w.id, v.id));
        let f = fs::File::create(&log)?;
        let child = Netns::exec(&env.ns.server)
            .arg(env.exe)
            .args(["server", "--socket"])
            .arg(&sock)
            .args(["--cpus", &a.server_cpu.to_string(), "--poll", &a.poll])
            .args(&v.server_args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .map_err(|e| format!("cannot start the TCP server: {e}"))?;
        let mut p = Proc {
            name: "the TCP server",
            child,
            log,
        };
        demo::wait_for("the TCP server's socket", Duration::from_secs(10), || {
            p.check_alive()?;
            Ok(sock.exists())
        })?;
        Some(p)
    } else {
        None
    };
    let cores = if v.net == Net::Kernel && !v.host_cores_only {
        format!("{},{}", a.host_cpu, a.server_cpu)
    } else {
        a.host_cpu.to_string()
    };
    let log = env.tmp.join(format!("webserver-{}-{}.log", w.id, v.id));
    if v.nginx {
        let web = start_nginx(env, w, &cores, &sock, &log)?;
        return Ok((server, web, log));
    }
    let f = fs::File::create(&log)?;
    let net = if v.net == Net::Tcps { "tcps" } else { "kernel" };
    let child = Netns::exec(&env.ns.server)
        .args(["taskset", "-c", &cores])
        .arg(env.webserver)
        .args([
            "--net",
            net,
            "--addr",
            SERVER_ADDR,
            "--port",
            &PORT.to_string(),
        ])
        .arg("--root")
        .arg(workload::root_of(env.tmp, w))
        .args(["--send-size", &w.send_size.to_string()])
        .args(["--threads", &a.connections.to_string(), "--quiet"])
        .args(&v.web_args)
        .env("TCPS_SOCKET", &sock)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", env.webserver.display()))?;
    let mut web = Proc {
        name: "the web server",
        child,
        log: log.clone(),
    };
    demo::wait_for("the web server to listen", Duration::from_secs(10), || {
        web.check_alive()?;
        Ok(fs::read_to_string(&log)
            .map(|t| t.contains("listening on"))
            .unwrap_or(false))
    })?;
    Ok((server, web, log))
}

/// The unmodified nginx through `tcps run` (one worker, sendfile on, the
/// workload's site as root) pinned to `cores`; up once its pid file exists
/// and its worker accepts.
fn start_nginx(
    env: &Env,
    w: &Workload,
    cores: &str,
    sock: &Path,
    log: &Path,
) -> Result<Proc, Error> {
    let dir = env.tmp.join(format!("nginx-{}", w.id));
    fs::create_dir_all(dir.join("tmp"))?;
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    fs::write(
        &conf,
        format!(
            "worker_processes 1;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n access_log off;\n sendfile on;\n tcp_nodelay on;\n keepalive_requests 100000;\n\
             client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
             server {{ listen {SERVER_ADDR}:{PORT} reuseport backlog=4096; root {}; }}\n}}\n",
            workload::root_of(env.tmp, w).display()
        ),
    )?;
    let f = fs::File::create(log)?;
    let child = Netns::exec(&env.ns.server)
        .args(["taskset", "-c", cores])
        .arg(env.exe)
        .arg("run")
        .arg("--socket")
        .arg(sock)
        .args(["--", "nginx", "-c"])
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
        .map_err(|e| format!("cannot start nginx through tcps run: {e}"))?;
    let mut web = Proc {
        name: "nginx",
        child,
        log: log.to_path_buf(),
    };
    let pid_file = dir.join("nginx.pid");
    demo::wait_for("nginx to start", Duration::from_secs(10), || {
        web.check_alive()?;
        Ok(pid_file.exists() && !measure::children_of(web.pid()).is_empty())
    })?;
    // The worker attaches and listens on its first accept.
    std::thread::sleep(Duration::from_millis(300));
    Ok(web)
}

/// "Transfer/sec:    109.15MB" → MB/s.
fn parse_transfer(out: &str) -> Option<f64> {
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

/// One load point: wrk in the client namespace, CPU and system calls around it.
fn point(
    env: &Env,
    w: &Workload,
    v: &Variant,
    server: Option<&Proc>,
    web: &mut Proc,
    offered: Option<f64>,
    count_syscalls: bool,
) -> Result<Point, Error> {
    let a = env.args;
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
        workload::wrk_script(&paths, w.http, offered, a.wrk_threads),
    )?;
    // perf -p counts one process: nginx's work is in its worker.
    let sys = if count_syscalls && !v.nginx {
        env.perf.as_ref().and_then(|p| {
            measure::SyscallCounter::start(p, web.pid(), env.tmp.join(format!("{tag}.perf")))
        })
    } else {
        None
    };
    let (host_cores, server_cores): (Vec<usize>, Vec<usize>) =
        if v.net == Net::Kernel && !v.host_cores_only {
            (vec![a.host_cpu, a.server_cpu], vec![])
        } else {
            (vec![a.host_cpu], vec![a.server_cpu])
        };
    let out_path = env.tmp.join(format!("{tag}.wrk"));
    let out = fs::File::create(&out_path)?;
    let cpu0 = measure::cpu_snapshot()?;
    let host0 = measure::tree_cpu_us(web.pid())?;
    let srv0 = server.map(|s| demo::cpu_us(s.pid())).transpose()?;
    let child = Netns::exec(&env.ns.client)
        .arg(env.wrk)
        .arg(format!("-t{}", a.wrk_threads))
        .arg(format!("-c{}", a.connections))
        .arg(format!("-d{}s", env.duration))
        .args(["--timeout", "5s", "--latency", "-s"])
        .arg(&script)
        .arg(format!("http://{SERVER_ADDR}:{PORT}/"))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let mut wrk = Proc {
        name: "wrk",
        child,
        log: out_path.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(env.duration + 30);
    let status = loop {
        if let Some(st) = wrk.child.try_wait()? {
            break st;
        }
        crate::demo::check_interrupted()?;
        if Instant::now() > deadline {
            return Err("wrk did not finish in time".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let cpu1 = measure::cpu_snapshot()?;
    let host1 = measure::tree_cpu_us(web.pid())?;
    let srv1 = server.map(|s| demo::cpu_us(s.pid())).transpose()?;
    let syscalls = sys.and_then(|s| s.finish());
    let text = fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        return Err(format!("wrk failed ({status}):\n{text}").into());
    }
    web.check_alive()?;
    let r = demo::parse_wrk(&text)?;
    if r.requests == 0 {
        return Err(format!("no request completed:\n{text}").into());
    }
    let n = r.requests as f64;
    let host_us = (host1 - host0) / n;
    let srv_us = match (srv0, srv1) {
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
        host_cores: measure::cpu_split(&cpu0, &cpu1, &host_cores),
        server_cores: (!server_cores.is_empty())
            .then(|| measure::cpu_split(&cpu0, &cpu1, &server_cores)),
        syscalls_per_req: syscalls.map(|c| c as f64 / n),
    })
}

fn empty_curve(w: &Workload, v: &Variant, error: Option<String>) -> Curve {
    Curve {
        workload: w.id.into(),
        variant: v.id.into(),
        available: v.available,
        note: v.note.clone(),
        error,
        points: vec![],
        saturation_rps: None,
        saturation_samples: Vec::new(),
        ratio_vs_regular: None,
        ratio_vs_regular_host: None,
        host_cpu_us_per_req: None,
        server_cpu_us_per_req: None,
        total_cpu_us_per_req: None,
        syscalls_per_req: None,
        bytes_copied_per_network_byte: None,
        round_trips_per_req: None,
    }
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
    let (server, mut web, log) = start_servers(env, w, v)?;
    let mut c = empty_curve(w, v, None);
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
        let p = point(
            env,
            w,
            v,
            server.as_ref(),
            &mut web,
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
    drop(server);
    web.stop(Duration::from_secs(3));
    let sat = c
        .points
        .iter()
        .max_by(|a, b| a.rps.total_cmp(&b.rps))
        .cloned();
    if let Some(s) = sat {
        c.saturation_rps = Some(s.rps);
        c.saturation_samples.push(s.rps);
        c.host_cpu_us_per_req = Some(s.host_cpu_us_per_req);
        c.server_cpu_us_per_req = s.server_cpu_us_per_req;
        c.total_cpu_us_per_req = Some(s.total_cpu_us_per_req);
    }
    c.syscalls_per_req = c
        .points
        .iter()
        .find(|p| p.offered_rps.is_some())
        .and_then(|p| p.syscalls_per_req);
    if v.net == Net::Tcps {
        let text = fs::read_to_string(&log).unwrap_or_default();
        c.bytes_copied_per_network_byte = measure::copies_per_network_byte(&text);
        c.round_trips_per_req = measure::round_trips_per_request(&text);
    }
    Ok(c)
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
    let (server, mut web, _log) = start_servers(env, w, v)?;
    let p = point(env, w, v, server.as_ref(), &mut web, None, false);
    prog.done += 1;
    drop(server);
    web.stop(Duration::from_secs(3));
    let p = p?;
    eprintln!("      {:.0} req/s", p.rps);
    Ok(p.rps)
}

/// The median of a non-empty sample (the mean of the middle two if even).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn fill_ratios(curves: &mut [Curve]) {
    let sat = |curves: &[Curve], w: &str, v: &str| {
        curves
            .iter()
            .find(|c| c.workload == w && c.variant == v)
            .and_then(|c| c.saturation_rps)
    };
    let snapshot = curves.to_vec();
    for c in curves.iter_mut() {
        if let Some(s) = c.saturation_rps {
            c.ratio_vs_regular = sat(&snapshot, &c.workload, "regular").map(|r| s / r);
            c.ratio_vs_regular_host = sat(&snapshot, &c.workload, "regular-host").map(|r| s / r);
        }
    }
}

/// Busy share of all CPUs over one second before the run: how loaded the
/// machine is by others (recorded in the summary).
fn background_load() -> Result<f64, Error> {
    let a = measure::cpu_snapshot()?;
    std::thread::sleep(Duration::from_secs(1));
    let b = measure::cpu_snapshot()?;
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let s = measure::cpu_split(&a, &b, &(0..n).collect::<Vec<_>>());
    Ok(s.user_pct + s.sys_pct + s.steal_pct)
}

pub fn run(args: WebArgs) -> Result<(), Error> {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            demo::on_signal as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            demo::on_signal as *const () as libc::sighandler_t,
        );
    }
    let started = Instant::now();
    let wrk = demo::which("wrk").ok_or("wrk not found: apt-get install wrk")?;
    for tool in ["ip", "taskset"] {
        demo::which(tool)
            .ok_or_else(|| format!("{tool} not found (packages iproute2, util-linux)"))?;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("tcps bench web needs root (it creates network namespaces)".into());
    }
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if args.host_cpu == args.server_cpu || args.host_cpu.max(args.server_cpu) >= ncpu {
        return Err(
            format!("--host-cpu and --server-cpu must be two different CPUs below {ncpu}").into(),
        );
    }
    let exe = std::env::current_exe()?;
    let webserver = demo::find_webserver(&exe)?;
    let perf = demo::which("perf");
    let features = Features::detect(&webserver, &exe);
    let mut wanted = args.variants.clone();
    if !wanted.is_empty() && !wanted.iter().any(|v| v == "regular") {
        wanted.insert(0, "regular".into());
    }
    let vars = variants::select(variants::all(&features), &wanted)?;
    let all_wl = workload::all();
    for w in &args.workloads {
        if !all_wl.iter().any(|x| x.id == w) {
            let ids: Vec<&str> = all_wl.iter().map(|x| x.id).collect();
            return Err(format!("unknown workload '{w}' (known: {})", ids.join(", ")).into());
        }
    }
    let wl: Vec<Workload> = all_wl
        .into_iter()
        .filter(|w| {
            if !args.workloads.is_empty() {
                args.workloads.iter().any(|x| x == w.id)
            } else {
                !args.quick || QUICK_WORKLOADS.contains(&w.id)
            }
        })
        .collect();
    let runnable = vars.iter().filter(|v| v.available).count();
    let steps = if args.quick { QUICK_STEPS } else { FULL_STEPS };
    let points_per_curve = steps.len() + args.repeat as usize;
    let duration = args.duration.unwrap_or_else(|| {
        if args.quick {
            return 1;
        }
        let curves = (wl.len() * runnable).max(1) as f64;
        let per_point = (FULL_BUDGET_S / curves - CURVE_OVERHEAD_S) / points_per_curve as f64
            - POINT_OVERHEAD_S;
        per_point.floor().clamp(1.0, 5.0) as u64
    });
    for v in vars.iter().filter(|v| !v.available) {
        eprintln!("variant {} ({}): n/a — {}", v.id, v.label, v.note);
    }
    let load_before = background_load()?;
    let loadavg = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "machine: {ncpu} CPUs, {load_before:.0}% busy before the run (load average {}); \
         {} workloads × {runnable} variants × {points_per_curve} points of {duration} s",
        loadavg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        wl.len()
    );
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
    let mut curves = Vec::new();
    for w in &wl {
        let mut calib = None;
        for v in &vars {
            crate::demo::check_interrupted()?;
            if !v.available {
                curves.push(empty_curve(w, v, None));
                continue;
            }
            if v.nginx && w.id == "combined" {
                let mut c = empty_curve(w, v, None);
                c.available = false;
                c.note =
                    "nginx serves no /dynamic/N (the example web server's CGI-like pages)".into();
                curves.push(c);
                continue;
            }
            match curve(&env, w, v, calib, &mut prog) {
                Ok(c) => {
                    if v.id == "regular" {
                        calib = c.saturation_rps;
                    }
                    curves.push(c);
                }
                Err(e) => {
                    crate::demo::check_interrupted()?;
                    eprintln!("  {} · {}: FAILED: {e}", w.id, v.id);
                    curves.push(empty_curve(w, v, Some(e.to_string())));
                }
            }
        }
    }
    for round in 1..args.repeat {
        for c in curves.iter_mut() {
            crate::demo::check_interrupted()?;
            if c.saturation_samples.is_empty() || c.error.is_some() {
                continue;
            }
            let (Some(w), Some(v)) = (
                wl.iter().find(|w| w.id == c.workload),
                vars.iter().find(|v| v.id == c.variant),
            ) else {
                continue;
            };
            match saturation_again(&env, w, v, round, &mut prog) {
                Ok(rps) => c.saturation_samples.push(rps),
                Err(e) => {
                    crate::demo::check_interrupted()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_samples() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
    }

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
