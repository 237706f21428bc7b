//! Issue 12, findings 1–5: the kernel, not tcps, decides what a host may
//! do. A local host creates, binds, listens on and sets options of its own
//! kernel sockets (under its own credentials); the server creates and binds
//! no socket for it, reads no capability from /proc, and applies only an
//! allow-list of unprivileged, pointer-free options where it still acts for
//! a host. Attackers run as uid 65534 (`nobody`) where it matters, with
//! the host library or the raw protocol.

mod common;

use common::*;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};
use tcps::Client;
use tcps_proto::Call;

/// A server that `nobody` may attach to (another change makes 0660 the
/// default mode of the control socket).
fn open_server(engine: &str) -> Server {
    Server::start(engine, &["--poll", "adaptive", "--socket-mode", "666"])
}

/// A port below 1024 that nothing listens on right now.
fn free_low_port() -> u16 {
    let mut rng = Rng::new(u64::from(std::process::id()) ^ 0x5ec);
    for _ in 0..200 {
        let p = 600 + rng.below(400) as u16;
        if TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in 600..1000");
}

fn result_name<T>(r: &std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(e) => errno_name(errno_of(e)),
    }
}

/// Runs test function `name` of this binary as role `role`, uid/gid 65534,
/// with `envs`; returns its stdout (asserting it succeeded).
fn run_as_nobody(srv: &Server, name: &str, role: &str, envs: &[(&str, String)]) -> String {
    let exe = world_executable_self(srv.dir.path());
    let mut cmd = child_command_exe(&exe, name, role);
    cmd.env("TCPS_IT_SOCKET", &srv.socket).uid(65534).gid(65534);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let (st, out, err) = run_child(cmd, Duration::from_secs(30));
    assert!(
        st.success(),
        "{role} failed: {st}\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

fn one_mark(out: &str, key: &str) -> String {
    let m = marks(out, key);
    assert_eq!(m.len(), 1, "mark {key}:\n{out}");
    m[0].clone()
}

// ---- a raw-protocol host ---------------------------------------------------

/// Channel 0 driven by hand ([`RawCalls`]).
struct Raw(RawCalls);

impl std::ops::Deref for Raw {
    type Target = RawCalls;
    fn deref(&self) -> &RawCalls {
        &self.0
    }
}

impl Raw {
    fn new(h: RawHost) -> Raw {
        Raw(RawCalls::new(h))
    }

    /// The errno of a raw setsockopt (0: it succeeded).
    fn setsockopt(&self, sock: u32, level: i32, name: i32, value: &[u8]) -> i32 {
        let c = self.run_with(value, |value| Call::SetSockOpt {
            sock,
            level,
            name,
            value,
        });
        if c.result < 0 {
            c.errno
        } else {
            0
        }
    }

    /// A TCP socket of this process, handed to the server: its id there.
    fn own_socket(&self, domain: i32) -> u32 {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        self.h
            .adopt_socket(fd.as_raw_fd(), false)
            .expect("SocketAdopt")
    }
}

fn sockaddr_in(port: u16) -> Vec<u8> {
    let mut a = vec![0u8; 16];
    a[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    a[2..4].copy_from_slice(&port.to_be_bytes());
    a[4..8].copy_from_slice(&[127, 0, 0, 1]);
    a
}

// ---- finding 1 ---------------------------------------------------------------

/// A root daemon listens on 127.0.0.1:P (no SO_REUSEPORT). `nobody`,
/// through the host library, cannot enable TCP_REPAIR nor bind P, and the
/// daemon gets every connection.
fn nobody_cannot_take_a_root_daemons_port(engine: &str) {
    require_root("it runs attackers as uid 65534 and binds low ports");
    let srv = open_server(engine);
    let daemon = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = daemon.local_addr().unwrap().port();
    let out = run_as_nobody(
        &srv,
        "child_port_takeover",
        "port-takeover",
        &[("TCPS_IT_PORT", port.to_string())],
    );
    assert_eq!(one_mark(&out, "tcp-repair"), "EPERM", "{out}");
    assert_eq!(one_mark(&out, "bind"), "EADDRINUSE", "{out}");
    // The daemon gets its connections.
    daemon.set_nonblocking(true).unwrap();
    for i in 0..5 {
        let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let t = Instant::now();
        loop {
            match daemon.accept() {
                Ok(_) => break,
                Err(_) if t.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("the daemon lost connection {i}: {e}"),
            }
        }
    }
}

#[test]
fn child_port_takeover() {
    let Some(()) = child_role("port-takeover") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).unwrap();
    let port: u16 = env("TCPS_IT_PORT").parse().unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let r = c.setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_REPAIR, 1);
    mark("tcp-repair", result_name(&r));
    let r = c.bind(s, &SocketAddr::from(([127, 0, 0, 1], port)));
    mark("bind", result_name(&r));
    if r.is_ok() {
        let _ = c.listen(s, 16);
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Through the raw protocol, the server sets no privileged or
/// pointer-holding option for a host (whoever it is), and creates and
/// binds no socket for a local host.
fn server_refuses_privileged_options_and_socket_ops(engine: &str) {
    let srv = open_server(engine);
    let raw = Raw::new(RawHost::attach(&srv.socket).unwrap());
    let s4 = raw.own_socket(libc::AF_INET);
    let s6 = raw.own_socket(libc::AF_INET6);
    let one = 1i32.to_ne_bytes();
    // IPOPT_SEC (130): a privileged IP option.
    let sec_opt = [130u8, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let checks: Vec<(&str, u32, i32, i32, Vec<u8>)> = vec![
        (
            "TCP_REPAIR",
            s4,
            libc::IPPROTO_TCP,
            libc::TCP_REPAIR,
            one.to_vec(),
        ),
        (
            "IP_OPTIONS",
            s4,
            libc::IPPROTO_IP,
            libc::IP_OPTIONS,
            sec_opt.to_vec(),
        ),
        (
            "IPV6_HOPOPTS",
            s6,
            libc::IPPROTO_IPV6,
            libc::IPV6_HOPOPTS,
            vec![0u8; 8],
        ),
        // Available but not in tcp_allowed_congestion_control here ("reno
        // bbr"); root could set it, nobody could not.
        (
            "TCP_CONGESTION",
            s4,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            not_allowed_cc(),
        ),
        (
            "SO_PREFER_BUSY_POLL",
            s4,
            libc::SOL_SOCKET,
            libc::SO_PREFER_BUSY_POLL,
            one.to_vec(),
        ),
        (
            "IP_XFRM_POLICY",
            s4,
            libc::IPPROTO_IP,
            libc::IP_XFRM_POLICY,
            vec![0u8; 64],
        ),
        (
            "SO_BINDTOIFINDEX",
            s4,
            libc::SOL_SOCKET,
            libc::SO_BINDTOIFINDEX,
            one.to_vec(),
        ),
        ("SO_MARK", s4, libc::SOL_SOCKET, libc::SO_MARK, one.to_vec()),
        (
            "SO_ATTACH_FILTER",
            s4,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            vec![0u8; 16],
        ),
        (
            "SO_PRIORITY 7",
            s4,
            libc::SOL_SOCKET,
            libc::SO_PRIORITY,
            7i32.to_ne_bytes().to_vec(),
        ),
    ];
    for (what, s, level, name, value) in checks {
        assert_eq!(
            errno_name(raw.setsockopt(s, level, name, &value)),
            "EPERM",
            "{what} through the server"
        );
    }
    // What is on the allow-list still works.
    assert_eq!(
        raw.setsockopt(s4, libc::IPPROTO_TCP, libc::TCP_NODELAY, &one),
        0
    );
    assert_eq!(
        raw.setsockopt(s4, libc::SOL_SOCKET, libc::SO_PRIORITY, &6i32.to_ne_bytes()),
        0
    );
    // No socket and no bind for a local host.
    let c = raw.run(Call::Socket {
        domain: libc::AF_INET,
        ty: libc::SOCK_STREAM,
        protocol: 0,
    });
    assert_eq!(
        (c.result, errno_name(c.errno)),
        (-1, "EPERM".into()),
        "Op::Socket"
    );
    let c = raw.run_with(&sockaddr_in(0), |addr| Call::Bind { sock: s4, addr });
    assert_eq!(
        (c.result, errno_name(c.errno)),
        (-1, "EPERM".into()),
        "Op::Bind"
    );
    assert!(
        srv.log_text().contains("socket refused"),
        "{}",
        srv.log_text()
    );
}

/// A congestion control the kernel offers but does not allow to
/// unprivileged users (or a made-up name if every one is allowed).
fn not_allowed_cc() -> Vec<u8> {
    let read =
        |f: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{f}")).unwrap_or_default();
    let allowed = read("tcp_allowed_congestion_control");
    let name = read("tcp_available_congestion_control")
        .split_whitespace()
        .find(|n| !allowed.split_whitespace().any(|a| a == *n))
        .unwrap_or("no-such-cc")
        .to_string();
    name.into_bytes()
}

// ---- finding 2 ---------------------------------------------------------------

/// (a) `nobody` in a user namespace of its own (full capabilities there,
/// as after `unshare -Ur`) gets nothing more through tcps: no low port, no
/// SO_MARK.
fn user_namespace_caps_are_not_believed(engine: &str) {
    require_root("it runs attackers as uid 65534 and binds low ports");
    let srv = open_server(engine);
    let port = free_low_port();
    let exe = world_executable_self(srv.dir.path());
    let mut cmd = child_command_exe(&exe, "child_userns", "userns");
    cmd.env("TCPS_IT_SOCKET", &srv.socket)
        .env("TCPS_IT_PORT", port.to_string())
        .uid(65534)
        .gid(65534);
    // SAFETY: runs in the forked child before exec: only raw syscalls.
    unsafe {
        cmd.pre_exec(enter_own_user_namespace);
    }
    let (st, out, err) = run_child(cmd, Duration::from_secs(30));
    assert!(st.success(), "userns child failed: {st}\n{out}\n{err}");
    let caps = one_mark(&out, "capeff");
    assert_ne!(
        caps, "0000000000000000",
        "the child has capabilities in its namespace"
    );
    assert_eq!(one_mark(&out, "low-bind"), "EACCES", "{out}");
    assert_eq!(one_mark(&out, "so-mark"), "EPERM", "{out}");
}

/// `unshare -Ur`: a new user namespace where this (uid 65534) process is root.
fn enter_own_user_namespace() -> std::io::Result<()> {
    // SAFETY: plain syscalls on constant paths and local buffers.
    unsafe {
        // setuid made the process non-dumpable: /proc/self would be root's.
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
        if libc::unshare(libc::CLONE_NEWUSER) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for (path, text) in [
            (c"/proc/self/setgroups", &b"deny"[..]),
            (c"/proc/self/uid_map", &b"0 65534 1"[..]),
            (c"/proc/self/gid_map", &b"0 65534 1"[..]),
        ] {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, text.as_ptr() as *const libc::c_void, text.len()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
        }
    }
    Ok(())
}

#[test]
fn child_userns() {
    let Some(()) = child_role("userns") else {
        return;
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap_or("")
        .trim()
        .to_string();
    mark("capeff", caps);
    let c = Client::attach(env("TCPS_IT_SOCKET")).unwrap();
    let port: u16 = env("TCPS_IT_PORT").parse().unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let r = c.bind(s, &SocketAddr::from(([127, 0, 0, 1], port)));
    mark("low-bind", result_name(&r));
    let r = c.setsockopt_int(s, libc::SOL_SOCKET, libc::SO_MARK, 7);
    mark("so-mark", result_name(&r));
}

/// (b) `nobody` connects to the control socket from a child that then
/// execs a setuid-root program (still running), and completes the attach
/// itself: the server creates and binds no socket for it, so it cannot
/// bind a low port with the setuid program's capabilities.
fn setuid_exec_after_connect_grants_nothing(engine: &str) {
    require_root("it runs attackers as uid 65534 and binds low ports");
    let Some(setuid) = ["/usr/bin/su", "/bin/su", "/usr/bin/passwd"]
        .into_iter()
        .find(|p| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o4001 == 0o4001)
        })
    else {
        eprintln!("SKIP: no setuid-root program to exec");
        return;
    };
    let srv = open_server(engine);
    let port = free_low_port();
    let out = run_as_nobody(
        &srv,
        "child_setuid_exec",
        "setuid-exec",
        &[
            ("TCPS_IT_PORT", port.to_string()),
            ("TCPS_IT_SETUID", setuid.into()),
        ],
    );
    if marks(&out, "skip").len() == 1 {
        eprintln!("SKIP: {}", one_mark(&out, "skip"));
        return;
    }
    assert_eq!(one_mark(&out, "peer-euid"), "0", "{out}");
    assert_eq!(one_mark(&out, "server-bind"), "EPERM", "{out}");
    assert_eq!(one_mark(&out, "own-bind"), "EACCES", "{out}");
}

/// The effective uid of process `pid` (from its status), if readable.
fn euid_of(pid: i32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uids = s.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn child_setuid_exec() {
    let Some(()) = child_role("setuid-exec") else {
        return;
    };
    let port: u16 = env("TCPS_IT_PORT").parse().unwrap();
    let prog = std::ffi::CString::new(env("TCPS_IT_SETUID")).unwrap();
    let path = std::ffi::CString::new(env("TCPS_IT_SOCKET")).unwrap();
    // SAFETY: sockaddr_un is plain data.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *s as libc::c_char;
    }
    let mut stdin_pipe = [0; 2];
    // SAFETY: plain syscalls; after fork the child only makes raw syscalls.
    let (ctl, pid) = unsafe {
        let ctl = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(ctl >= 0);
        assert_eq!(libc::pipe(stdin_pipe.as_mut_ptr()), 0);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        let argv = [prog.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        let pid = libc::fork();
        if pid == 0 {
            // The child connects (the server sees its pid), then becomes a
            // setuid-root process that waits on its stdin.
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(ctl, &sa as *const _ as *const libc::sockaddr, len) != 0 {
                libc::_exit(3);
            }
            libc::dup2(stdin_pipe[0], 0);
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(4);
        }
        assert!(pid > 0);
        (OwnedFd::from_raw_fd(ctl), pid)
    };
    let t = Instant::now();
    while euid_of(pid) != Some(0) {
        if t.elapsed() > Duration::from_secs(5) {
            mark("skip", "the setuid program did not run as euid 0");
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    mark("peer-euid", 0);
    // Complete the attach over the socket the child connected.
    let raw = Raw::new(attach_over(ctl));
    let c = raw.run(Call::Socket {
        domain: libc::AF_INET,
        ty: libc::SOCK_STREAM,
        protocol: 0,
    });
    let server_bind = if c.result < 0 {
        c.errno
    } else {
        let sock = c.result as u32;
        let b = raw.run_with(&sockaddr_in(port), |addr| Call::Bind { sock, addr });
        if b.result < 0 {
            b.errno
        } else {
            0
        }
    };
    mark("server-bind", errno_name(server_bind));
    // Its own socket: the kernel's answer for uid 65534.
    let own = TcpListener::bind(("127.0.0.1", port));
    mark("own-bind", result_name(&own));
    // SAFETY: our child (its real uid is ours, so we may signal it).
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// The attach handshake over an already connected control socket.
fn attach_over(ctl: OwnedFd) -> RawHost {
    use tcps_proto::handshake::{Hello, Welcome, WELCOME_LEN};
    let hello = Hello::new(std::process::id()).encode();
    tcps_proto::fdpass::send_with_fds(ctl.as_raw_fd(), &hello, &[]).unwrap();
    let mut b = vec![0u8; WELCOME_LEN + 1];
    let (n, fds) = tcps_proto::fdpass::recv_with_fds(ctl.as_raw_fd(), &mut b, 0).unwrap();
    let w = Welcome::decode(&b[..n]).expect("a Welcome");
    assert_eq!(w.status, 0, "{}", w.message);
    let [memfd, doorbell]: [OwnedFd; 2] = fds.try_into().expect("memfd + doorbell");
    let region = tcps_proto::Region::map_from_header(memfd.as_fd(), w.region_size).unwrap();
    let region_size = region.layout().region_size();
    RawHost {
        ctl,
        doorbell,
        memfd,
        region,
        region_size,
    }
}

// ---- finding 3 ---------------------------------------------------------------

/// A host that attached as root and then became `nobody` binds as nobody.
fn credentials_are_the_current_ones(engine: &str) {
    require_root("it runs attackers as uid 65534 and binds low ports");
    let srv = open_server(engine);
    let port = free_low_port();
    let exe = world_executable_self(srv.dir.path());
    let mut cmd = child_command_exe(&exe, "child_setuid_after_attach", "setuid-after-attach");
    cmd.env("TCPS_IT_SOCKET", &srv.socket)
        .env("TCPS_IT_PORT", port.to_string());
    let (st, out, err) = run_child(cmd, Duration::from_secs(30));
    assert!(st.success(), "child failed: {st}\n{out}\n{err}");
    assert_eq!(one_mark(&out, "euid"), "65534", "{out}");
    assert_eq!(one_mark(&out, "low-bind"), "EACCES", "{out}");
}

#[test]
fn child_setuid_after_attach() {
    let Some(()) = child_role("setuid-after-attach") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).unwrap();
    let port: u16 = env("TCPS_IT_PORT").parse().unwrap();
    // SAFETY: dropping every privilege of this process for good.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
        assert_eq!(libc::setresgid(65534, 65534, 65534), 0);
        assert_eq!(libc::setresuid(65534, 65534, 65534), 0);
        mark("euid", libc::geteuid());
    }
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let r = c.bind(s, &SocketAddr::from(([127, 0, 0, 1], port)));
    mark("low-bind", result_name(&r));
}

// ---- finding 4 ---------------------------------------------------------------

/// SO_REUSEPORT groups are per owner: `nobody` cannot join a root
/// daemon's, and a tcps listener made by `nobody` is owned by 65534 (so
/// owner-based firewall rules and reuseport see the real user).
fn reuseport_and_ownership_are_the_hosts(engine: &str) {
    require_root("it runs attackers as uid 65534 and binds low ports");
    let srv = open_server(engine);
    let daemon = reuseport_listener();
    let port = local_port(daemon.as_raw_fd());
    let out = run_as_nobody(
        &srv,
        "child_reuseport",
        "reuseport",
        &[("TCPS_IT_PORT", port.to_string())],
    );
    assert_eq!(one_mark(&out, "reuseport-bind"), "EADDRINUSE", "{out}");
    assert_eq!(one_mark(&out, "listener-uid"), "65534", "{out}");
}

/// A root kernel listener on 127.0.0.1 with SO_REUSEPORT.
fn reuseport_listener() -> OwnedFd {
    let a = sockaddr_in(0);
    // SAFETY: plain syscalls on a fresh socket.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let one: libc::c_int = 1;
        let p = &one as *const libc::c_int as *const libc::c_void;
        assert_eq!(
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, p, 4),
            0
        );
        assert_eq!(libc::bind(fd, a.as_ptr() as *const libc::sockaddr, 16), 0);
        assert_eq!(libc::listen(fd, 16), 0);
        OwnedFd::from_raw_fd(fd)
    }
}

fn local_port(fd: RawFd) -> u16 {
    // SAFETY: getsockname into a local sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: as above.
    let rc = unsafe { libc::getsockname(fd, &mut sa as *mut _ as *mut libc::sockaddr, &mut len) };
    assert_eq!(rc, 0);
    u16::from_be(sa.sin_port)
}

/// The uid /proc/net/tcp shows for the listener on 127.0.0.1:`port`.
fn listener_uid(port: u16) -> Option<String> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let want = format!("0100007F:{port:04X}");
    tcp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&want.as_str()) && f.get(3) == Some(&"0A")).then(|| f[7].to_string())
    })
}

#[test]
fn child_reuseport() {
    let Some(()) = child_role("reuseport") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).unwrap();
    let port: u16 = env("TCPS_IT_PORT").parse().unwrap();
    let s = c.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    c.setsockopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
        .unwrap();
    let r = c.bind(s, &SocketAddr::from(([127, 0, 0, 1], port)));
    mark("reuseport-bind", result_name(&r));
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
    let lport = c.getsockname(l).unwrap().port();
    mark(
        "listener-uid",
        listener_uid(lport).unwrap_or_else(|| "none".into()),
    );
}

// ---- finding 5 ---------------------------------------------------------------

/// Options whose values hold pointers are never read in the server's
/// address space: SO_ATTACH_FILTER answers EPERM whatever its pointer (no
/// EFAULT/EINVAL oracle), and SO_GET_FILTER is refused.
fn pointer_options_are_refused(engine: &str) {
    let srv = open_server(engine);
    let raw = Raw::new(RawHost::attach(&srv.socket).unwrap());
    let s = raw.own_socket(libc::AF_INET);
    // struct sock_fprog { u16 len; (pad); struct sock_filter *filter; }
    let fprog = |len: u16, ptr: u64| {
        let mut v = vec![0u8; 16];
        v[..2].copy_from_slice(&len.to_ne_bytes());
        v[8..].copy_from_slice(&ptr.to_ne_bytes());
        v
    };
    let unmapped = fprog(1, 0x10);
    let empty = fprog(0, 0x10);
    let here = fprog(1, &raw as *const Raw as u64);
    let answers: Vec<String> = [unmapped, empty, here]
        .iter()
        .map(|v| errno_name(raw.setsockopt(s, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, v)))
        .collect();
    assert_eq!(answers, vec!["EPERM"; 3], "SO_ATTACH_FILTER answers");
    let c = raw.run_with(&[0u8; 64], |value| Call::GetSockOpt {
        sock: s,
        level: libc::SOL_SOCKET,
        name: libc::SO_GET_FILTER,
        value,
    });
    assert_eq!(
        (c.result, errno_name(c.errno)),
        (-1, "EPERM".into()),
        "SO_GET_FILTER"
    );
    // A pointer-free read still works.
    let c = raw.run_with(&[0u8; 4], |value| Call::GetSockOpt {
        sock: s,
        level: libc::SOL_SOCKET,
        name: libc::SO_TYPE,
        value,
    });
    assert_eq!(c.result, 0, "SO_TYPE: {c:?}");
}

/// The host library still sets any option the kernel lets the host set,
/// also on a connection the server accepted (on a duplicate of it), and
/// the kernel refuses the rest for the host's own reasons.
fn host_library_sets_options_itself(engine: &str) {
    let srv = open_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let _peer = TcpStream::connect(addr).unwrap();
    let (a, _) = c.accept(l, 0).unwrap();
    // Allowed at the server.
    c.setsockopt_int(a, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
        .unwrap();
    assert_eq!(
        c.getsockopt_int(a, libc::IPPROTO_TCP, libc::TCP_NODELAY)
            .unwrap(),
        1
    );
    // Not on the allow-list: set by this (root) process on its duplicate.
    c.setsockopt_int(a, libc::SOL_SOCKET, libc::SO_MARK, 42)
        .unwrap();
    assert_eq!(
        c.getsockopt_int(a, libc::SOL_SOCKET, libc::SO_MARK)
            .unwrap(),
        42
    );
    // The connection still works.
    assert_eq!(c.send(a, b"hello", 0).unwrap(), 5);
}

/// Every control exchange of a process (socket adoption, memory
/// registration, socket duplicates) goes through one lock: threads doing
/// all of them at once never read each other's replies.
fn control_exchanges_never_mix(engine: &str) {
    let srv = open_server(engine);
    let c = srv.attach();
    let (l, addr) = tcps_listener(&c);
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..30 {
                    if i % 2 == 0 {
                        let s = c.socket(libc::AF_INET6, libc::SOCK_STREAM, 0).unwrap();
                        c.setsockopt_int(s, libc::SOL_SOCKET, libc::SO_MARK, 3)
                            .unwrap();
                        c.close(s).unwrap();
                    } else {
                        let (p, h) = c.alloc_registered(4096).unwrap();
                        assert!(!p.is_null());
                        c.deregister_memory(h).unwrap();
                    }
                }
            })
        })
        .collect();
    // Meanwhile: duplicates of accepted connections (SO_MARK is not on the
    // server's allow-list).
    for _ in 0..10 {
        let _peer = TcpStream::connect(addr).unwrap();
        let (a, _) = c.accept(l, 0).unwrap();
        c.setsockopt_int(a, libc::SOL_SOCKET, libc::SO_MARK, 5)
            .unwrap();
        c.close(a).unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
}

engine_tests!(
    control_exchanges_never_mix,
    nobody_cannot_take_a_root_daemons_port,
    server_refuses_privileged_options_and_socket_ops,
    user_namespace_caps_are_not_believed,
    setuid_exec_after_connect_grants_nothing,
    credentials_are_the_current_ones,
    reuseport_and_ownership_are_the_hosts,
    pointer_options_are_refused,
    host_library_sets_options_itself,
);
