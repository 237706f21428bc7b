//! The server's configuration (`tcps server` options) and its defaults:
//! what every other module reads, so it sits below all of them.

use crate::engine::EngineKind;
use std::path::PathBuf;
use std::time::Duration;
use tcps_proto::Layout;

/// How a worker waits for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Spin forever: lowest latency, one core always busy.
    Busy,
    /// Spin for `spin`, then sleep until a host rings the doorbell.
    Adaptive,
    /// Sleep whenever idle: every call rings the doorbell.
    Block,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub socket_path: PathBuf,
    /// Mode of the control socket file (who may attach): 0660 by default,
    /// so root and members of the socket's group attach, nobody else.
    pub socket_mode: u32,
    /// Group of the control socket file (None: the server's own group).
    pub socket_group: Option<u32>,
    /// One worker per CPU listed, pinned to it; empty: one unpinned worker.
    pub cpus: Vec<usize>,
    pub poll: PollMode,
    /// How long an adaptive worker spins before sleeping.
    pub spin: Duration,
    pub engine: EngineKind,
    pub max_hosts: usize,
    /// Most hosts one uid may have attached at once (0: unlimited), so one
    /// user cannot take every `max_hosts` slot.
    pub max_hosts_per_uid: usize,
    pub max_sockets_per_host: usize,
    /// Descriptors the sockets of one user's hosts (other than root's) may
    /// hold at the server (EMFILE beyond; 0: half of what `RLIMIT_NOFILE`
    /// leaves after a reserve, `fdbudget`).
    pub max_fds_per_uid: usize,
    /// Geometry of each host's channel region.
    pub layout: Layout,
    /// Live accepted connections per listener; more are reset at the
    /// server and never reach the host (0: unlimited).
    pub max_conns_per_listener: u32,
    /// Live accepted connections per client IP address across the whole
    /// server; more are reset at the server (0: unlimited).
    pub max_conns_per_addr: u32,
    /// Process-ahead policy (server-wide defaults; sockets override with
    /// `SOL_TCPS` options).
    pub eager: EagerPolicy,
    /// Serve the `tcps stat` counters for Prometheus at `GET /metrics` on
    /// this address (None: no metrics listener).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `/metrics` also shows each attached host (pid, uid, counters);
    /// otherwise only server totals (`--metrics-per-host`).
    pub metrics_per_host: bool,
    /// Per-host budget of registered memory: bytes mapped (ENOMEM beyond).
    pub max_registered_bytes_per_host: u64,
    /// Per-host budget of registered memory: registrations (ENOSPC beyond).
    pub max_registrations_per_host: u32,
    /// Per-user budget of fork snapshots waiting for their child (EAGAIN beyond).
    pub max_fork_snapshots_per_user: usize,
    /// Per-user budget of descriptors those snapshots hold (EAGAIN beyond).
    pub max_fork_fds_per_user: usize,
    /// Per-user rate of descriptors fork snapshots may dup() per second
    /// (EAGAIN beyond; 0: no limit).
    pub max_fork_fds_per_sec_per_user: usize,
    /// Per-host budget of pull-buffer bytes (read ahead at the server); a
    /// host at its budget reads ahead on no more sockets (bytes stay in
    /// the kernel) until it takes what is buffered.
    pub max_pull_bytes_per_host: usize,
    /// Dynamic host/server balancing (`crate::balance`).
    pub balance: BalanceConfig,
    /// Remote hosts over UCX (`--fabric-listen`; None: local hosts only).
    pub fabric: Option<FabricConfig>,
}

/// `tcps server --fabric-listen ADDR:PORT --fabric-auth FILE [--fabric-uid N]`
/// (`docs/ARCHITECTURE.md`, "The channel over a fabric").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    pub listen: std::net::SocketAddr,
    /// The shared-secret file hosts authenticate with.
    pub auth: PathBuf,
    /// The uid a remote host is accounted to (and, once remote `Socket`
    /// and `Bind` run here, acts as) unless its auth file names one.
    pub uid: u32,
    /// `--shared-files DIR`: remote hosts' `Op::FileOpen` opens files
    /// inside DIR here (`crate::shared_files`); None: refused.
    pub shared_files: Option<PathBuf>,
}

/// `tcps server --balance on|off` and its testing aid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalanceConfig {
    /// Off: every connection is offloaded.
    pub on: bool,
    /// `--balance-force-direct N`: a fixed share of N percent instead of
    /// the measured one (a testing aid: mixes direct and offloaded
    /// connections on a quiet machine).
    pub force_direct_pct: Option<u8>,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            on: true,
            force_direct_pct: None,
        }
    }
}

/// How the server receives ahead of the host's `recv` calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EagerRecv {
    /// Only when the host asks (a `recv` request).
    Off,
    /// Into a buffer at the server; a `recv` request is answered from it at once.
    Pull,
    /// Into the socket's receive ring in the host's region; a `recv` is a
    /// local copy at the host (pull for sockets without a ring).
    Push,
}

/// Process-ahead (thesis §4.6.2–4.6.4): what the server does before the
/// host asks. Defaults are the fastest safe choice: everything on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerPolicy {
    /// Accept ahead into each listener's accept ring.
    pub accept: bool,
    /// Most connections accepted ahead and not yet taken, per listener.
    pub accept_size: u32,
    pub recv: EagerRecv,
    /// Bytes read ahead per socket in pull mode (push: the ring size).
    pub recv_size: u32,
    /// Bind the async send queue and the receive ring as part of accept.
    pub setup_with_accept: bool,
    /// A listener's new connections may go to the host directly
    /// (`TCPS_BALANCE`; balancing).
    pub balance: bool,
}

impl Default for EagerPolicy {
    fn default() -> Self {
        EagerPolicy {
            accept: true,
            accept_size: DEFAULT_EAGER_ACCEPT_SIZE,
            recv: EagerRecv::Push,
            recv_size: tcps_proto::layout::DEFAULT_RQ_BYTES,
            setup_with_accept: true,
            balance: true,
        }
    }
}

/// Registered bytes per host: the host library's 16 MiB staging pool, a
/// web server's file cache (`examples/webserver.c`, at most 512 MiB) and
/// its send buffers fit; 64 hosts stay far from the 128 TiB address space.
pub const DEFAULT_MAX_REGISTERED_BYTES_PER_HOST: u64 = 1 << 30;
/// Registrations per host: the webserver of `tcps bench web` registers one
/// per thread (64 by default) plus its cache and the staging pool; every
/// mapping is a VMA of the server (`vm.max_map_count`, 65530).
pub const DEFAULT_MAX_REGISTRATIONS_PER_HOST: u32 = 256;
/// Fork snapshots a user's processes may have waiting for their children
/// (a prefork server forking its workers at once).
pub const DEFAULT_MAX_FORK_SNAPSHOTS_PER_USER: usize = 64;
/// Descriptors (dup()ed sockets) those snapshots may hold in all.
pub const DEFAULT_MAX_FORK_FDS_PER_USER: usize = 4096;
/// Descriptors a user's snapshots may dup() per second: each dup() (and
/// the close when the snapshot goes) is worker time every host waits for,
/// about 1 µs, so this is at most ~1 % of a worker; a prefork server's
/// start or a fork per connection with a few sockets open stays far below.
pub const DEFAULT_MAX_FORK_FDS_PER_SEC_PER_USER: usize = 8192;
/// Pull-buffer bytes per host: 8,192 connections with the default 32 KiB
/// read ahead (sockets beyond the 1,024 receive rings pull).
pub const DEFAULT_MAX_PULL_BYTES_PER_HOST: usize = 256 << 20;

/// The thesis' `EAGER_ACCEPT_SIZE`: connections accepted ahead per listener.
pub const DEFAULT_EAGER_ACCEPT_SIZE: u32 = 64;

impl Default for Config {
    fn default() -> Self {
        Config {
            socket_path: tcps_proto::handshake::default_socket_path(),
            socket_mode: 0o660,
            socket_group: None,
            cpus: Vec::new(),
            poll: PollMode::Adaptive,
            spin: Duration::from_micros(50),
            engine: EngineKind::Uring,
            max_hosts: 64,
            max_hosts_per_uid: 16,
            max_sockets_per_host: 65536,
            max_fds_per_uid: 0,
            layout: Layout::default(),
            max_conns_per_listener: 0,
            max_conns_per_addr: 0,
            eager: EagerPolicy::default(),
            metrics_listen: None,
            metrics_per_host: false,
            max_registered_bytes_per_host: DEFAULT_MAX_REGISTERED_BYTES_PER_HOST,
            max_registrations_per_host: DEFAULT_MAX_REGISTRATIONS_PER_HOST,
            max_fork_snapshots_per_user: DEFAULT_MAX_FORK_SNAPSHOTS_PER_USER,
            max_fork_fds_per_user: DEFAULT_MAX_FORK_FDS_PER_USER,
            max_fork_fds_per_sec_per_user: DEFAULT_MAX_FORK_FDS_PER_SEC_PER_USER,
            max_pull_bytes_per_host: DEFAULT_MAX_PULL_BYTES_PER_HOST,
            balance: BalanceConfig::default(),
            fabric: None,
        }
    }
}

/// The poll mode as `--poll` spells it.
pub(crate) fn poll_name(poll: PollMode) -> &'static str {
    match poll {
        PollMode::Busy => "busy",
        PollMode::Adaptive => "adaptive",
        PollMode::Block => "block",
    }
}
