//! The integrity matrix's parts: the TCP server configurations it covers,
//! the programs it runs and the client cases it drives against them.

#![allow(dead_code)]

pub mod client;

use crate::common::{Server, TempDir};
use crate::preload::*;
use client::{echo, Conn, Got, Reader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One configuration of the TCP server and the preload.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub engine: &'static str,
    pub balance: &'static str,
    pub eager_recv: &'static str,
    pub async_send: bool,
}

/// Every pair of values of any two dimensions appears in some row (a
/// pairwise cover of engine × balancing × eager receive × asynchronous
/// sends: 6 rows instead of 24).
pub const CONFIGS: [Config; 6] = [
    cfg("uring", "on", "push", true),
    cfg("uring", "off", "pull", false),
    cfg("epoll", "on", "off", false),
    cfg("epoll", "off", "push", true),
    cfg("uring", "off", "off", true),
    cfg("epoll", "on", "pull", true),
];

const fn cfg(
    engine: &'static str,
    balance: &'static str,
    eager_recv: &'static str,
    async_send: bool,
) -> Config {
    Config {
        engine,
        balance,
        eager_recv,
        async_send,
    }
}

impl Config {
    pub fn server(&self) -> Server {
        Server::start(
            self.engine,
            &["--balance", self.balance, "--eager-recv", self.eager_recv],
        )
    }
}

/// `TCPS_INTEGRITY_SOAK=1`: the long version (a 1 GiB file, more
/// connections); `scripts/soak.sh` runs it in a loop.
pub fn soak() -> bool {
    std::env::var_os("TCPS_INTEGRITY_SOAK").is_some_and(|v| v != "0")
}

/// The files the HTTP servers serve: name and size (odd sizes cross every
/// buffer boundary; the largest takes many send-queue rounds).
pub fn files() -> Vec<(&'static str, usize)> {
    let mut f = vec![
        ("1b", 1),
        ("64k1", (64 << 10) + 1),
        ("1m3", (1 << 20) + 3),
        ("16m", 16 << 20),
        ("64m", 64 << 20),
    ];
    if soak() {
        f.push(("1g", 1 << 30));
    }
    f
}

/// Writes the files into `www` (seeded, so every run serves the same
/// bytes); returns what a GET of each should give.
pub fn make_files(www: &Path) -> Vec<(String, Got)> {
    std::fs::create_dir_all(www).expect("www");
    let mut rng = crate::common::Rng::new(28);
    files()
        .into_iter()
        .map(|(name, len)| {
            let body = rng.bytes(len);
            std::fs::write(www.join(name), &body).expect("write file");
            (name.to_string(), Got::of(200, &body))
        })
        .collect()
}

/// The expected answer for `name`.
pub fn want<'a>(files: &'a [(String, Got)], name: &str) -> &'a Got {
    &files.iter().find(|(n, _)| n == name).expect("a file").1
}

/// What an HTTP program can take: keep-alive connections (pipelining), and
/// how many connections at once (Python's `http.server` listens with a
/// backlog of 5).
#[derive(Clone, Copy)]
pub struct Shape {
    pub keep_alive: bool,
    pub conns: usize,
}

/// The HTTP cases, each a list of (what, answer): every file fast on one
/// keep-alive connection (or one each, without keep-alive), the 1 MiB
/// file to a slow reader with a small window, pipelined requests, a
/// request after a half-close, a download reset in the middle and one
/// fetched after it, and many connections at once.
pub fn http_cases(
    port: u16,
    files: &[(String, Got)],
    shape: Shape,
    tag: &str,
) -> Vec<(String, Got)> {
    let keep_alive = shape.keep_alive;
    let mut out = Vec::new();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    if keep_alive {
        let mut c = Conn::open(port, Reader::Fast, &format!("{tag} keep-alive"));
        for n in &names {
            c.get(&[n], false);
            out.push((format!("fast {n}"), c.response(Reader::Fast)));
        }
        let mut c = Conn::open(port, Reader::Fast, &format!("{tag} pipelined"));
        let batch = ["64k1", "1b", "1m3", "64k1"];
        c.get(&batch, false);
        for n in batch {
            out.push((format!("pipelined {n}"), c.response(Reader::Fast)));
        }
    } else {
        for n in &names {
            let mut c = Conn::open(port, Reader::Fast, &format!("{tag} fast {n}"));
            c.get(&[n], true);
            out.push((format!("fast {n}"), c.response(Reader::Fast)));
        }
    }
    let mut c = Conn::open(port, Reader::Slow, &format!("{tag} slow"));
    c.get(&["1m3"], true);
    out.push(("slow 1m3".into(), c.response(Reader::Slow)));
    let mut c = Conn::open(port, Reader::Fast, &format!("{tag} half-close"));
    c.get(&["1m3"], true);
    c.shutdown_write();
    out.push(("half-closed 1m3".into(), c.response(Reader::Fast)));
    let mut c = Conn::open(port, Reader::Fast, &format!("{tag} reset"));
    c.get(&["64m"], true);
    c.reset_after(1 << 20);
    let mut c = Conn::open(port, Reader::Fast, &format!("{tag} after reset"));
    c.get(&["1m3"], true);
    out.push(("after a reset 1m3".into(), c.response(Reader::Fast)));
    out.push(("many".into(), many_http(port, shape, tag)));
    out
}

/// Connections open at once in the many-connections cases.
pub fn many() -> usize {
    if soak() {
        400
    } else {
        100
    }
}

/// `shape.conns` connections at once, each fetching the 64 KiB file and
/// the 1-byte file (pipelined where keep-alive allows): one answer, of
/// all of them in connection order.
fn many_http(port: u16, shape: Shape, tag: &str) -> Got {
    let keep_alive = shape.keep_alive;
    let go = std::sync::Arc::new(std::sync::Barrier::new(shape.conns));
    let threads: Vec<_> = (0..shape.conns)
        .map(|i| {
            let go = go.clone();
            let what = format!("{tag} many #{i}");
            std::thread::spawn(move || {
                let mut c = Conn::open(port, Reader::Fast, &what);
                go.wait();
                let mut got = Vec::new();
                if keep_alive {
                    c.get(&["64k1", "1b"], true);
                    got.push(c.response(Reader::Fast));
                    got.push(c.response(Reader::Fast));
                } else {
                    c.get(&["64k1"], true);
                    got.push(c.response(Reader::Fast));
                }
                got
            })
        })
        .collect();
    let all: Vec<Got> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("a many-connections client"))
        .collect();
    summary(&all)
}

/// One answer standing for a list of them (their lengths and hashes).
fn summary(all: &[Got]) -> Got {
    let text: String = all
        .iter()
        .map(|g| format!("{} {} {}\n", g.status, g.len, g.sha))
        .collect();
    Got::of(all.len() as u32, text.as_bytes())
}

/// What [`http_cases`] should answer, from the files alone.
pub fn http_expected(files: &[(String, Got)], shape: Shape) -> Vec<(String, Got)> {
    let keep_alive = shape.keep_alive;
    let mut out = Vec::new();
    for (n, g) in files {
        out.push((format!("fast {n}"), g.clone()));
    }
    if keep_alive {
        for n in ["64k1", "1b", "1m3", "64k1"] {
            out.push((format!("pipelined {n}"), want(files, n).clone()));
        }
    }
    let m = want(files, "1m3").clone();
    out.push(("slow 1m3".into(), m.clone()));
    out.push(("half-closed 1m3".into(), m.clone()));
    out.push(("after a reset 1m3".into(), m));
    let one: Vec<Got> = if keep_alive {
        vec![want(files, "64k1").clone(), want(files, "1b").clone()]
    } else {
        vec![want(files, "64k1").clone()]
    };
    let all: Vec<Got> = (0..shape.conns).flat_map(|_| one.clone()).collect();
    out.push(("many".into(), summary(&all)));
    out
}

/// The raw-stream cases against an echo server: sizes from 1 byte to
/// 8 MiB (1 GiB in the soak), sent whole or in segments with pauses (a
/// request body in two halves 100 ms apart), each half-closed after its
/// last byte; and many echoes at once. Returns (what, echo, sent).
pub fn echo_cases(port: u16, tag: &str) -> Vec<(String, Got, Got)> {
    let mut rng = crate::common::Rng::new(5);
    let mut shapes = vec![
        (1usize, 1usize, 0u64),
        (10, 2, 100),
        (100_000, 3, 50),
        (8 << 20, 1, 0),
        ((8 << 20) + 7, 16, 5),
    ];
    if soak() {
        shapes.push((1 << 30, 1, 0));
    }
    let mut out = Vec::new();
    for (len, segments, pause) in shapes {
        let data = rng.bytes(len);
        let what = format!("echo {len} B in {segments} segment(s) {pause} ms apart");
        let got = echo(
            port,
            &data,
            segments,
            Duration::from_millis(pause),
            &format!("{tag} {what}"),
        );
        out.push((what, got, Got::of(0, &data)));
    }
    let data = rng.bytes(64 << 10);
    let threads: Vec<_> = (0..many() / 2)
        .map(|i| {
            let d = data.clone();
            let what = format!("{tag} many echoes #{i}");
            std::thread::spawn(move || echo(port, &d, 2, Duration::from_millis(20), &what))
        })
        .collect();
    let all: Vec<Got> = threads
        .into_iter()
        .map(|t| t.join().expect("an echo client"))
        .collect();
    let sent = vec![Got::of(0, &data); many() / 2];
    out.push(("many echoes".into(), summary(&all), summary(&sent)));
    out
}

/// A program of the matrix, started on `net`.
pub struct Program {
    pub child: Daemon,
    pub port: u16,
    pub log: PathBuf,
}

/// Starts `argv` (`{port}` replaced by a free port) on `net` (for tcps:
/// through `srv`, with asynchronous sends as `cfg` says).
pub fn start(
    net: Net,
    srv: &Server,
    cfg: Config,
    dir: &TempDir,
    tag: &str,
    argv: &[&str],
) -> Program {
    let port = free_port();
    let p = port.to_string();
    let argv: Vec<&str> = argv
        .iter()
        .map(|&a| if a == "{port}" { &p[..] } else { a })
        .collect();
    let stats = dir.path().join(format!("{tag}.stats"));
    let log = dir.path().join(format!("{tag}.log"));
    let mut cmd = command(net, srv, &stats, &log, &argv);
    cmd.env("TCPS_ASYNC_SEND", if cfg.async_send { "1" } else { "0" });
    let mut child = Daemon(cmd.spawn().expect("spawn"));
    wait_port(port, &mut child.0, tag, &log);
    Program { child, port, log }
}

/// Proves the program was offloaded: the server counted its accepted
/// connections (handed over directly ones with balancing on).
pub fn assert_offloaded(srv: &Server, cfg: Config, tag: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = srv.stat_json();
        let hosts = v["hosts"].as_array().cloned().unwrap_or_default();
        let sum = |k: &str| -> u64 {
            hosts
                .iter()
                .map(|h| h["counters"][k].as_u64().unwrap_or(0))
                .sum()
        };
        let offloaded = sum("accepts_eager") + sum("accepts_on_demand");
        let direct = sum("accepts_direct");
        let ok = if cfg.balance == "off" {
            offloaded > 0 && direct == 0
        } else {
            offloaded + direct > 0
        };
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tag}: the server saw no accepted connection (offloaded {offloaded}, direct {direct}): {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
