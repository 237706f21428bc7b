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
mod arrival;
mod balance;
mod calls;
mod closer;
mod config;
mod control;
pub mod engine;
mod fabric;
mod fdbudget;
mod guard;
mod heap;
mod host;
mod host_doorbell;
mod inherit;
mod links;
pub mod metrics;
mod procstat;
mod registry;
mod sendfile;
mod shared;
mod shared_files;
mod slab;
pub mod sockopt_policy;
mod stats;
mod sys;
mod token;
pub mod upgrade;
mod worker;

pub use config::{
    BalanceConfig, Config, EagerPolicy, EagerRecv, FabricConfig, PollMode,
    DEFAULT_EAGER_ACCEPT_SIZE, DEFAULT_MAX_FORK_FDS_PER_SEC_PER_USER,
    DEFAULT_MAX_FORK_FDS_PER_USER, DEFAULT_MAX_FORK_SNAPSHOTS_PER_USER,
    DEFAULT_MAX_PULL_BYTES_PER_HOST, DEFAULT_MAX_REGISTERED_BYTES_PER_HOST,
    DEFAULT_MAX_REGISTRATIONS_PER_HOST,
};
pub use engine::EngineKind;
pub use shared::Shared;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use tracing::info;

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
/// SIGUSR2 upgrades it in place (`upgrade`). Started by an upgrade (the
/// state record in `$TCPS_UPGRADE_STATE`), it takes over the old server's
/// hosts and sockets.
pub fn run(cfg: Config) -> io::Result<()> {
    let origin = upgrade::exec::Origin::now();
    let inherited = inherited_record()?;
    // Handlers first: a signal that arrives while the server starts must
    // still be handled (and a stop remove the socket file).
    let wake = sys::eventfd().map_err(io::Error::from_raw_os_error)?;
    SIGNAL_FD.store(wake.as_raw_fd(), Ordering::SeqCst);
    // SAFETY: installing an async-signal-safe handler for four signals.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR2] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // Blocked by the old image across an upgrade's exec: pending ones
    // reach the handlers now.
    upgrade::exec::signal_mask(libc::SIG_UNBLOCK);
    let server =
        start_with(cfg, inherited).inspect_err(|_| SIGNAL_FD.store(-1, Ordering::SeqCst))?;
    notify_systemd("READY=1");
    let stop_signal = loop {
        match wait_for_stop_signal(&wake) {
            Some(stop) => break stop,
            None => {
                upgrade::exec::upgrade(&server.running(), &origin);
            }
        }
    };
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

/// The state record an upgrade left for this process, if it was started
/// by one (`$TCPS_UPGRADE_STATE`, taken out of the environment).
fn inherited_record() -> io::Result<Option<upgrade::record::Record>> {
    let Some(v) = std::env::var_os(upgrade::record::STATE_ENV) else {
        return Ok(None);
    };
    std::env::remove_var(upgrade::record::STATE_ENV);
    let fd: i32 = v.to_string_lossy().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "TCPS_UPGRADE_STATE: not a descriptor",
        )
    })?;
    let r = upgrade::record::Record::from_memfd(fd).map_err(|e| {
        tracing::error!(error = %e, "hot upgrade failed after exec: cannot load the state record; the hosts lose this server");
        e
    })?;
    Ok(Some(r))
}

/// Sleeps until SIGINT or SIGTERM arrives (returning its name), logging
/// every SIGHUP on the way; None when SIGUSR2 asks for an upgrade.
fn wait_for_stop_signal(wake: &OwnedFd) -> Option<&'static str> {
    loop {
        let pending = PENDING_SIGNALS.swap(0, Ordering::SeqCst);
        if pending & (1 << libc::SIGHUP) != 0 {
            info!("SIGHUP ignored: the server keeps running (it has no configuration to reload; restart it to change options)");
        }
        if pending & (1 << libc::SIGTERM) != 0 {
            return Some("SIGTERM");
        }
        if pending & (1 << libc::SIGINT) != 0 {
            return Some("SIGINT");
        }
        if pending & (1 << libc::SIGUSR2) != 0 {
            info!("SIGUSR2: hot upgrade");
            return None;
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
    cfg: Arc<Config>,
    /// The workers' own doorbells, the control socket's and the metrics
    /// listener (what a hot upgrade needs).
    doorbells: Vec<Arc<OwnedFd>>,
    listener_fd: std::os::fd::RawFd,
    metrics_fd: Option<std::os::fd::RawFd>,
}

impl Server {
    /// What a hot upgrade needs of this server.
    pub fn running(&self) -> upgrade::exec::Running<'_> {
        upgrade::exec::Running {
            cfg: &self.cfg,
            shared: &self.shared,
            doorbells: &self.doorbells,
            listener: self.listener_fd,
            metrics: self.metrics_fd,
            made_socket_path: self.socket_path.is_some(),
            pending_signals: &PENDING_SIGNALS,
        }
    }

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
    start_with(cfg, None)
}

/// The control socket's listener, the socket file to remove at stop, the
/// path to show, and the metrics listener: inherited from an upgrade's
/// record, else systemd's socket or a new one.
type Listeners = (
    OwnedFd,
    Option<PathBuf>,
    PathBuf,
    Option<std::net::TcpListener>,
);

fn listeners(cfg: &Config, inherited: Option<&upgrade::record::Record>) -> io::Result<Listeners> {
    let metrics = |fd: Option<i32>| -> io::Result<Option<std::net::TcpListener>> {
        match fd {
            Some(fd) => Ok(Some(std::net::TcpListener::from(upgrade::record::own(fd)?))),
            None => cfg.metrics_listen.map(metrics::http::listen).transpose(),
        }
    };
    if let Some(r) = inherited {
        let made = r.made_socket_path.then(|| cfg.socket_path.clone());
        let l = upgrade::record::own(r.listener)?;
        return Ok((l, made, cfg.socket_path.clone(), metrics(r.metrics)?));
    }
    let (l, made, shown) = match control::activated_listener()? {
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
    Ok((l, made, shown, metrics(None)?))
}

/// Starts a server; with `inherited`, one that takes over the hosts and
/// sockets an upgrade recorded.
pub fn start_with(cfg: Config, inherited: Option<upgrade::record::Record>) -> io::Result<Server> {
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
    let (total, per_uid) = fdbudget::init(cfg.max_fds_per_uid);
    info!(
        total,
        per_uid,
        reserve = fdbudget::RESERVE,
        "descriptors for hosts' sockets: in all and per user other than root (--max-fds-per-uid)"
    );
    let cfg = Arc::new(cfg);
    let shared = Arc::new(Shared::default());
    let shutdown = Arc::new(sys::eventfd().map_err(io::Error::from_raw_os_error)?);
    // An upgrade's, systemd's socket (tcps.socket) if it started us, else our own.
    let (listener, made_path, socket_shown, metrics_listener) =
        listeners(&cfg, inherited.as_ref())?;
    let (listener_fd, metrics_fd) = (
        listener.as_raw_fd(),
        metrics_listener.as_ref().map(AsRawFd::as_raw_fd),
    );
    let (mut carried, mut last_id) = (Vec::new(), 0);
    if let Some(r) = inherited {
        shared
            .refused_hosts
            .store(r.refused_hosts, Ordering::Relaxed);
        shared.upgrade.done.store(r.upgrades + 1, Ordering::Relaxed);
        (carried, last_id) = (r.workers, r.last_host_id);
    }
    let (mut threads, handles, doorbells) = spawn_workers(&cfg, &shared, &shutdown, carried)?;
    threads.extend(fabric::serve::start(
        &cfg,
        &shared,
        &handles,
        shutdown.as_raw_fd(),
    )?);
    let (c2, s2, sfd) = (cfg.clone(), shared.clone(), shutdown.as_raw_fd());
    let shutdown_keep = shutdown.clone();
    threads.push(
        std::thread::Builder::new()
            .name("tcps-control".into())
            .spawn(move || {
                let _keep = shutdown_keep;
                control::serve(listener, sfd, c2, s2, handles, last_id)
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
                    metrics::http::serve(l, sfd, s2, per_host)
                })?,
        );
    }
    info!(
        socket = %socket_shown.display(),
        engine = engine_name(cfg.engine),
        poll = config::poll_name(cfg.poll),
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
        cfg,
        doorbells,
        listener_fd,
        metrics_fd,
    })
}

/// How long the start waits for a worker thread to run.
const WORKER_START: std::time::Duration = std::time::Duration::from_secs(5);

/// The workers' threads (each given its share of the hosts an upgrade
/// `carried`), their handles for the control thread, and their doorbells.
type Workers = (
    Vec<std::thread::JoinHandle<()>>,
    Vec<control::WorkerHandle>,
    Vec<Arc<OwnedFd>>,
);

fn spawn_workers(
    cfg: &Arc<Config>,
    shared: &Arc<Shared>,
    shutdown: &OwnedFd,
    carried: Vec<Vec<upgrade::record::HostRecord>>,
) -> io::Result<Workers> {
    let workers = cfg.cpus.len().max(1);
    let mut per_worker: Vec<Vec<upgrade::record::HostRecord>> = vec![Vec::new(); workers];
    for (i, hosts) in carried.into_iter().enumerate() {
        per_worker[i % workers].extend(hosts);
    }
    let mut threads = Vec::new();
    let mut handles = Vec::new();
    let mut doorbells = Vec::new();
    // Each worker says when it runs with every descriptor it keeps open.
    let (running, started) = std::sync::mpsc::channel::<()>();
    for (index, carried) in per_worker.into_iter().enumerate() {
        let doorbell = Arc::new(sys::eventfd().map_err(io::Error::from_raw_os_error)?);
        let inbox = Arc::new(worker::Inbox::default());
        handles.push(control::WorkerHandle {
            inbox: inbox.clone(),
            doorbell: doorbell.clone(),
        });
        doorbells.push(doorbell.clone());
        let mut w = worker::Worker::new(
            index,
            cfg.clone(),
            shared.clone(),
            doorbell,
            inbox,
            shutdown.as_raw_fd(),
        )?;
        w.restore(carried)?;
        let running = running.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("tcps-worker-{index}"))
                .spawn(move || w.run(running))?,
        );
    }
    // The "listening" line follows: from then on an idle server's
    // descriptors are the same set (the fault matrix counts them). (A
    // worker that died before it ran drops its sender: no wait for it.)
    drop(running);
    for _ in 0..threads.len() {
        if started.recv_timeout(WORKER_START).is_err() {
            tracing::warn!("a worker did not start within {WORKER_START:?}");
            break;
        }
    }
    Ok((threads, handles, doorbells))
}
