//! `tcps fabric-pump`: the host's half of the channel over a fabric, in a
//! helper process of its own (`docs/ARCHITECTURE.md`, "The channel over a
//! fabric"). The host library starts it when `TCPS_REMOTE` is set
//! (`tcps::remote`), handing it one end of a socketpair that stands in
//! for the control socket. It attaches to the TCP server over UCX (the
//! HMAC answer to the server's nonce), makes the host's copy of the region
//! and a doorbell eventfd and answers the library's `Hello` with them, as
//! a local server does; then it pumps: the library's writes out
//! (`tcps::remote::pump::HostPump::collect`, once per millisecond and at
//! once when a request rings the doorbell), the server's batches in,
//! waking the library's sleepers — futexes, and the host doorbell pipes
//! it hands out for `HostDoorbell` — as the server would.
//!
//! Control messages that make sense across nodes go to the server
//! (`AM_CONTROL`, after the spans gathered so far, so the server has
//! applied everything the library wrote before it) and its replies back
//! to the library: fork snapshots (`Fork`, `Forked`, `Inherit`: a forked
//! child's own helper claims its parent's snapshot) and registrations
//! (`Register`: the library's memfd is mapped here, and the bytes its
//! descriptors and `SendReg`s name are shipped from it; `Deregister`).
//! The rest (descriptors, files) is answered EOPNOTSUPP.
//!
//! Failure: the server's endpoint failing, or the server silent for
//! 800 ms (it sends a keepalive every 250 ms), ends the link: the copy's
//! `server_alive` goes to 0, every sleeper is woken and the process exits,
//! closing the library's control socket and doorbell pipes — the library
//! sees a dead server (ECONNRESET/ENOTCONN). The library's end closing
//! (the program exited) ends the helper, and the server frees the host.

use clap::Args;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tcps::remote::pump::HostPump;
use tcps_fabric::auth::{Secret, NONCE_LEN};
use tcps_fabric::wire::{self, auth_context, Spans};
use tcps_fabric::{Context, ContextOptions, Endpoint, Worker};
use tcps_proto::fdpass;
use tcps_proto::handshake::{ControlMsg, Hello, Welcome, CONTROL_MSG_LEN};
use tcps_proto::layout::{Layout, VERSION};
use tcps_proto::mirror::{RegCopy, Writer};
use tcps_proto::ready_log::{DOORBELL_SLOTS, READY_LOG_OFFSET};
use tcps_proto::ring::HostCursor;
use tcps_proto::Region;

#[derive(Args, Debug)]
pub struct PumpArgs {
    /// The TCP server's fabric address (its --fabric-listen)
    #[arg(long, value_name = "ADDR:PORT")]
    pub remote: SocketAddr,
    /// The secret shared with the server (its --fabric-auth FILE)
    #[arg(long, value_name = "FILE")]
    pub fabric_auth: PathBuf,
    /// The descriptor of the host library's control socketpair end
    #[arg(long, value_name = "FD", default_value_t = 3)]
    pub fd: RawFd,
    /// Fork; the parent exits at once (the library waits for it), so the
    /// helper is not left as the program's child
    #[arg(long)]
    pub detach: bool,
}

/// Keepalive period, and the silence after which the server is gone (as
/// the server's `fabric::serve`).
const KEEPALIVE: Duration = Duration::from_millis(250);
const SILENCE: Duration = Duration::from_millis(800);
/// The pump's backstop: what the library writes without ringing the
/// doorbell (ring heads, `cq_head` credits) goes out at least this often.
const TICK_MS: i32 = 5;
/// A gap in the pump's own loop this long means it was not running.
const STARVED: Duration = Duration::from_millis(200);
/// How often the ready log's sleepers are looked at regardless (`sweep`).
const SWEEP: Duration = Duration::from_millis(10);
/// Offset of `server_alive` in the region header.
const SERVER_ALIVE: usize = 68;
/// `Pump::forward`'s "sent; the reply comes later" (not an errno).
const FORWARDED: i32 = -1;

fn os(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

pub fn run(args: PumpArgs) -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: fcntl on a number; checks it is an open descriptor.
    if unsafe { libc::fcntl(args.fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(format!("--fd {}: {}", args.fd, io::Error::last_os_error()).into());
    }
    // SAFETY: an open descriptor our parent gave us; owned from here on.
    let ctl = unsafe { OwnedFd::from_raw_fd(args.fd) };
    if args.detach {
        // SAFETY: this process is single-threaded here (no UCX yet).
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error().into()),
            // SAFETY: the parent only exits.
            0 => unsafe {
                libc::setsid();
            },
            _ => unsafe { libc::_exit(0) },
        }
    }
    let pid = read_hello(&ctl)?;
    narrow_net_devices(args.remote);
    let link = match Link::attach(&args, pid) {
        Ok(l) => l,
        Err((errno, message)) => {
            let w = Welcome::refused(errno, message);
            let _ = fdpass::send_with_fds(ctl.as_raw_fd(), &w.encode(), &[]);
            return Ok(());
        }
    };
    let mut p = Pump::new(link, ctl)?;
    p.run();
    Ok(())
}

/// A host that uses several servers names the devices of all its links in
/// `UCX_NET_DEVICES` (`a,b`); UCX would offer the server every one of
/// them, and addresses of the other links cannot be reached from it (the
/// connection fails). So each helper keeps the device its own server is
/// routed through, when the list names it.
fn narrow_net_devices(remote: SocketAddr) {
    let Ok(list) = std::env::var("UCX_NET_DEVICES") else {
        return;
    };
    if !list.contains(',') {
        return;
    }
    let Some(dev) = route_device(remote) else {
        return;
    };
    if list.split(',').any(|d| d.trim() == dev) {
        // (Single-threaded still: UCX is not loaded yet.)
        std::env::set_var("UCX_NET_DEVICES", &dev);
    }
}

/// The name of the interface the kernel routes `to` through (the one
/// holding the source address a datagram socket connected to it gets).
fn route_device(to: std::net::SocketAddr) -> Option<String> {
    let probe = std::net::UdpSocket::bind(match to {
        std::net::SocketAddr::V4(_) => "0.0.0.0:0",
        std::net::SocketAddr::V6(_) => "[::]:0",
    })
    .ok()?;
    probe.connect(to).ok()?;
    let local = probe.local_addr().ok()?.ip();
    let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifs` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifs;
    // SAFETY: walking the list getifaddrs made, until its NULL end; each
    // entry's name is a C string and its address (if any) a sockaddr of
    // the family it says.
    unsafe {
        while let Some(i) = p.as_ref() {
            let a = i.ifa_addr;
            let ip = match a.as_ref().map(|a| i32::from(a.sa_family)) {
                Some(libc::AF_INET) => {
                    let sin = &*(a as *const libc::sockaddr_in);
                    Some(std::net::IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                Some(libc::AF_INET6) => {
                    let sin6 = &*(a as *const libc::sockaddr_in6);
                    Some(std::net::IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            if ip == Some(local) {
                found = Some(
                    std::ffi::CStr::from_ptr(i.ifa_name)
                        .to_string_lossy()
                        .into_owned(),
                );
                break;
            }
            p = i.ifa_next;
        }
        libc::freeifaddrs(ifs);
    }
    found
}

/// The library's `Hello`: its pid (named in the HMAC answer).
fn read_hello(ctl: &OwnedFd) -> io::Result<u32> {
    let mut p = libc::pollfd {
        fd: ctl.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, 10_000) } <= 0 {
        return Err(os(libc::ETIMEDOUT));
    }
    let mut b = [0u8; 64];
    let (n, _) = fdpass::recv_with_fds(ctl.as_raw_fd(), &mut b, 0)?;
    let h = Hello::decode(&b[..n]).ok_or(os(libc::EPROTO))?;
    Ok(h.pid)
}

/// The attached fabric link.
struct Link {
    worker: Worker,
    ep: Endpoint,
    layout: Layout,
}

impl Link {
    /// Connects, authenticates and gets the geometry; `Err((errno, why))`.
    fn attach(args: &PumpArgs, pid: u32) -> Result<Link, (i32, String)> {
        let fail = |e: String| (libc::ECONNREFUSED, format!("tcps fabric-pump: {e}"));
        let secret = Secret::read(&args.fabric_auth)
            .map_err(|e| (libc::EACCES, format!("--fabric-auth: {e}")))?;
        let ctx =
            Context::new(&ContextOptions::default()).map_err(|e| fail(format!("UCX: {e}")))?;
        let worker = Worker::new(&ctx).map_err(|e| fail(format!("UCX: {e}")))?;
        for id in [
            wire::AM_CHALLENGE,
            wire::AM_WELCOME,
            wire::AM_SPANS,
            wire::AM_KEEPALIVE,
            wire::AM_CONTROL,
        ] {
            worker
                .set_am_handler(id)
                .map_err(|e| fail(format!("UCX: {e}")))?;
        }
        let at = args.remote;
        let ep = worker
            .connect(at)
            .map_err(|e| fail(format!("cannot reach {at}: {e}")))?;
        let send = |id, h: &[u8]| ep.am_send(id, h, Vec::new(), true);
        send(wire::AM_HELLO, &Hello::new(pid).encode()).map_err(|e| fail(format!("{at}: {e}")))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if Instant::now() > deadline {
                return Err((libc::ETIMEDOUT, format!("{at} did not answer the attach")));
            }
            worker.wait(Some(Duration::from_millis(20)));
            if let Some((_, e)) = worker.take_failures().into_iter().next() {
                return Err(fail(format!("{at}: {e}")));
            }
            let Some(m) = worker.take_am() else { continue };
            match m.id {
                wire::AM_CHALLENGE => {
                    let n: [u8; NONCE_LEN] = m
                        .header
                        .as_slice()
                        .try_into()
                        .map_err(|_| (libc::EPROTO, "a malformed challenge".to_string()))?;
                    let mac = secret.answer(&n, &auth_context(VERSION, pid));
                    send(wire::AM_AUTH, &mac).map_err(|e| fail(format!("{at}: {e}")))?;
                }
                wire::AM_WELCOME => {
                    let w = wire::Welcome::decode(&m.header)
                        .ok_or((libc::EPROTO, "a malformed welcome".to_string()))?;
                    if w.status != 0 {
                        return Err((w.status, w.message));
                    }
                    let layout = Layout::from_words(&w.geometry).map_err(|e| {
                        (
                            libc::EPROTO,
                            format!("the server's geometry is invalid: {e}"),
                        )
                    })?;
                    return Ok(Link { worker, ep, layout });
                }
                _ => {}
            }
        }
    }
}

/// A fresh memfd of `len` bytes.
fn memfd(len: usize) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a valid name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"tcps-remote".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn check(rc: i32) -> io::Result<i32> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A pipe (read end, write end), both non-blocking and close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptors, owned from here on.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The helper's state while attached.
struct Pump {
    link: Link,
    region: Region,
    pump: HostPump,
    ctl: OwnedFd,
    /// The eventfd the library rings when it posts a request.
    doorbell: OwnedFd,
    /// The host doorbell pipes (read end, write end), by slot.
    bells: Vec<Option<(OwnedFd, OwnedFd)>>,
    heard: Instant,
    sent: Instant,
    /// The ready log's `tail` at the last sweep, and when that was.
    swept: (u32, Instant),
    /// When the loop last ran.
    looped: Instant,
    /// Control messages sent to the server, not answered yet.
    awaiting: VecDeque<ControlMsg>,
    /// The library's memfd of a `Register` not answered yet, mapped.
    registering: Option<(u32, RegCopy)>,
}

impl Pump {
    /// Makes the copy and the doorbell and answers the library's Hello.
    fn new(link: Link, ctl: OwnedFd) -> io::Result<Pump> {
        let l = link.layout;
        let fd = memfd(l.region_size())?;
        let region = Region::map(std::os::fd::AsFd::as_fd(&fd), l)?;
        region.init_header();
        HostPump::init(&region);
        // SAFETY: eventfd with constant flags; checked.
        let efd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: a fresh descriptor, owned from here on.
        let doorbell = unsafe { OwnedFd::from_raw_fd(efd) };
        let w = Welcome::accepted(l.region_size() as u64);
        fdpass::send_with_fds(
            ctl.as_raw_fd(),
            &w.encode(),
            &[fd.as_raw_fd(), doorbell.as_raw_fd()],
        )?;
        Ok(Pump {
            pump: HostPump::new(l),
            link,
            region,
            ctl,
            doorbell,
            bells: (0..DOORBELL_SLOTS).map(|_| None).collect(),
            heard: Instant::now(),
            sent: Instant::now(),
            swept: (0, Instant::now()),
            looped: Instant::now(),
            awaiting: VecDeque::new(),
            registering: None,
        })
    }

    /// Until the library hangs up or the link fails.
    fn run(&mut self) {
        loop {
            let w = &self.link.worker;
            if w.progress() == 0 && w.arm() {
                let mut pfds = [
                    self.ctl.as_raw_fd(),
                    self.doorbell.as_raw_fd(),
                    w.event_fd(),
                ]
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                // SAFETY: a valid array of three pollfds.
                unsafe { libc::poll(pfds.as_mut_ptr(), 3, TICK_MS) };
            }
            w.progress();
            if !self.control() {
                return; // the library is gone: so is the host
            }
            let mut b = [0u8; 8];
            // SAFETY: reading the eventfd's counter into a local buffer.
            unsafe { libc::read(self.doorbell.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
            if let Err(why) = self.exchange() {
                self.link_down(&why);
                return;
            }
        }
    }

    /// The server's batches in, the library's writes out, keepalives.
    fn exchange(&mut self) -> Result<(), String> {
        let w = &self.link.worker;
        if let Some((_, e)) = w.take_failures().into_iter().next() {
            return Err(format!("the server's endpoint failed: {e}"));
        }
        // Silence counts only while this process runs: after a gap in its
        // own loop (it was not scheduled: an overloaded machine) the server
        // gets a fresh window, or a starved helper would cut a live link.
        if self.looped.elapsed() > STARVED {
            self.heard = Instant::now();
        }
        self.looped = Instant::now();
        while let Some(m) = self.link.worker.take_am() {
            self.heard = Instant::now();
            if m.id == wire::AM_CONTROL {
                self.server_reply(&m.header)?;
                continue;
            }
            if m.id != wire::AM_SPANS {
                continue;
            }
            let woke = self
                .pump
                .apply(&self.region, &m.header, &m.data)
                .map_err(|e| format!("a bad batch from the server ({e:?})"))?;
            self.ring_bells(woke.bells);
        }
        self.sweep();
        if self.heard.elapsed() > SILENCE {
            return Err(format!("the server was silent for {SILENCE:?}"));
        }
        self.ship()
    }

    /// The library's writes since the last pass in one batch (or a
    /// keepalive when due).
    fn ship(&mut self) -> Result<(), String> {
        let mut out = Spans::new();
        self.pump.collect(&self.region, &mut out);
        let ep = &self.link.ep;
        let r = if !out.is_empty() {
            let (h, d) = out.take();
            ep.am_send(wire::AM_SPANS, &h, d, true)
        } else if self.sent.elapsed() >= KEEPALIVE {
            ep.am_send(wire::AM_KEEPALIVE, &[], Vec::new(), true)
        } else {
            return Ok(());
        };
        self.sent = Instant::now();
        r.map_err(|e| format!("cannot send to the server: {e}"))
    }

    /// Every `SWEEP`: if the ready log moved since the last sweep, rings
    /// the doorbells of whoever sleeps on it now, a backstop for a wake-up
    /// lost on the way (as the server's own periodic sweep is).
    fn sweep(&mut self) {
        if self.swept.1.elapsed() < SWEEP {
            return;
        }
        let mut tail = [0u8; 4];
        let _ = self.region.read_span(READY_LOG_OFFSET, &mut tail);
        let tail = u32::from_le_bytes(tail);
        if tail != self.swept.0 {
            self.ring_bells(self.region.wake_ready_log().bells);
        }
        self.swept = (tail, Instant::now());
    }

    fn ring_bells(&self, bells: u64) {
        for (slot, bell) in self.bells.iter().enumerate().take(64) {
            if let Some((_, tx)) = bell.as_ref().filter(|_| bells & (1u64 << slot) != 0) {
                // SAFETY: one byte from a constant; a full pipe is rung already.
                unsafe { libc::write(tx.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            }
        }
    }

    /// Answers the library's control messages; false when it hung up.
    fn control(&mut self) -> bool {
        loop {
            let mut b = [0u8; CONTROL_MSG_LEN + 1];
            let fd = self.ctl.as_raw_fd();
            let (n, fds) = match fdpass::recv_with_fds(fd, &mut b, libc::MSG_DONTWAIT) {
                Ok(got) => got,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return true,
                Err(_) => return false,
            };
            if n == 0 {
                return false;
            }
            let Some(msg) = ControlMsg::decode(&b[..n]) else {
                return false;
            };
            let handle = msg.handle();
            let (errno, give) = match msg {
                ControlMsg::HostDoorbell { handle: slot } => match self.bell(slot) {
                    Ok(rx) => (0, Some(rx)),
                    Err(e) => (e.raw_os_error().unwrap_or(libc::EIO), None),
                },
                ControlMsg::Fork { .. }
                | ControlMsg::Forked { .. }
                | ControlMsg::Inherit { .. }
                | ControlMsg::Deregister { .. } => (self.forward(msg), None),
                ControlMsg::Register { handle, len } => {
                    let mapped = match fds.first() {
                        Some(fd) => RegCopy::map(fd.as_fd(), len as usize),
                        None => Err(os(libc::EINVAL)),
                    };
                    match mapped {
                        Ok(copy) => {
                            self.registering = Some((handle, copy));
                            (self.forward(msg), None)
                        }
                        Err(e) => (e.raw_os_error().unwrap_or(libc::EINVAL), None),
                    }
                }
                // Descriptors and files: not across nodes.
                _ => (libc::EOPNOTSUPP, None),
            };
            if errno == FORWARDED {
                continue;
            }
            let reply = ControlMsg::Reply { handle, errno }.encode();
            let fds: Vec<RawFd> = give.iter().map(|f| f.as_raw_fd()).collect();
            if fdpass::send_with_fds(fd, &reply, &fds).is_err() {
                return false;
            }
        }
    }

    /// Sends a control message to the server after the spans gathered so
    /// far: `FORWARDED` (its reply comes later), or the errno for the
    /// library if the server cannot be reached.
    fn forward(&mut self, msg: ControlMsg) -> i32 {
        if self.ship().is_err() {
            return libc::ECONNRESET;
        }
        let ep = &self.link.ep;
        match ep.am_send(wire::AM_CONTROL, &msg.encode(), Vec::new(), true) {
            Ok(()) => {
                self.sent = Instant::now();
                self.awaiting.push_back(msg);
                FORWARDED
            }
            Err(_) => libc::ECONNRESET,
        }
    }

    /// The server's reply to the oldest forwarded message, to the library.
    fn server_reply(&mut self, header: &[u8]) -> Result<(), String> {
        let bad = || "a bad control reply from the server".to_string();
        let Some(ControlMsg::Reply { errno, .. }) = ControlMsg::decode(header) else {
            return Err(bad());
        };
        let asked = self.awaiting.pop_front().ok_or_else(bad)?;
        match asked {
            ControlMsg::Register { handle, .. } => {
                let copy = self.registering.take().filter(|(h, _)| *h == handle);
                if let (0, Some((h, copy))) = (errno, copy) {
                    self.pump.add_registration(h, copy);
                }
            }
            ControlMsg::Deregister { handle } if errno == 0 => self.pump.drop_registration(handle),
            _ => {}
        }
        let reply = ControlMsg::Reply {
            handle: asked.handle(),
            errno,
        };
        // The library waits for it; a library gone is seen by `control`.
        let _ = fdpass::send_with_fds(self.ctl.as_raw_fd(), &reply.encode(), &[]);
        Ok(())
    }

    /// Host doorbell `slot`, made on first request: a duplicate of its
    /// read end to hand out (as the server's `host_doorbell`).
    fn bell(&mut self, slot: u32) -> io::Result<OwnedFd> {
        let cell = self.bells.get_mut(slot as usize).ok_or(os(libc::EINVAL))?;
        if cell.is_none() {
            *cell = Some(pipe()?);
        }
        match cell {
            Some((rx, _)) => rx.try_clone(),
            None => Err(os(libc::EIO)),
        }
    }

    /// The server is gone: the copy says so, every sleeper wakes.
    fn link_down(&mut self, why: &str) {
        eprintln!("tcps fabric-pump: {why}: the TCP server is gone");
        let r = &self.region;
        let _ = r.apply_span(Writer::Server, SERVER_ALIVE, &0u32.to_le_bytes());
        let l = self.link.layout;
        for c in 0..l.n_channels {
            if let Some(ch) = r.channel(c) {
                HostCursor::wake_sleepers(&ch);
            }
        }
        for i in 0..l.recv_rings {
            let _ = r.wake_recv_ring(i);
        }
        for q in 0..l.send_queues {
            let _ = r.wake_send_queue(q);
        }
        // Closing the pipes' write ends wakes their sleepers with an end
        // of file; closing the control socket tells the library.
        self.bells.clear();
    }
}
