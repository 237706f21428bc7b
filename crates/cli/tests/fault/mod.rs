//! The fault matrix's workloads (`fault_matrix.rs`): the native hosts it
//! kills (children: re-executions of the test binary, each a `child_*`
//! test of this module) and the clients that drive them and check every
//! byte they get back.
#![allow(dead_code)]

use crate::common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcps::Client;

/// How long anything may take to come back after a kill.
pub(crate) const PROMPT: Duration = Duration::from_secs(2);

/// What one point found; empty strings are fine.
#[derive(Default)]
pub(crate) struct Outcome {
    pub(crate) completed: u64,
    pub(crate) cut: u64,
    pub(crate) hang: Vec<String>,
    pub(crate) leak: Vec<String>,
    pub(crate) corrupt: Vec<String>,
    pub(crate) unserved: Vec<String>,
}

impl Outcome {
    pub(crate) fn failed(&self) -> bool {
        !(self.hang.is_empty()
            && self.leak.is_empty()
            && self.corrupt.is_empty()
            && self.unserved.is_empty())
    }
}

/// The deterministic bytes of a file of `len` bytes named by `seed`.
pub(crate) fn file_bytes(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

// ---- the native hosts (children: re-executions of this test binary) ------------

/// Child: attaches, listens, prints the port; each connection sends
/// `LEN SEED\n` and gets [`file_bytes`]`(SEED, LEN)` back (asynchronous or
/// synchronous sends, by SEED), then EOF. Prints `returned ERRNO` and exits
/// if its accept fails (the server died).
#[test]
pub(crate) fn child_fault_serve() {
    let Some(()) = child_role("fault-serve") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    let l = c.tcp_listen("127.0.0.1:0".parse().unwrap(), 64).unwrap();
    mark("port", c.getsockname(l).unwrap().port());
    loop {
        let s = match c.accept(l, 0) {
            Ok((s, _)) => s,
            Err(e) => {
                mark("returned", errno_of(&e));
                std::process::exit(0);
            }
        };
        let c = c.clone();
        std::thread::spawn(move || serve_one(&c, s));
    }
}

pub(crate) fn serve_one(c: &Client, s: u32) {
    let mut req = Vec::new();
    let mut b = [0u8; 64];
    while !req.contains(&b'\n') {
        match c.recv(s, &mut b, 0) {
            Ok(0) | Err(_) => return,
            Ok(n) => req.extend_from_slice(&b[..n]),
        }
    }
    let text = String::from_utf8_lossy(&req);
    let mut f = text.split_whitespace();
    let (Some(Ok(len)), Some(Ok(seed))) = (
        f.next().map(str::parse::<usize>),
        f.next().map(str::parse::<u64>),
    ) else {
        return;
    };
    let body = file_bytes(seed, len);
    let ok = if seed % 2 == 0 {
        body.chunks(64 * 1024)
            .all(|p| c.send_async(s, p, 0).is_ok_and(|n| n == p.len()))
            && c.flush_async(s, Some(PROMPT)).is_ok()
    } else {
        c.send_all(s, &body).is_ok()
    };
    if ok {
        let _ = c.shutdown(s, libc::SHUT_WR);
    }
    let _ = c.close(s);
}

/// The period of the registered stream's pattern.
pub(crate) const PERIOD: usize = 1 << 20;

/// Child: connects to `TCPS_FAULT_ADDR` and streams the region
/// [`file_bytes`]`(TCPS_FAULT_STREAM_SEED, PERIOD)` over and over from
/// registered memory, asynchronously and with no copy, until killed.
#[test]
pub(crate) fn child_fault_stream() {
    let Some(()) = child_role("fault-stream") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    let seed: u64 = env("TCPS_FAULT_STREAM_SEED").parse().unwrap();
    let s = c
        .tcp_connect(env("TCPS_FAULT_ADDR").parse().unwrap())
        .expect("connect");
    let (ptr, mem) = c.alloc_registered(PERIOD).expect("registered memory");
    let pattern = file_bytes(seed, PERIOD);
    // SAFETY: alloc_registered returned PERIOD writable bytes at ptr, ours
    // until the process ends; nothing is in flight yet.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), ptr, PERIOD) };
    mark("streaming", 1);
    let piece = 128 * 1024;
    loop {
        for off in (0..PERIOD).step_by(piece) {
            // SAFETY: off + piece <= PERIOD, inside the registration; the
            // bytes are never written again.
            let p = unsafe { ptr.add(off) };
            if let Err(e) = c.send_async_registered(s, p, piece, 0, mem) {
                mark("returned", errno_of(&e));
                std::process::exit(0);
            }
        }
    }
}

/// Child: blocks in a recv on a connection to `TCPS_FAULT_ADDR` (nothing
/// is ever sent); prints `returned ERRNO` when it comes back.
#[test]
pub(crate) fn child_fault_block() {
    let Some(()) = child_role("fault-block") else {
        return;
    };
    let c = Client::attach(env("TCPS_IT_SOCKET")).expect("attach");
    let s = c
        .tcp_connect(env("TCPS_FAULT_ADDR").parse().unwrap())
        .expect("connect");
    mark("blocked", 1);
    let mut b = [0u8; 16];
    let r = c.recv(s, &mut b, 0);
    mark("returned", r.map_or_else(|e| errno_of(&e), |n| -(n as i32)));
}

pub(crate) fn spawn_child(
    srv: &Server,
    role: &str,
    test: &str,
    envs: &[(&str, String)],
) -> ChildProc {
    let mut cmd = child_command(test, role);
    cmd.env("TCPS_IT_SOCKET", &srv.socket);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    ChildProc::spawn(cmd)
}

pub(crate) fn kill9(kid: &mut ChildProc) {
    let _ = kid.child.kill();
    let _ = kid.child.wait();
}

// ---- the clients (in this process, on kernel sockets) --------------------------

/// Counters the client threads of one point share.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) completed: AtomicU64,
    pub(crate) cut: AtomicU64,
    pub(crate) problems: std::sync::Mutex<Vec<(&'static str, String)>>,
}

impl Tally {
    pub(crate) fn problem(&self, kind: &'static str, what: String) {
        self.problems.lock().unwrap().push((kind, what));
    }

    /// Adds the counts and the problems to `out`.
    pub(crate) fn drain_into(&self, out: &mut Outcome) {
        out.completed += self.completed.load(Ordering::Relaxed);
        out.cut += self.cut.load(Ordering::Relaxed);
        for (kind, what) in self.problems.lock().unwrap().drain(..) {
            match kind {
                "corrupt" => out.corrupt.push(what),
                _ => out.hang.push(what),
            }
        }
    }
}

/// Fetches files from a [`child_fault_serve`] host until `stop`, checking
/// each against its checksum (or, if cut, against its prefix).
pub(crate) fn fetch_files(port: u16, seed: u64, stop: &AtomicBool, tally: &Tally) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let max = if rng.below(4) == 0 { 4 << 20 } else { 64 << 10 };
        let len = 1 + rng.below(max) as usize;
        let fseed = rng.next_u64();
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        s.set_read_timeout(Some(PROMPT)).unwrap();
        if s.write_all(format!("{len} {fseed}\n").as_bytes()).is_err() {
            continue;
        }
        let mut got = Vec::with_capacity(len);
        let r = s.read_to_end(&mut got);
        let want = file_bytes(fseed, len);
        if got.len() > len || got[..] != want[..got.len()] {
            tally.problem(
                "corrupt",
                format!("file {len} B seed {fseed}: bytes differ"),
            );
        } else if got.len() == len {
            tally.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.cut.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = &r {
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                    tally.problem(
                        "hang",
                        format!("file fetch: no byte nor EOF for {PROMPT:?}"),
                    );
                }
            }
        }
    }
}

/// Reads the registered stream from `conn` until EOF or an error,
/// checking every byte against the pattern.
pub(crate) fn read_stream(mut conn: TcpStream, seed: u64, tally: &Tally) {
    conn.set_read_timeout(Some(PROMPT)).unwrap();
    let pattern = file_bytes(seed, PERIOD);
    let mut off = 0usize;
    let mut b = vec![0u8; 256 * 1024];
    loop {
        match conn.read(&mut b) {
            Ok(0) => break,
            Ok(n) => {
                for (i, &x) in b[..n].iter().enumerate() {
                    if x != pattern[(off + i) % PERIOD] {
                        let at = off + i;
                        tally.problem("corrupt", format!("stream byte {at} differs"));
                        return;
                    }
                }
                off += n;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                tally.problem("hang", format!("stream: no byte nor EOF for {PROMPT:?}"));
                return;
            }
            Err(_) => break,
        }
    }
    tally.cut.fetch_add(1, Ordering::Relaxed);
    tally
        .completed
        .fetch_add((off / PERIOD) as u64, Ordering::Relaxed);
}

/// Client threads of one point; each gets its own seed.
pub(crate) struct Clients {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) tally: Arc<Tally>,
    pub(crate) done: std::sync::mpsc::Receiver<()>,
    pub(crate) n: usize,
}

impl Clients {
    pub(crate) fn start(
        n: usize,
        seed: u64,
        f: impl Fn(u64, &AtomicBool, &Tally) + Send + Sync + 'static,
    ) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let f = Arc::new(f);
        let (tx, done) = std::sync::mpsc::channel();
        for i in 0..n {
            let (stop, tally, f, tx) = (stop.clone(), tally.clone(), f.clone(), tx.clone());
            std::thread::spawn(move || {
                f(seed ^ ((i as u64 + 1) * 0x9e37_79b9), &stop, &tally);
                let _ = tx.send(());
            });
        }
        Clients {
            stop,
            tally,
            done,
            n,
        }
    }

    /// Stops the clients; each must finish within `PROMPT` (+1 s slack).
    pub(crate) fn finish(self, out: &mut Outcome) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + PROMPT + Duration::from_secs(1);
        for _ in 0..self.n {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                out.hang.push("a client did not finish".into());
                break;
            }
        }
        self.tally.drain_into(out);
    }
}

/// Waits until a child prints `returned`, within `PROMPT`.
pub(crate) fn returns_promptly(kid: &mut ChildProc, who: &str, out: &mut Outcome) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        kid.read_mark("returned", PROMPT)
    }));
    if r.is_err() {
        out.hang.push(format!(
            "{who}: its blocked call did not return within {PROMPT:?}"
        ));
    }
}

/// Accepts one connection on `l` within 20 s.
pub(crate) fn accept_within(l: &TcpListener) -> TcpStream {
    l.set_nonblocking(true).unwrap();
    let t = Instant::now();
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e)
                if e.kind() == ErrorKind::WouldBlock && t.elapsed() < Duration::from_secs(20) =>
            {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("no connection from the child: {e}"),
        }
    }
}

/// The processes whose parent is `pid`.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|c| {
                    c.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Sends lines to the fork-per-connection server and checks the answers.
pub(crate) fn upper_client(port: u16, seed: u64, stop: &AtomicBool, tally: &Tally) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        s.set_read_timeout(Some(PROMPT)).unwrap();
        let line = format!("line-{seed:x}-{n}\n");
        if s.write_all(line.as_bytes()).is_err() {
            continue;
        }
        let mut got = Vec::new();
        let r = s.read_to_end(&mut got);
        let want = line.to_uppercase().into_bytes();
        if got.len() > want.len() || got[..] != want[..got.len()] {
            tally.problem("corrupt", format!("{line:?} answered {got:?}"));
        } else if got.len() == want.len() {
            tally.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.cut.fetch_add(1, Ordering::Relaxed);
            if r.is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)) {
                tally.problem(
                    "hang",
                    format!("{line:?}: no answer nor EOF for {PROMPT:?}"),
                );
            }
        }
    }
}

/// SET then GET of random values through redis, checked byte for byte.
pub(crate) fn redis_client(port: u16, seed: u64, stop: &AtomicBool, tally: &Tally) {
    let mut rng = Rng::new(seed);
    let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    s.set_read_timeout(Some(PROMPT)).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = std::io::BufReader::new(s);
    while !stop.load(Ordering::Relaxed) {
        // Keys of its own: another client's SET must not change its GET.
        let key = format!("k{seed:x}-{}", rng.below(64));
        let n = 1 + rng.below(32 * 1024) as usize;
        let val = rng.bytes(n);
        let mut cmd = format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n",
            key.len(),
            val.len()
        )
        .into_bytes();
        cmd.extend_from_slice(&val);
        cmd.extend_from_slice(
            format!("\r\n*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes(),
        );
        if w.write_all(&cmd).is_err() {
            return;
        }
        let mut got = Vec::new();
        let want_len = 5 + format!("${}\r\n", val.len()).len() + val.len() + 2;
        let res = (&mut r).take(want_len as u64).read_to_end(&mut got);
        let mut want = b"+OK\r\n".to_vec();
        want.extend_from_slice(format!("${}\r\n", val.len()).as_bytes());
        want.extend_from_slice(&val);
        want.extend_from_slice(b"\r\n");
        if got[..] != want[..got.len()] {
            tally.problem("corrupt", format!("redis GET {key}: reply differs"));
            return;
        }
        if got.len() == want.len() {
            tally.completed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        tally.cut.fetch_add(1, Ordering::Relaxed);
        if res.is_err_and(|e| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)) {
            tally.problem("hang", format!("redis: no reply nor EOF for {PROMPT:?}"));
        }
        return;
    }
}
