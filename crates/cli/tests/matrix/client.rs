//! The clients of the integrity matrix: HTTP/1.1 requests and raw echo
//! streams over kernel sockets (the client side is never offloaded), each
//! byte hashed as it arrives, and every read under a progress watchdog: a
//! transfer that stops moving for [`STALL`] fails the test with how far it
//! got, instead of hanging it.

use crate::common::{reset_on_close, set_rcvbuf};
use sha2::{Digest, Sha256};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// How long a transfer may stand still before it counts as stalled.
pub const STALL: Duration = Duration::from_secs(5);

/// What a response or a stream came to: status (0 for a raw stream),
/// length and SHA-256 of the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Got {
    pub status: u32,
    pub len: u64,
    pub sha: String,
}

impl Got {
    /// What `body` would come to with `status`.
    pub fn of(status: u32, body: &[u8]) -> Got {
        Got {
            status,
            len: body.len() as u64,
            sha: hex(&Sha256::digest(body)),
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How the client reads.
#[derive(Clone, Copy, Debug)]
pub enum Reader {
    /// As fast as it can, 256 KiB at a time.
    Fast,
    /// A small receive buffer (32 KiB), 2 KiB reads and a pause every
    /// 16 KiB: the sender meets a small, slowly opening window.
    Slow,
}

/// A connection with what was read past the last response.
pub struct Conn {
    s: TcpStream,
    left: Vec<u8>,
    what: String,
}

impl Conn {
    /// Connects to 127.0.0.1:`port` (`reader` decides the receive buffer).
    pub fn open(port: u16, reader: Reader, what: &str) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("{what}: connect to {port}: {e}"));
        if let Reader::Slow = reader {
            set_rcvbuf(&s, 32 << 10);
        }
        s.set_read_timeout(Some(STALL)).expect("read timeout");
        s.set_write_timeout(Some(STALL)).expect("write timeout");
        s.set_nodelay(true).expect("nodelay");
        Conn {
            s,
            left: Vec::new(),
            what: what.to_string(),
        }
    }

    /// Sends `bytes`, failing the test on a stall or an error.
    pub fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.s.write_all(bytes) {
            panic!("{}: send stalled or failed: {e}", self.what);
        }
    }

    /// Sends a GET for each of `paths` at once (pipelined; the last asks
    /// the server to close when `close`).
    pub fn get(&mut self, paths: &[&str], close: bool) {
        let mut req = String::new();
        for (i, p) in paths.iter().enumerate() {
            let last = close && i + 1 == paths.len();
            req += &format!(
                "GET /{p} HTTP/1.1\r\nHost: t\r\n{}\r\n",
                if last { "Connection: close\r\n" } else { "" }
            );
        }
        self.send(req.as_bytes());
    }

    /// Half-closes the sending side.
    pub fn shutdown_write(&self) {
        self.s.shutdown(Shutdown::Write).expect("shutdown");
    }

    /// One read (`reader`'s size) under the watchdog; 0 at the end.
    fn read_some(&mut self, buf: &mut [u8], reader: Reader, done: u64) -> usize {
        let n = match reader {
            Reader::Fast => buf.len(),
            Reader::Slow => 2048.min(buf.len()),
        };
        loop {
            match self.s.read(&mut buf[..n]) {
                Ok(k) => return k,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!(
                        "{}: STALLED: no byte for {STALL:?} after {done} bytes",
                        self.what
                    )
                }
                Err(e) => panic!("{}: read failed after {done} bytes: {e}", self.what),
            }
        }
    }

    /// Reads one response: status line, headers (Content-Length required),
    /// body hashed as it comes.
    pub fn response(&mut self, reader: Reader) -> Got {
        let mut buf = vec![0u8; 256 << 10];
        let head_end = loop {
            if let Some(i) = find(&self.left, b"\r\n\r\n") {
                break i + 4;
            }
            let n = self.read_some(&mut buf, Reader::Fast, self.left.len() as u64);
            assert!(n > 0, "{}: connection closed inside the headers", self.what);
            self.left.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&self.left[..head_end]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{}: bad status line: {head}", self.what));
        let len: u64 = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("{}: no Content-Length: {head}", self.what));
        self.left.drain(..head_end);
        let mut h = Sha256::new();
        let mut got = (self.left.len() as u64).min(len);
        h.update(&self.left[..got as usize]);
        self.left.drain(..got as usize);
        while got < len {
            let want = ((len - got) as usize).min(buf.len());
            let n = self.read_some(&mut buf[..want], reader, got);
            assert!(n > 0, "{}: closed after {got} of {len} bytes", self.what);
            h.update(&buf[..n]);
            got += n as u64;
            if let Reader::Slow = reader {
                if got % (16 << 10) < n as u64 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        Got {
            status,
            len,
            sha: hex(&h.finalize()),
        }
    }

    /// Reads to the end of the stream, hashing; the bytes left over first.
    pub fn to_end(&mut self, reader: Reader) -> Got {
        let mut buf = vec![0u8; 256 << 10];
        let mut h = Sha256::new();
        let mut got = self.left.len() as u64;
        h.update(&self.left);
        self.left.clear();
        loop {
            let n = self.read_some(&mut buf, reader, got);
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            got += n as u64;
        }
        Got {
            status: 0,
            len: got,
            sha: hex(&h.finalize()),
        }
    }

    /// Reads about `n` bytes and then resets the connection (SO_LINGER 0).
    pub fn reset_after(mut self, n: u64) {
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0u64;
        while got < n {
            let k = self.read_some(&mut buf, Reader::Fast, got);
            if k == 0 {
                break;
            }
            got += k as u64;
        }
        reset_on_close(&self.s);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sends `data` to an echo server at `port` in `segments` pieces with
/// `pause` between them, half-closes, and reads the echo to its end (a
/// writer thread, so neither side's buffer fills against the other).
pub fn echo(port: u16, data: &[u8], segments: usize, pause: Duration, what: &str) -> Got {
    let mut c = Conn::open(port, Reader::Fast, what);
    let mut w = c.s.try_clone().expect("clone");
    let data = data.to_vec();
    let name = what.to_string();
    let writer = std::thread::spawn(move || {
        let step = data.len().div_ceil(segments.max(1)).max(1);
        for (i, part) in data.chunks(step).enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            if let Err(e) = w.write_all(part) {
                panic!("{name}: echo send failed: {e}");
            }
        }
        w.shutdown(Shutdown::Write).expect("shutdown");
    });
    let got = c.to_end(Reader::Fast);
    writer.join().expect("echo writer");
    got
}
