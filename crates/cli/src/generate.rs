//! `tcps generate man|completions DIR`: writes the man pages and the shell
//! completions from the same clap definitions `--help` prints, so
//! `make install` ships documentation that cannot drift from the binary.
//! A build tool, not an operator's command: it is handled before the `tcps`
//! command line is parsed, so it shows in neither `--help`, the man pages
//! nor the completions.

use clap::{Parser, Subcommand};
use clap_complete::Shell;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `tcps generate ...`: runs it and returns its exit code; None for every
/// other command line. `cli` builds the whole `tcps` command definition.
pub fn run_if_asked(cli: impl FnOnce() -> clap::Command) -> Option<ExitCode> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).map(|a| a.as_os_str()) != Some("generate".as_ref()) {
        return None;
    }
    let args = GenerateArgs::parse_from(&argv[1..]);
    Some(match run(args, cli()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcps generate: {e}");
            ExitCode::FAILURE
        }
    })
}

#[derive(Parser)]
#[command(
    name = "tcps generate",
    bin_name = "tcps generate",
    about = "Write the man pages or shell completions (used by `make install`)"
)]
struct GenerateArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Man pages: tcps.1 and tcps-SUBCOMMAND.1 for each subcommand.
    Man {
        /// Directory to write the pages to (created if missing).
        dir: PathBuf,
    },
    /// Shell completions: tcps.bash, _tcps (zsh), tcps.fish.
    Completions {
        /// Directory to write the scripts to (created if missing).
        dir: PathBuf,
    },
}

/// `cli` is the whole `tcps` command (`Cli::command()` in main.rs).
fn run(args: GenerateArgs, cli: clap::Command) -> Result<(), Box<dyn std::error::Error>> {
    match args.what {
        What::Man { dir } => man_pages(cli, &dir),
        What::Completions { dir } => completions(cli, &dir),
    }
}

fn man_pages(mut cli: clap::Command, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    // build() propagates the version and global settings to the subcommands.
    cli.build();
    write_page(&cli, "tcps", dir)?;
    for sub in cli.get_subcommands().filter(|s| shown(s)) {
        write_subcommand_pages(sub, "tcps", dir)?;
    }
    Ok(())
}

/// `tcps-server.1`, `tcps-bench-ttcp.1`, ...: one page per (nested) subcommand.
fn write_subcommand_pages(
    cmd: &clap::Command,
    parent: &str,
    dir: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("{parent}-{}", cmd.get_name());
    write_page(cmd, &name, dir)?;
    for sub in cmd.get_subcommands().filter(|s| shown(s)) {
        write_subcommand_pages(sub, &name, dir)?;
    }
    Ok(())
}

fn write_page(
    cmd: &clap::Command,
    name: &str,
    dir: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    // The page's title and NAME section use the dashed name (`tcps-run`),
    // as man(1) looks pages up by file name.
    let page = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    std::fs::write(dir.join(format!("{name}.1")), out)?;
    Ok(())
}

fn completions(mut cli: clap::Command, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    // The names the shells' completion directories expect.
    let shells = [
        (Shell::Bash, "tcps.bash"),
        (Shell::Zsh, "_tcps"),
        (Shell::Fish, "tcps.fish"),
    ];
    for (shell, file) in shells {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cli, "tcps", &mut out);
        std::fs::write(dir.join(file), out)?;
    }
    Ok(())
}

/// Subcommands that get a page: not hidden, not clap's own `help`.
fn shown(cmd: &clap::Command) -> bool {
    !cmd.is_hide_set() && cmd.get_name() != "help"
}
