//! Request bodies that arrive in segments, with pauses between them, to
//! nginx under `tcps run --fallback fail` and to the same nginx on kernel
//! sockets: each answer must come (within a bound) and be the same bytes,
//! and an upload must be stored byte for byte.
//!
//! nginx reads with EPOLLET and EPOLLRDHUP: after a short read it does not
//! read again until epoll reports a new arrival, so a segment whose edge
//! is lost leaves the request waiting until its client gives up. The
//! cases run one after another on one nginx (a body kept in a file only
//! and proxied back to the same server, which proxies to a second one;
//! two and three segments; an upload through a proxy; a POST to a static
//! location; a body kept in memory), with a listener no request reaches
//! beside them, as a status port would be: a worker never accepts on it,
//! so it has no accept ring there, and its waits cannot all sleep on the
//! host doorbells.

mod common;
mod preload;

use common::{hex, sha256, Rng, Server, TempDir};
use preload::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a client waits for an answer (the kernel's comes at once).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The pause between two segments of a body.
const PAUSE: Duration = Duration::from_millis(100);

/// One request: its head, and its body in segments (the first sent with
/// the head), each after a pause.
struct Case {
    name: &'static str,
    head: String,
    segments: Vec<Vec<u8>>,
}

/// The listeners of one nginx: the front, the second server the front
/// proxies to, and one no request reaches.
#[derive(Clone, Copy)]
struct Ports {
    front: u16,
    second: u16,
    idle: u16,
}

fn nginx_conf(dir: &Path, tag: &str, p: Ports, master: bool) -> String {
    let d = dir.display();
    // SAFETY: geteuid has no preconditions.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root;\n"
    } else {
        ""
    };
    format!(
        "{user}daemon off;\nmaster_process {};\nworker_processes 1;\npid {d}/{tag}.pid;\n\
         error_log {d}/{tag}-error.log notice;\nevents {{ worker_connections 256; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/tmp-{tag};\n\
         proxy_temp_path {d}/tmp-{tag};\n fastcgi_temp_path {d}/tmp-{tag};\n\
         uwsgi_temp_path {d}/tmp-{tag};\n scgi_temp_path {d}/tmp-{tag};\n\
         server {{\n  listen 127.0.0.1:{f};\n\
           location /file {{ client_body_in_file_only on; proxy_pass http://127.0.0.1:{f}/echo; }}\n\
           location /echo {{ client_body_buffer_size 16k; add_header X-Body \"$request_body\";\n\
             proxy_pass http://127.0.0.1:{s}; }}\n\
           location /up/ {{ proxy_pass http://127.0.0.1:{s}/store/; }}\n\
           location /static/ {{ root {d}/www; }}\n\
         }}\n\
         server {{\n  listen 127.0.0.1:{s};\n\
           location / {{ return 200 \"second\\n\"; }}\n\
           location /store/ {{ root {d}/store-{tag}; dav_methods PUT; }}\n\
         }}\n\
         server {{ listen 127.0.0.1:{i}; return 204; }}\n}}\n",
        if master { "on" } else { "off" },
        f = p.front,
        s = p.second,
        i = p.idle,
    )
}

/// The cases, in the order they run; `upload` is the body stored by the
/// upload case.
fn cases(upload: &[u8]) -> Vec<Case> {
    let ten = b"0123456789";
    let post = |name, path: &str, segments: Vec<Vec<u8>>| {
        let len: usize = segments.iter().map(Vec::len).sum();
        Case {
            name,
            head: format!(
                "POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {len}\r\n\r\n"
            ),
            segments,
        }
    };
    let third = upload.len() / 3;
    let mut up = post(
        "upload via a proxy, 3 segments",
        "/up/upload.bin",
        vec![
            upload[..third].to_vec(),
            upload[third..2 * third].to_vec(),
            upload[2 * third..].to_vec(),
        ],
    );
    up.head = up.head.replacen("POST", "PUT", 1);
    vec![
        post(
            "body in a file only, proxied to itself, 2 segments",
            "/file",
            vec![ten[..5].to_vec(), ten[5..].to_vec()],
        ),
        post(
            "body in a file only, proxied to itself, 3 segments",
            "/file",
            vec![ten[..4].to_vec(), ten[4..7].to_vec(), ten[7..].to_vec()],
        ),
        up,
        post(
            "POST to a static location, 2 segments",
            "/static/index.html",
            vec![ten[..5].to_vec(), ten[5..].to_vec()],
        ),
        post(
            "body in memory, proxied, 2 segments",
            "/echo",
            vec![ten[..3].to_vec(), ten[3..].to_vec()],
        ),
        post(
            "body in a file only again, after the others",
            "/file",
            vec![ten[..5].to_vec(), ten[5..].to_vec()],
        ),
    ]
}

/// Sends `case` to 127.0.0.1:`port` (head and first segment at once, each
/// other segment after [`PAUSE`]) and reads the answer to its end (the
/// server closes: HTTP/1.0). Err: no whole answer within [`ANSWER_WITHIN`]
/// of the last segment.
fn exchange(port: u16, case: &Case) -> Result<Vec<u8>, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    let mut first = case.head.as_bytes().to_vec();
    first.extend_from_slice(&case.segments[0]);
    s.write_all(&first).map_err(|e| format!("send: {e}"))?;
    for seg in &case.segments[1..] {
        std::thread::sleep(PAUSE);
        s.write_all(seg).map_err(|e| format!("send: {e}"))?;
    }
    let deadline = Instant::now() + ANSWER_WITHIN;
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no answer within {ANSWER_WITHIN:?} ({} bytes so far)",
                got.len()
            ));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::Interrupted) => {}
            Err(e) => {
                return Err(format!(
                    "no answer within {ANSWER_WITHIN:?} ({e}; {} bytes so far)",
                    got.len()
                ))
            }
        }
    }
}

/// An answer without what differs between two runs of the same nginx:
/// the Date header, and the ports (in a Location header).
fn normalized(answer: &[u8], p: Ports) -> String {
    let text = String::from_utf8_lossy(answer);
    let mut out: String = text
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("Date: "))
        .collect();
    for (port, name) in [(p.front, "FRONT"), (p.second, "SECOND"), (p.idle, "IDLE")] {
        out = out.replace(&port.to_string(), name);
    }
    out
}

/// What one run saw: each case's answer (normalized), and the SHA-256 of
/// the stored upload.
struct Run {
    answers: Vec<String>,
    stored: String,
}

/// nginx on `net` (`master`: a master and one worker, which inherits the
/// listeners through fork; else one process), the cases sent to it one
/// after another.
fn run(net: Net, srv: &Server, dir: &Path, master: bool, upload: &[u8]) -> Run {
    let tag = format!("{net:?}-{}", if master { "master" } else { "single" });
    let p = Ports {
        front: free_port(),
        second: free_port(),
        idle: free_port(),
    };
    std::fs::create_dir_all(dir.join(format!("tmp-{tag}"))).unwrap();
    std::fs::create_dir_all(dir.join(format!("store-{tag}/store"))).unwrap();
    let conf = nginx_conf(dir, &tag, p, master);
    let (mut nginx, stats, _) = start_nginx_with(net, srv, dir, &conf, p.front, &tag);
    let mut answers = Vec::new();
    for case in cases(upload) {
        let got = exchange(p.front, &case).unwrap_or_else(|e| {
            panic!(
                "{tag}: {}: {e}\nnginx's log:\n{}",
                case.name,
                read(&dir.join(format!("{tag}-error.log")))
            )
        });
        answers.push(normalized(&got, p));
    }
    let stored =
        std::fs::read(dir.join(format!("store-{tag}/store/upload.bin"))).unwrap_or_default();
    stop(&mut nginx.0, libc::SIGQUIT);
    if net == Net::Tcps {
        let procs = if master { 2 } else { 1 };
        let sums = wait_summaries(&stats, procs);
        let accepted: u64 = sums.iter().map(|s| s.accepted).sum();
        assert!(
            sums.len() == procs && accepted >= 8 && sums.iter().all(|s| s.kernel_tcp == 0),
            "{tag}: not offloaded: {sums:?}"
        );
    }
    Run {
        answers,
        stored: hex(&sha256(&stored)),
    }
}

/// Both runs of one nginx mode: the same answers, each as expected, and
/// the upload stored whole.
fn compare(master: bool) {
    need("nginx");
    let srv = Server::start("uring", &["--poll", "adaptive"]);
    let dir = TempDir::new("nginx-body");
    std::fs::create_dir_all(dir.path().join("www/static")).unwrap();
    std::fs::write(dir.path().join("www/static/index.html"), b"static\n").unwrap();
    let upload = Rng::new(28).bytes(200_000 + 7);
    let kernel = run(Net::Kernel, &srv, dir.path(), master, &upload);
    let tcps = run(Net::Tcps, &srv, dir.path(), master, &upload);
    let want = hex(&sha256(&upload));
    assert_eq!(kernel.stored, want, "kernel run: upload stored wrong");
    assert_eq!(tcps.stored, want, "tcps run: upload stored wrong");
    for ((k, t), case) in kernel.answers.iter().zip(&tcps.answers).zip(cases(&upload)) {
        assert_eq!(k, t, "{}: the answers differ (left: kernel)", case.name);
    }
    let expect = [
        "X-Body: 0123456789",
        "X-Body: 0123456789",
        "201 Created",
        "405 Not Allowed",
        "X-Body: 0123456789",
        "X-Body: 0123456789",
    ];
    for (a, e) in kernel.answers.iter().zip(expect) {
        assert!(a.contains(e), "kernel answer without {e:?}:\n{a}");
    }
}

/// nginx with a master and one worker: the worker inherited its
/// listeners, one of which it never accepts on.
#[test]
fn body_segments_master_and_worker() {
    compare(true);
}

/// nginx as one process (`master_process off`).
#[test]
fn body_segments_single_process() {
    compare(false);
}
