//! What the demo's parts share: its arguments, the run's context and one
//! row of results.

use crate::harness::WrkResult;
use crate::server_cmd::PollArg;
use std::path::Path;

pub(super) type Error = Box<dyn std::error::Error>;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Needs wrk and nginx (apt-get install wrk nginx-light; --no-nginx leaves nginx out) and the C examples (`make`). \
Set TCPS_EXAMPLES to the directory holding the webserver binary if it is not in \
<repo>/examples/build."
)]
pub struct DemoArgs {
    /// Seconds wrk drives each variant
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: u64,
    /// Concurrent wrk connections (keep-alive)
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub connections: u32,
    /// wrk threads
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads_wrk: u32,
    /// Port of the web server
    #[arg(long, default_value_t = 8080, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// How the TCP server's workers wait for work
    #[arg(long, value_enum, default_value = "adaptive")]
    pub poll: PollArg,
    /// Web server worker threads; each serves one connection at a time
    /// [default: --connections, at least 4]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub webserver_threads: Option<u32>,
    /// CPUs for the TCP server's workers (passed to `tcps server --cpus`)
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Leave out the nginx rows (they need nginx: apt-get install nginx-light)
    #[arg(long)]
    pub no_nginx: bool,
    /// Rounds: each runs every variant once, tcps and kernel alternating
    /// which goes first; the table shows medians and their spread
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
}

/// One variant's results.
pub(super) struct Row {
    pub(super) variant: &'static str,
    pub(super) wrk: WrkResult,
    pub(super) host_cpu_us: f64,
    pub(super) server_cpu_us: Option<f64>,
}

pub(super) struct Ctx<'a> {
    pub(super) args: &'a DemoArgs,
    pub(super) tmp: &'a Path,
    /// This `tcps` executable (`tcps run` for nginx).
    pub(super) exe: &'a Path,
    pub(super) webserver: &'a Path,
    /// nginx, unless --no-nginx.
    pub(super) nginx: Option<&'a Path>,
    pub(super) wrk: &'a Path,
    pub(super) index: &'a [u8],
}
