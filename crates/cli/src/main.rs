//! The `tcps` command.

mod bench;
mod bench_cluster;
mod bench_web;
mod cluster_nodes;
mod demo;
mod docs_cmd;
mod fabric_pump;
mod harness;
mod run_cmd;
mod server_cmd;
mod stat_cmd;
mod stat_fabric;
mod stat_text;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "tcps",
    version,
    about = "TCP/IP offload for Internet servers: a TCP server process executes the socket calls of host applications over shared-memory channels",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a TCP server: hosts attach to it and their socket calls run here.
    Server(server_cmd::ServerArgs),
    /// Benchmarks (cost of a send call, ...).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The demo: the example web server through tcps and on kernel sockets, driven by wrk, side by side.
    Demo(demo::DemoArgs),
    /// Run an unmodified program with its TCP sockets served by the TCP server (preload library).
    Run(run_cmd::RunArgs),
    /// The host's half of a channel to a TCP server on another node (UCX): started by the host library when TCPS_REMOTE is set, not by hand.
    FabricPump(fabric_pump::PumpArgs),
    /// Show what a running TCP server is doing: per attached host and in total, calls by type, round trips, process-ahead, bytes, refusals and queue depths.
    Stat(stat_cmd::StatArgs),
    /// Write the manual pages (tcps.1, tcps-SUBCOMMAND.1) into DIR (for `make install`).
    #[command(hide = true)]
    Man { dir: std::path::PathBuf },
    /// Print a shell completion script (bash, zsh, fish) (for `make install`).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    let cli = match with_config_file(std::env::args().collect()) {
        Ok(argv) => Cli::parse_from(argv),
        Err(e) => {
            eprintln!("tcps: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Server(args) => server_cmd::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Demo(args) => demo::run(args),
        Command::Run(args) => run_cmd::run(args),
        Command::Stat(args) => stat_cmd::run(args),
        Command::FabricPump(args) => fabric_pump::run(args),
        Command::Man { dir } => docs_cmd::write_man_pages(Cli::command(), &dir).map_err(Into::into),
        Command::Completions { shell } => {
            print!("{}", docs_cmd::completion(Cli::command(), shell));
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcps: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tcps server --config FILE ...`: the file's options go first, so the
/// command line overrides them.
fn with_config_file(argv: Vec<String>) -> Result<Vec<String>, String> {
    let Some(pos) = argv
        .iter()
        .position(|a| a == "--config" || a.starts_with("--config="))
    else {
        return Ok(argv);
    };
    if argv.get(1).map(String::as_str) != Some("server") {
        return Ok(argv);
    }
    let path = match argv[pos].strip_prefix("--config=") {
        Some(p) => p.to_string(),
        None => argv.get(pos + 1).cloned().ok_or("--config needs a FILE")?,
    };
    let mut out = argv[..2].to_vec();
    out.extend(server_cmd::config_file_args(std::path::Path::new(&path))?);
    out.extend(argv[2..].iter().cloned());
    Ok(out)
}
