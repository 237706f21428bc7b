//! A minimal in-process stand-in for the tcps TCP server, enough to test the
//! host library without the real one: it speaks the attach handshake, serves
//! the rings with `ServerCursor`, sleeps behind the doorbell and wakes
//! sleeping hosts with the futex. "Sockets" are in-memory loopback buffers.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tcps_proto::handshake::{Welcome, HELLO_LEN};
use tcps_proto::msg::{ArenaRange, PollEntry};
use tcps_proto::region::ChannelRef;
use tcps_proto::ring::ServerCursor;
use tcps_proto::{wake_batch, Call, Completion, Layout, Region};

/// `shutdown` with this `how` is answered only after [`SLOW_DELAY`] (tests
/// the host's futex sleep and the server's wake).
pub const SLOW_HOW: i32 = 77;
pub const SLOW_DELAY: Duration = Duration::from_millis(5);
/// `listen` with this backlog fails with EADDRINUSE.
pub const FAILING_BACKLOG: i32 = 999;
/// A send on a socket with `O_NONBLOCK` accepts at most this many bytes.
pub const NONBLOCK_SEND_LIMIT: usize = 1000;
/// Ring mode: `shutdown` with this `how` ends the socket's byte ring with
/// `END_ERROR` (ECONNRESET) after its data.
pub const RESET_HOW: i32 = 88;
/// Bytes per receive ring in ring mode.
pub const RING_BYTES: u32 = 4096;

#[derive(Clone)]
pub enum Mode {
    Accept,
    Refuse(i32, &'static str),
    Version(u32),
}

pub struct Fake {
    pub path: PathBuf,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    layout: Layout,
    doorbell: OwnedFd,
    listener: OwnedFd,
    mode: Mode,
    stop: AtomicBool,
    hosts: Mutex<Vec<Host>>,
    hosts_gone: AtomicU64,
    pub doorbells: AtomicU64,
    /// Eager receive and accept (`Fake::with_rings`): listeners get accept rings,
    /// accepted and connected sockets byte rings (eager receive push).
    rings: bool,
    /// Connections the fake may hand out on accept rings (it invents them).
    offered: AtomicU32,
    recv_kicks: AtomicU64,
    /// Every request's op and MSG_ flags argument (Send/Recv), for tests.
    log: Mutex<Vec<(u16, i64)>>,
}

/// One attached host: its control socket and its own region.
struct Host {
    conn: OwnedFd,
    region: Region,
    cursors: Vec<ServerCursor>,
    gone: bool,
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn unique_path() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "tcps-host-test-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

impl Fake {
    pub fn start(mode: Mode) -> Fake {
        Fake::with_layout(
            mode,
            Layout {
                n_channels: 8,
                ring_entries: 8,
                arena_size: 16384,
                ..Default::default()
            },
        )
    }

    /// A fake with eager receive and accept: listen binds an accept ring (the fake
    /// accepts ahead [`offer`](Fake::offer)ed connections once the host
    /// kicked), accepted connections come with a byte ring
    /// (`SETUP_RECV_RING`), `RecvBind` binds one; sends loop back into the
    /// socket's own ring.
    pub fn with_rings() -> Fake {
        Fake::build(
            Mode::Accept,
            Layout {
                n_channels: 8,
                ring_entries: 8,
                arena_size: 16384,
                recv_rings: 64,
                rq_bytes: RING_BYTES,
                ..Default::default()
            },
            true,
        )
    }

    pub fn with_layout(mode: Mode, layout: Layout) -> Fake {
        Fake::build(mode, layout, false)
    }

    fn build(mode: Mode, layout: Layout, rings: bool) -> Fake {
        let path = unique_path();
        // SAFETY: eventfd with valid flags; result checked.
        let efd =
            check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }).unwrap();
        // SAFETY: fresh descriptor.
        let doorbell = unsafe { OwnedFd::from_raw_fd(efd) };
        let listener = listen(&path);
        let shared = Arc::new(Shared {
            layout,
            doorbell,
            listener,
            mode,
            stop: AtomicBool::new(false),
            hosts: Mutex::new(Vec::new()),
            hosts_gone: AtomicU64::new(0),
            doorbells: AtomicU64::new(0),
            rings,
            offered: AtomicU32::new(0),
            recv_kicks: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
        });
        let s1 = shared.clone();
        let s2 = shared.clone();
        let threads = vec![
            std::thread::spawn(move || accept_loop(&s1)),
            std::thread::spawn(move || serve(&s2)),
        ];
        Fake {
            path,
            shared,
            threads,
        }
    }

    /// Lets the fake accept `n` more connections ahead (ring mode).
    pub fn offer(&self, n: u32) {
        self.shared.offered.fetch_add(n, Ordering::AcqRel);
    }

    /// `RecvKick`s taken.
    pub fn recv_kicks(&self) -> u64 {
        self.shared.recv_kicks.load(Ordering::Relaxed)
    }

    /// (op, flags) of every request taken so far.
    pub fn requests(&self) -> Vec<(u16, i64)> {
        self.shared.log.lock().unwrap().clone()
    }

    pub fn doorbells(&self) -> u64 {
        self.shared.doorbells.load(Ordering::Relaxed)
    }

    /// Hosts whose control socket hung up.
    pub fn hosts_gone(&self) -> u64 {
        self.shared.hosts_gone.load(Ordering::Relaxed)
    }

    /// Stops serving and hangs up every host, like a crashed server.
    pub fn kill(mut self) {
        self.stop();
    }

    /// Stops serving and clears `server_alive`, but keeps the control sockets open.
    pub fn clear_alive_flag(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(serve) = self.threads.pop() {
            let _ = serve.join();
        }
        for h in self.shared.hosts.lock().unwrap().iter() {
            h.region.header().server_alive.store(0, Ordering::Release);
        }
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // SAFETY: shutdown on our own listening socket wakes the accept loop.
        unsafe { libc::shutdown(self.shared.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.shared.hosts.lock().unwrap().clear();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop();
    }
}

fn make_region(layout: Layout) -> (OwnedFd, Region) {
    // SAFETY: memfd_create with a valid C string; result checked.
    let fd =
        check(unsafe { libc::memfd_create(c"tcps-fake".as_ptr(), libc::MFD_CLOEXEC) }).unwrap();
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: valid fd and size.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), layout.region_size() as i64) }).unwrap();
    let region = Region::map(fd.as_fd(), layout).unwrap();
    region.init_header();
    (fd, region)
}

fn listen(path: &Path) -> OwnedFd {
    // SAFETY: plain socket call; checked.
    let fd =
        check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })
            .unwrap();
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &s) in a.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *d = s as libc::c_char;
    }
    let len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: valid address of `len` bytes.
    check(unsafe { libc::bind(fd.as_raw_fd(), &a as *const _ as *const libc::sockaddr, len) })
        .unwrap();
    // SAFETY: valid socket.
    check(unsafe { libc::listen(fd.as_raw_fd(), 16) }).unwrap();
    fd
}

fn accept_loop(s: &Shared) {
    while !s.stop.load(Ordering::Relaxed) {
        // SAFETY: accept on our listener; result checked.
        let fd = unsafe {
            libc::accept4(
                s.listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            continue;
        }
        // SAFETY: fresh descriptor.
        let conn = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut hello = [0u8; 64];
        // SAFETY: valid buffer.
        let n = unsafe { libc::recv(fd, hello.as_mut_ptr() as *mut libc::c_void, hello.len(), 0) };
        assert_eq!(n as usize, HELLO_LEN);
        let (memfd, region) = make_region(s.layout);
        let size = s.layout.region_size() as u64;
        let welcome = match s.mode {
            Mode::Accept => Welcome::accepted(size),
            Mode::Refuse(e, m) => Welcome::refused(e, m),
            Mode::Version(v) => {
                let mut w = Welcome::accepted(size);
                w.version = v;
                w
            }
        };
        let fds = if welcome.status == 0 {
            vec![memfd.as_raw_fd(), s.doorbell.as_raw_fd()]
        } else {
            vec![]
        };
        send_with_fds(fd, &welcome.encode(), &fds).unwrap();
        if welcome.status == 0 {
            let cursors = vec![ServerCursor::default(); s.layout.n_channels as usize];
            s.hosts.lock().unwrap().push(Host {
                conn,
                region,
                cursors,
                gone: false,
            });
        }
    }
}

fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    #[repr(C, align(8))]
    struct Buf([u8; 64]);
    let mut cbuf = Buf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as _;
        // SAFETY: the control buffer is large and aligned enough for one cmsg
        // carrying `fds`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: msg points to live buffers.
    check(unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) } as libc::c_int).map(drop)
}

#[derive(Default)]
struct Sock {
    data: VecDeque<u8>,
    flags: i64,
    name: Vec<u8>,
    /// Ring mode: the socket's ring is bound (`KIND_*`).
    ring: u32,
    /// Accept ring: the host kicked (wants connections).
    demand: bool,
    /// Byte ring: end after the data (`END_*`).
    end: u32,
}

#[derive(Default)]
struct State {
    next_id: u32,
    socks: HashMap<u32, Sock>,
}

fn serve(s: &Shared) {
    let mut st = State {
        next_id: 3,
        ..Default::default()
    };
    let mut idle = 0u32;
    while !s.stop.load(Ordering::Relaxed) {
        let mut hosts = s.hosts.lock().unwrap();
        let mut did = false;
        for h in hosts.iter_mut() {
            did |= serve_host(s, &mut st, h);
            if s.rings {
                did |= pump(s, &mut st, &h.region);
            }
            watch_host(s, &mut st, h);
        }
        if did {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle < 200 {
            drop(hosts);
            std::thread::yield_now();
            continue;
        }
        // Sleep behind the doorbell (Dekker: flag, fence, re-check).
        for h in hosts.iter() {
            h.region
                .header()
                .server_sleeping
                .store(1, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        let pending = hosts.iter().any(|h| {
            let used = h
                .region
                .header()
                .channels_used
                .load(Ordering::Acquire)
                .min(s.layout.n_channels);
            (0..used).any(|i| h.cursors[i as usize].has_requests(&h.region.channel(i).unwrap()))
        });
        if !pending {
            // Not holding the host list while asleep: the acceptor must be
            // able to add a host (whose control messages wait until then).
            drop(hosts);
            let mut p = libc::pollfd {
                fd: s.doorbell.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, 20) };
            let mut v = [0u8; 8];
            // SAFETY: 8-byte read from our eventfd into a local buffer.
            if unsafe {
                libc::read(
                    s.doorbell.as_raw_fd(),
                    v.as_mut_ptr() as *mut libc::c_void,
                    8,
                )
            } == 8
            {
                s.doorbells.fetch_add(1, Ordering::Relaxed);
            }
            hosts = s.hosts.lock().unwrap();
        }
        for h in hosts.iter() {
            h.region
                .header()
                .server_sleeping
                .store(0, Ordering::Relaxed);
        }
    }
}

/// Runs every pending request of one host; true if there were any.
fn serve_host(s: &Shared, st: &mut State, h: &mut Host) -> bool {
    let used = h
        .region
        .header()
        .channels_used
        .load(Ordering::Acquire)
        .min(h.region.layout().n_channels);
    let mut did = false;
    for i in 0..used {
        let ch = h.region.channel(i).unwrap();
        let cursor = &mut h.cursors[i as usize];
        while let Ok(Some(req)) = cursor.pop(&ch) {
            did = true;
            s.log.lock().unwrap().push((req.op, req.args[0] as i64));
            let c = if s.rings {
                handle_ring(s, st, &h.region, &ch, &req)
            } else {
                handle(st, &ch, &req)
            };
            let Some(c) = c else {
                // Kicks and unanswered closes free their completion slot;
                // other calls without an answer stay parked forever.
                if Call::decode(&req, ch.arena_size()).is_ok_and(|c| !c.completes()) {
                    cursor.retire();
                }
                continue;
            };
            if cursor.complete(&ch, &c).unwrap() {
                wake_batch::wake_all(&ch.ctl().cq_tail);
            }
        }
        // Threads that found the request ring full wait for room.
        if did && ServerCursor::room_wanted(&ch) {
            ServerCursor::wake_room(&ch);
        }
    }
    did
}

/// Answers a host's control messages (socket adoption; anything else is
/// EINVAL) and counts a host whose control socket reached EOF (once).
fn watch_host(s: &Shared, st: &mut State, h: &mut Host) {
    use tcps_proto::handshake::{ControlMsg, CONTROL_MSG_LEN};
    while !h.gone {
        let mut b = [0u8; CONTROL_MSG_LEN + 1];
        let (n, fds) =
            match tcps_proto::fdpass::recv_with_fds(h.conn.as_raw_fd(), &mut b, libc::MSG_DONTWAIT)
            {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return,
                Ok((n, fds)) if n > 0 => (n, fds),
                _ => {
                    h.gone = true;
                    s.hosts_gone.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
        let reply = match ControlMsg::decode(&b[..n]) {
            // The fake keeps no kernel socket: it counts the one it got.
            Some(ControlMsg::SocketAdopt {
                handle,
                nonblocking,
            }) if fds.len() == 1 => {
                let id = st.next_id;
                st.next_id += 1;
                let flags = if nonblocking {
                    libc::O_NONBLOCK as i64
                } else {
                    0
                };
                st.socks.insert(
                    id,
                    Sock {
                        flags,
                        ..Default::default()
                    },
                );
                ControlMsg::Adopted { handle, sock: id }
            }
            Some(ControlMsg::SocketDup { handle }) => ControlMsg::Reply {
                handle,
                errno: libc::EBADF,
            },
            Some(ControlMsg::Register { handle, .. }) => ControlMsg::Reply {
                handle,
                errno: libc::EINVAL,
            },
            _ => ControlMsg::Reply {
                handle: 0,
                errno: libc::EINVAL,
            },
        };
        let _ = tcps_proto::fdpass::send_with_fds(h.conn.as_raw_fd(), &reply.encode(), &[]);
    }
}

fn done(c: &mut Completion, result: i64) -> Option<Completion> {
    c.result = result;
    Some(*c)
}

fn fail(c: &mut Completion, e: i32) -> Option<Completion> {
    c.result = -1;
    c.errno = e;
    Some(*c)
}

/// Answers a `Poll` request: writes each entry's revents into the arena
/// (POLLOUT always, POLLIN when `readable`, POLLNVAL for unknown sockets)
/// and returns how many are ready.
fn answer_poll(
    st: &State,
    ch: &ChannelRef<'_>,
    entries: ArenaRange,
    n: u32,
    readable: impl Fn(u32, &Sock) -> bool,
) -> i64 {
    let raw = read(ch, entries);
    let mut ready = 0;
    for i in 0..n as usize {
        let e = &raw[i * 8..i * 8 + 8];
        let sock = u32::from_ne_bytes(e[0..4].try_into().unwrap());
        let events = i16::from_ne_bytes(e[4..6].try_into().unwrap());
        let revents = match st.socks.get(&sock) {
            None => libc::POLLNVAL,
            Some(s) => {
                let mut r = events & libc::POLLOUT;
                if readable(sock, s) {
                    r |= events & libc::POLLIN;
                }
                r
            }
        };
        if revents != 0 {
            ready += 1;
        }
        let off = entries.off + (i * size_of::<PollEntry>()) as u32 + 6;
        assert!(ch.copy_to_arena(off, &revents.to_ne_bytes()));
    }
    ready
}

fn read(ch: &ChannelRef<'_>, r: ArenaRange) -> Vec<u8> {
    let mut v = vec![0u8; r.len as usize];
    assert!(ch.copy_from_arena(r.off, &mut v));
    v
}

/// Executes one request; `None` parks it forever (a call that never completes).
fn handle(st: &mut State, ch: &ChannelRef<'_>, req: &tcps_proto::Request) -> Option<Completion> {
    let mut c = Completion {
        user_data: req.user_data,
        op: req.op,
        ..Default::default()
    };
    let call = match Call::decode(req, ch.arena_size()) {
        Ok(call) => call,
        Err(_) => return fail(&mut c, libc::EINVAL),
    };
    let sock_of = |call: &Call| match *call {
        Call::Bind { sock, .. }
        | Call::Listen { sock, .. }
        | Call::Accept { sock, .. }
        | Call::Connect { sock, .. }
        | Call::Send { sock, .. }
        | Call::Recv { sock, .. }
        | Call::Shutdown { sock, .. }
        | Call::Close { sock, .. }
        | Call::SetSockOpt { sock, .. }
        | Call::GetSockOpt { sock, .. }
        | Call::GetSockName { sock, .. }
        | Call::GetPeerName { sock, .. }
        | Call::Fcntl { sock, .. } => Some(sock),
        _ => None,
    };
    if let Some(sock) = sock_of(&call) {
        if !st.socks.contains_key(&sock) {
            return fail(&mut c, libc::EBADF);
        }
    }
    match call {
        Call::Nop => done(&mut c, 0),
        Call::Shutdown { how, .. } if how == SLOW_HOW => {
            std::thread::sleep(SLOW_DELAY);
            done(&mut c, 0)
        }
        Call::Socket { domain, ty, .. } => {
            if domain != libc::AF_INET && domain != libc::AF_INET6 {
                return fail(&mut c, libc::EAFNOSUPPORT);
            }
            let id = st.next_id;
            st.next_id += 1;
            let flags = if ty & libc::SOCK_NONBLOCK != 0 {
                libc::O_NONBLOCK as i64
            } else {
                0
            };
            st.socks.insert(
                id,
                Sock {
                    flags,
                    ..Default::default()
                },
            );
            done(&mut c, id as i64)
        }
        Call::Bind { sock, addr } => {
            let a = read(ch, addr);
            if tcps_proto::addr::parse(&a).is_err() {
                return fail(&mut c, libc::EINVAL);
            }
            st.socks.get_mut(&sock)?.name = a;
            done(&mut c, 0)
        }
        Call::Connect { addr, .. } => {
            let a = tcps_proto::addr::parse(&read(ch, addr));
            match a {
                Ok(a) if a.port() == 1 => fail(&mut c, libc::ECONNREFUSED),
                Ok(_) => done(&mut c, 0),
                Err(_) => fail(&mut c, libc::EINVAL),
            }
        }
        Call::Listen { backlog, .. } if backlog == FAILING_BACKLOG => {
            fail(&mut c, libc::EADDRINUSE)
        }
        Call::Shutdown { reply: false, .. } => None,
        Call::Listen { .. } | Call::Shutdown { .. } | Call::SetSockOpt { .. } => done(&mut c, 0),
        Call::Accept { addr, flags, .. } => {
            if flags & !libc::SOCK_NONBLOCK != 0 {
                return fail(&mut c, libc::EINVAL);
            }
            let id = st.next_id;
            st.next_id += 1;
            let flags = if flags & libc::SOCK_NONBLOCK != 0 {
                libc::O_NONBLOCK as i64
            } else {
                0
            };
            st.socks.insert(
                id,
                Sock {
                    flags,
                    ..Default::default()
                },
            );
            let peer = tcps_proto::addr::encode(&"127.0.0.1:4242".parse().unwrap());
            let n = peer.len().min(addr.len as usize);
            assert!(ch.copy_to_arena(addr.off, &peer[..n]));
            c.aux = peer.len() as u64;
            done(&mut c, id as i64)
        }
        Call::Send { sock, data, .. } => {
            let s = st.socks.get_mut(&sock)?;
            let mut bytes = read(ch, data);
            if s.flags & libc::O_NONBLOCK as i64 != 0 {
                if s.data.len() >= NONBLOCK_SEND_LIMIT {
                    return fail(&mut c, libc::EAGAIN);
                }
                bytes.truncate(NONBLOCK_SEND_LIMIT - s.data.len());
            }
            s.data.extend(&bytes);
            done(&mut c, bytes.len() as i64)
        }
        Call::Recv { sock, data, .. } => {
            let s = st.socks.get_mut(&sock)?;
            if s.data.is_empty() {
                if s.flags & libc::O_NONBLOCK as i64 != 0 {
                    return fail(&mut c, libc::EAGAIN);
                }
                return None; // park: blocks forever
            }
            let n = s.data.len().min(data.len as usize);
            let bytes: Vec<u8> = s.data.drain(..n).collect();
            assert!(ch.copy_to_arena(data.off, &bytes));
            done(&mut c, n as i64)
        }
        Call::Close { sock, reply } => {
            st.socks.remove(&sock);
            reply.then(|| done(&mut c, 0))?
        }
        Call::GetSockOpt { value, .. } => {
            let v = 7i32.to_ne_bytes();
            let n = v.len().min(value.len as usize);
            assert!(ch.copy_to_arena(value.off, &v[..n]));
            c.aux = n as u64;
            done(&mut c, 0)
        }
        Call::GetSockName { sock, addr } | Call::GetPeerName { sock, addr } => {
            let name = st.socks.get(&sock)?.name.clone();
            let n = name.len().min(addr.len as usize);
            assert!(ch.copy_to_arena(addr.off, &name[..n]));
            c.aux = name.len() as u64;
            done(&mut c, 0)
        }
        Call::Poll { entries, n, .. } => {
            let ready = answer_poll(st, ch, entries, n, |_, s| !s.data.is_empty());
            done(&mut c, ready)
        }
        Call::Fcntl { sock, cmd, arg } => {
            let s = st.socks.get_mut(&sock)?;
            match cmd {
                libc::F_GETFL => done(&mut c, s.flags | libc::O_RDWR as i64),
                libc::F_SETFL => {
                    s.flags = arg & libc::O_NONBLOCK as i64;
                    done(&mut c, 0)
                }
                _ => fail(&mut c, libc::EINVAL),
            }
        }
        // The fake server has no registered memory, send queues nor files.
        Call::SendReg { .. }
        | Call::RecvReg { .. }
        | Call::AsyncBind { .. }
        | Call::SendFile { .. }
        | Call::FileOpen { .. }
        | Call::FileClose { .. } => fail(&mut c, libc::EOPNOTSUPP),
        // No eager receive either: every socket receives on demand.
        Call::RecvBind { .. } => done(&mut c, tcps_proto::eager::RECV_MODE_NONE as i64),
        // Nothing parks here long enough to be cancelled.
        Call::AsyncKick { .. } | Call::RecvKick { .. } | Call::Cancel { .. } => None,
    }
}

/// Binds ring `sock` of `region` as `kind`, empty.
fn bind_ring(region: &Region, sock: u32, kind: u32) -> bool {
    let Some(ring) = region.recv_ring(sock) else {
        return false;
    };
    let ctl = ring.ctl();
    ctl.head.store(0, Ordering::Relaxed);
    ctl.tail.store(0, Ordering::Relaxed);
    ctl.end.store(0, Ordering::Relaxed);
    ctl.end_errno.store(0, Ordering::Relaxed);
    ctl.paused.store(0, Ordering::Relaxed);
    ctl.kind.store(kind, Ordering::Relaxed);
    ctl.owner.store(sock + 1, Ordering::Release);
    true
}

/// Ring mode: the calls that differ, then [`handle`].
fn handle_ring(
    sh: &Shared,
    st: &mut State,
    region: &Region,
    ch: &ChannelRef<'_>,
    req: &tcps_proto::Request,
) -> Option<Completion> {
    use tcps_proto::eager::*;
    let mut c = Completion {
        user_data: req.user_data,
        op: req.op,
        ..Default::default()
    };
    let call = match Call::decode(req, ch.arena_size()) {
        Ok(call) => call,
        Err(_) => return fail(&mut c, libc::EINVAL),
    };
    match call {
        Call::Listen { sock, .. } => {
            let s = st.socks.get_mut(&sock)?;
            if bind_ring(region, sock, KIND_ACCEPT) {
                s.ring = KIND_ACCEPT;
                c.aux = RECV_MODE_RING;
            }
            done(&mut c, 0)
        }
        Call::RecvBind { sock } => {
            let Some(s) = st.socks.get_mut(&sock) else {
                return fail(&mut c, libc::EBADF);
            };
            if s.ring == 0 && bind_ring(region, sock, KIND_BYTES) {
                s.ring = KIND_BYTES;
            }
            if s.ring == KIND_ACCEPT {
                // Like the server: the host wants connections now.
                s.demand = true;
            }
            let mode = if s.ring != 0 {
                RECV_MODE_RING
            } else {
                RECV_MODE_NONE
            };
            done(&mut c, mode as i64)
        }
        Call::RecvKick { sock } => {
            sh.recv_kicks.fetch_add(1, Ordering::Relaxed);
            if let (Some(s), Some(ring)) = (st.socks.get_mut(&sock), region.recv_ring(sock)) {
                s.demand = true;
                let ctl = ring.ctl();
                ctl.kicks_seen.fetch_add(1, Ordering::Release);
                ctl.paused.store(0, Ordering::Release);
            }
            None
        }
        Call::Shutdown { sock, how, reply } if st.socks.get(&sock).is_some_and(|s| s.ring != 0) => {
            let s = st.socks.get_mut(&sock)?;
            if how == RESET_HOW {
                s.end = END_ERROR;
            } else if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
                s.end = END_EOF;
            }
            reply.then(|| done(&mut c, 0))?
        }
        Call::Close { sock, reply } => {
            if let (Some(s), Some(ring)) = (st.socks.remove(&sock), region.recv_ring(sock)) {
                if s.ring != 0 {
                    ring.ctl().owner.store(0, Ordering::Release);
                    ring.ctl().kind.store(0, Ordering::Release);
                }
            }
            reply.then(|| done(&mut c, 0))?
        }
        Call::Poll { entries, n, .. } => {
            // A ring socket is readable when its ring holds something.
            let ready = answer_poll(st, ch, entries, n, |sock, s| match region.recv_ring(sock) {
                Some(ring) if s.ring != 0 => {
                    let ctl = ring.ctl();
                    ctl.tail.load(Ordering::Acquire) != ctl.head.load(Ordering::Acquire)
                        || ctl.end.load(Ordering::Acquire) != 0
                }
                _ => !s.data.is_empty(),
            });
            done(&mut c, ready)
        }
        _ => handle(st, ch, req),
    }
}

/// Ring mode: moves loopback data into byte rings (pausing when full),
/// publishes ends, and accepts offered connections ahead on listeners the
/// host kicked. True if anything moved.
fn pump(sh: &Shared, st: &mut State, region: &Region) -> bool {
    use tcps_proto::eager::*;
    let mut did = false;
    let mut new_conns = Vec::new();
    let ids: Vec<u32> = st.socks.keys().copied().collect();
    for id in ids {
        let Some(ring) = region.recv_ring(id) else {
            continue;
        };
        let ctl = ring.ctl();
        let s = st.socks.get_mut(&id).unwrap();
        let tail = ctl.tail.load(Ordering::Relaxed);
        let head = ctl.head.load(Ordering::Acquire);
        let room = ring.size() - tail.wrapping_sub(head).min(ring.size());
        let mut moved = false;
        match s.ring {
            KIND_BYTES => {
                if ctl.end.load(Ordering::Relaxed) != END_NONE {
                    continue;
                }
                let n = (room as usize).min(s.data.len());
                if n > 0 {
                    let bytes: Vec<u8> = s.data.drain(..n).collect();
                    ring.write_at(tail, &bytes);
                    ctl.tail
                        .store(tail.wrapping_add(n as u32), Ordering::Release);
                    moved = true;
                }
                if s.data.is_empty() && s.end != END_NONE {
                    ctl.end_errno.store(libc::ECONNRESET, Ordering::Relaxed);
                    ctl.end.store(s.end, Ordering::Release);
                    moved = true;
                } else if !s.data.is_empty() && ctl.paused.load(Ordering::Relaxed) == 0 {
                    ctl.paused.store(1, Ordering::Release);
                }
            }
            KIND_ACCEPT if s.demand && room >= ACCEPT_RECORD_SIZE => {
                let offered = sh.offered.load(Ordering::Acquire);
                if offered > 0
                    && sh
                        .offered
                        .compare_exchange(offered, offered - 1, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    let nid = st.next_id;
                    st.next_id += 1;
                    let peer = tcps_proto::addr::encode(&"127.0.0.1:4343".parse().unwrap());
                    let mut rec = AcceptRecord {
                        sock: nid,
                        addr_len: peer.len() as u32,
                        ..Default::default()
                    };
                    rec.addr[..peer.len()].copy_from_slice(&peer);
                    if bind_ring(region, nid, KIND_BYTES) {
                        rec.flags = SETUP_RECV_RING;
                    }
                    new_conns.push((nid, rec.flags));
                    ring.write_record(tail, &rec);
                    ctl.tail
                        .store(tail.wrapping_add(ACCEPT_RECORD_SIZE), Ordering::Release);
                    moved = true;
                }
            }
            _ => {}
        }
        if moved {
            did = true;
            fence(Ordering::SeqCst);
            if ctl.host_waiting.load(Ordering::Relaxed) != 0 {
                wake_batch::wake_all(&ctl.tail);
            }
        }
    }
    for (nid, flags) in new_conns {
        st.socks.insert(
            nid,
            Sock {
                ring: if flags & SETUP_RECV_RING != 0 {
                    KIND_BYTES
                } else {
                    0
                },
                ..Default::default()
            },
        );
    }
    did
}
