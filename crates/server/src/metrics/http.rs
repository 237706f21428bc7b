//! The HTTP side of `--metrics-listen`: one thread serves every open
//! connection at once with one `poll(2)`, each with its own deadline
//! ([`CLIENT_BUDGET`] from its accept to the end of its answer), and at
//! most [`MAX_CLIENTS`] open: a new connection beyond that drops the oldest.
//!
//! So clients that connect and say nothing (slowloris) cost the scraper
//! nothing: it is answered as soon as its request is in, whatever the
//! others do. The thread reads only the stats board, never a `Host`, so
//! nothing a client does can delay a worker or an attach.

use super::render;
use crate::shared::Shared;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// Longest time one client may take to send its request and read the reply.
const CLIENT_BUDGET: Duration = Duration::from_secs(1);
/// Longest request accepted (request line and headers).
const MAX_REQUEST: usize = 8192;
/// Most connections open at once; a new one beyond drops the oldest.
/// Scrapers are few and quick: the cap bounds what strangers can hold
/// (descriptors, request buffers, rendered answers not yet read).
pub const MAX_CLIENTS: usize = 64;

/// Binds the metrics listener (before the server reports itself started,
/// so a bad address fails `tcps server` at once).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let l = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("--metrics-listen {addr}: {e}")))?;
    l.set_nonblocking(true)?;
    info!(addr = %l.local_addr()?, "metrics listening (GET /metrics)");
    Ok(l)
}

/// One open connection: reading its request, then writing its answer.
struct Conn {
    c: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    req: Vec<u8>,
    /// The answer and how much of it is written (None: still reading).
    out: Option<(Vec<u8>, usize)>,
}

/// What one step of a connection left it as.
enum Step {
    Open,
    Done,
}

impl Conn {
    /// The poll events it waits for.
    fn events(&self) -> libc::c_short {
        if self.out.is_some() {
            libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Reads or writes what it can without blocking; once the request is
    /// in, renders the answer and starts writing it.
    fn step(&mut self, shared: &Shared, per_host: bool) -> io::Result<Step> {
        if self.out.is_none() {
            if !self.read_request()? {
                return Ok(Step::Open);
            }
            self.out = Some((answer(&self.req, shared, per_host), 0));
        }
        self.write_answer()
    }

    /// Reads what has arrived; true once the headers are complete.
    fn read_request(&mut self) -> io::Result<bool> {
        let mut buf = [0u8; 1024];
        loop {
            let n = match self.c.read(&mut buf) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no request")),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.req.extend_from_slice(&buf[..n]);
            if headers_end(&self.req) {
                return Ok(true);
            }
            if self.req.len() > MAX_REQUEST {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request too long",
                ));
            }
        }
    }

    fn write_answer(&mut self) -> io::Result<Step> {
        let Some((out, done)) = self.out.as_mut() else {
            return Ok(Step::Open);
        };
        while *done < out.len() {
            match self.c.write(&out[*done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => *done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Step::Done)
    }
}

/// Whether `req` holds the end of the headers (a bare LF ending is accepted
/// too).
fn headers_end(req: &[u8]) -> bool {
    req.windows(4).any(|w| w == b"\r\n\r\n") || req.windows(2).any(|w| w == b"\n\n")
}

/// The connections of the metrics thread, oldest first.
struct Conns {
    open: Vec<Conn>,
    shared: Arc<Shared>,
    per_host: bool,
}

impl Conns {
    /// Accepts what is waiting (at most [`MAX_CLIENTS`] per pass, so a
    /// flood of connections cannot keep the thread from its clients).
    fn accept(&mut self, l: &TcpListener) {
        for _ in 0..MAX_CLIENTS {
            let (c, peer) = match l.accept() {
                Ok(a) => a,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    debug!(error = %e, "metrics: accept failed");
                    // EMFILE and friends: the listener stays readable, so
                    // pause instead of spinning on it.
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            if c.set_nonblocking(true).is_err() {
                continue;
            }
            if self.open.len() >= MAX_CLIENTS {
                let old = self.open.remove(0);
                debug!(peer = %old.peer, "metrics: too many connections, oldest dropped");
            }
            let deadline = Instant::now() + CLIENT_BUDGET;
            let (req, out) = (Vec::new(), None);
            self.open.push(Conn {
                c,
                peer,
                deadline,
                req,
                out,
            });
        }
    }

    /// Steps the connections `ready` marks (by index in `open`), then
    /// drops those finished, failed or past their deadline.
    fn serve(&mut self, ready: &[bool]) {
        let now = Instant::now();
        let (shared, per_host) = (&self.shared, self.per_host);
        let mut i = 0;
        self.open.retain_mut(|k| {
            let step = if ready.get(i).copied().unwrap_or(false) {
                k.step(shared, per_host)
            } else {
                Ok(Step::Open)
            };
            i += 1;
            match step {
                Ok(Step::Open) if now < k.deadline => true,
                Ok(Step::Open) => {
                    debug!(peer = %k.peer, "metrics: too slow, dropped");
                    false
                }
                Ok(Step::Done) => false,
                Err(e) => {
                    debug!(peer = %k.peer, error = %e, "metrics: scrape not answered");
                    false
                }
            }
        });
    }

    /// Milliseconds until the nearest deadline (at most a second, so the
    /// shutdown is seen in time either way).
    fn timeout_ms(&self) -> i32 {
        let now = Instant::now();
        let next = self
            .open
            .iter()
            .map(|k| k.deadline.saturating_duration_since(now))
            .min();
        let t = next
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        // Round up: waking before the deadline would only poll again.
        i32::try_from(t.as_millis()).unwrap_or(1000) + 1
    }
}

/// Serves scrapes until the shutdown eventfd becomes readable (checked at
/// least once a second).
pub fn serve(l: TcpListener, shutdown_fd: RawFd, shared: Arc<Shared>, per_host: bool) {
    let mut conns = Conns {
        open: Vec::new(),
        shared,
        per_host,
    };
    let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CLIENTS + 2);
    let mut ready: Vec<bool> = Vec::with_capacity(MAX_CLIENTS);
    loop {
        pfds.clear();
        let fds = [(l.as_raw_fd(), libc::POLLIN), (shutdown_fd, libc::POLLIN)];
        let conn_fds = conns.open.iter().map(|k| (k.c.as_raw_fd(), k.events()));
        for (fd, events) in fds.into_iter().chain(conn_fds) {
            pfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
        let nfds = libc::nfds_t::try_from(pfds.len()).unwrap_or(0);
        // SAFETY: pfds is a valid, writable array of nfds entries.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), nfds, conns.timeout_ms()) };
        if n > 0 && pfds[1].revents != 0 {
            return;
        }
        ready.clear();
        ready.extend(pfds[2..].iter().map(|p| n > 0 && p.revents != 0));
        // Connections first (they were polled), then new ones.
        conns.serve(&ready);
        if n > 0 && pfds[0].revents != 0 {
            conns.accept(&l);
        }
    }
}

/// The whole HTTP answer to request `req`.
fn answer(req: &[u8], shared: &Shared, per_host: bool) -> Vec<u8> {
    let route = route(req);
    let (status, ctype, body) = match route {
        Route::Metrics { .. } => {
            // SAFETY: geteuid cannot fail.
            let uid = unsafe { libc::geteuid() };
            (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                render(&shared.stat_report(uid), per_host),
            )
        }
        Route::NotFound { .. } => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "tcps server: the metrics are at /metrics\n".to_string(),
        ),
        Route::BadMethod => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "tcps server: only GET /metrics\n".to_string(),
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !route.head() {
        out.push_str(&body);
    }
    out.into_bytes()
}

/// What a scraper's request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (`head`: HEAD, headers only); a query string is ignored.
    Metrics { head: bool },
    /// GET or HEAD of another path.
    NotFound { head: bool },
    /// Any other method, or no request line.
    BadMethod,
}

impl Route {
    fn head(self) -> bool {
        matches!(
            self,
            Route::Metrics { head: true } | Route::NotFound { head: true }
        )
    }
}

/// Parses the request line of `req` (any bytes: the scraper is untrusted).
pub fn route(req: &[u8]) -> Route {
    let line = req
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::BadMethod,
    };
    if path == "/metrics" {
        Route::Metrics { head }
    } else {
        Route::NotFound { head }
    }
}
