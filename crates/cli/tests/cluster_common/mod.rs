//! What the cluster tests share (`cluster.rs`, `cluster_multi.rs`): the
//! nodes (`src/cluster_nodes.rs`, which each test crate includes as
//! `crate::cluster_nodes`), TCP servers on server nodes, programs on the
//! application node under `tcps run --remote`, the server's `tcps stat`, and
//! curl on the client node checked against the files by SHA-256.
#![allow(dead_code)]

use crate::cluster_nodes::{self, Nodes};
use crate::common::TCPS;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const PORT: u16 = 7010;
/// The server node's metrics listener (inside its namespace).
pub const METRICS: &str = "127.0.0.1:9477";

pub fn ip(args: &[&str]) {
    cluster_nodes::ip(args).unwrap();
}

/// The nodes of one test (root only): `tcps-{app,srv,cli}-<pid><k>`.
pub fn nodes() -> Nodes {
    let (tag, sub) = tag_sub();
    Nodes::create("tcps-", &tag, sub, false).unwrap()
}

/// The same with a second server node `tcps-srv2-<pid><k>`.
pub fn two_server_nodes() -> Nodes {
    let (tag, sub) = tag_sub();
    Nodes::create_two_servers("tcps-", &tag, sub).unwrap()
}

/// A test's node tag and subnet octet: the tests of a file run at once,
/// each with its own nodes and subnets.
fn tag_sub() -> (String, u32) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the cluster tests need root (network namespaces)"
    );
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 8;
    let pid = std::process::id();
    (format!("{pid}{k}"), (pid % 30) * 8 + k)
}

/// A process in a namespace, killed (SIGKILL) and reaped on drop.
pub struct InNs(pub std::process::Child);

impl Drop for InNs {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn stat_json(socket: &std::path::Path) -> serde_json::Value {
    let out = Command::new(TCPS)
        .args(["stat", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

pub fn hosts_attached(socket: &std::path::Path) -> u64 {
    stat_json(socket)["server"]["hosts_attached"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

/// Waits until the server has no remote host left: how long it took.
pub fn wait_freed(socket: &std::path::Path, limit: Duration, log: &dyn Fn() -> String) -> Duration {
    let t = Instant::now();
    while hosts_attached(socket) != 0 {
        assert!(
            t.elapsed() < limit,
            "a departed remote host was not freed:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

/// The TCP server in the server namespace, its fabric listener on the
/// application link: the server, its control socket, its log, and the
/// fabric address.
pub fn start_server(n: &Nodes, dir: &Path) -> (InNs, PathBuf, PathBuf, String) {
    start_server_in(&n.srv, &n.srv_dev, &n.srv_app_addr, dir, "")
}

/// A TCP server in namespace `ns`, its fabric listener on `listen_ip`
/// (device `dev`), its control socket `tcps{name}.sock` and its log
/// `server{name}.log` in `dir`, the secret `dir/fabric.key`.
pub fn start_server_in(
    ns: &str,
    dev: &str,
    listen_ip: &str,
    dir: &Path,
    name: &str,
) -> (InNs, PathBuf, PathBuf, String) {
    let key = dir.join("fabric.key");
    let socket = dir.join(format!("tcps{name}.sock"));
    let log = dir.join(format!("server{name}.log"));
    let addr = format!("{listen_ip}:{PORT}");
    let server = InNs(
        Command::new("ip")
            .args(["netns", "exec", ns, TCPS, "server", "--socket"])
            .arg(&socket)
            .args(["--fabric-listen", &addr, "--fabric-auth"])
            .env("UCX_NET_DEVICES", dev)
            .arg(&key)
            .args(["--metrics-listen", METRICS, "--metrics-per-host"])
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_text(&log, "fabric listener", Duration::from_secs(30), "server");
    (server, socket, log, addr)
}

/// Waits until `file` contains `text`, at most `limit`; else panics with
/// what did not start, and the file.
pub fn wait_text(file: &Path, text: &str, limit: Duration, what: &str) {
    let t = Instant::now();
    while !std::fs::read_to_string(file)
        .unwrap_or_default()
        .contains(text)
    {
        assert!(
            t.elapsed() < limit,
            "{what} did not start: {}",
            std::fs::read_to_string(file).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Panics (the test fails, it is not skipped) if a program is missing.
pub fn need(progs: &[&str]) {
    for p in progs {
        assert!(
            Command::new("which")
                .arg(p)
                .output()
                .is_ok_and(|o| o.status.success()),
            "{p} is not installed (scripts/test.sh installs it)"
        );
    }
}

/// `args` in namespace `ns`.
pub fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Nodes::exec(ns);
    c.args(args);
    c
}

/// A remote host's environment on the application node (the native way:
/// `TCPS_REMOTE`, `TCPS_FABRIC_AUTH`; `TCPS_BIN` names the helper).
pub fn remote_env<'a>(c: &'a mut Command, n: &Nodes, addr: &str, dir: &Path) -> &'a mut Command {
    c.env("TCPS_REMOTE", addr)
        .env("TCPS_FABRIC_AUTH", dir.join("fabric.key"))
        .env("TCPS_BIN", TCPS)
        .env("UCX_NET_DEVICES", n.app_devs())
}

/// An unmodified program under `tcps run --remote` on the application node.
/// Its output (both streams) goes to `out`.
pub fn run_remote(n: &Nodes, addr: &str, dir: &Path, argv: &[&str], out: &Path) -> InNs {
    let log = std::fs::File::create(out).unwrap();
    InNs(
        remote_cmd(n, addr, dir, argv)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The command `tcps run --remote ADDR --fabric-auth dir/fabric.key --
/// argv` on the application node (`addr` a server or a comma list).
pub fn remote_cmd(n: &Nodes, addr: &str, dir: &Path, argv: &[&str]) -> Command {
    let key = dir.join("fabric.key");
    let mut args = vec![TCPS, "run", "--fallback", "fail", "--remote", addr];
    args.extend(["--fabric-auth", key.to_str().unwrap(), "--"]);
    args.extend_from_slice(argv);
    let mut c = in_ns(&n.app, &args);
    c.env("UCX_NET_DEVICES", n.app_devs());
    c
}

/// Signals the process (`sig`) and waits up to 10 s for it to exit.
pub fn stop_gracefully(mut p: InNs, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(p.0.id() as i32, sig) };
    let t = Instant::now();
    while p.0.try_wait().ok().flatten().is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A GET from the client node: the body, or None.
pub fn curl(n: &Nodes, url: &str) -> Option<Vec<u8>> {
    let out = in_ns(&n.cli, &["curl", "-sf", "--max-time", "20", url])
        .output()
        .ok()?;
    out.status.success().then_some(out.stdout)
}

pub fn wait_http(n: &Nodes, url: &str, log: &dyn Fn() -> String) {
    wait_http_from(n, url, None, log)
}

/// `wait_http` for the server `prog`: fails at once if it exits first
/// (e.g. `tcps run` refused its arguments).
pub fn wait_http_from(n: &Nodes, url: &str, mut prog: Option<&mut InNs>, log: &dyn Fn() -> String) {
    let t = Instant::now();
    while curl(n, url).is_none() {
        if let Some(Ok(Some(st))) = prog.as_mut().map(|p| p.0.try_wait()) {
            panic!("the server exited ({st}) before {url} answered:\n{}", log());
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{url} does not answer:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn sha256(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(b))
}

/// Random files under `root`: 1 byte, 16 KiB, one larger than a channel
/// arena, and 1 MiB + 7.
pub fn www(root: &Path) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut rnd = std::fs::File::open("/dev/urandom").unwrap();
    let mut files = Vec::new();
    for (name, len) in [
        ("one.bin", 1),
        ("index.html", 16384),
        ("sub/big.bin", 300_001),
        ("mega.bin", (1 << 20) + 7),
    ] {
        let mut b = vec![0u8; len];
        rnd.read_exact(&mut b).unwrap();
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &b).unwrap();
        files.push((name.to_string(), b));
    }
    files
}

/// Every file fetched from the client node is the file (SHA-256).
pub fn fetch_all(
    n: &Nodes,
    base: &str,
    files: &[(String, Vec<u8>)],
    what: &str,
    log: &dyn Fn() -> String,
) {
    for (name, bytes) in files {
        let got = curl(n, &format!("{base}/{name}")).unwrap_or_else(|| {
            let again = in_ns(&n.cli, &["curl", "-sS", "-v", "--max-time", "20"])
                .arg(format!("{base}/{name}"))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
            panic!("{what}: GET /{name} failed (again: {again:?})\n{}", log())
        });
        assert_eq!(
            (got.len(), sha256(&got)),
            (bytes.len(), sha256(bytes)),
            "{what}: /{name} differs from the file"
        );
    }
}

/// nginx's configuration `d/nginx.conf` (made): the default master
/// process and two workers, sendfile, `root` served on `port`, its files
/// under `d`.
pub fn nginx_conf(d: &Path, root: &Path, port: u16) -> PathBuf {
    std::fs::create_dir_all(d.join("tmp")).unwrap();
    let conf = format!(
        "worker_processes 2;\ndaemon off;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log notice;\nevents {{ worker_connections 512; }}\n\
         http {{\n access_log off;\n sendfile on;\n client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n\
         fastcgi_temp_path {d}/tmp;\n uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
         server {{ listen {port}; root {}; }}\n}}\n",
        root.display(),
        d = d.display()
    );
    std::fs::write(d.join("nginx.conf"), conf).unwrap();
    d.join("nginx.conf")
}
