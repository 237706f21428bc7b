//! The fabric thread (`--fabric-listen`): a UCX listener beside the control
//! socket. Each endpoint attaches (`attach`); an admitted host gets a
//! region and a doorbell as a local one does, and the worker gets it as a
//! `NewHost` whose control socket is one end of a socketpair this thread
//! holds — when the endpoint fails (the host died, the link broke) the
//! thread drops that end and the worker frees the host as it does for a
//! local host that hangs up. In between it runs the host's `pump`: the
//! host's spans in, and, each pass, what the server wrote back out in one
//! message.
//!
//! The worker tells the thread when it published for a host: it rings
//! the host's doorbell 0, a pipe this thread asks for on the stand-in
//! control socket (`ServerPump::init` makes the worker owe it); the
//! thread sleeps on those, with a 5 ms backstop.

use super::attach::{Attach, Step};
use super::control::Ctl;
use super::pump::ServerPump;
use crate::config::{Config, FabricConfig};
use crate::control::{admit_host, host_region, WorkerHandle};
use crate::host::NewHost;
use crate::links::{LinkBoard, LinkCounters, LinkView, PUBLISH_EVERY};
use crate::shared::Shared;
use crate::sys;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tcps_fabric::auth::Secret;
use tcps_fabric::wire::{
    Spans, Welcome, AM_AUTH, AM_CHALLENGE, AM_CONTROL, AM_HELLO, AM_KEEPALIVE, AM_SPANS, AM_WELCOME,
};
use tcps_fabric::{Context, ContextOptions, Endpoint, Listener, Worker};
use tcps_proto::handshake::ControlMsg;
use tcps_proto::Region;
use tracing::{info, warn};

/// A live remote host at this thread.
struct Live {
    id: u64,
    pid: u32,
    uid: u32,
    attached: SystemTime,
    region: Region,
    pump: ServerPump,
    doorbell: OwnedFd,
    /// The worker's `NewHost::control` is the other end: dropping this
    /// frees the host. On it the pump asks for the host's doorbell 0.
    control: OwnedFd,
    /// Doorbell 0's read end (once the worker answered): readable when the
    /// worker published for the host (`ServerPump::init`).
    bell: Option<OwnedFd>,
    /// When the host was last heard from, and last sent anything.
    heard: Instant,
    sent: Instant,
    /// Its control messages forwarded to the worker (`control`).
    ctl: Ctl,
}

/// A gap this long in the thread's own loop (it sleeps at most
/// `BACKSTOP_MS` while hosts are attached) means it was not running (an
/// overloaded machine): the hosts' silence restarts, so a starved server
/// does not drop live hosts.
const STARVED: Duration = Duration::from_millis(200);

/// How long the pump sleeps at most while remote hosts are attached: the
/// worker's doorbell 0 wakes it when it published; this is the backstop
/// for what it publishes without a wake (a ring's `paused`, line 2).
const BACKSTOP_MS: i32 = 5;

impl Live {
    /// What the pump sleeps on for this host: doorbell 0, or the control
    /// socket until the worker's answer with it arrived.
    fn watched(&self) -> RawFd {
        match &self.bell {
            Some(b) => b.as_raw_fd(),
            None => self.control.as_raw_fd(),
        }
    }

    /// Takes the worker's answer (doorbell 0) if it came; empties the bell;
    /// relays the worker's later replies to the host (`control`). False:
    /// the worker hung up the stand-in (it cut the host off).
    fn drain_bell(&mut self, link: (&Endpoint, &mut LinkCounters)) -> bool {
        let mut b = [0u8; 64];
        if let Some(bell) = &self.bell {
            // SAFETY: reading a non-blocking pipe into a local buffer.
            while unsafe { libc::read(bell.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) } > 0 {}
            let control = self.control.as_raw_fd();
            return self.ctl.relay(&mut self.pump, control, link);
        }
        let fd = self.control.as_raw_fd();
        match tcps_proto::fdpass::recv_with_fds(fd, &mut b, libc::MSG_DONTWAIT) {
            Ok((0, _)) => false,
            Ok((n, mut got)) => {
                let ok = matches!(
                    ControlMsg::decode(&b[..n]),
                    Some(ControlMsg::Reply { errno: 0, .. })
                );
                if ok && got.len() == 1 {
                    self.bell = got.pop();
                }
                true
            }
            Err(e) => e.raw_os_error() == Some(libc::EAGAIN),
        }
    }
}

/// A host sends at least this often (a keepalive when it has nothing
/// else); so does the server.
pub const KEEPALIVE: Duration = Duration::from_millis(250);
/// A host silent this long (three keepalives missed) is gone: a cut link
/// is noticed within a second (UCX alone would notice only when TCP's
/// retransmissions give up).
pub const SILENCE: Duration = Duration::from_millis(800);

enum State {
    Attaching(Attach),
    Live(Box<Live>),
}

struct Conn {
    ep: Endpoint,
    state: State,
    /// The peer's address (`tcps stat`), and the messages and bytes each
    /// way (`crate::links`).
    addr: Option<std::net::SocketAddr>,
    io: LinkCounters,
    /// The host's fabric address (its node), from the connection request.
    peer: Option<std::net::IpAddr>,
}

impl Conn {
    fn new(ep: Endpoint, addr: Option<std::net::SocketAddr>) -> Conn {
        Conn {
            ep,
            state: State::Attaching(Attach::new(Instant::now())),
            addr,
            io: LinkCounters::default(),
            peer: addr.map(|a| a.ip()),
        }
    }

    /// Sends an active message, counted in the link's counters.
    fn send(&mut self, id: u32, header: &[u8], data: Vec<u8>) -> bool {
        let n = header.len() + data.len();
        let ok = self.ep.am_send(id, header, data, false).is_ok();
        if ok {
            self.io.sent(n);
        }
        ok
    }

    fn view(&self) -> Option<LinkView> {
        let State::Live(l) = &self.state else {
            return None;
        };
        Some(LinkView {
            host: l.id,
            pid: l.pid,
            uid: l.uid,
            addr: self.addr,
            attached: l.attached,
            heard: l.heard,
            io: self.io,
        })
    }

    /// The endpoint is dropped: a host's link is lost (`why`), an attach's
    /// traffic counts in the totals.
    fn gone(&self, links: &LinkBoard, why: String) {
        match self.view() {
            Some(v) => links.lost(v, why),
            None => links.unadmitted(&self.io),
        }
    }
}

/// Everything the thread needs of the server.
pub struct Server {
    pub cfg: Arc<Config>,
    pub shared: Arc<Shared>,
    pub workers: Vec<WorkerHandle>,
    pub shutdown_fd: RawFd,
}

/// The fabric's listener (made on the fabric thread: a UCX worker stays on
/// its thread; `spawn` waits for it, so a bad address, secret file or a
/// missing UCX fails `tcps server` at once).
pub struct Fabric {
    worker: Worker,
    listener: Listener,
    secret: Secret,
    uid: u32,
}

impl Fabric {
    pub fn open(f: &FabricConfig) -> std::io::Result<Fabric> {
        let err = std::io::Error::other;
        let secret = Secret::read(&f.auth).map_err(err)?;
        // Active messages only: the server is never the target of a put.
        // A server restarted at once binds its port again (TIME_WAIT).
        let opts = ContextOptions {
            reuse_addr: true,
            ..ContextOptions::default()
        };
        let ctx = Context::new(&opts).map_err(|e| err(format!("UCX: {e}")))?;
        let worker = Worker::new(&ctx).map_err(|e| err(format!("UCX: {e}")))?;
        for id in [AM_HELLO, AM_AUTH, AM_SPANS, AM_KEEPALIVE, AM_CONTROL] {
            worker
                .set_am_handler(id)
                .map_err(|e| err(format!("UCX: {e}")))?;
        }
        let listener = worker
            .listen(f.listen)
            .map_err(|e| err(format!("--fabric-listen {}: {e}", f.listen)))?;
        Ok(Fabric {
            worker,
            listener,
            secret,
            uid: f.uid,
        })
    }

    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.local_addr().ok()
    }
}

fn welcome(c: &mut Conn, status: i32, geometry: [u32; 8], message: String) {
    let w = Welcome {
        status,
        geometry,
        message,
    };
    c.send(AM_WELCOME, &w.encode(), Vec::new());
}

/// Takes the worker's answers and replies for every live host; lets go of
/// those whose worker dropped them.
fn drain_bells(conns: &mut HashMap<u64, Conn>, links: &LinkBoard) {
    conns.retain(|_, c| {
        let kept = match &mut c.state {
            State::Live(l) => {
                let kept = l.drain_bell((&c.ep, &mut c.io));
                if !kept {
                    info!(host = l.id, "remote host let go: its worker dropped it");
                }
                kept
            }
            State::Attaching(_) => true,
        };
        if !kept {
            c.gone(links, "dropped by its worker".into());
        }
        kept
    });
}

/// The thread: runs until the server's shutdown eventfd fires.
pub fn serve(fabric: Fabric, srv: Server) {
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut next_id = 1u64 << 48; // ids apart from local hosts'
    let mut next_worker = 0usize;
    let mut looped = Instant::now();
    let mut published = Instant::now();
    loop {
        // Silence counts only while this thread runs (see `STARVED`).
        if looped.elapsed() > STARVED {
            for c in conns.values_mut() {
                if let State::Live(l) = &mut c.state {
                    l.heard = Instant::now();
                }
            }
        }
        looped = Instant::now();
        let any_live = conns.values().any(|c| matches!(c.state, State::Live(_)));
        if fabric.worker.progress() == 0 && fabric.worker.arm() {
            sleep(&fabric, &srv, &conns, any_live);
        }
        drain_bells(&mut conns, &srv.shared.links);
        if srv.shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        fabric.worker.progress();
        while let Some(req) = fabric.listener.take_request() {
            let addr = req.peer_addr();
            match req.accept() {
                Ok(ep) => {
                    conns.insert(ep.tag(), Conn::new(ep, addr));
                }
                Err(e) => warn!("fabric: cannot accept a connection: {e}"),
            }
        }
        for (tag, e) in fabric.worker.take_failures() {
            if let Some(c) = conns.remove(&tag) {
                if let State::Live(l) = &c.state {
                    info!(host = l.id, "remote host gone: {e}");
                }
                c.gone(&srv.shared.links, format!("endpoint failed: {e}"));
            }
        }
        while let Some(m) = fabric.worker.take_am() {
            let Some(tag) = m.from else { continue };
            let Some(conn) = conns.get_mut(&tag) else {
                continue;
            };
            conn.io.received(m.header.len() + m.data.len());
            if let State::Live(l) = &mut conn.state {
                l.heard = Instant::now();
            }
            let keep = match &mut conn.state {
                State::Attaching(a) => {
                    let step = a.on_message(&fabric.secret, m.id, &m.header);
                    attach_step(&fabric, &srv, conn, step, &mut next_id, &mut next_worker)
                }
                State::Live(l) if m.id == AM_SPANS => {
                    match l.pump.apply(&l.region, &m.header, &m.data) {
                        Ok(requests) => {
                            if requests {
                                sys::eventfd_ring(l.doorbell.as_raw_fd());
                            }
                            true
                        }
                        Err(e) => {
                            warn!(host = l.id, "remote host cut off: bad spans ({e:?})");
                            false
                        }
                    }
                }
                State::Live(l) if m.id == AM_CONTROL => {
                    let control = l.control.as_raw_fd();
                    l.ctl.carry_out(
                        &srv.cfg,
                        &mut l.pump,
                        control,
                        (&conn.ep, &mut conn.io),
                        &m.header,
                    )
                }
                State::Live(_) => m.id == AM_KEEPALIVE,
            };
            if !keep {
                if let Some(c) = conns.remove(&tag) {
                    c.gone(&srv.shared.links, "cut off (a bad message)".into());
                }
            }
        }
        ship(&mut conns, &srv.shared.links, &mut published);
    }
}

/// Sleeps until the fabric, a worker's bell or the shutdown fd wakes the
/// thread, at most the backstop while remote hosts are attached.
fn sleep(fabric: &Fabric, srv: &Server, conns: &HashMap<u64, Conn>, any_live: bool) {
    let wait = if any_live { BACKSTOP_MS } else { 100 };
    let mut fds = vec![srv.shutdown_fd, fabric.worker.event_fd()];
    fds.extend(conns.values().flat_map(|c| match &c.state {
        // The worker's replies to forwarded control messages too.
        State::Live(l) => vec![l.watched(), l.control.as_raw_fd()],
        State::Attaching(_) => Vec::new(),
    }));
    let mut pfds: Vec<libc::pollfd> = fds
        .into_iter()
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid array of pollfds of that length.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait) };
}

/// Each host's batch of what the server wrote (or a keepalive); drops
/// hosts silent too long and attaches that take too long; publishes the
/// links every `PUBLISH_EVERY` (`published`: when it last did).
fn ship(conns: &mut HashMap<u64, Conn>, links: &LinkBoard, published: &mut Instant) {
    let now = Instant::now();
    conns.retain(|_, c| match ship_one(c, now) {
        Ok(()) => true,
        Err(why) => {
            c.gone(links, why);
            false
        }
    });
    if now.duration_since(*published) >= PUBLISH_EVERY {
        *published = now;
        links.publish(conns.values().filter_map(Conn::view));
    }
}

/// One endpoint's part of `ship`; an error: drop it (why).
fn ship_one(c: &mut Conn, now: Instant) -> Result<(), String> {
    let sent = match &mut c.state {
        State::Attaching(a) if a.expired(now) => {
            welcome(c, libc::ETIMEDOUT, [0; 8], "tcps: attach timed out".into());
            return Err("attach timed out".into());
        }
        State::Attaching(_) => return Ok(()),
        State::Live(l) => {
            if now.duration_since(l.heard) > SILENCE {
                warn!(host = l.id, "remote host silent for {SILENCE:?}: gone");
                return Err(format!("silent for {SILENCE:?}"));
            }
            let mut out = Spans::new();
            l.pump.collect(&l.region, &mut out);
            if out.is_empty() {
                if now.duration_since(l.sent) < KEEPALIVE {
                    return Ok(());
                }
                l.sent = now;
                c.send(AM_KEEPALIVE, &[], Vec::new())
            } else {
                l.sent = now;
                let (h, d) = out.take();
                c.send(AM_SPANS, &h, d)
            }
        }
    };
    if sent {
        Ok(())
    } else {
        Err("send failed".into())
    }
}

/// Carries out an attach step; false: drop the endpoint.
fn attach_step(
    fabric: &Fabric,
    srv: &Server,
    conn: &mut Conn,
    step: Step,
    next_id: &mut u64,
    next_worker: &mut usize,
) -> bool {
    match step {
        Step::Challenge(n) => conn.send(AM_CHALLENGE, &n, Vec::new()),
        Step::Refuse { errno, message } => {
            warn!(errno, "fabric: {message}");
            welcome(conn, errno, [0; 8], message);
            false
        }
        Step::Admit { pid } => {
            let uid = fabric.secret.uid.unwrap_or(fabric.uid);
            if let Err(message) = admit_host(&srv.cfg, &srv.shared, uid, pid as i32) {
                srv.shared.refused_hosts.fetch_add(1, Ordering::Relaxed);
                warn!("{message}");
                welcome(conn, libc::EUSERS, [0; 8], message);
                return false;
            }
            *next_id += 1;
            let w = &srv.workers[*next_worker % srv.workers.len().max(1)];
            *next_worker += 1;
            match new_remote_host(*next_id, &srv.cfg, (pid, uid, conn.peer), w) {
                Ok(live) => {
                    info!(host = live.id, pid, uid, "remote host attached");
                    welcome(conn, 0, srv.cfg.layout.to_words(), String::new());
                    conn.state = State::Live(Box::new(live));
                    true
                }
                Err(e) => {
                    srv.shared.host_gone(uid);
                    welcome(conn, libc::ENOMEM, [0; 8], format!("tcps: {e}"));
                    false
                }
            }
        }
    }
}

/// A remote host's region (the server's copy), doorbell and stand-in
/// control socket; the worker gets its `NewHost`.
fn new_remote_host(
    id: u64,
    cfg: &Config,
    (pid, uid, peer): (u32, u32, Option<std::net::IpAddr>),
    w: &WorkerHandle,
) -> std::io::Result<Live> {
    let io = std::io::Error::from_raw_os_error;
    let (memfd, region) = host_region(cfg)?;
    let pump_region = Region::map(memfd.as_fd(), cfg.layout)?;
    ServerPump::init(&pump_region);
    let doorbell = sys::eventfd().map_err(io)?;
    let pump_doorbell = doorbell.try_clone()?;
    let (a, b) = super::control::socket_pair()?;
    let ask = ControlMsg::HostDoorbell { handle: 0 }.encode();
    tcps_proto::fdpass::send_with_fds(b.as_raw_fd(), &ask, &[])?;
    let host = NewHost {
        id,
        pid,
        uid,
        region,
        control: a,
        doorbell,
        remote: true,
        fabric_peer: peer,
        memfd: None,
    };
    if let Ok(mut inbox) = w.inbox.hosts.lock() {
        inbox.push(host);
    }
    sys::eventfd_ring(w.doorbell.as_raw_fd());
    Ok(Live {
        id,
        pid,
        uid,
        attached: SystemTime::now(),
        pump: ServerPump::new(cfg.layout),
        region: pump_region,
        doorbell: pump_doorbell,
        control: b,
        bell: None,
        heard: Instant::now(),
        sent: Instant::now(),
        ctl: Ctl::default(),
    })
}

/// Starts the fabric thread; returns once its listener listens (its
/// address) or failed.
pub fn spawn(
    f: FabricConfig,
    srv: Server,
) -> std::io::Result<(std::thread::JoinHandle<()>, std::net::SocketAddr)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::Builder::new()
        .name("tcps-fabric".into())
        .spawn(move || match Fabric::open(&f) {
            Ok(fabric) => {
                let _ = tx.send(
                    fabric
                        .local_addr()
                        .ok_or_else(|| "no listener address".to_string()),
                );
                serve(fabric, srv)
            }
            Err(e) => {
                let _ = tx.send(Err(e.to_string()));
            }
        })?;
    match rx.recv() {
        Ok(Ok(addr)) => Ok((t, addr)),
        Ok(Err(m)) => Err(std::io::Error::other(m)),
        Err(_) => Err(std::io::Error::other("fabric thread died")),
    }
}

/// Starts the fabric thread if `--fabric-listen` asks for it.
pub fn start(
    cfg: &Arc<Config>,
    shared: &Arc<Shared>,
    workers: &[WorkerHandle],
    shutdown_fd: RawFd,
) -> std::io::Result<Option<std::thread::JoinHandle<()>>> {
    let Some(f) = cfg.fabric.clone() else {
        return Ok(None);
    };
    let workers = workers
        .iter()
        .map(|h| WorkerHandle {
            inbox: h.inbox.clone(),
            doorbell: h.doorbell.clone(),
        })
        .collect();
    let srv = Server {
        cfg: cfg.clone(),
        shared: shared.clone(),
        workers,
        shutdown_fd,
    };
    let (t, addr) = spawn(f, srv)?;
    shared.links.set_listen(addr);
    info!(%addr, "fabric listener (remote hosts over UCX)");
    Ok(Some(t))
}
