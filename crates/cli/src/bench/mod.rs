//! `tcps bench`: measurements that print medians and ratios against the
//! kernel-socket baseline taken side by side in the same run.
//!
//! One file per benchmark (`call_cost`, `pingpong`, `ttcp`; `bench web` is
//! `crate::bench_web`, `bench cluster` `crate::bench_cluster`), over the
//! timing loops of `timing` and the TCP server of `server`.

mod call_cost;
mod pingpong;
mod server;
mod timing;
mod ttcp;

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Cost of one send call as the application sees it (thesis Table 6.2):
    /// kernel send(2) vs tcps_send on a connected TCP socket whose reader keeps up.
    CallCost(call_cost::CallCostArgs),
    /// Send/recv round trips between two tcps sockets connected to each
    /// other, in one host thread: the host's steady-state system calls per
    /// socket call (run it under `strace -c -f`; see scripts/syscall-count.sh).
    Pingpong(pingpong::PingpongArgs),
    /// The web-server experiments of thesis §6.4: every workload and variant,
    /// stepped offered load, CPU split, ratios to Regular; results.json,
    /// summary.md and plots in --out (see docs/BENCHMARKS.md).
    Web(crate::bench_web::WebArgs),
    /// The cluster deployment side by side with the one-machine ones:
    /// network namespaces as nodes, the web server (and nginx) on kernel
    /// sockets, through a local TCP server and through a TCP server on
    /// another node (UCX); throughput, CPU per request, fabric messages and
    /// bytes per request; results.json and summary.md in --out.
    Cluster(crate::bench_cluster::ClusterArgs),
    /// ttcp (thesis §6.3): one connection, the host transmits N bytes in
    /// writes of S to a receiver in another process; throughput at the
    /// receiver, CPU of host and TCP server, PE index, for kernel / sync /
    /// sync-registered / async / async-registered.
    Ttcp(ttcp::TtcpArgs),
    /// The receiver of `ttcp` (run by it in a process of its own).
    #[command(hide = true)]
    TtcpRecv(ttcp::TtcpRecvArgs),
}

pub fn run(cmd: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        BenchCommand::CallCost(a) => call_cost::run(a),
        BenchCommand::Pingpong(a) => pingpong::run(a),
        BenchCommand::Web(a) => crate::bench_web::run(a),
        BenchCommand::Cluster(a) => crate::bench_cluster::run(a),
        BenchCommand::Ttcp(a) => ttcp::run(a),
        BenchCommand::TtcpRecv(a) => ttcp::recv_main(a),
    }
}
