//! `tcps run [--socket PATH] [--fallback kernel|fail] -- PROGRAM [ARGS...]`:
//! runs an unmodified program with `libtcps_preload.so` preloaded, so its
//! TCP sockets are served by the TCP server (see docs/PRELOAD.md).
//!
//! The server is probed first: with `--fallback kernel` (default) and no
//! server, the program runs on kernel sockets without the library after one
//! warning line; with `--fallback fail` tcps exits with the reason.

use clap::{Args, ValueEnum};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fallback {
    /// No server: run on kernel sockets (one warning line).
    Kernel,
    /// No server: exit with an error.
    Fail,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Environment for the program: TCPS_LOG=debug|info|warn|off explains \
every decision of the library on stderr; TCPS_PRELOAD_STATS=FILE appends one line per process \
(offloaded and kernel socket counts) to FILE at exit; TCPS_PRELOAD_LIB overrides the library path."
)]
pub struct RunArgs {
    /// Control socket of the TCP server [default: $TCPS_SOCKET, else $XDG_RUNTIME_DIR/tcps.sock, else /run/tcps/tcps.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// What to do when no TCP server answers
    #[arg(long, value_enum, default_value = "kernel")]
    pub fallback: Fallback,
    /// The program and its arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

/// `libtcps_preload.so`: $TCPS_PRELOAD_LIB, else next to this executable
/// (target/release), else ../lib/tcps/ relative to it.
fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TCPS_PRELOAD_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the tcps executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join("libtcps_preload.so"),
        dir.join("../lib/tcps/libtcps_preload.so"),
        dir.join("../libtcps_preload.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "libtcps_preload.so not found next to {} (build it: cargo build --release -p tcps-preload, or set TCPS_PRELOAD_LIB)",
                exe.display()
            )
        })
}

pub fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = args.socket.clone().unwrap_or_else(tcps::default_path);
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    cmd.env("TCPS_SOCKET", &socket);
    // Probe the server once, so that a missing one is reported here, once.
    match tcps::Client::attach(&socket) {
        Ok(c) => {
            c.detach();
            let lib = library()?;
            let preload = match std::env::var_os("LD_PRELOAD") {
                Some(old) if !old.is_empty() => {
                    let mut v = lib.into_os_string();
                    v.push(" ");
                    v.push(old);
                    v
                }
                _ => lib.into_os_string(),
            };
            cmd.env("LD_PRELOAD", preload);
            cmd.env(
                "TCPS_FALLBACK",
                match args.fallback {
                    Fallback::Kernel => "kernel",
                    Fallback::Fail => "fail",
                },
            );
        }
        Err(e) => {
            let why = tcps::last_attach_error();
            let why = if why.is_empty() { e.to_string() } else { why };
            match args.fallback {
                Fallback::Fail => {
                    return Err(format!(
                        "no TCP server answers ({why}); not running {:?} (--fallback fail)",
                        args.command[0]
                    )
                    .into());
                }
                Fallback::Kernel => {
                    eprintln!("tcps run: warning: no TCP server answers ({why}); running {:?} on kernel sockets", args.command[0]);
                }
            }
        }
    }
    let err = cmd.exec();
    Err(format!("cannot run {:?}: {err}", args.command[0]).into())
}
