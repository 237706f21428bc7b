//! The data-integrity and liveness matrix: real programs (nginx with
//! `sendfile` on and off, Python's `http.server`, a thread-per-connection
//! Python echo server) × file and stream sizes from 1 byte to 64 MiB
//! (1 GiB in the soak) × the TCP server's configurations (both engines,
//! balancing on and off, eager receive off/pull/push, asynchronous sends on
//! and off: a pairwise cover, `matrix::CONFIGS`) × client behaviours (a
//! fast reader, a slow reader with a small window, pipelined requests,
//! a half-close, a reset in mid-transfer, request bodies split into
//! segments with pauses, many connections at once).
//!
//! Every byte is checked (SHA-256 against the files and streams sent),
//! every read is under a progress watchdog (`client::STALL`: a transfer
//! that stops moving fails the test with how far it got), each program runs
//! first on kernel sockets (which must give the same answers) and the
//! server must have counted the program's connections (no silent
//! fallback). `TCPS_INTEGRITY_SOAK=1` is the long version
//! (`scripts/soak.sh`); `TCPS_INTEGRITY_CONFIGS=0,3` picks rows.

mod common;
mod matrix;
mod preload;

use common::TempDir;
use matrix::*;
use preload::{need, stop, Net};

const ECHO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/echo_threads.py");

/// The configuration rows to run (all unless `TCPS_INTEGRITY_CONFIGS`).
fn configs() -> Vec<Config> {
    match std::env::var("TCPS_INTEGRITY_CONFIGS") {
        Ok(list) => list
            .split(',')
            .filter_map(|i| i.trim().parse::<usize>().ok())
            .filter_map(|i| CONFIGS.get(i).copied())
            .collect(),
        Err(_) => CONFIGS.to_vec(),
    }
}

/// An HTTP server program over `www`, on kernel sockets and then through
/// every configuration: the same answers, and the files' bytes.
fn http_matrix(name: &str, shape: Shape, argv: impl Fn(&std::path::Path) -> Vec<String>) {
    let dir = TempDir::new(name);
    let www = dir.path().join("www");
    let files = make_files(&www);
    std::fs::create_dir_all(dir.path().join("tmp")).expect("tmp");
    let args = argv(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let expected = http_expected(&files, shape);
    let kernel_srv = CONFIGS[0].server();
    let mut k = start(
        Net::Kernel,
        &kernel_srv,
        CONFIGS[0],
        &dir,
        &format!("{name}-kernel"),
        &args,
    );
    let on_kernel = http_cases(k.port, &files, shape, &format!("{name} on kernel sockets"));
    stop(&mut k.child.0, libc::SIGTERM);
    assert_same(&on_kernel, &expected, &format!("{name} on kernel sockets"));
    drop(kernel_srv);
    for (row, cfg) in configs().into_iter().enumerate() {
        let tag = format!("{name} through tcps {cfg:?}");
        let srv = cfg.server();
        let mut p = start(Net::Tcps, &srv, cfg, &dir, &format!("{name}-{row}"), &args);
        let got = http_cases(p.port, &files, shape, &tag);
        assert_offloaded(&srv, cfg, &tag);
        stop(&mut p.child.0, libc::SIGTERM);
        assert_same(&got, &on_kernel, &tag);
        eprintln!("{tag}: {} cases byte-identical", got.len());
    }
}

fn assert_same(got: &[(String, client::Got)], want: &[(String, client::Got)], tag: &str) {
    assert_eq!(got.len(), want.len(), "{tag}: number of cases");
    for ((case, g), (case_w, w)) in got.iter().zip(want) {
        assert_eq!(case, case_w, "{tag}: case order");
        assert_eq!(g, w, "{tag}: {case}: different bytes");
    }
}

fn nginx_args(dir: &std::path::Path, sendfile: bool) -> Vec<String> {
    // One configuration file per port is written by `nginx_conf`; here the
    // port is a placeholder filled in at start, so the file is written per
    // start instead (see `nginx_conf_file`).
    let conf = dir.join(format!("nginx-{sendfile}.conf.in"));
    let d = dir.display();
    let text = format!(
        "worker_processes 1;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log notice;\nevents {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n sendfile {};\n keepalive_requests 100000;\n\
         client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n\
         uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
         server {{ listen 127.0.0.1:PORT; root {d}/www; }}\n}}\n",
        if sendfile { "on" } else { "off" },
    );
    std::fs::write(&conf, text).expect("nginx conf");
    // A shell fills in the port and execs nginx (the same pid: `tcps run`
    // follows the exec).
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "sed s/PORT/$0/ {c} > {c}.$0 && exec nginx -c {c}.$0 -p {d}",
            c = conf.display()
        ),
        "{port}".into(),
    ]
}

fn nginx_shape() -> Shape {
    Shape {
        keep_alive: true,
        conns: many(),
    }
}

#[test]
fn nginx_sendfile_on() {
    need("nginx");
    http_matrix("nginx-sendfile", nginx_shape(), |d| nginx_args(d, true));
}

#[test]
fn nginx_sendfile_off() {
    need("nginx");
    http_matrix("nginx-nosendfile", nginx_shape(), |d| nginx_args(d, false));
}

#[test]
fn python_http_server() {
    need("python3");
    let shape = Shape {
        keep_alive: false,
        conns: 4,
    };
    http_matrix("python-http", shape, |d| {
        let www = d.join("www").display().to_string();
        [
            "python3",
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            "--directory",
            &www,
            "{port}",
        ]
        .map(String::from)
        .to_vec()
    });
}

/// The echo server: every stream comes back whole, on kernel sockets and
/// through every configuration.
#[test]
fn python_echo_streams() {
    need("python3");
    let dir = TempDir::new("echo");
    let argv = ["python3", ECHO, "{port}"];
    let mut runs = vec![(Net::Kernel, CONFIGS[0], "kernel".to_string())];
    for (row, cfg) in configs().into_iter().enumerate() {
        runs.push((Net::Tcps, cfg, format!("{row}")));
    }
    for (net, cfg, row) in runs {
        let tag = format!("echo {net:?} {cfg:?}");
        let srv = cfg.server();
        let mut p = start(net, &srv, cfg, &dir, &format!("echo-{row}"), &argv);
        for (what, got, sent) in echo_cases(p.port, &tag) {
            assert_eq!(got, sent, "{tag}: {what}: the echo differs");
        }
        if net == Net::Tcps {
            assert_offloaded(&srv, cfg, &tag);
        }
        stop(&mut p.child.0, libc::SIGTERM);
        eprintln!("{tag}: every stream echoed whole");
    }
}
