//! What every part of `tcps bench web` shares: its command line and its
//! error type.

use std::path::PathBuf;

pub type Error = Box<dyn std::error::Error>;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Needs root (network namespaces), wrk, iproute2, taskset; \
perf for system calls per request and python3-matplotlib for the plots \
(scripts/test.sh installs them). Variants that do not exist yet are reported as n/a."
)]
pub struct WebArgs {
    /// A short run (≤ 1 min): two load points of 1 s per curve, workloads
    /// static-16k, combined and http11 unless --workloads says otherwise
    #[arg(long)]
    pub quick: bool,
    /// Variants to run, comma-separated ids [default: all; regular is always run]
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// Workloads, comma-separated: static-4k, same-file, combined, static-16k, http11, trace [default: all]
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Output directory for results.json, summary.md and the PNGs
    #[arg(long, default_value = "docs/results")]
    pub out: PathBuf,
    /// Seconds per load point [default: fitted so the run takes ≤ 9 min; 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub duration: Option<u64>,
    /// wrk connections (bounds the requests in flight of a paced load)
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub connections: u32,
    /// wrk threads
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub wrk_threads: u32,
    /// CPUs of the web server (host), comma-separated (e.g. 0,1 on a
    /// 4-core machine for the thesis' SMP configuration: 2 of 4 processors
    /// for networking)
    #[arg(long, alias = "host-cpu", value_delimiter = ',', default_value = "0")]
    pub host_cpus: Vec<usize>,
    /// CPUs of the TCP server, comma-separated: one worker per CPU
    /// (tcps server --cpus); disjoint from --host-cpus
    #[arg(long, alias = "server-cpu", value_delimiter = ',', default_value = "1")]
    pub server_cpus: Vec<usize>,
    /// CPUs of the clients (wrk), comma-separated [default: unpinned, they
    /// share every core]
    #[arg(long, value_delimiter = ',')]
    pub client_cpus: Vec<usize>,
    /// How the TCP server waits for work (tcps server --poll)
    #[arg(long, default_value = "adaptive")]
    pub poll: String,
    /// Seed of the file sets and request streams
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Saturation points per curve: the first with the curve, the others in
    /// later rounds over every variant in turn (so a drift of the machine
    /// hits all variants alike); saturation is then their median
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Do not draw the plots
    #[arg(long)]
    pub no_plots: bool,
}

/// `0,1,3`: a CPU list as taskset and `tcps server --cpus` take it.
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
