//! `tcps bench web`: the web-server experiments of thesis §6.4 as one
//! reproducible run — every workload × variant, offered load stepped until
//! saturation, CPU per core group, system calls per request, ratios to
//! Regular from the same run — written to `DIR/results.json`,
//! `DIR/summary.md` and PNG plots (scripts/plot_web.py, matplotlib).
//!
//! Topology (on a 2-core machine by default): the TCP server polls on
//! `--server-cpus` (one worker per CPU), the web server (host) is pinned
//! to `--host-cpus`, the clients (wrk) run in their own network namespace
//! (netns.rs), unpinned or on `--client-cpus`. Regular gets the host's and
//! the server's cores together and, as the thesis compared, the host's
//! cores only. On a bigger machine the thesis' SMP configuration (2 of 4
//! processors for networking) is `--host-cpus 0,1 --server-cpus 2,3`.
//!
//! Modules, bottom up (each uses only those below it): `types` (options,
//! error); `netns`, `workload`, `variants`, `measure` (/proc and perf);
//! `env` (what a run fixes), `results` (points, curves); `servers` (start
//! a curve's servers), `point` (measure one load point); `report`
//! (results.json, summary.md, plots); `run` (the whole run). This file only
//! names them; `tcps bench cluster` (`crate::bench_cluster`) uses the
//! workloads, the measurements and wrk's runner.

mod economy;
mod env;
pub(crate) mod measure;
mod netns;
pub(crate) mod point;
pub(crate) mod report;
pub(crate) mod results;
mod run;
mod servers;
pub(crate) mod types;
mod variants;
pub(crate) mod workload;

pub use run::run;
pub use types::WebArgs;
