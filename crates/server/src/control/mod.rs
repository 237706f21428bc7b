//! The control socket: where hosts attach.
//!
//! The acceptor thread accepts a connection, reads the host's credentials
//! (SO_PEERCRED) and its `Hello`, applies admission control, creates the
//! host's channel region (a memfd) and answers with a `Welcome` carrying the
//! region and the host's own doorbell eventfd (SCM_RIGHTS). The connection is
//! then handed to a worker, which watches it for the host's hang-up.
//! A `StatQuery` instead of a `Hello` is answered here (`stats::answer`).

mod socket;

use crate::config::Config;
use crate::host::NewHost;
use crate::shared::Shared;
use crate::sys;
use crate::worker::Inbox;
pub use socket::{activated_listener, listen};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps_proto::handshake::{Hello, StatQuery, Welcome, HELLO_LEN};
use tcps_proto::layout::SERVER_DEDICATED_CORES;
use tcps_proto::{Region, MAGIC, VERSION};
use tracing::{debug, info, warn};

/// A worker as the acceptor sees it: where to put hosts and how to wake it.
pub struct WorkerHandle {
    pub inbox: Arc<Inbox>,
    /// Rung when a host waits in `inbox`; the worker's own (no host holds it).
    pub doorbell: Arc<OwnedFd>,
}

/// How long a connection may take to send its `Hello` (or `StatQuery`).
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// Most connections waiting for their `Hello` at once; the oldest is
/// dropped for a new one beyond that.
const MAX_PENDING: usize = 256;
/// Most of them from one uid (other than root): more from it are dropped
/// at once, so one user's silent connections cannot push out others'.
const MAX_PENDING_PER_UID: usize = 16;
/// How long the acceptor leaves the listener alone when the server is out
/// of descriptors (EMFILE/ENFILE), instead of spinning on accept4.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A connection accepted and waiting for its first message.
struct Pending {
    conn: OwnedFd,
    uid: u32,
    deadline: Instant,
}

/// Accepts hosts until the shutdown eventfd becomes readable; host ids
/// go on after `last_id` (a hot upgrade carried hosts up to it).
///
/// Never waits for one connection while others are ready: accepted
/// connections wait in a poll set (each with its own deadline) until their
/// `Hello` arrives, so silent connections delay nobody.
pub fn serve(
    listener: OwnedFd,
    shutdown_fd: RawFd,
    cfg: Arc<Config>,
    shared: Arc<Shared>,
    workers: Vec<WorkerHandle>,
    last_id: u64,
) {
    let mut next_worker = 0usize;
    let mut next_id = last_id;
    let mut pending: Vec<Pending> = Vec::new();
    // While out of descriptors: when to try accept4 again, and whether
    // that was logged (once per episode).
    let mut accept_paused_until: Option<Instant> = None;
    let mut out_of_fds_logged = false;
    // accept_all takes connections until EAGAIN.
    if let Err(e) = sys::set_nonblocking(listener.as_raw_fd()) {
        warn!(errno = e, "cannot make the control socket non-blocking");
    }
    loop {
        let now = Instant::now();
        if accept_paused_until.is_some_and(|t| now >= t) {
            accept_paused_until = None;
        }
        let listening = accept_paused_until.is_none();
        let mut pfds = Vec::with_capacity(2 + pending.len());
        for fd in [shutdown_fd, listener.as_raw_fd()] {
            pfds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if !listening {
            pfds[1].fd = -1; // poll ignores it
        }
        pfds.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.conn.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let mut wake = pending
            .iter()
            .map(|p| p.deadline)
            .chain(accept_paused_until)
            .min()
            .map_or(1000, |d| {
                d.saturating_duration_since(now).as_millis() as i32 + 1
            });
        wake = wake.clamp(0, 1000);
        // SAFETY: pfds is a valid, writable array of its length.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wake) };
        if shared.stopping.load(Ordering::Relaxed) || pfds[0].revents != 0 {
            return;
        }
        // A hot upgrade holds the gate while it runs: new hosts wait.
        let _gate = shared
            .upgrade
            .gate
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // First the connections whose Hello arrived (or that hung up)...
        let ready: Vec<bool> = pfds[2..].iter().map(|p| p.revents != 0).collect();
        pending = answer_ready(
            pending,
            &ready,
            &mut next_id,
            &mut next_worker,
            &cfg,
            &shared,
            &workers,
        );
        // ...then new connections, as many as are waiting.
        if listening && pfds[1].revents != 0 {
            match accept_all(listener.as_raw_fd(), &mut pending) {
                Ok(()) => out_of_fds_logged = false,
                Err(e) => {
                    accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    if !out_of_fds_logged {
                        out_of_fds_logged = true;
                        warn!(
                            errno = e,
                            "out of descriptors: cannot accept hosts; retrying every 100 ms"
                        );
                    }
                }
            }
        }
    }
}

/// Answers the pending connections that are `ready` (their first message
/// arrived, or they hung up) and drops those past their deadline; returns
/// the ones still waiting.
fn answer_ready(
    pending: Vec<Pending>,
    ready: &[bool],
    next_id: &mut u64,
    next_worker: &mut usize,
    cfg: &Config,
    shared: &Shared,
    workers: &[WorkerHandle],
) -> Vec<Pending> {
    let now = Instant::now();
    let mut kept = Vec::with_capacity(pending.len());
    for (p, &ready) in pending.into_iter().zip(ready) {
        if ready {
            *next_id += 1;
            let worker = &workers[*next_worker % workers.len()];
            match attach(p.conn, *next_id, cfg, shared, worker) {
                Ok(true) => *next_worker += 1,
                Ok(false) => {}
                Err(e) => warn!(error = %e, "attach failed"),
            }
        } else if now >= p.deadline {
            debug!("a connection sent no hello within 1 s; dropped");
        } else {
            kept.push(p);
        }
    }
    kept
}

/// Accepts every waiting connection into `pending` (non-blocking). An
/// error is EMFILE/ENFILE (or another failure that would repeat at once).
fn accept_all(listener: RawFd, pending: &mut Vec<Pending>) -> Result<(), i32> {
    loop {
        // SAFETY: accepting on our listener; peer address not wanted.
        let cfd = unsafe {
            libc::accept4(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if cfd < 0 {
            return match sys::errno() {
                libc::EAGAIN | libc::EINTR | libc::ECONNABORTED => Ok(()),
                e @ (libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => Err(e),
                _ => Ok(()),
            };
        }
        // SAFETY: a fresh descriptor we own.
        let conn = unsafe { OwnedFd::from_raw_fd(cfd) };
        let Ok(cred) = peer_cred(conn.as_raw_fd()) else {
            continue;
        };
        let waiting = pending.iter().filter(|p| p.uid == cred.uid).count();
        if cred.uid != 0 && waiting >= MAX_PENDING_PER_UID {
            debug!(
                uid = cred.uid,
                "too many connections of one uid without a hello; dropped"
            );
            continue;
        }
        if pending.len() >= MAX_PENDING {
            debug!("too many connections without a hello; dropping the oldest");
            pending.remove(0);
        }
        pending.push(Pending {
            conn,
            uid: cred.uid,
            deadline: Instant::now() + HELLO_TIMEOUT,
        });
    }
}

/// Takes a slot for a host of `uid`: `Err(message)` when the server or
/// the uid is full (`--max-hosts`, `--max-hosts-per-uid`; uid 0 is not
/// limited per uid: root can stop the server anyway).
pub(crate) fn admit_host(cfg: &Config, shared: &Shared, uid: u32, pid: i32) -> Result<(), String> {
    let attached = shared.hosts.fetch_add(1, Ordering::AcqRel);
    if attached >= cfg.max_hosts {
        shared.hosts.fetch_sub(1, Ordering::AcqRel);
        return Err(format!(
            "tcps: server full: {attached} hosts attached (--max-hosts {}); pid {pid} refused",
            cfg.max_hosts
        ));
    }
    let mut per_uid = shared
        .hosts_per_uid
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let n = per_uid.entry(uid).or_insert(0);
    if uid != 0 && cfg.max_hosts_per_uid != 0 && *n >= cfg.max_hosts_per_uid {
        let had = *n;
        if had == 0 {
            per_uid.remove(&uid);
        }
        drop(per_uid);
        shared.hosts.fetch_sub(1, Ordering::AcqRel);
        return Err(format!(
            "tcps: uid {uid} has {had} hosts attached (--max-hosts-per-uid {}); pid {pid} refused",
            cfg.max_hosts_per_uid
        ));
    }
    *n += 1;
    Ok(())
}

fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is a writable ucred with its size in len.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

fn send_welcome(fd: RawFd, w: &Welcome, fds: &[RawFd]) -> io::Result<()> {
    tcps_proto::fdpass::send_with_fds(fd, &w.encode(), fds)
}

fn refuse(fd: RawFd, errno: i32, message: String) -> io::Result<()> {
    warn!(errno, "{message}");
    send_welcome(fd, &Welcome::refused(errno, message), &[])
}

/// A new host's region: the memfd and the server's mapping, header
/// written (for local hosts and remote ones, `fabric::serve`).
pub(crate) fn host_region(cfg: &Config) -> io::Result<(OwnedFd, Region)> {
    let size = cfg.layout.region_size();
    let memfd = sys::memfd(c"tcps-channels", size).map_err(io::Error::from_raw_os_error)?;
    let region = Region::map(std::os::fd::AsFd::as_fd(&memfd), cfg.layout)?;
    region.init_header();
    if !cfg.cpus.is_empty() {
        region
            .header()
            .server_flags
            .store(SERVER_DEDICATED_CORES, Ordering::Release);
    }
    Ok((memfd, region))
}

/// An admitted host's channel region (a memfd) and doorbell, sent to it in
/// its `Welcome` on `conn`: the host as the worker will take it.
fn new_host(conn: OwnedFd, id: u64, cfg: &Config, pid: u32, uid: u32) -> io::Result<NewHost> {
    let fd = conn.as_raw_fd();
    let size = cfg.layout.region_size();
    let (memfd, region) = host_region(cfg)?;
    // Its own doorbell: no other host can drain (or ring) it.
    let doorbell = sys::eventfd().map_err(io::Error::from_raw_os_error)?;
    // The Welcome fits an empty socket buffer: a non-blocking send
    // does not fail for want of room.
    send_welcome(
        fd,
        &Welcome::accepted(size as u64),
        &[memfd.as_raw_fd(), doorbell.as_raw_fd()],
    )?;
    Ok(NewHost {
        id,
        pid,
        uid,
        region,
        control: conn,
        doorbell,
        remote: false,
        fabric_peer: None,
        memfd: Some(memfd),
    })
}

/// Answers the first message of a connection (its `Hello`, readable now):
/// attaches the host (`Ok(true)`) or answers a `StatQuery` or a refusal.
fn attach(
    conn: OwnedFd,
    id: u64,
    cfg: &Config,
    shared: &Shared,
    worker: &WorkerHandle,
) -> io::Result<bool> {
    let fd = conn.as_raw_fd();
    let cred = peer_cred(fd)?;
    let mut buf = [0u8; HELLO_LEN + 1];
    // SAFETY: reading into a valid local buffer; never waits.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    // `tcps stat`: not an attach, so before admission control.
    if let Some(q) = StatQuery::decode(&buf[..n.max(0) as usize]) {
        // Its reply is sent within a budget, on a blocking socket.
        let _ = sys::set_blocking(fd);
        crate::stats::answer(fd, cred.uid, q, |uid| shared.stat_report(uid));
        return Ok(false);
    }
    let hello = if n >= 0 {
        Hello::decode(&buf[..n as usize])
    } else {
        None
    };
    let Some(hello) = hello.filter(|h| h.magic == MAGIC) else {
        refuse(
            fd,
            libc::EPROTO,
            format!(
                "tcps: pid {} sent no valid hello; is it a tcps host?",
                cred.pid
            ),
        )?;
        return Ok(false);
    };
    if hello.version != VERSION {
        refuse(
            fd,
            libc::EPROTO,
            format!(
                "tcps: protocol version mismatch: server v{VERSION}, host library v{}",
                hello.version
            ),
        )?;
        return Ok(false);
    }
    if let Err(message) = admit_host(cfg, shared, cred.uid, cred.pid) {
        shared.refused_hosts.fetch_add(1, Ordering::Relaxed);
        refuse(fd, libc::EUSERS, message)?;
        return Ok(false);
    }
    let result = new_host(conn, id, cfg, cred.pid as u32, cred.uid);
    match result {
        Ok(host) => {
            info!(host = id, pid = host.pid, uid = host.uid, "host attached");
            if let Ok(mut inbox) = worker.inbox.hosts.lock() {
                inbox.push(host);
            }
            sys::eventfd_ring(worker.doorbell.as_raw_fd());
            Ok(true)
        }
        Err(e) => {
            shared.host_gone(cred.uid);
            Err(e)
        }
    }
}
