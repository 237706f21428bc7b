//! `tcps run [--socket PATH | --remote ADDR:PORT --fabric-auth FILE]
//! [--fallback kernel|fail] [--reattach] -- PROGRAM [ARGS...]`:
//! runs an unmodified program with `libtcps_preload.so` preloaded, so its
//! TCP sockets are served by the TCP server (see docs/PRELOAD.md).
//!
//! The server is probed first: with `--fallback kernel` (default) and no
//! server, the program runs on kernel sockets without the library after one
//! warning line; with `--fallback fail` tcps exits with the reason. With
//! `--reattach` the library is loaded even then, and attaches when a server
//! comes (and again after one died).

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

impl Fallback {
    fn name(self) -> &'static str {
        match self {
            Fallback::Kernel => "kernel",
            Fallback::Fail => "fail",
        }
    }
}

#[derive(Args, Debug)]
#[command(
    after_help = "Environment for the program: TCPS_LOG=debug|info|warn|off explains \
every decision of the library on stderr; TCPS_PRELOAD_STATS=FILE appends one line per process \
(offloaded and kernel socket counts) to FILE at exit; TCPS_PRELOAD_LIB overrides the library path; \
TCPS_FALLBACK=kernel|fail is the default for --fallback; TCPS_REATTACH=1 is --reattach; TCPS_SPIN_US=N (microseconds a host \
thread spins for a completion). Invalid values are refused before the program runs."
)]
pub struct RunArgs {
    /// Control socket of the TCP server [default: $TCPS_SOCKET, else /run/tcps/tcps.sock, the same for every user and session]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// What to do when no TCP server answers or it refuses this program
    /// [default: $TCPS_FALLBACK, else kernel]
    #[arg(long, value_enum)]
    pub fallback: Option<Fallback>,
    /// Seconds to wait for a TCP server that does not answer yet (one that
    /// is starting) before the fallback applies
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub wait: f64,
    /// Survive a server restart: after the TCP server died (or when none
    /// answered at the start), attach to one that comes back at the same
    /// socket path (tried at most every 200 ms, on new sockets and from
    /// waits). Until then new sockets follow --fallback; the connections of
    /// the moment are lost (each reports a reset once); listeners are taken
    /// over by the new server with their address, options and waiting
    /// connections (sets TCPS_REATTACH=1)
    #[arg(long)]
    pub reattach: bool,
    /// When the TCP server dies, exit (status 75, EX_TEMPFAIL) instead of
    /// running on without it, so that a supervisor (systemd's
    /// Restart=on-failure) restarts the program; without --reattach the
    /// program's listeners stop listening either way, so clients are
    /// refused rather than left waiting (sets TCPS_EXIT_ON_SERVER_DEATH=1)
    #[arg(long, conflicts_with = "reattach")]
    pub exit_on_server_death: bool,
    /// Attach to a TCP server on another node over UCX, at its
    /// `--fabric-listen ADDR:PORT` (sets TCPS_REMOTE; needs --fabric-auth).
    /// Several servers, comma-separated (`A:P,B:P`): listeners are opened on
    /// each, new outgoing connections are spread over them, and a server
    /// that dies or is cut off fails only its own sockets. Each process of
    /// the program starts a `tcps fabric-pump` helper per server
    #[arg(long, value_name = "ADDR:PORT[,ADDR:PORT...]", requires = "fabric_auth", value_parser = parse_remotes)]
    pub remote: Option<Remotes>,
    /// The secret shared with that server, a file as its --fabric-auth
    /// (sets TCPS_FABRIC_AUTH)
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub fabric_auth: Option<PathBuf>,
    /// The program and its arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

/// The servers of `--remote` (at least one).
#[derive(Clone, Debug)]
pub struct Remotes(pub Vec<std::net::SocketAddr>);

impl std::fmt::Display for Remotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<String> = self.0.iter().map(|a| a.to_string()).collect();
        f.write_str(&all.join(","))
    }
}

/// `ADDR:PORT[,ADDR:PORT...]`, each once.
fn parse_remotes(s: &str) -> Result<Remotes, String> {
    let mut all = Vec::new();
    for part in s.split(',') {
        let a: std::net::SocketAddr = part
            .trim()
            .parse()
            .map_err(|e| format!("{part:?} is not ADDR:PORT: {e}"))?;
        if all.contains(&a) {
            return Err(format!("{a} is named twice"));
        }
        all.push(a);
    }
    Ok(Remotes(all))
}

/// `libtcps_preload.so`: $TCPS_PRELOAD_LIB, else next to this executable
/// (target/release), else ../lib/tcps/ relative to it.
fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TCPS_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(format!(
                "TCPS_PRELOAD_LIB={}: no such file (it must name libtcps_preload.so; unset it to use the one installed with tcps)",
                p.display()
            ));
        }
        return Ok(p);
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

/// The words an on/off setting takes (`tcps::Switch`).
const SWITCH: &[&str] = &["0", "1", "on", "off", "yes", "no", "true", "false"];

/// The environment variables the preload library and the host library
/// read, and what each accepts: a wrong value is an error here, before the
/// program runs, rather than silently ignored there.
const CHECKED_ENV: &[(&str, &[&str], &str)] = &[
    ("TCPS_FALLBACK", &["kernel", "fail"], "kernel or fail"),
    (
        "TCPS_LOG",
        &[
            "debug", "trace", "info", "warn", "warning", "off", "none", "0",
        ],
        "debug, info, warn or off",
    ),
    ("TCPS_REATTACH", SWITCH, "1 (on) or 0 (off)"),
    ("TCPS_EXIT_ON_SERVER_DEATH", SWITCH, "1 (on) or 0 (off)"),
    ("TCPS_BALANCE", SWITCH, "1 (on) or 0 (off)"),
    ("TCPS_ASYNC_SEND", SWITCH, "1 (on) or 0 (off)"),
    ("TCPS_HOST_DOORBELL", SWITCH, "1 (on) or 0 (off)"),
    ("TCPS_SPIN_US", &[], "a number of microseconds (e.g. 50)"),
    ("TCPS_SPINNERS", &[], "a number of threads (e.g. 1)"),
    ("TCPS_ASYNC_POOL_KIB", &[], "a number of KiB (e.g. 4096)"),
];

/// Refuses invalid TCPS_* values, naming the variable and what it takes.
fn check_environment() -> Result<(), String> {
    for (name, words, valid) in CHECKED_ENV {
        let Some(value) = std::env::var_os(name) else {
            continue;
        };
        let value = value.to_string_lossy();
        if value.is_empty() {
            continue; // set but empty: the default, as the libraries read it
        }
        let ok = if words.is_empty() {
            value.trim().parse::<u64>().is_ok()
        } else {
            words.contains(&value.trim())
        };
        if !ok {
            return Err(format!("{name}={value:?} is not valid: expected {valid}"));
        }
    }
    Ok(())
}

/// `--fallback`, else `TCPS_FALLBACK` (checked already), else kernel.
fn fallback(args: &RunArgs) -> Fallback {
    args.fallback
        .unwrap_or_else(|| match std::env::var("TCPS_FALLBACK").as_deref() {
            Ok("fail") => Fallback::Fail,
            _ => Fallback::Kernel,
        })
}

/// Why the program cannot be served by the server at `socket`, in words
/// that say whose problem it is.
fn why_not_served(socket: &Path, e: &std::io::Error) -> String {
    let why = tcps::last_attach_error();
    let why = if why.is_empty() { e.to_string() } else { why };
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) if !can_connect(socket) => format!(
            "permission denied on the control socket {}: only root and members of the socket's \
             group may attach (start the server with --socket-group GROUP and add this user to \
             GROUP, or --socket-mode 666 for every user; or use another server with --socket PATH \
             or TCPS_SOCKET)",
            socket.display()
        ),
        Some(libc::ECONNREFUSED | libc::ENOENT | libc::ENOTSOCK | libc::ENOTDIR) | None => {
            format!("no TCP server answers ({why})")
        }
        Some(_) if can_connect(socket) => {
            format!(
                "the TCP server at {} refused this program ({why})",
                socket.display()
            )
        }
        Some(_) => format!("cannot reach the TCP server ({why})"),
    }
}

/// Whether something accepts connections on `socket` (the server).
fn can_connect(socket: &Path) -> bool {
    crate::stat_cmd::seqpacket_connect(socket).is_ok()
}

/// `program` as `execvp` would find it (through PATH if it has no slash).
fn find_program(program: &std::ffi::OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(p))
        .find(|c| c.is_file())
}

/// Why the preload library could not see the sockets of the program at
/// `path`, if it could not: an ELF executable without a program
/// interpreter (statically linked, static-pie included: the dynamic loader
/// never runs, so LD_PRELOAD reaches nothing), or a Go program (its
/// runtime makes socket system calls itself, never through libc, even when
/// it is dynamically linked and the library is loaded).
fn bypass_reason(path: &Path) -> Option<&'static str> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).ok()?;
    if tcps::statically_linked_fd(f.as_raw_fd()) == Some(true) {
        return Some("is statically linked: the preload library is never loaded into it");
    }
    if tcps::go_program_fd(f.as_raw_fd()) {
        return Some(
            "is a Go program: Go's runtime makes its socket system calls directly, not through \
             libc, so the preload library never sees them",
        );
    }
    None
}

/// A program whose sockets would stay on the kernel's without a word:
/// with `--fallback fail` it is refused, else warned about once.
fn check_bypass(args: &RunArgs, fallback: Fallback) -> Result<(), String> {
    let Some(reason) = find_program(&args.command[0])
        .as_deref()
        .and_then(bypass_reason)
    else {
        return Ok(());
    };
    let name = &args.command[0];
    if let Fallback::Fail = fallback {
        return Err(format!(
            "{name:?} {reason}; its sockets would run on the kernel's, which --fallback fail refuses \
             (docs/PRELOAD.md, \"Runtimes\")"
        ));
    }
    eprintln!(
        "tcps run: warning: {name:?} {reason}: its sockets stay on the kernel's (not offloaded)"
    );
    Ok(())
}

/// Attaches, retrying for up to `wait` while no server answers (it may be
/// starting); a server that answers and refuses is not retried.
fn attach_waiting(socket: &Path, wait: std::time::Duration) -> std::io::Result<tcps::Client> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match tcps::Client::attach(socket) {
            Err(e)
                if e.raw_os_error() == Some(libc::ECONNREFUSED)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Attaches to each server of `--remote A,B` once: Ok if one answers (the
/// program uses those that do; a warning names the others), else the last
/// error.
fn probe_each(remotes: &[std::net::SocketAddr], wait: std::time::Duration) -> std::io::Result<()> {
    let mut last = None;
    let mut up = 0;
    for r in remotes {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match tcps::Client::attach_remote(&r.to_string()) {
                Ok(c) => {
                    c.detach();
                    up += 1;
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::ECONNREFUSED)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                }
                Err(e) => {
                    eprintln!(
                        "tcps run: warning: the TCP server at {r} does not answer ({}); the program uses the others",
                        tcps::last_attach_error()
                    );
                    last = Some(e);
                }
            }
            break;
        }
    }
    match last {
        Some(e) if up == 0 => Err(e),
        _ => Ok(()),
    }
}

/// Loads the library into `cmd` (before any LD_PRELOAD it had), with the
/// fallback it follows.
fn preload(cmd: &mut std::process::Command, fallback: Fallback) -> Result<(), String> {
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
    cmd.env("TCPS_FALLBACK", fallback.name());
    Ok(())
}

pub fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    check_environment()?;
    let fallback = fallback(&args);
    check_bypass(&args, fallback)?;
    let socket = args.socket.clone().unwrap_or_else(tcps::default_path);
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    cmd.env("TCPS_SOCKET", &socket);
    if let (Some(remote), Some(auth)) = (&args.remote, &args.fabric_auth) {
        let auth = std::path::absolute(auth)?;
        let exe = std::env::current_exe()?;
        // Here too: the probe below attaches as the program will.
        for (k, v) in [
            ("TCPS_REMOTE", std::ffi::OsString::from(remote.to_string())),
            ("TCPS_FABRIC_AUTH", auth.into_os_string()),
            ("TCPS_BIN", exe.into_os_string()),
        ] {
            std::env::set_var(k, &v);
            cmd.env(k, v);
        }
    }
    let reattach = args.reattach
        || std::env::var("TCPS_REATTACH")
            .is_ok_and(|v| matches!(v.as_str(), "1" | "on" | "yes" | "true"));
    if reattach {
        cmd.env("TCPS_REATTACH", "1");
    }
    if args.exit_on_server_death {
        cmd.env("TCPS_EXIT_ON_SERVER_DEATH", "1");
    }
    // The program keeps this pid (exec): the library knows it is the one
    // `tcps run` started and writes its summary line even without sockets.
    cmd.env("TCPS_RUN_PID", std::process::id().to_string());
    if !(args.wait.is_finite() && args.wait >= 0.0) {
        return Err(format!("--wait needs a number of seconds >= 0, got {}", args.wait).into());
    }
    // Probe the server once, so that a missing one is reported here, once.
    let wait = std::time::Duration::from_secs_f64(args.wait);
    let probe = match &args.remote {
        Some(r) if r.0.len() > 1 => probe_each(&r.0, wait),
        _ => attach_waiting(&socket, wait).map(|c| c.detach()),
    };
    match probe {
        Ok(()) => preload(&mut cmd, fallback)?,
        Err(e) => {
            let why = why_not_served(&socket, &e);
            match fallback {
                Fallback::Fail => {
                    return Err(format!(
                        "{why}; not running {:?} (--fallback fail)",
                        args.command[0]
                    )
                    .into());
                }
                Fallback::Kernel if reattach => {
                    eprintln!(
                        "tcps run: warning: {why}; running {:?} on kernel sockets until a \
                         server answers (--reattach)",
                        args.command[0]
                    );
                    preload(&mut cmd, fallback)?;
                    cmd.env("TCPS_FALLBACK_QUIET", "1");
                }
                Fallback::Kernel => {
                    eprintln!(
                        "tcps run: warning: {why}; running {:?} on kernel sockets",
                        args.command[0]
                    );
                }
            }
        }
    }
    let err = cmd.exec();
    eprintln!("tcps: cannot run {:?}: {err}", args.command[0]);
    std::process::exit(exec_failure_status(&err))
}

/// The exit status of a program that could not be run, as sh(1) and env(1)
/// give it: 127 when it is not found, 126 when it cannot be executed.
fn exec_failure_status(err: &std::io::Error) -> i32 {
    match err.raw_os_error() {
        Some(libc::ENOENT) => 127,
        _ => 126,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_lists() {
        let r = parse_remotes("10.0.0.1:7010, 10.0.1.1:7010").unwrap();
        assert_eq!(r.0.len(), 2);
        // What TCPS_REMOTE carries, and what the host library splits.
        assert_eq!(r.to_string(), "10.0.0.1:7010,10.0.1.1:7010");
        assert!(parse_remotes("10.0.0.1:7010,10.0.0.1:7010")
            .unwrap_err()
            .contains("twice"));
        assert!(parse_remotes("10.0.0.1:7010,nowhere").is_err());
        assert_eq!(parse_remotes("[::1]:7010").unwrap().0.len(), 1);
    }
}
