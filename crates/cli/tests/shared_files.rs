//! sendfile on a TCP server on another node (`tcps run --remote`) with
//! `tcps server --shared-files DIR`: a file inside DIR that the server
//! node holds too is read there (no file byte crosses the fabric); any
//! other file's bytes are sent by the host.
//!
//! One machine plays both nodes: the server runs in a mount namespace of
//! its own in which DIR is a different directory (its "node's copy"). A
//! file there with the same size and modification time but other bytes
//! shows which side read it: the client receives the server node's bytes
//! only if the server opened the file itself. The same-size files that
//! differ in mtime, that the host's mapped uid may not read on the server
//! node, or that lie outside DIR must arrive as the host's bytes. A local
//! host gets no path opened for it at all.

mod common;
mod fabric_host;

use common::*;
use fabric_host::*;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Python file server: for each connection, a path on one line, then the
/// file sent with os.sendfile and the connection closed.
const FILE_SERVER: &str = r#"
import os, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print("READY", flush=True)
while True:
    c, _ = s.accept()
    name = b""
    while not name.endswith(b"\n"):
        b = c.recv(4096)
        if not b:
            break
        name += b
    with open(name.strip(), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        off = 0
        while off < size:
            n = os.sendfile(c.fileno(), f.fileno(), off, size - off)
            if n == 0:
                break
            off += n
    c.close()
"#;

/// Writes `bytes` to `path` with modification time `mtime_ns` and `mode`.
fn put(path: &Path, bytes: &[u8], mtime_ns: i64, mode: u32) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    let t = libc::timespec {
        tv_sec: mtime_ns / 1_000_000_000,
        tv_nsec: mtime_ns % 1_000_000_000,
    };
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: utimensat on a NUL-terminated path with two timespecs.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), [t, t].as_ptr(), 0) },
        0
    );
}

fn fetch(port: u16, path: &Path) -> Vec<u8> {
    let mut k = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    k.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    k.write_all(format!("{}\n", path.display()).as_bytes())
        .unwrap();
    let mut got = Vec::new();
    k.read_to_end(&mut got).unwrap();
    got
}

/// Kills and reaps the child on drop.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, log: &Path, mut ready: impl FnMut(&str) -> bool) {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if ready(&text) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{what}: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn remote_sendfile_reads_shared_files_at_the_server() {
    let t = TempDir::new("shared-files");
    let (www, view, other) = (
        t.path().join("www"),
        t.path().join("view"),
        t.path().join("other"),
    );
    for d in [&www, &view, &other] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut rng = Rng::new(17);
    let when = 1_700_000_000_123_456_789i64;
    let size = 3 << 20; // over the send queue's room: queued and synchronous parts
    let file = |name: &str| (www.join(name), rng.bytes(size), rng.bytes(size));
    let [shared, stale, private] = ["shared.bin", "stale.bin", "private.bin"].map(file);
    // The host's files, and the server node's copies of the same size.
    for (p, host, srv) in [&shared, &stale, &private] {
        put(p, host, when, 0o644);
        put(&view.join(p.file_name().unwrap()), srv, when, 0o644);
    }
    // Differs in mtime there; there only its owner (root) may read it.
    put(&view.join("stale.bin"), &stale.2, when + 1_000, 0o644);
    put(&view.join("private.bin"), &private.2, when, 0o600);
    let outside = (other.join("outside.bin"), rng.bytes(size));
    put(&outside.0, &outside.1, when, 0o644);

    let key = key_file(t.path(), "fabric.key", SECRET);
    let socket = t.path().join("tcps.sock");
    let (srv_log, app_log) = (t.path().join("server.log"), t.path().join("app.log"));
    let app_err = t.path().join("app.err");
    let fabric = format!("127.0.0.1:{}", free_port());
    // The server node: DIR is `view` in its own mount namespace.
    let script = format!(
        "mount --bind {view} {www} && exec {TCPS} server --socket {socket} --balance off \
         --fabric-listen {fabric} --fabric-auth {key} --shared-files {www}",
        view = view.display(),
        www = www.display(),
        socket = socket.display(),
        key = key.display(),
    );
    let _server = Reaped(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stderr(std::fs::File::create(&srv_log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for("server did not start", &srv_log, |l| {
        l.contains("fabric listener")
    });

    let prog = t.path().join("files.py");
    std::fs::write(&prog, FILE_SERVER).unwrap();
    let port = free_port();
    let _app = Reaped(
        Command::new(TCPS)
            .args([
                "run",
                "--fallback",
                "fail",
                "--remote",
                &fabric,
                "--fabric-auth",
            ])
            .arg(&key)
            .env("TCPS_LOG", "debug")
            .args(["--", "python3"])
            .arg(&prog)
            .arg(port.to_string())
            .stdout(std::fs::File::create(&app_log).unwrap())
            .stderr(std::fs::File::create(&app_err).unwrap())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("file server did not start", &app_log, |l| {
        l.contains("READY")
    });

    let check = |what: &str, path: &Path, want: &[u8], not: &[u8]| {
        let got = fetch(port, path);
        let n = got.len();
        let got = sha256(&got);
        assert!(
            got == sha256(want),
            "{what}: wrong bytes arrived ({n} of {}; the other node's copy: {})\n\
             program: {}\nserver: {}",
            want.len(),
            got == sha256(not),
            std::fs::read_to_string(&app_err).unwrap_or_default(),
            std::fs::read_to_string(&srv_log).unwrap_or_default(),
        );
    };
    // Read at the server: the server node's bytes arrive (twice: the second
    // time from the library's cached handle).
    check("shared file", &shared.0, &shared.2, &shared.1);
    check("shared file again", &shared.0, &shared.2, &shared.1);
    // Not the same file there (mtime), not readable there by the mapped
    // uid (65534), not in the tree: the host's own bytes arrive.
    check("changed on the server node", &stale.0, &stale.1, &stale.2);
    check(
        "private on the server node",
        &private.0,
        &private.1,
        &private.2,
    );
    check("outside the shared tree", &outside.0, &outside.1, &[]);
    check(
        "shared file after the others",
        &shared.0,
        &shared.2,
        &shared.1,
    );

    // A local host passes descriptors (the kernel checked it may open
    // them): the server opens no path for it, shared tree or not.
    let local = RawCalls::new(RawHost::attach(&socket).expect("local attach"));
    let path = shared.0.as_os_str().as_encoded_bytes();
    let c = local.run_with(path, |path| tcps_proto::Call::FileOpen {
        handle: 1,
        path,
        size: size as u64,
        mtime_ns: when as u64,
    });
    assert_eq!((c.result, c.errno), (-1, libc::EOPNOTSUPP), "{c:?}");
}
