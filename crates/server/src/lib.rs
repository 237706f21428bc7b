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
mod calls;
mod closer;
mod control;
pub mod engine;
mod host;
mod inherit;
mod metrics;
pub mod privilege;
mod registry;
mod sendfile;
mod slab;
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
    /// Mode of the control socket file (who may attach).
    pub socket_mode: u32,
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
    /// Ports below this need CAP_NET_BIND_SERVICE (read from the kernel).
    pub unprivileged_port_start: u16,
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

/// The thesis' `EAGER_ACCEPT_SIZE`: connections accepted ahead per listener.
pub const DEFAULT_EAGER_ACCEPT_SIZE: u32 = 64;

impl Default for Config {
    fn default() -> Self {
        Config {
            socket_path: tcps_proto::handshake::default_socket_path(),
            socket_mode: 0o666,
            cpus: Vec::new(),
            poll: PollMode::Adaptive,
            spin: Duration::from_micros(50),
            engine: EngineKind::Uring,
            max_hosts: 64,
            max_hosts_per_uid: 16,
            max_sockets_per_host: 65536,
            layout: Layout::default(),
            unprivileged_port_start: privilege::unprivileged_port_start(),
            max_conns_per_listener: 0,
            max_conns_per_addr: 0,
            eager: EagerPolicy::default(),
            metrics_listen: None,
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

/// The eventfd a signal handler rings to stop the server (-1: none yet).
static SHUTDOWN_FD: AtomicI32 = AtomicI32::new(-1);
/// A stop signal that arrived before the server was up.
static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP_REQUESTED.store(true, Ordering::SeqCst);
    let fd = SHUTDOWN_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) is async-signal-safe; the buffer is valid.
        unsafe { libc::write(fd, one.as_ptr() as *const libc::c_void, 8) };
    }
}

/// Runs a server until SIGINT or SIGTERM, then shuts it down cleanly.
pub fn run(cfg: Config) -> io::Result<()> {
    // Handlers first: a signal that arrives while the server starts must
    // still stop it cleanly (and remove its socket file).
    // SAFETY: installing an async-signal-safe handler for two signals.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let server = start(cfg)?;
    SHUTDOWN_FD.store(server.shutdown.as_raw_fd(), Ordering::SeqCst);
    if STOP_REQUESTED.load(Ordering::SeqCst) {
        server.stop();
    }
    server.wait();
    SHUTDOWN_FD.store(-1, Ordering::SeqCst);
    Ok(())
}

/// A running server.
pub struct Server {
    shutdown: Arc<OwnedFd>,
    threads: Vec<std::thread::JoinHandle<()>>,
    socket_path: PathBuf,
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
        let _ = std::fs::remove_file(&self.socket_path);
        info!("tcps server stopped");
    }
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
    let listener = control::listen(&cfg.socket_path, cfg.socket_mode)?;
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
        threads.push(
            std::thread::Builder::new()
                .name("tcps-metrics".into())
                .spawn(move || {
                    let _keep = keep;
                    metrics::serve(l, sfd, s2)
                })?,
        );
    }
    info!(
        socket = %cfg.socket_path.display(),
        engine = ?cfg.engine,
        poll = ?cfg.poll,
        workers = cfg.cpus.len().max(1),
        max_hosts = cfg.max_hosts,
        max_sockets_per_host = cfg.max_sockets_per_host,
        "tcps server listening"
    );
    Ok(Server {
        shutdown,
        threads,
        socket_path: cfg.socket_path.clone(),
        shared,
    })
}
