//! The `tcps` command.

mod bench;
mod demo;
mod server_cmd;

use clap::{Parser, Subcommand};
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
    /// Build-free demo: a web server through tcps vs kernel sockets, driven by wrk.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => server_cmd::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcps: {e}");
            ExitCode::FAILURE
        }
    }
}
