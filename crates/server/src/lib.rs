//! The tcps TCP server: hosts attach over a Unix control socket and get a
//! shared-memory channel region; workers poll those channels and execute
//! the hosts' socket calls on real kernel sockets.
//!
//! ```text
//! control (acceptor thread)  --NewHost-->  worker 0..N (one per --cpus entry)
//!   SO_PEERCRED, admission,                 scan channels -> calls::dispatch
//!   memfd + doorbell                        engine (io_uring | epoll) -> parked calls
//! ```

mod admission;
mod adopt;
mod calls;
mod closer;
mod control;
pub mod engine;
mod guard;
mod host;
mod inherit;
mod metrics;
mod registry;
mod sendfile;
mod slab;
pub mod sockopt_policy;
mod stats;
mod sys;
mod token;
mod worker;

pub use engine::EngineKind;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tcps_proto::Layout;
use tracing::info;

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
    /// Per-host budget of pull-buffer bytes (read ahead at the server); a
    /// host at its budget reads ahead on no more sockets (bytes stay in
    /// the kernel) until it takes what is buffered.
    pub max_pull_bytes_per_host: usize,
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
}

impl Default for EagerPolicy {
    fn default() -> Self {
        EagerPolicy {
            accept: true,
            accept_size: DEFAULT_EAGER_ACCEPT_SIZE,
            recv: EagerRecv::Push,
            recv_size: tcps_proto::layout::DEFAULT_RQ_BYTES,
            setup_with_accept: true,
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
            max_pull_bytes_per_host: DEFAULT_MAX_PULL_BYTES_PER_HOST,
        }
    }
}

/// State shared by the acceptor and the workers.
#[derive(Default)]
pub struct Shared {
    pub stopping: AtomicBool,
    /// Hosts attached (admission control counts against --max-hosts).
    pub hosts: AtomicUsize,
    /// Hosts attached per uid (`--max-hosts-per-uid`).
    pub hosts_per_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    pub refused_hosts: AtomicU64,
    /// Live accepted connections per client address (--max-conns-per-addr).
    pub conns_per_addr: admission::AddrCounts,
    /// Hosts' counters and queue depths as the workers last published them (`tcps stat`).
    pub stats: stats::Board,
}

/// The eventfd a signal handler rings to wake `run` (-1: none yet).
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);
/// Signals received and not yet handled by `run`, one bit per number.
static PENDING_SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNALS.fetch_or(1 << sig, Ordering::SeqCst);
    let fd = SIGNAL_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) is async-signal-safe; the buffer is valid.
        unsafe { libc::write(fd, one.as_ptr() as *const libc::c_void, 8) };
    }
}

/// Runs a server until SIGINT or SIGTERM, then shuts it down cleanly.
/// SIGHUP (a closed terminal or SSH session, or an operator asking for a
/// reload) is logged and ignored: the server keeps serving its hosts.
pub fn run(cfg: Config) -> io::Result<()> {
    // Handlers first: a signal that arrives while the server starts must
    // still be handled (and a stop remove the socket file).
    let wake = sys::eventfd().map_err(io::Error::from_raw_os_error)?;
    SIGNAL_FD.store(wake.as_raw_fd(), Ordering::SeqCst);
    // SAFETY: installing an async-signal-safe handler for three signals.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let server = start(cfg).inspect_err(|_| SIGNAL_FD.store(-1, Ordering::SeqCst))?;
    notify_systemd("READY=1");
    let stop_signal = wait_for_stop_signal(&wake);
    notify_systemd("STOPPING=1");
    info!(
        signal = stop_signal,
        hosts_attached = server.shared.hosts.load(Ordering::Relaxed),
        "tcps server shutting down on {stop_signal}: {} hosts attached",
        server.shared.hosts.load(Ordering::Relaxed)
    );
    server.stop();
    server.wait();
    SIGNAL_FD.store(-1, Ordering::SeqCst);
    Ok(())
}

/// Tells systemd (`Type=notify`: `$NOTIFY_SOCKET`) how the server is doing;
/// nothing without it. READY=1 comes once the control socket accepts.
fn notify_systemd(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    let addr = match target.strip_prefix('@') {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()),
        None => std::os::unix::net::SocketAddr::from_pathname(&target),
    };
    let sent = addr.and_then(|addr| {
        let sock = std::os::unix::net::UnixDatagram::unbound()?;
        let msg = format!("{state}\nMAINPID={}", std::process::id());
        sock.send_to_addr(msg.as_bytes(), &addr)
    });
    if let Err(e) = sent {
        tracing::warn!(error = %e, notify_socket = %target, "cannot notify systemd ({state})");
    }
}

/// Sleeps until SIGINT or SIGTERM arrives (returning its name), logging
/// every SIGHUP on the way.
fn wait_for_stop_signal(wake: &OwnedFd) -> &'static str {
    loop {
        let pending = PENDING_SIGNALS.swap(0, Ordering::SeqCst);
        if pending & (1 << libc::SIGHUP) != 0 {
            info!("SIGHUP ignored: the server keeps running (it has no configuration to reload; restart it to change options)");
        }
        if pending & (1 << libc::SIGTERM) != 0 {
            return "SIGTERM";
        }
        if pending & (1 << libc::SIGINT) != 0 {
            return "SIGINT";
        }
        // The eventfd is non-blocking: wait for it (or a signal: EINTR)
        // before draining it, or this loop would spin.
        let mut p = libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no timeout (a signal interrupts it).
        unsafe { libc::poll(&mut p, 1, -1) };
        sys::eventfd_drain(wake.as_raw_fd());
    }
}

/// A running server.
pub struct Server {
    shutdown: Arc<OwnedFd>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The control socket file this server made (None: systemd's, kept).
    socket_path: Option<PathBuf>,
    shared: Arc<Shared>,
}

impl Server {
    /// Asks every thread to stop.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe {
            libc::write(
                self.shutdown.as_raw_fd(),
                one.as_ptr() as *const libc::c_void,
                8,
            )
        };
    }

    /// Waits until the server stopped, then removes its socket file.
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
        let hosts = self.shared.hosts.load(Ordering::Relaxed);
        info!(
            hosts_attached = hosts,
            "tcps server stopped: {hosts} hosts attached"
        );
    }
}

/// The engine's name as the workers log it.
fn engine_name(kind: EngineKind) -> &'static str {
    match kind {
        EngineKind::Uring => "io_uring",
        EngineKind::Epoll => "epoll",
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

/// The pinned CPUs (`--cpus`), e.g. `1,2`, or `unpinned`.
fn cpus_text(cpus: &[usize]) -> String {
    if cpus.is_empty() {
        return "unpinned".to_string();
    }
    let names: Vec<String> = cpus.iter().map(usize::to_string).collect();
    names.join(",")
}

/// Every host socket is a descriptor of the server: lift the soft limit to
/// the hard one so the server is not the first to run out.
fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reading and writing a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Starts the acceptor and the workers in background threads.
pub fn start(cfg: Config) -> io::Result<Server> {
    cfg.layout
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.0))?;
    if cfg.max_hosts == 0 || cfg.max_sockets_per_host == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--max-hosts and --max-sockets-per-host must be at least 1",
        ));
    }
    raise_fd_limit();
    let cfg = Arc::new(cfg);
    let shared = Arc::new(Shared::default());
    let shutdown = Arc::new(sys::eventfd().map_err(io::Error::from_raw_os_error)?);
    // systemd's socket (tcps.socket) if it started us, else our own.
    let (listener, made_path, socket_shown) = match control::activated_listener()? {
        Some((fd, path)) => {
            info!(socket = %path.display(), "control socket from systemd (socket activation)");
            (fd, None, path)
        }
        None => (
            control::listen(&cfg.socket_path, cfg.socket_mode, cfg.socket_group)?,
            Some(cfg.socket_path.clone()),
            cfg.socket_path.clone(),
        ),
    };
    let metrics_listener = cfg.metrics_listen.map(metrics::listen).transpose()?;
    let mut threads = Vec::new();
    let mut handles = Vec::new();
    for index in 0..cfg.cpus.len().max(1) {
        let doorbell = Arc::new(sys::eventfd().map_err(io::Error::from_raw_os_error)?);
        let inbox = Arc::new(worker::Inbox::default());
        handles.push(control::WorkerHandle {
            inbox: inbox.clone(),
            doorbell: doorbell.clone(),
        });
        let w = worker::Worker::new(
            index,
            cfg.clone(),
            shared.clone(),
            doorbell,
            inbox,
            shutdown.as_raw_fd(),
        )?;
        threads.push(
            std::thread::Builder::new()
                .name(format!("tcps-worker-{index}"))
                .spawn(move || w.run())?,
        );
    }
    let (c2, s2, sfd) = (cfg.clone(), shared.clone(), shutdown.as_raw_fd());
    let shutdown_keep = shutdown.clone();
    threads.push(
        std::thread::Builder::new()
            .name("tcps-control".into())
            .spawn(move || {
                let _keep = shutdown_keep;
                control::serve(listener, sfd, c2, s2, handles)
            })?,
    );
    if let Some(l) = metrics_listener {
        let (s2, sfd, keep) = (shared.clone(), shutdown.as_raw_fd(), shutdown.clone());
        let per_host = cfg.metrics_per_host;
        threads.push(
            std::thread::Builder::new()
                .name("tcps-metrics".into())
                .spawn(move || {
                    let _keep = keep;
                    metrics::serve(l, sfd, s2, per_host)
                })?,
        );
    }
    info!(
        socket = %socket_shown.display(),
        engine = engine_name(cfg.engine),
        poll = poll_name(cfg.poll),
        workers = cfg.cpus.len().max(1),
        cpus = %cpus_text(&cfg.cpus),
        max_hosts = cfg.max_hosts,
        max_sockets_per_host = cfg.max_sockets_per_host,
        "tcps server listening"
    );
    Ok(Server {
        shutdown,
        threads,
        socket_path: made_path,
        shared,
    })
}
