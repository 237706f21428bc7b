//! What one run of the suite fixes before its first curve, and every curve
//! and load point reads: the options, the network namespaces, the
//! directory of generated files, the programs, the per-point duration.

use std::path::{Path, PathBuf};

use super::netns::Netns;
use super::types::WebArgs;

/// The web server's port (in the server namespace).
pub const PORT: u16 = 8080;

pub struct Env<'a> {
    pub args: &'a WebArgs,
    pub ns: &'a Netns,
    pub tmp: &'a Path,
    /// This `tcps` executable (TCP server, `tcps run`).
    pub exe: &'a Path,
    pub webserver: &'a Path,
    pub wrk: &'a Path,
    pub perf: Option<PathBuf>,
    /// Seconds per load point.
    pub duration: u64,
    /// Paced load points, as fractions of Regular's saturation throughput.
    pub steps: &'a [f64],
}
