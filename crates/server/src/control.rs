//! The control socket: where hosts attach.
//!
//! The acceptor thread accepts a connection, reads the host's credentials
//! (SO_PEERCRED) and its `Hello`, applies admission control, creates the
//! host's channel region (a memfd) and answers with a `Welcome` carrying the
//! region and the worker's doorbell eventfd (SCM_RIGHTS). The connection is
//! then handed to a worker, which watches it for the host's hang-up.
//! A `StatQuery` instead of a `Hello` is answered here (`stats::answer`).

use crate::host::NewHost;
use crate::sys::{self, ListenerWake};
use crate::worker::Inbox;
use crate::{Config, Shared};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tcps_proto::handshake::{Hello, StatQuery, Welcome, HELLO_LEN};
use tcps_proto::layout::SERVER_DEDICATED_CORES;
use tcps_proto::{Region, MAGIC, VERSION};
use tracing::{info, warn};

/// A worker as the acceptor sees it: where to put hosts and how to wake it.
pub struct WorkerHandle {
    pub inbox: Arc<Inbox>,
    pub doorbell: Arc<OwnedFd>,
}

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path too long: {}", path.display()),
        ));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok((
        sa,
        (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t,
    ))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds and listens on the control socket. A stale socket file (no server
/// answering) is replaced; a live one is an error.
pub fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let (sa, len) = sockaddr_un(path)?;
    if path.exists() {
        let probe = seqpacket()?;
        // SAFETY: sa/len describe a valid sockaddr_un.
        let r = unsafe {
            libc::connect(
                probe.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                len,
            )
        };
        if r == 0 {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another tcps server is listening on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let fd = seqpacket()?;
    // SAFETY: as above.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            len,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    // SAFETY: plain syscall.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Accepts hosts until the shutdown eventfd becomes readable.
pub fn serve(
    listener: OwnedFd,
    shutdown_fd: RawFd,
    cfg: Arc<Config>,
    shared: Arc<Shared>,
    workers: Vec<WorkerHandle>,
) {
    let mut next_worker = 0usize;
    let mut next_id = 0u64;
    loop {
        let wake = sys::wait_listener(listener.as_raw_fd(), shutdown_fd, 1000);
        if shared.stopping.load(Ordering::Relaxed) || wake == ListenerWake::Shutdown {
            return;
        }
        if wake == ListenerWake::Nothing {
            continue;
        }
        // SAFETY: accepting on our listener; peer address not wanted.
        let cfd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if cfd < 0 {
            continue;
        }
        // SAFETY: a fresh descriptor we own.
        let conn = unsafe { OwnedFd::from_raw_fd(cfd) };
        next_id += 1;
        let worker = &workers[next_worker % workers.len()];
        match attach(conn, next_id, &cfg, &shared, worker) {
            Ok(()) => next_worker += 1,
            Err(e) => warn!(error = %e, "attach failed"),
        }
    }
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

fn attach(
    conn: OwnedFd,
    id: u64,
    cfg: &Config,
    shared: &Shared,
    worker: &WorkerHandle,
) -> io::Result<()> {
    let fd = conn.as_raw_fd();
    let cred = peer_cred(fd)?;
    // A host that connects and says nothing must not stall the acceptor.
    let _ = crate::sys::set_timeout_secs(fd, libc::SO_RCVTIMEO, 1);
    let mut buf = [0u8; HELLO_LEN + 1];
    // SAFETY: reading into a valid local buffer.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    // `tcps stat`: not an attach, so before admission control.
    if let Some(q) = StatQuery::decode(&buf[..n.max(0) as usize]) {
        crate::stats::answer(fd, cred.uid, q, shared);
        return Ok(());
    }
    let hello = if n >= 0 {
        Hello::decode(&buf[..n as usize])
    } else {
        None
    };
    let Some(hello) = hello.filter(|h| h.magic == MAGIC) else {
        return refuse(
            fd,
            libc::EPROTO,
            format!(
                "tcps: pid {} sent no valid hello; is it a tcps host?",
                cred.pid
            ),
        );
    };
    if hello.version != VERSION {
        return refuse(
            fd,
            libc::EPROTO,
            format!(
                "tcps: protocol version mismatch: server v{VERSION}, host library v{}",
                hello.version
            ),
        );
    }
    let attached = shared.hosts.fetch_add(1, Ordering::AcqRel);
    if attached >= cfg.max_hosts {
        shared.hosts.fetch_sub(1, Ordering::AcqRel);
        shared.refused_hosts.fetch_add(1, Ordering::Relaxed);
        return refuse(
            fd,
            libc::EUSERS,
            format!(
                "tcps: server full: {attached} hosts attached (--max-hosts {}); pid {} refused",
                cfg.max_hosts, cred.pid
            ),
        );
    }
    let result = (|| -> io::Result<NewHost> {
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
        send_welcome(
            fd,
            &Welcome::accepted(size as u64),
            &[memfd.as_raw_fd(), worker.doorbell.as_raw_fd()],
        )?;
        Ok(NewHost {
            id,
            pid: cred.pid as u32,
            uid: cred.uid,
            region,
            control: conn,
        })
    })();
    match result {
        Ok(host) => {
            info!(host = id, pid = host.pid, uid = host.uid, "host attached");
            if let Ok(mut inbox) = worker.inbox.hosts.lock() {
                inbox.push(host);
            }
            sys::eventfd_ring(worker.doorbell.as_raw_fd());
            Ok(())
        }
        Err(e) => {
            shared.hosts.fetch_sub(1, Ordering::AcqRel);
            Err(e)
        }
    }
}
