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

#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    after_help = "Config file: `--config FILE` reads `key = value` lines with the long option names \
(e.g. `poll = busy`, `max-hosts = 16`); options on the command line override the file.\n\
Logs: RUST_LOG=debug for every refused call and attach."
)]
pub struct ServerArgs {
    /// Control socket hosts attach to [default: $XDG_RUNTIME_DIR/tcps.sock, else /run/tcps/tcps.sock]
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
    /// Serve the counters and queue depths of `tcps stat` for Prometheus
    /// at http://ADDR/metrics (e.g. 127.0.0.1:9464; every host's counters,
    /// so bind it where only operators reach it) [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Mode of the control socket file (octal); the server checks each host's privileges itself
    #[arg(long, default_value = "666")]
    pub socket_mode: String,
    /// Read options from a config file (`key = value` lines)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
/// ones, so the command line wins.
pub fn config_file_args(path: &std::path::Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    let mut args = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("{}:{}: expected `key = value`", path.display(), i + 1))?;
        args.push(format!("--{}", k.trim()));
        args.push(v.trim().trim_matches('"').to_string());
    }
    Ok(args)
}

pub fn run(args: ServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    init_logging();
    let mut cfg = Config::default();
    if let Some(p) = args.socket {
        cfg.socket_path = p;
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
    cfg.max_conns_per_listener = args.max_conns_per_listener;
    cfg.max_conns_per_addr = args.max_conns_per_addr;
    cfg.metrics_listen = args.metrics_listen;
    if !(4096..=16 << 20).contains(&args.eager_recv_size) {
        return Err("--eager-recv-size must be between 4096 and 16777216 bytes".into());
    }
    cfg.eager = tcps_server::EagerPolicy {
        accept: args.eager_accept,
        accept_size: args.eager_accept_size.max(1),
        recv: args.eager_recv,
        recv_size: args.eager_recv_size,
        setup_with_accept: args.setup_with_accept,
    };
    cfg.layout.n_channels = args.channels;
    cfg.layout.arena_size = args.arena_kib.saturating_mul(1024);
    cfg.layout.send_queues = args.send_queues;
    cfg.layout.sq_entries = args.sq_entries;
    cfg.layout.recv_rings = args.recv_rings;
    cfg.layout.rq_bytes = args.eager_recv_size.next_power_of_two();
    cfg.layout
        .validate()
        .map_err(|e| format!("bad channel geometry: {e}"))?;
    cfg.socket_mode = u32::from_str_radix(&args.socket_mode, 8)
        .map_err(|_| format!("bad --socket-mode {:?}", args.socket_mode))?;
    tcps_server::run(cfg)?;
    Ok(())
}

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
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
