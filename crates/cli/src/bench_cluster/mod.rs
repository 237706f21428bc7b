//! `tcps bench cluster`: the cluster deployment (issue 17,
//! `docs/DEPLOYMENT.md`) measured side by side with the one-machine ones,
//! in one run: network namespaces as nodes (`crate::cluster_nodes`: an
//! application node, a TCP-server node, a client node, and a second
//! TCP-server node when nginx-remote2 is measured), the example web
//! server (and optionally nginx) on the application node on kernel sockets
//! (Regular), through a TCP server on the same node (local tcps, shared
//! memory), and through the TCP server on the server node (remote tcps,
//! UCX); nginx also through both server nodes at once (`tcps run --remote
//! S1,S2`, driven through both by two wrk processes). wrk on the client
//! node. Each configuration is measured once per round, rounds in turn
//! (`--repeat`), and reported as medians: throughput and its ratio to
//! Regular (nginx's: to nginx), CPU per request (the application, the
//! application node, everything), fabric messages and bytes per request
//! each way (the TCP servers' `tcps stat` counters, summed).
//!
//! Modules, bottom up: `args` (the command line), `configs` (what each
//! configuration runs), `start` (starting one in the nodes), `load` (wrk,
//! one process per address served, results combined), `sample` (one
//! measurement), `report` (medians, results.json, summary.md), `run` (the
//! whole run). The workloads, the site and the wrk script are `bench web`'s
//! (`crate::bench_web::workload`).

mod args;
mod configs;
mod load;
mod report;
mod run;
mod sample;
mod start;

pub use args::ClusterArgs;
pub use run::run;
