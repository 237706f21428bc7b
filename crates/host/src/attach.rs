//! Attaching to a TCP server: the control-socket handshake and the mapping of
//! the channel region it hands over.
//!
//! Every failure is an errno (so `raw_os_error()` works) plus a sentence for
//! humans, kept process-wide for [`last_attach_error`] and
//! `tcps_strerror_last()`.

use std::ffi::OsStr;
use std::io;
use std::mem::{size_of, size_of_val};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tcps_proto::handshake::{self, Hello, Welcome, WELCOME_LEN};
use tcps_proto::{Region, MAGIC, VERSION};

/// How long the handshake may take before we give up on the server.
const HANDSHAKE_TIMEOUT_SECS: libc::time_t = 10;

/// What a successful attach yields: the raw pieces of an attachment, for
/// [`Client`](crate::Client) and for tools and tests that speak the channel
/// protocol themselves.
pub struct Attached {
    /// The control socket; keep it open for the attachment's lifetime.
    pub ctl: OwnedFd,
    /// The server's doorbell eventfd.
    pub doorbell: OwnedFd,
    /// The region's memfd, as the server handed it over (sealed).
    pub memfd: OwnedFd,
    pub region: Region,
}

/// An attach failure: the errno callers see and the explanation.
struct Failure {
    errno: i32,
    message: String,
}

impl Failure {
    fn new(errno: i32, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            message: message.into(),
        }
    }
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// A description of the last attach failure in this process ("" if none).
pub fn last_attach_error() -> String {
    LAST_ERROR
        .lock()
        .map(|s| s.clone())
        .unwrap_or_else(|p| p.into_inner().clone())
}

/// Held across fork by the preload library (`crates/preload/src/fork.rs`):
/// a child must not inherit it locked by another thread of its parent.
pub fn attach_error_lock_for_fork() -> std::sync::MutexGuard<'static, String> {
    LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner())
}

fn record_failure(message: &str) {
    let mut s = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    s.clear();
    s.push_str(message);
}

/// The control socket path when none is given: `$TCPS_SOCKET` (as pinned
/// when the preload library loaded, `settings.rs`), else the protocol's
/// default.
pub fn default_path() -> PathBuf {
    match crate::settings::setting(handshake::SOCKET_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => handshake::default_socket_path(),
    }
}

/// Does the attach handshake with the server listening at `path` and maps
/// the region it hands over, without building a [`Client`](crate::Client).
pub fn attach(path: &Path) -> io::Result<Attached> {
    attach_inner(path).map_err(|f| {
        record_failure(&f.message);
        io::Error::from_raw_os_error(f.errno)
    })
}

/// Does the attach handshake with the server at fabric address `remote`
/// (`ADDR:PORT`, one server of `TCPS_REMOTE`) through a `tcps fabric-pump`
/// helper (`crate::remote`).
pub fn attach_remote(remote: &str) -> io::Result<Attached> {
    attach_remote_inner(remote).map_err(|f| {
        record_failure(&f.message);
        io::Error::from_raw_os_error(f.errno)
    })
}

fn attach_remote_inner(remote: &str) -> Result<Attached, Failure> {
    // Over a fabric: the helper answers the same handshake.
    let ctl = crate::remote::start_pump(remote).map_err(|e| {
        Failure::new(
            e.raw_os_error().unwrap_or(libc::EINVAL),
            format!("tcps: cannot start `tcps fabric-pump` for TCPS_REMOTE={remote}: {e}"),
        )
    })?;
    handshake(ctl, &format!("TCPS_REMOTE={remote}"))
}

fn attach_inner(path: &Path) -> Result<Attached, Failure> {
    if let Some(remote) = crate::remote::address() {
        if remote.contains(',') {
            return Err(Failure::new(
                libc::EINVAL,
                format!(
                    "tcps: TCPS_REMOTE={remote} names several servers: a program under \
                     `tcps run` uses them all; a native host attaches to each with \
                     Client::attach_remote"
                ),
            ));
        }
        return attach_remote_inner(&remote);
    }
    let ctl = connect(path).map_err(|e| {
        let errno = e.raw_os_error().unwrap_or(libc::ECONNREFUSED);
        let errno = match errno {
            libc::ENOENT | libc::ECONNREFUSED => libc::ECONNREFUSED,
            other => other,
        };
        // Permission denied means a server is there but its socket's mode
        // and group keep this user out: say that, not "is it running?".
        let hint = if errno == libc::EACCES || errno == libc::EPERM {
            "(the server's control socket does not let this user in: ask for its group, \
             `tcps server --socket-group`, or use another server with --socket/TCPS_SOCKET)"
        } else {
            "(is `tcps server` running?)"
        };
        Failure::new(
            errno,
            format!(
                "tcps: cannot reach a TCP server at {}: {} {hint}",
                path.display(),
                describe(&e)
            ),
        )
    })?;
    handshake(ctl, &path.display().to_string())
}

/// Hello, then the server's Welcome with the region and the doorbell, on
/// a connected control socket (`at` names the server in errors).
fn handshake(ctl: OwnedFd, at: &str) -> Result<Attached, Failure> {
    let os_fail = |what: &str, e: io::Error| {
        Failure::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("tcps: {what}: {e}"),
        )
    };
    set_recv_timeout(ctl.as_raw_fd())
        .map_err(|e| os_fail("cannot set the control socket timeout", e))?;
    send_hello(ctl.as_raw_fd()).map_err(|e| os_fail("cannot send Hello to the server", e))?;
    let (bytes, fds) = recv_welcome(ctl.as_raw_fd()).map_err(|e| match e.raw_os_error() {
        Some(libc::EAGAIN) => Failure::new(
            libc::ETIMEDOUT,
            format!("tcps: the server at {at} did not answer the attach request"),
        ),
        _ => os_fail("cannot receive the server's Welcome", e),
    })?;
    let welcome = check_welcome(&bytes, &fds)?;
    let [memfd, doorbell]: [OwnedFd; 2] = fds
        .try_into()
        .map_err(|_| Failure::new(libc::EPROTO, "tcps: the server sent no region/doorbell"))?;
    let region = map_region(&memfd, welcome.region_size)?;
    Ok(Attached {
        ctl,
        doorbell,
        memfd,
        region,
    })
}

/// An error in words, without std's " (os error N)" suffix.
fn describe(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Validates a Welcome and turns a refusal into a [`Failure`].
fn check_welcome(bytes: &[u8], fds: &[OwnedFd]) -> Result<Welcome, Failure> {
    let w = Welcome::decode(bytes).ok_or_else(|| {
        Failure::new(
            libc::EPROTO,
            format!("tcps: malformed Welcome ({} bytes)", bytes.len()),
        )
    })?;
    if w.magic != MAGIC {
        return Err(Failure::new(
            libc::EPROTO,
            "tcps: the control socket is not a tcps server",
        ));
    }
    if w.version != VERSION {
        let errno = if w.status != 0 {
            w.status
        } else {
            libc::EPROTO
        };
        return Err(Failure::new(
            errno,
            format!(
                "tcps: protocol version mismatch: server v{}, library v{VERSION}",
                w.version
            ),
        ));
    }
    if w.status != 0 {
        let why = if w.message.is_empty() {
            describe(&io::Error::from_raw_os_error(w.status))
        } else {
            w.message.clone()
        };
        return Err(Failure::new(
            w.status,
            format!("tcps: the server refused to attach: {why}"),
        ));
    }
    if fds.len() != 2 {
        return Err(Failure::new(
            libc::EPROTO,
            format!(
                "tcps: the server sent {} descriptors, expected 2",
                fds.len()
            ),
        ));
    }
    Ok(w)
}

fn map_region(memfd: &OwnedFd, region_size: u64) -> Result<Region, Failure> {
    // Mapping more than the file holds would turn every access past its end
    // into SIGBUS: check the size first.
    // SAFETY: fstat writes into a zeroed `stat` we own; the fd is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(memfd.as_raw_fd(), &mut st) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Failure::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("tcps: fstat on the region: {}", describe(&e)),
        ));
    }
    if (st.st_size as u64) < region_size {
        return Err(Failure::new(
            libc::EPROTO,
            format!(
                "tcps: region file holds {} bytes, Welcome says {region_size}",
                st.st_size
            ),
        ));
    }
    Region::map_from_header(memfd.as_fd(), region_size).map_err(|e| {
        Failure::new(
            e.raw_os_error().unwrap_or(libc::EPROTO),
            format!("tcps: cannot map the channel region: {}", describe(&e)),
        )
    })
}

fn connect(path: &Path) -> io::Result<OwnedFd> {
    let mut addr = sockaddr_un(path.as_os_str())?;
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let p = &mut addr as *mut libc::sockaddr_un as *const libc::sockaddr;
    // SAFETY: `p` points to a complete sockaddr_un of `len` bytes.
    if unsafe { libc::connect(fd.as_raw_fd(), p, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn sockaddr_un(path: &OsStr) -> io::Result<libc::sockaddr_un> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(if bytes.is_empty() {
            libc::ENOENT
        } else {
            libc::ENAMETOOLONG
        }));
    }
    for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    Ok(addr)
}

fn set_recv_timeout(fd: RawFd) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: HANDSHAKE_TIMEOUT_SECS,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a valid timeval of the size we pass.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            size_of_val(&tv) as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn send_hello(fd: RawFd) -> io::Result<()> {
    let hello = Hello::new(std::process::id()).encode();
    // SAFETY: the buffer is valid for its length.
    let n = unsafe {
        libc::send(
            fd,
            hello.as_ptr() as *const libc::c_void,
            hello.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != hello.len() {
        return Err(io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok(())
}

/// Receives one Welcome datagram and any descriptors passed with it.
fn recv_welcome(fd: RawFd) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    // One byte more than a Welcome, so an oversized message shows.
    let mut buf = vec![0u8; WELCOME_LEN + 1];
    let (n, fds) = tcps_proto::fdpass::recv_with_fds(fd, &mut buf, 0)?;
    if n == 0 {
        return Err(io::Error::from_raw_os_error(libc::ECONNRESET));
    }
    buf.truncate(n);
    Ok((buf, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_server_is_econnrefused_with_a_message() {
        let path = Path::new("/nonexistent/tcps-test/none.sock");
        let e = match attach(path) {
            Err(e) => e,
            Ok(_) => panic!("attached to nothing"),
        };
        assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
        let msg = last_attach_error();
        assert!(msg.contains("/nonexistent/tcps-test/none.sock"), "{msg}");
    }

    #[test]
    fn overlong_path_is_refused() {
        let long = "x".repeat(200);
        let e = sockaddr_un(OsStr::new(&long))
            .err()
            .map(|e| e.raw_os_error());
        assert_eq!(e, Some(Some(libc::ENAMETOOLONG)));
    }

    #[test]
    fn welcome_checks() {
        let w = Welcome::refused(libc::EAGAIN, "too many hosts");
        let f = check_welcome(&w.encode(), &[])
            .err()
            .map(|f| (f.errno, f.message));
        let (errno, message) = f.unwrap_or_default();
        assert_eq!(errno, libc::EAGAIN);
        assert!(message.contains("too many hosts"));

        let mut w = Welcome::accepted(4096);
        w.version = VERSION + 1;
        let f = check_welcome(&w.encode(), &[])
            .err()
            .map(|f| f.message)
            .unwrap_or_default();
        assert_eq!(
            f,
            format!(
                "tcps: protocol version mismatch: server v{}, library v{VERSION}",
                VERSION + 1
            )
        );

        let w = Welcome::accepted(4096);
        assert!(
            check_welcome(&w.encode(), &[]).is_err(),
            "an accept needs 2 descriptors"
        );
        assert!(check_welcome(&w.encode()[..10], &[]).is_err());
    }
}
