//! `tcps stat [--socket PATH] [--json] [--watch SECS]`: what a running TCP
//! server is doing, per attached host and in total.
//!
//! The command connects to the server's control socket and sends a
//! `StatQuery` instead of a `Hello` (`docs/PROTOCOL.md` §1); the server
//! answers with JSON (messages of at most 60 KiB, then an empty one) built
//! from the snapshots its workers publish every 100 ms.

use clap::Args;
use serde_json::Value;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tcps_proto::handshake::{StatQuery, Welcome, STAT_CHUNK, WELCOME_LEN};
use tcps_proto::{Op, MAGIC};

use crate::stat_fabric::fabric_section;
use crate::stat_text::{bytes, delta, num, table};

const AFTER_HELP: &str = "\
Counters (since each host attached; with --watch: during the last interval):
  CALLS       socket calls the host made (requests taken from its channels);
              the \"calls by type\" lines break them down by call (Socket,
              Send, Recv, Accept, ...)
  RTRIPS      channel round trips: completions published, each one a call
              the host waited on (asynchronous sends and kicks need none)
  WAKES       wake-ups of sleeping host threads: futex wakes (a completion,
              receive or accept ring publish, or finished asynchronous send
              found a host thread asleep waiting for it) plus host doorbell
              rings (a thread asleep in poll/epoll on its rings and send
              queues; at most one per server pass)
  ACCEPT e/d  connections accepted ahead into accept rings (eager) / Accept
              requests that went to the kernel (on demand)
  RECV e/d    receives served ahead (into receive rings or answered from the
              read-ahead buffer) / Recv requests that went to the kernel
  EAGER       bytes received eagerly (ahead of the host's recv calls)
  IN, OUT     bytes received from / sent to the network for the host
  REFUSED c/s connections reset by admission limits (--max-conns-per-*) /
              sockets refused by --max-sockets-per-host
  ASYNC       asynchronous sends finished (failed ones in brackets)
  KICKS       AsyncKick requests (host woke a cold send queue)
  RKICKS      RecvKick requests (host resumed a paused receive ring)

Queues right now (as the server's worker last published them, <= 100 ms old):
  PARKED      calls parked at the server waiting for their socket (a
              blocking recv, accept, send or connect)
  POLLS       poll calls parked
  SOCKETS     sockets the host holds (+N: closed, still sending queued data)
  SENDQ b/d   bound send queues with asynchronous sends in progress / those
              sends (descriptors taken, not finished)
  RING-B      bytes waiting in receive rings for the host to recv
  RING-A      connections waiting in accept rings for the host to accept

Balancing (new connections handed to the host as kernel sockets when the
server is the bottleneck and the host has idle CPU; `tcps server --balance`):
  CONNS o/d   connections accepted since the host attached: offloaded (at the
              server) / direct (handed to the host, which runs them itself)
  SHARE       percent of the host's new connections handed over directly now
  WHY         why the share is what it is: server-busy (server the bottleneck,
              host idle: up), host-busy (host the bottleneck, server has room:
              down), light (neither busy: down), steady (loads within 30
              points of each other, or both busy), forced (--balance-force-direct), off (--balance off),
              host-cannot (the host keeps every connection offloaded: the
              native API), start (not measured yet)
  SRV%, HOST% load of the host's server worker (time in passes that found
              work, or waiting for its core) / of the host (CPU and waiting
              for a CPU, of the cores it may use that no worker is pinned
              to), each averaged over the last two 250 ms windows

Fabric (remote hosts over UCX, `tcps server --fabric-listen`; shown when it
listens; a remote host's COMMAND is \"(remote)\": its process is on another node):
  ADDRESS     the remote host's fabric address (its node's, as UCX saw it)
  LINK        up, or lost (the link was cut or silent for 800 ms, the
              endpoint failed, or the host was cut off; the last 16 lost
              links are kept, with why)
  HEARD       time since the last message or keepalive from the host
              (keepalives every 250 ms when idle)
  MSGS o/i    fabric messages the server sent to / received from the host
              (a batch of spans, a keepalive or an attach step each)
  BYTES o/i   their bytes (header and data)

TOTAL covers every host, also those of other users (whose rows only root and
the server's own user see) and hosts that detached (their counters are kept).
Exit status 1 when no server answers.";

#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct StatArgs {
    /// Control socket of the TCP server [default: $TCPS_SOCKET, else /run/tcps/tcps.sock, the same for every user and session]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print the server's answer as JSON (pretty printed) instead of tables
    #[arg(long)]
    pub json: bool,
    /// Ask again every SECS seconds (until interrupted); the tables then
    /// show what the counters did during each interval
    #[arg(long, value_name = "SECS")]
    pub watch: Option<f64>,
}

pub fn run(args: StatArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = args.socket.clone().unwrap_or_else(tcps::default_path);
    let every = match args.watch {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => {
            return Err(format!("--watch needs a positive number of seconds, got {s}").into())
        }
    };
    let mut prev: Option<(Value, Instant)> = None;
    loop {
        let v = query(&socket)?;
        let at = Instant::now();
        let text = if args.json {
            format!("{}\n", serde_json::to_string_pretty(&v)?)
        } else {
            let since = prev.as_ref().map(|(p, t)| (p, at.duration_since(*t)));
            render(&v, &socket, since)
        };
        let Some(every) = every else {
            return print_or_quit(&text);
        };
        // A blank line between reports (not after the last one).
        let text = if args.json { text } else { text + "\n" };
        if let Err(e) = write_stdout(&text) {
            return quiet_if_closed(e);
        }
        prev = Some((v, at));
        std::thread::sleep(every);
    }
}

fn write_stdout(text: &str) -> io::Result<()> {
    use std::io::Write;
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

fn print_or_quit(text: &str) -> Result<(), Box<dyn std::error::Error>> {
    write_stdout(text).or_else(quiet_if_closed)
}

/// A reader that went away (`tcps stat --watch 1 | head`) ends the command
/// quietly and successfully, as with other tools; other errors are errors.
fn quiet_if_closed(e: io::Error) -> Result<(), Box<dyn std::error::Error>> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(format!("cannot write to stdout: {e}").into())
    }
}

pub(crate) fn seqpacket_connect(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: sa/len describe a valid sockaddr_un.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval of the given size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
    Ok(fd)
}

/// Asks the server at `path` for its statistics.
pub fn query(path: &Path) -> Result<Value, String> {
    let fd = seqpacket_connect(path).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            format!("cannot reach the tcps server at {}: {e}", path.display())
        }
        _ => format!(
            "no tcps server at {} (is `tcps server` running?)",
            path.display()
        ),
    })?;
    let q = StatQuery::new(0).encode();
    // SAFETY: q is a valid buffer of its length.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            q.as_ptr() as *const libc::c_void,
            q.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n != q.len() as isize {
        return Err(format!(
            "tcps server at {}: cannot send the query: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    let mut text = Vec::new();
    let mut buf = vec![0u8; STAT_CHUNK + 1];
    loop {
        // SAFETY: reading into a valid buffer of its length.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        if n < 0 {
            return Err(format!(
                "tcps server at {}: no answer: {}",
                path.display(),
                io::Error::last_os_error()
            ));
        }
        let n = n as usize;
        // An empty message (or the server closing) ends the answer.
        if n == 0 {
            break;
        }
        if text.is_empty() && n == WELCOME_LEN {
            if let Some(w) = Welcome::decode(&buf[..n]).filter(|w| w.magic == MAGIC) {
                return Err(format!(
                    "the tcps server at {} does not answer stat queries (an older version?): {}",
                    path.display(),
                    w.message
                ));
            }
        }
        if n > STAT_CHUNK {
            return Err(format!(
                "tcps server at {}: answer message too long",
                path.display()
            ));
        }
        text.extend_from_slice(&buf[..n]);
    }
    let v: Value = serde_json::from_slice(&text).map_err(|e| {
        format!(
            "tcps server at {}: unreadable answer ({} bytes): {e}",
            path.display(),
            text.len()
        )
    })?;
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        return Err(format!("tcps server at {}: {err}", path.display()));
    }
    Ok(v)
}

// ---- rendering ----------------------------------------------------------------

/// The command name of process `pid` as this machine's /proc shows it (like
/// `ss -p`), "-" if it is gone or not visible from here.
fn command_of(pid: u64) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .ok()
        .filter(|c| pid != 0 && !c.is_empty())
        .unwrap_or_else(|| "-".to_string())
}

/// The first cells of a host's row: which host, its process and user. A
/// remote host's process is on another node: its command is not looked up.
fn host_cells(h: &Value) -> Vec<String> {
    let remote = h["remote"].as_bool().unwrap_or(false);
    vec![
        format!("host {}", num(h, "id")),
        num(h, "pid").to_string(),
        if remote {
            "(remote)".to_string()
        } else {
            command_of(num(h, "pid"))
        },
        num(h, "uid").to_string(),
    ]
}

fn counter_cells(c: &Value) -> Vec<String> {
    let failed = num(c, "async_failed");
    vec![
        num(c, "calls_total").to_string(),
        num(c, "round_trips").to_string(),
        (num(c, "wakes") + num(c, "doorbell_rings")).to_string(),
        format!(
            "{}/{}",
            num(c, "accepts_eager"),
            num(c, "accepts_on_demand")
        ),
        format!("{}/{}", num(c, "recvs_eager"), num(c, "recvs_on_demand")),
        bytes(num(c, "bytes_eager")),
        bytes(num(c, "bytes_received")),
        bytes(num(c, "bytes_sent")),
        format!("{}/{}", num(c, "refused_conns"), num(c, "refused_sockets")),
        if failed > 0 {
            format!("{}({failed})", num(c, "async_sends"))
        } else {
            num(c, "async_sends").to_string()
        },
        num(c, "kicks").to_string(),
        num(c, "recv_kicks").to_string(),
    ]
}

fn depth_cells(d: &Value) -> Vec<String> {
    let closing = num(d, "sockets_closing");
    vec![
        num(d, "parked_calls").to_string(),
        num(d, "parked_polls").to_string(),
        if closing > 0 {
            format!("{}+{closing}", num(d, "sockets"))
        } else {
            num(d, "sockets").to_string()
        },
        format!(
            "{}/{}",
            num(d, "send_queues_busy"),
            num(d, "send_descs_pending")
        ),
        bytes(num(d, "recv_ring_bytes")),
        num(d, "accept_ring_records").to_string(),
    ]
}

/// `Socket=3 Connect=1 Send=2` (calls by type, non-zero only, in op order).
fn calls_line(c: &Value) -> String {
    let calls = c.get("calls");
    let parts: Vec<String> = Op::ALL
        .iter()
        .filter_map(|op| {
            let n = calls.map(|m| num(m, op.name())).unwrap_or(0);
            (n > 0).then(|| format!("{}={n}", op.name()))
        })
        .collect();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(" ")
    }
}

/// The TOTAL row: blank host cells, then `cells`.
fn total_row(cells: Vec<String>) -> Vec<String> {
    let mut r = vec![
        "TOTAL".to_string(),
        String::new(),
        String::new(),
        String::new(),
    ];
    r.extend(cells);
    r
}

/// The first lines: the server, its hosts, and whether some are hidden.
fn server_lines(v: &Value, socket: &Path) -> String {
    let server = &v["server"];
    let mut out = format!(
        "tcps server pid {} at {}: {} hosts attached, {} refused, {} detached; {} system calls, {} heap allocations\n",
        num(server, "pid"),
        socket.display(),
        num(server, "hosts_attached"),
        num(server, "hosts_refused"),
        num(server, "hosts_detached"),
        num(server, "syscalls"),
        num(server, "heap_allocations"),
    );
    let hidden = num(v, "hidden_hosts");
    if hidden > 0 {
        out.push_str(&format!(
            "({hidden} hosts of other users not shown; TOTAL includes them)\n"
        ));
    }
    out
}

/// The COUNTERS table (per host and TOTAL) and the calls by type; with
/// `prev`, differences since that earlier answer.
fn counters_section(v: &Value, hosts: &[&Value], prev: Option<(&Value, Duration)>) -> String {
    let prev_host = |id: u64| -> Option<&Value> {
        prev?.0["hosts"]
            .as_array()?
            .iter()
            .find(|h| num(h, "id") == id)
    };
    let counters = |h: &Value, old: Option<&Value>| -> Value {
        match prev {
            Some(_) => delta(&h["counters"], old.map(|o| &o["counters"])),
            None => h["counters"].clone(),
        }
    };
    let total_c = counters(&v["total"], prev.map(|p| &p.0["total"]));
    let title = match prev {
        Some((_, d)) => format!("COUNTERS (last {:.1}s)", d.as_secs_f64()),
        None => "COUNTERS".to_string(),
    };
    let mut rows = Vec::new();
    let mut calls_rows = Vec::new();
    for h in hosts {
        let id = num(h, "id");
        let c = counters(h, prev_host(id));
        let mut r = host_cells(h);
        r.extend(counter_cells(&c));
        rows.push(r);
        calls_rows.push(format!("  pid {}: {}\n", num(h, "pid"), calls_line(&c)));
    }
    rows.push(total_row(counter_cells(&total_c)));
    let mut out = String::from("\n");
    out.push_str(&table(
        &[
            &title,
            "PID",
            "COMMAND",
            "UID",
            "CALLS",
            "RTRIPS",
            "WAKES",
            "ACCEPT e/d",
            "RECV e/d",
            "EAGER",
            "IN",
            "OUT",
            "REFUSED c/s",
            "ASYNC",
            "KICKS",
            "RKICKS",
        ],
        &rows,
    ));
    out.push_str("\ncalls by type:\n");
    for l in calls_rows {
        out.push_str(&l);
    }
    out.push_str(&format!("  TOTAL: {}\n", calls_line(&total_c)));
    out
}

/// The QUEUES NOW table: depths at the time of the answer, never deltas.
fn queues_section(v: &Value, hosts: &[&Value]) -> String {
    let mut rows = Vec::new();
    for h in hosts {
        let mut r = host_cells(h);
        r.extend(depth_cells(&h["depths"]));
        rows.push(r);
    }
    rows.push(total_row(depth_cells(&v["total"]["depths"])));
    let mut out = String::from("\n");
    out.push_str(&table(
        &[
            "QUEUES NOW",
            "PID",
            "COMMAND",
            "UID",
            "PARKED",
            "POLLS",
            "SOCKETS",
            "SENDQ b/d",
            "RING-B",
            "RING-A",
        ],
        &rows,
    ));
    out
}

/// The BALANCE table: offloaded vs direct connections, each host's share
/// now and why (`tcps server --balance`).
fn balance_section(v: &Value, hosts: &[&Value]) -> String {
    let conns = |c: &Value| {
        let off = num(c, "accepts_eager") + num(c, "accepts_on_demand");
        format!("{off}/{}", num(c, "accepts_direct"))
    };
    let mut rows = Vec::new();
    for h in hosts {
        let b = &h["balance"];
        let mut r = host_cells(h);
        r.extend([
            conns(&h["counters"]),
            format!("{}%", num(b, "share_pct")),
            b["reason"].as_str().unwrap_or("-").to_string(),
            format!("{}%", num(b, "server_busy_pct")),
            format!("{}%", num(b, "host_busy_pct")),
        ]);
        rows.push(r);
    }
    let mut total = total_row(vec![conns(&v["total"]["counters"])]);
    total.extend(std::iter::repeat_n(String::new(), 4));
    rows.push(total);
    let mut out = String::from("\n");
    out.push_str(&table(
        &[
            "BALANCE",
            "PID",
            "COMMAND",
            "UID",
            "CONNS o/d",
            "SHARE",
            "WHY",
            "SRV%",
            "HOST%",
        ],
        &rows,
    ));
    out
}

/// The human-readable report of answer `v`; with `prev`, counters are the
/// differences since that earlier answer (`elapsed` before this one).
pub fn render(v: &Value, socket: &Path, prev: Option<(&Value, Duration)>) -> String {
    let hosts: Vec<&Value> = v["hosts"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut out = server_lines(v, socket);
    out.push_str(&counters_section(v, &hosts, prev));
    out.push_str(&queues_section(v, &hosts));
    out.push_str(&balance_section(v, &hosts));
    out.push_str(&fabric_section(v, prev.map(|p| p.0)));
    out
}
