//! `tcps server`: run a TCP server.

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tcps_server::{Config, EngineKind, PollMode};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PollArg {
    /// Spin without pause: lowest latency, burns a core.
    Busy,
    /// Spin for --spin-us after the last work, then sleep until a host rings.
    Adaptive,
    /// Sleep whenever idle; every host call rings the doorbell.
    Block,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EngineArg {
    /// io_uring (POLL_ADD, batched submissions).
    Uring,
    /// epoll (one-shot registrations).
    Epoll,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    /// One line per event: time, level, target, message, key=value fields.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    after_help = "Config file: `--config FILE` reads `key = value` lines with the long option names \
(e.g. `poll = busy`, `max-hosts = 16`); options on the command line override the file. \
docs/tcps.conf lists every key with its default.\n\
Who may attach: the control socket is mode 660 (--socket-mode) and belongs to the server's group \
or --socket-group, so root and members of that group attach; everyone else gets EACCES. \
Use --socket-group GROUP and add the users to GROUP, or --socket-mode 666 to let every local user attach.\n\
Signals: SIGTERM or SIGINT stop the server (logged with the number of attached hosts); \
SIGHUP is logged and ignored (the server survives the end of a terminal or SSH session); \
SIGUSR2 upgrades it in place (as --upgrade).\n\
Hot upgrade: `tcps server --upgrade [--socket PATH]` asks the running server to exec the binary \
it was started from (the file at that path now: install the new one there first) in place, same pid, \
with the same options. It hands over its hosts (channels, registered memory), listeners, connections, \
receive/accept rings and send queues; calls parked at the server are answered and re-issued by the \
host library; hosts see a pause. It is refused (the old server keeps running, exit status 1, the reason \
printed and logged) when the new binary cannot load the state record, remote (fabric) hosts are served, \
queued sends do not finish within 2 s, or other state it cannot carry is present.\n\
Logs: RUST_LOG=debug for every refused call and attach."
)]
pub struct ServerArgs {
    /// Control socket hosts attach to [default: $TCPS_SOCKET, else /run/tcps/tcps.sock, the same for every user and session]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// CPUs to run workers on, one pinned worker per CPU (e.g. `1` or `0,1` or `0-3`).
    /// Declares them the server's own: hosts then spin briefly for completions
    /// instead of sleeping (without --cpus: one unpinned worker, hosts sleep at once)
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// How workers wait for work
    #[arg(long, value_enum, default_value = "adaptive")]
    pub poll: PollArg,
    /// Microseconds an adaptive worker spins before it sleeps
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// Socket engine
    #[arg(long, value_enum, default_value = "uring")]
    pub engine: EngineArg,
    /// Admission control: most hosts attached at once (more are refused with EUSERS)
    #[arg(long, default_value_t = 64)]
    pub max_hosts: usize,
    /// Admission control: most hosts one user (uid) may have attached at
    /// once; more are refused with EUSERS (0: unlimited)
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_hosts_per_uid: usize,
    /// Admission control: most sockets per host (more are refused with EMFILE)
    #[arg(long, default_value_t = 65536)]
    pub max_sockets_per_host: usize,
    /// Budget: descriptors the sockets of one user's hosts may hold at the
    /// server, root's excepted (EMFILE beyond). 0: half of what the server's
    /// RLIMIT_NOFILE leaves after a reserve kept for attaching and accepting
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_fds_per_uid: usize,
    /// Connection admission: most live accepted connections per listener;
    /// more are reset at the server and never reach the host (0: unlimited)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_conns_per_listener: u32,
    /// Connection admission: most live accepted connections per client IP
    /// address, across all hosts and listeners of this server; more are
    /// reset at the server and never reach the host (0: unlimited)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_conns_per_addr: u32,
    /// Channels per host (host threads calling at once without sharing)
    #[arg(long, default_value_t = tcps_proto::layout::DEFAULT_CHANNELS)]
    pub channels: u32,
    /// Data arena per channel in KiB (largest single transfer)
    #[arg(long, default_value_t = tcps_proto::layout::DEFAULT_ARENA_SIZE / 1024)]
    pub arena_kib: u32,
    /// Asynchronous send queues per host: how many sockets of a host can
    /// send asynchronously at once (0 turns asynchronous sends into
    /// synchronous ones)
    #[arg(long, default_value_t = tcps_proto::layout::DEFAULT_SEND_QUEUES)]
    pub send_queues: u32,
    /// Descriptors per send queue (a power of two): the most asynchronous
    /// sends one socket may have in flight (the thesis' maxPipeline)
    #[arg(long, default_value_t = tcps_proto::layout::DEFAULT_SQ_ENTRIES)]
    pub sq_entries: u32,
    /// Receive rings per host: sockets with a smaller id can receive
    /// eagerly into the host's memory (push); others fall back to pull
    #[arg(long, value_name = "N", default_value_t = tcps_proto::layout::DEFAULT_RECV_RINGS)]
    pub recv_rings: u32,
    /// Eager accept (process-ahead): the server accepts connections before
    /// the host asks, into each listener's accept ring (on|off)
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub eager_accept: bool,
    /// Most connections accepted ahead and not yet taken, per listener;
    /// above it the kernel backlog applies as usual
    #[arg(long, value_name = "N", default_value_t = tcps_server::DEFAULT_EAGER_ACCEPT_SIZE)]
    pub eager_accept_size: u32,
    /// Eager receive (process-ahead): off (recv goes to the kernel on
    /// demand), pull (the server reads ahead into its own buffer and answers
    /// recv at once), push (the server reads ahead into a ring in the host's
    /// memory; recv is a local copy with no round trip)
    #[arg(long, value_name = "off|pull|push", default_value = "push", value_parser = parse_eager_recv)]
    pub eager_recv: tcps_server::EagerRecv,
    /// Bytes read ahead per connection before the server stops reading
    /// (TCP's window then holds the peer back); the ring size for push,
    /// rounded up to a power of two
    #[arg(long, value_name = "BYTES", default_value_t = tcps_proto::layout::DEFAULT_RQ_BYTES)]
    pub eager_recv_size: u32,
    /// Set up the async send queue and receive ring of a connection as
    /// part of accept, so its first send/recv needs no extra round trip (on|off)
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub setup_with_accept: bool,
    /// Dynamic host/server balancing: when the server is the bottleneck and
    /// a host has idle CPU, a share of that host's new connections is
    /// handed to it as kernel sockets (hosts that take them: programs under
    /// `tcps run`); off keeps every connection offloaded (on|off)
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub balance: bool,
    /// Testing aid: hand this percentage of new connections directly
    /// (hosts that take them, listeners that allow it) whatever the load
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub balance_force_direct: Option<u8>,
    /// Serve the counters and queue depths of `tcps stat` for Prometheus
    /// at http://ADDR/metrics (e.g. 127.0.0.1:9464): server totals only,
    /// unless --metrics-per-host [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Also accept hosts on other nodes over UCX at ADDR:PORT (port 0: any;
    /// the address is logged), beside local ones; needs --fabric-auth
    /// (docs/DEPLOYMENT.md; how the channel maps onto UCX:
    /// docs/ARCHITECTURE.md, "The channel over a fabric")
    #[arg(long, value_name = "ADDR:PORT", requires = "fabric_auth")]
    pub fabric_listen: Option<std::net::SocketAddr>,
    /// The shared-secret file remote hosts authenticate with (mode 600; the
    /// secret on its first line, optionally a line uid=N)
    #[arg(long, value_name = "FILE", requires = "fabric_listen")]
    pub fabric_auth: Option<std::path::PathBuf>,
    /// The uid remote hosts are accounted to when their auth file names
    /// none
    #[arg(long, value_name = "UID", default_value_t = 65534)]
    pub fabric_uid: u32,
    /// A directory tree this node sees at the same paths, holding the same
    /// files, as the application nodes (a replicated or read-only image, a
    /// synced copy): a remote host's sendfile of a file inside it is read
    /// here, opened with the host's mapped uid's permissions, and no file
    /// byte crosses the fabric. Files elsewhere, changed (size or mtime
    /// differ) or on a network file system are sent by the host as bytes
    #[arg(long, value_name = "DIR", requires = "fabric_listen")]
    pub shared_files: Option<std::path::PathBuf>,
    /// Also serve per-host series (tcps_host_*, labelled with each host's
    /// pid and uid) at /metrics. Anyone who reaches the metrics address sees
    /// every user's hosts (`tcps stat` shows a user only their own): bind it
    /// where only operators reach it [on|off; the bare flag: on]
    #[arg(long, value_name = "on|off", default_value = "off", num_args = 0..=1,
          default_missing_value = "on", require_equals = false,
          value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub metrics_per_host: bool,
    /// Budget: bytes of registered memory a host may have mapped into the
    /// server (more are refused with ENOMEM)
    #[arg(long, value_name = "BYTES", default_value_t = tcps_server::DEFAULT_MAX_REGISTERED_BYTES_PER_HOST)]
    pub max_registered_bytes_per_host: u64,
    /// Budget: registrations (mappings) a host may hold (more are refused
    /// with ENOSPC)
    #[arg(long, value_name = "N", default_value_t = tcps_server::DEFAULT_MAX_REGISTRATIONS_PER_HOST)]
    pub max_registrations_per_host: u32,
    /// Budget: fork snapshots a user's processes may have waiting for their
    /// children (a fork beyond it is refused with EAGAIN)
    #[arg(long, value_name = "N", default_value_t = tcps_server::DEFAULT_MAX_FORK_SNAPSHOTS_PER_USER)]
    pub max_fork_snapshots_per_user: usize,
    /// Budget: descriptors those snapshots may hold in all (EAGAIN beyond)
    #[arg(long, value_name = "N", default_value_t = tcps_server::DEFAULT_MAX_FORK_FDS_PER_USER)]
    pub max_fork_fds_per_user: usize,
    /// Budget: descriptors a user's fork snapshots may dup() per second
    /// (each is worker time every host waits for; EAGAIN beyond; 0: no limit)
    #[arg(long, value_name = "N", default_value_t = tcps_server::DEFAULT_MAX_FORK_FDS_PER_SEC_PER_USER)]
    pub max_fork_fds_per_sec_per_user: usize,
    /// Budget: bytes a host's sockets may have read ahead into buffers at
    /// the server (pull); at the budget more bytes stay in the kernel (TCP
    /// flow control holds the peer) until the host takes what is buffered
    #[arg(long, value_name = "BYTES", default_value_t = tcps_server::DEFAULT_MAX_PULL_BYTES_PER_HOST)]
    pub max_pull_bytes_per_host: usize,
    /// Mode of the control socket file (octal): who may attach. 660: root,
    /// the server's user and members of the socket's group (--socket-group);
    /// 666: every local user
    #[arg(long, value_name = "OCTAL", default_value = "660")]
    pub socket_mode: String,
    /// Group of the control socket file (a name or a numeric GID): its
    /// members may attach (with the default --socket-mode 660)
    /// [default: the server's group]
    #[arg(long, value_name = "NAME|GID")]
    pub socket_group: Option<String>,
    /// Log level: error, warn, info, debug or trace [default: $RUST_LOG
    /// (which may filter per module, e.g. `tcps_server::control=debug`), else info]
    #[arg(long, value_name = "LEVEL", value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: Option<String>,
    /// Log format on stderr: text (one line per event, key=value fields)
    /// or json (one JSON object per line: ts, level, target, message, fields)
    #[arg(long, value_enum, value_name = "FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// Read options from a config file (`key = value` lines)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Upgrade the running server (at --socket) in place: it execs the
    /// binary it was started from, keeping every host and connection
    /// (see below); exits 0 when done, 1 when refused
    #[arg(long)]
    pub upgrade: bool,
    /// Exit 0 if this binary can load a hot upgrade's state record of
    /// version N (asked by the running server before it execs this one)
    #[arg(long, value_name = "N", hide = true)]
    pub upgrade_check: Option<u32>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

fn parse_eager_recv(s: &str) -> Result<tcps_server::EagerRecv, String> {
    match s {
        "off" => Ok(tcps_server::EagerRecv::Off),
        "pull" => Ok(tcps_server::EagerRecv::Pull),
        "push" | "on" => Ok(tcps_server::EagerRecv::Push),
        _ => Err(format!("expected off, pull or push, got {s:?}")),
    }
}

/// Parses a CPU list: `1`, `0,2`, `0-3`, `0-1,3`.
pub fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("bad CPU list {s:?}: expected e.g. 1 or 0,1 or 0-3");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    // Online CPUs, not this process's affinity mask: a server started by a
    // pinned parent may still be told to run on another CPU.
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    if let Some(c) = out.iter().find(|&&c| c >= n) {
        return Err(format!("CPU {c} does not exist (this machine has {n})"));
    }
    Ok(out)
}

/// Turns a config file into `--key value` arguments placed before the real
/// ones, so the command line wins. Every line is checked on its own, so an
/// unknown key or a bad value is reported with the file and line.
pub fn config_file_args(path: &std::path::Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    let mut args = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("{at}: expected `key = value`, got {line:?}"))?;
        let (key, value) = (k.trim(), v.trim().trim_matches('"'));
        check_config_line(key, value).map_err(|e| format!("{at}: {e}"))?;
        args.push(format!("--{key}"));
        args.push(value.to_string());
    }
    Ok(args)
}

/// The keys a config file may set: every long option but `config`.
fn config_keys() -> Vec<String> {
    use clap::Args as _;
    ServerArgs::augment_args(clap::Command::new("server"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|k| !["config", "help", "upgrade", "upgrade-check"].contains(&k.as_str()))
        .collect()
}

/// Parses one `key = value` line as the command line would (clap's checks,
/// then the checks `config` makes on the values).
fn check_config_line(key: &str, value: &str) -> Result<(), String> {
    use clap::{Args as _, FromArgMatches as _};
    if !config_keys().iter().any(|k| k == key) {
        return Err(format!(
            "unknown key '{key}' (keys are the long options of `tcps server --help`, without --)"
        ));
    }
    let cmd = ServerArgs::augment_args(clap::Command::new("server"));
    let first_line = |e: clap::Error| {
        let text = e.to_string();
        let line = text
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        format!("bad value '{value}' for '{key}': {line}")
    };
    let matches = cmd
        .try_get_matches_from(["server", &format!("--{key}"), value])
        .map_err(first_line)?;
    let args = ServerArgs::from_arg_matches(&matches).map_err(first_line)?;
    config(args)
        .map(drop)
        .map_err(|e| format!("bad value '{value}' for '{key}': {e}"))
}

/// A group name or numeric GID as a GID; an error if no such group exists.
fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let unknown = || {
        format!("--socket-group {group:?}: no such group (see /etc/group, or give a numeric GID)")
    };
    let name = std::ffi::CString::new(group).map_err(|_| unknown())?;
    // SAFETY: group is plain data; zero is a valid value.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given; getgrnam_r writes
    // the entry's strings into buf.
    let r = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if r != 0 || found.is_null() {
        return Err(unknown());
    }
    Ok(entry.gr_gid)
}

/// The server's configuration from its options, every value checked.
/// The options that shape every host's region, each checked under its own
/// name and unit (the layout's own check speaks of its fields in bytes).
fn check_geometry(args: &ServerArgs) -> Result<(), String> {
    use tcps_proto::layout::*;
    let max_arena_kib = MAX_ARENA_SIZE / 1024;
    let bad = if !(1..=MAX_CHANNELS).contains(&args.channels) {
        format!("--channels {}: expected 1 to {MAX_CHANNELS}", args.channels)
    } else if args.arena_kib == 0
        || !args.arena_kib.is_multiple_of(4)
        || args.arena_kib > max_arena_kib
    {
        format!(
            "--arena-kib {}: expected a multiple of 4 (whole 4 KiB pages) from 4 to {max_arena_kib}",
            args.arena_kib
        )
    } else if args.send_queues > MAX_SEND_QUEUES {
        format!(
            "--send-queues {}: expected at most {MAX_SEND_QUEUES}",
            args.send_queues
        )
    } else if !args.sq_entries.is_power_of_two() || !(2..=MAX_SQ_ENTRIES).contains(&args.sq_entries)
    {
        format!(
            "--sq-entries {}: expected a power of two from 2 to {MAX_SQ_ENTRIES}",
            args.sq_entries
        )
    } else if args.recv_rings > MAX_RECV_RINGS {
        format!(
            "--recv-rings {}: expected at most {MAX_RECV_RINGS}",
            args.recv_rings
        )
    } else {
        return Ok(());
    };
    Err(bad)
}

fn config(args: ServerArgs) -> Result<Config, String> {
    check_geometry(&args)?;
    let mut cfg = Config::default();
    if let Some(p) = args.socket {
        cfg.socket_path = p;
    } else if std::env::var_os(tcps_proto::handshake::SOCKET_ENV).is_some_and(|p| !p.is_empty()) {
        // The same path `tcps run` and `tcps stat` use.
        cfg.socket_path = tcps::default_path();
    }
    if let Some(c) = &args.cpus {
        cfg.cpus = parse_cpus(c)?;
    }
    cfg.poll = match args.poll {
        PollArg::Busy => PollMode::Busy,
        PollArg::Adaptive => PollMode::Adaptive,
        PollArg::Block => PollMode::Block,
    };
    cfg.spin = Duration::from_micros(args.spin_us);
    cfg.engine = match args.engine {
        EngineArg::Uring => EngineKind::Uring,
        EngineArg::Epoll => EngineKind::Epoll,
    };
    cfg.max_hosts = args.max_hosts;
    cfg.max_hosts_per_uid = args.max_hosts_per_uid;
    cfg.max_sockets_per_host = args.max_sockets_per_host;
    cfg.max_fds_per_uid = args.max_fds_per_uid;
    cfg.max_conns_per_listener = args.max_conns_per_listener;
    cfg.max_conns_per_addr = args.max_conns_per_addr;
    cfg.metrics_listen = args.metrics_listen;
    cfg.fabric = match (args.fabric_listen, &args.fabric_auth) {
        (Some(listen), Some(auth)) => Some(tcps_server::FabricConfig {
            listen,
            auth: auth.clone(),
            uid: args.fabric_uid,
            shared_files: args.shared_files.clone(),
        }),
        _ => None,
    };
    cfg.metrics_per_host = args.metrics_per_host;
    cfg.max_registered_bytes_per_host = args.max_registered_bytes_per_host;
    cfg.max_registrations_per_host = args.max_registrations_per_host;
    cfg.max_fork_snapshots_per_user = args.max_fork_snapshots_per_user;
    cfg.max_fork_fds_per_user = args.max_fork_fds_per_user;
    cfg.max_fork_fds_per_sec_per_user = args.max_fork_fds_per_sec_per_user;
    cfg.max_pull_bytes_per_host = args.max_pull_bytes_per_host;
    if !(4096..=16 << 20).contains(&args.eager_recv_size) {
        return Err("--eager-recv-size must be between 4096 and 16777216 bytes".into());
    }
    cfg.eager = tcps_server::EagerPolicy {
        accept: args.eager_accept,
        accept_size: args.eager_accept_size.max(1),
        recv: args.eager_recv,
        recv_size: args.eager_recv_size,
        setup_with_accept: args.setup_with_accept,
        balance: true,
    };
    cfg.balance = tcps_server::BalanceConfig {
        on: args.balance,
        force_direct_pct: args.balance_force_direct,
    };
    cfg.layout.n_channels = args.channels;
    cfg.layout.arena_size = args.arena_kib.saturating_mul(1024);
    cfg.layout.send_queues = args.send_queues;
    cfg.layout.sq_entries = args.sq_entries;
    cfg.layout.recv_rings = args.recv_rings;
    cfg.layout.rq_bytes = args.eager_recv_size.next_power_of_two();
    cfg.layout.validate().map_err(|e| {
        format!(
            "--channels, --arena-kib, --send-queues, --sq-entries, --recv-rings and \
             --eager-recv-size together make a region the server cannot map ({e})"
        )
    })?;
    cfg.socket_mode = u32::from_str_radix(&args.socket_mode, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| {
            format!(
                "bad --socket-mode {:?}: expected an octal mode such as 660 or 666",
                args.socket_mode
            )
        })?;
    cfg.socket_group = args
        .socket_group
        .as_deref()
        .map(resolve_group)
        .transpose()?;
    Ok(cfg)
}

pub fn run(args: ServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(v) = args.upgrade_check {
        if tcps_server::upgrade::can_load(v) {
            return Ok(());
        }
        let mine = tcps_server::upgrade::RECORD_VERSION;
        eprintln!("tcps: cannot load state record version {v} (this binary: {mine})");
        std::process::exit(1);
    }
    if args.upgrade {
        return upgrade(&config(args)?.socket_path);
    }
    init_logging(args.log_level.as_deref(), args.log_format);
    tcps_server::run(config(args)?)?;
    Ok(())
}

/// `tcps server --upgrade`: SIGUSR2 to the server at `socket` (its pid
/// from `tcps stat`), then waits for its `server.upgrade` counters to say
/// done (exit 0) or refused (the reason, exit 1).
fn upgrade(socket: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let counts = |v: &serde_json::Value| {
        let u = &v["server"]["upgrade"];
        (
            u["done"].as_u64().unwrap_or(0),
            u["refused"].as_u64().unwrap_or(0),
        )
    };
    let before = crate::stat_cmd::query(socket)?;
    let pid = before["server"]["pid"].as_u64().unwrap_or(0) as libc::pid_t;
    let (done, refused) = counts(&before);
    // SAFETY: kill(2) with a pid the server reported.
    if pid <= 0 || unsafe { libc::kill(pid, libc::SIGUSR2) } != 0 {
        return Err(format!(
            "cannot signal the server (pid {pid}): {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let Ok(now) = crate::stat_cmd::query(socket) else {
            continue;
        };
        let (d, r) = counts(&now);
        if d > done {
            println!(
                "tcps server (pid {pid}) upgraded in place: {d} upgrades, {} hosts carried",
                now["server"]["hosts_attached"]
            );
            return Ok(());
        }
        if r > refused {
            let why = now["server"]["upgrade"]["last_refusal"]
                .as_str()
                .unwrap_or("")
                .to_string();
            eprintln!("tcps: upgrade refused, the server (pid {pid}) keeps running: {why}");
            std::process::exit(1);
        }
    }
    Err("the server did not report the upgrade within 30 s".into())
}

/// Logs to stderr at `level` (else as RUST_LOG says, else info), as text or
/// JSON lines.
pub fn init_logging(level: Option<&str>, format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    match format {
        LogFormat::Text => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                // Colours only on a terminal: a log file or pipe gets plain text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .try_init();
        }
        LogFormat::Json => {
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(json_log::JsonLines)
                .try_init();
        }
    }
}

/// `--log-format json`: one JSON object per event on stderr.
mod json_log {
    use serde_json::{Map, Value};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer};

    pub struct JsonLines;

    /// An event's fields as JSON values (numbers and booleans kept).
    struct Fields(Map<String, Value>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .insert(field.name().to_string(), Value::from(format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_bool(&mut self, field: &Field, value: bool) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
    }

    impl<S: Subscriber> Layer<S> for JsonLines {
        fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
            let mut fields = Fields(Map::new());
            event.record(&mut fields);
            let meta = event.metadata();
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            let mut line = Map::new();
            line.insert("ts".into(), Value::from(ts));
            line.insert("level".into(), Value::from(meta.level().as_str()));
            line.insert("target".into(), Value::from(meta.target()));
            if let Some(m) = fields.0.remove("message") {
                line.insert("message".into(), m);
            }
            line.insert("fields".into(), Value::Object(fields.0));
            let text = Value::Object(line).to_string() + "\n";
            use std::io::Write;
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpus("0").unwrap(), vec![0]);
        assert!(parse_cpus("0-x").is_err());
        assert!(parse_cpus("999").is_err());
    }
}
