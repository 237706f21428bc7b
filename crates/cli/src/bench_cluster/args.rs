//! `tcps bench cluster`'s command line and error type.

use std::path::PathBuf;

pub type Error = Box<dyn std::error::Error>;

const AFTER_HELP: &str = "\
Configurations (--configs; each is started afresh for every measurement):
  regular       the example web server on kernel sockets on the application
                node (pinned to --host-cpus and --server-cpus: the cores the
                tcps configurations use together)
  local         the web server through a `tcps server` on the application
                node, attached through shared memory (TCPS_SOCKET)
  remote        the web server on the application node attached to the
                `tcps server --fabric-listen` on the TCP-server node over UCX
                (TCPS_REMOTE); its sockets are the server node's
  nginx, nginx-local, nginx-remote
                the unmodified nginx (one process, sendfile on) the same three
                ways (`tcps run`, `tcps run --remote`; master_process off,
                so the three run the same single process on the pinned
                --host-cpus); their ratios are to nginx on kernel sockets
  nginx-remote2 the same nginx under `tcps run --remote S1,S2`: a TCP server
                on each of two server nodes (a fourth namespace, made only
                when this configuration is measured; both servers on
                --server-cpus), nginx listening on both; two wrk processes
                started together, half the connections and threads each,
                one through each server node (requests/s summed, p50 the
                request-weighted mean of the two, p99 the larger)

Columns of summary.md (medians over the rounds):
  req/s         requests per second wrk got (client node)
  vs base       req/s over Regular's (nginx's for the nginx configurations)
  host          CPU of the application per request, µs: the web server or
                nginx, and the `tcps fabric-pump` helper of a remote host
                (the helper's part in brackets)
  app node      CPU on the application node per request: the host, plus a
                local TCP server
  total         CPU per request of the host and the TCP server wherever it
                runs (wrk not counted)
  fabric msgs   fabric messages per request, to the host / from the host
                (the TCP server's counters: batches, keepalives; both
                servers' summed for nginx-remote2)
  fabric bytes  their bytes per request, to the host / from the host
  round trips   channel round trips the web server waited on per request
                (its library's counters at exit; not for nginx)

Needs root (network namespaces), wrk, curl, iproute2, taskset, UCX; nginx for
the nginx configurations. All nodes share this machine's cores: the numbers
count messages, bytes and CPU honestly, not a real network's latency.";

#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct ClusterArgs {
    /// Configurations, comma-separated: regular, local, remote, nginx,
    /// nginx-local, nginx-remote, nginx-remote2 [default: all; the nginx
    /// ones only if nginx is installed]
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// The workload (as `tcps bench web`): static-4k, same-file, combined,
    /// static-16k, http11, trace
    #[arg(long, default_value = "static-16k")]
    pub workload: String,
    /// Seconds per measurement [default: 10; 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub duration: Option<u64>,
    /// Rounds: each configuration is measured once per round, in turn (a
    /// drift of the machine hits all alike); the report gives medians
    /// [default: 3; 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: Option<u32>,
    /// A short run: 1 s per measurement, one round
    #[arg(long)]
    pub quick: bool,
    /// wrk connections
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub connections: u32,
    /// wrk threads
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub wrk_threads: u32,
    /// CPUs of the application (web server or nginx, the fabric-pump
    /// helper), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub host_cpus: Vec<usize>,
    /// CPUs of the TCP server, local or remote (tcps server --cpus; both
    /// servers of nginx-remote2)
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub server_cpus: Vec<usize>,
    /// The web server's --mode in the tcps configurations (registered
    /// memory does not cross nodes yet: copy or async)
    #[arg(long, default_value = "async")]
    pub mode: String,
    /// How the TCP server waits for work (tcps server --poll)
    #[arg(long, default_value = "adaptive")]
    pub poll: String,
    /// Output directory for results.json and summary.md
    #[arg(long, default_value = "docs/results/cluster")]
    pub out: PathBuf,
    /// Seed of the file set and request stream
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl ClusterArgs {
    pub fn duration(&self) -> u64 {
        self.duration.unwrap_or(if self.quick { 1 } else { 10 })
    }

    pub fn rounds(&self) -> u32 {
        self.repeat.unwrap_or(if self.quick { 1 } else { 3 })
    }
}
