//! The demo's table: per variant the median of its rounds with their
//! spread, the tcps / kernel ratios of the medians, and one line saying
//! what tcps gives and what it costs on this machine.

use super::context::Row;

/// The median of a sample and its range.
#[derive(Clone, Copy)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

fn stat(v: &[f64]) -> Stat {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Stat {
        median,
        min: s.first().copied().unwrap_or(f64::NAN),
        max: s.last().copied().unwrap_or(f64::NAN),
    }
}

/// One variant over its rounds.
struct Summary {
    variant: &'static str,
    rps: Stat,
    p50: Stat,
    p99: Stat,
    host: Stat,
    server: Option<Stat>,
    total: Stat,
}

fn summarize(variant: &'static str, rows: &[&Row]) -> Summary {
    let of = |f: &dyn Fn(&Row) -> f64| stat(&rows.iter().map(|r| f(r)).collect::<Vec<_>>());
    Summary {
        variant,
        rps: of(&|r| r.wrk.rps),
        p50: of(&|r| r.wrk.p50_us),
        p99: of(&|r| r.wrk.p99_us),
        host: of(&|r| r.host_cpu_us),
        server: rows
            .iter()
            .all(|r| r.server_cpu_us.is_some())
            .then(|| of(&|r| r.server_cpu_us.unwrap_or(0.0))),
        total: of(&|r| r.host_cpu_us + r.server_cpu_us.unwrap_or(0.0)),
    }
}

fn fmt_latency(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.0} µs")
    }
}

/// Prints the table of `rows` (every round of every variant, in the order
/// of `variants`) over `rounds` rounds on `cores` cores.
pub(super) fn print(rows: &[Row], variants: &[&'static str], rounds: u32, cores: usize) {
    let sums: Vec<Summary> = variants
        .iter()
        .map(|&v| {
            summarize(
                v,
                &rows.iter().filter(|r| r.variant == v).collect::<Vec<_>>(),
            )
        })
        .collect();
    println!();
    println!("medians of {rounds} rounds (the range of the rounds in brackets), {cores} cores:");
    println!(
        "{:<14} {:>24} {:>10} {:>10} {:>16} {:>22}",
        "variant", "requests/s", "p50", "p99", "app CPU µs/req", "TCP server CPU µs/req"
    );
    for s in &sums {
        let server = s
            .server
            .map_or("-".to_string(), |v| format!("{:.1}", v.median));
        println!(
            "{:<14} {:>24} {:>10} {:>10} {:>16.1} {:>22}",
            s.variant,
            format!("{:.0} [{:.0}–{:.0}]", s.rps.median, s.rps.min, s.rps.max),
            fmt_latency(s.p50.median),
            fmt_latency(s.p99.median),
            s.host.median,
            server
        );
    }
    println!();
    let get = |v: &str| sums.iter().find(|s| s.variant == v);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let mut verdict = Vec::new();
    for (program, label) in [("web", "the example web server"), ("nginx", "nginx")] {
        let (Some(t), Some(k)) = (
            get(&format!("{program}/tcps")),
            get(&format!("{program}/kernel")),
        ) else {
            continue;
        };
        let (rps, app, total) = (
            ratio(t.rps.median, k.rps.median),
            ratio(t.host.median, k.host.median),
            ratio(t.total.median, k.total.median),
        );
        println!(
            "{program}: tcps / kernel requests/s {rps:.2} (rounds {:.2}–{:.2}), p50 {:.2}, p99 {:.2}, \
             app CPU per request {app:.2}, total CPU per request {total:.2}",
            ratio(t.rps.min, k.rps.max),
            ratio(t.rps.max, k.rps.min),
            ratio(t.p50.median, k.p50.median),
            ratio(t.p99.median, k.p99.median),
        );
        verdict.push(format!(
            "{label} serves {rps:.2}x the kernel's requests/s with {app:.2}x the application's CPU \
             per request, at {total:.2}x the total CPU per request"
        ));
    }
    if !verdict.is_empty() {
        println!("\nIn one line, on this machine: {}.", verdict.join("; "));
    }
    println!(
        "(app CPU = the program's processes, user+system; on kernel sockets it includes the \
         kernel's TCP/IP work done in its system calls. TCP server CPU = the `tcps server` process; \
         total = both. nginx on kernel sockets runs one worker per core, through tcps one worker \
         beside the TCP server. wrk runs on the same machine.)"
    );
}
