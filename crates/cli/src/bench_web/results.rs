//! What a run measures, as recorded in results.json: one load point, one
//! curve (a variant in a workload), and the arithmetic over curves
//! (saturation as the median of its samples, ratios to Regular).

use serde::Serialize;

use super::economy::Economy;
use super::measure::CpuSplit;
use super::variants::Variant;
use super::workload::Workload;

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
    /// The TCP server's system calls, wakes and heap allocations per
    /// request (tcps variants; its `tcps stat` counters around the point).
    pub server_economy: Option<Economy>,
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
    /// The TCP server's economy at the saturation point.
    pub server_economy: Option<Economy>,
}

impl Curve {
    /// A curve with no points yet (or never: a variant that is n/a, or
    /// failed with `error`).
    pub fn empty(w: &Workload, v: &Variant, error: Option<String>) -> Curve {
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
            server_economy: None,
        }
    }

    /// Fills in the saturation figures (the highest throughput among the
    /// points, the first saturation sample) and the system calls at the
    /// lowest paced load point.
    pub fn sum_up_points(&mut self) {
        let sat = self
            .points
            .iter()
            .max_by(|a, b| a.rps.total_cmp(&b.rps))
            .cloned();
        if let Some(s) = sat {
            self.saturation_rps = Some(s.rps);
            self.saturation_samples.push(s.rps);
            self.host_cpu_us_per_req = Some(s.host_cpu_us_per_req);
            self.server_cpu_us_per_req = s.server_cpu_us_per_req;
            self.total_cpu_us_per_req = Some(s.total_cpu_us_per_req);
            self.server_economy = s.server_economy;
        }
        self.syscalls_per_req = self
            .points
            .iter()
            .find(|p| p.offered_rps.is_some())
            .and_then(|p| p.syscalls_per_req);
    }
}

/// The median of a non-empty sample (the mean of the middle two if even).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn fill_ratios(curves: &mut [Curve]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_samples() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
    }
}
