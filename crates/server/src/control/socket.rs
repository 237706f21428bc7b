//! The control socket file: creating it (mode, group, a stale file
//! replaced only if nothing answers on it) or taking systemd's (socket
//! activation).

use crate::sys;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use tracing::warn;

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path too long: {}", path.display()),
        ));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok((
        sa,
        (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t,
    ))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds and listens on the control socket. A stale socket file (no server
/// answering) is replaced; a live one is an error, and so is anything at
/// `path` that is not a socket (a typo must not delete a file). The socket
/// gets `mode` and, with `group`, that group: who may attach. It is made
/// under a temporary name and renamed into place once it accepts, so a
/// host that finds the file can attach at once (`tcps run` right after
/// `tcps server`).
pub fn listen(path: &Path, mode: u32, group: Option<u32>) -> io::Result<OwnedFd> {
    let (sa, len) = sockaddr_un(path)?;
    create_parent_dir(path)?;
    if refuse_to_replace(path)? {
        if probe_connect(&sa, len)? {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another tcps server is listening on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| about_path(path, "cannot remove the stale socket", e))?;
    }
    let staging = staging_path(path);
    if staging != path && refuse_to_replace(&staging)? {
        std::fs::remove_file(&staging)
            .map_err(|e| about_path(&staging, "cannot remove a leftover socket", e))?;
    }
    let fd = bind_and_listen(&staging, path, mode, group)?;
    if staging != path {
        if let Err(e) = std::fs::rename(&staging, path) {
            let _ = std::fs::remove_file(&staging);
            return Err(about_path(path, "cannot create the control socket", e));
        }
    }
    if let Some(why) = kept_out(path, mode, group) {
        warn!("{why}");
    }
    Ok(fd)
}

/// Whom the socket's mode and group admit but a directory on its path keeps
/// out (no search permission for them), in a sentence; None if nobody. So
/// `--socket-group` or `--socket-mode 666` on a socket inside a 0700
/// directory (a login session's `$XDG_RUNTIME_DIR`) does not silently mean
/// nothing. Mode bits only: an ACL may still let them in, so a warning,
/// not a refusal.
fn kept_out(path: &Path, mode: u32, group: Option<u32>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // Whom to check: everyone (None), else the socket's group.
    let (who, gid) = if mode & 0o002 != 0 {
        (
            format!("--socket-mode {mode:o} lets every user attach"),
            None,
        )
    } else {
        let gid = group.filter(|_| mode & 0o020 != 0)?;
        (format!("--socket-group lets group {gid} attach"), Some(gid))
    };
    let may_enter = |d: &std::fs::Metadata| {
        d.mode() & 0o001 != 0 || gid.is_some_and(|g| d.gid() == g && d.mode() & 0o010 != 0)
    };
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = std::fs::canonicalize(parent.unwrap_or(Path::new("."))).ok()?;
    let (blocking, meta) = dir.ancestors().find_map(|d| {
        let meta = std::fs::metadata(d).ok()?;
        (!may_enter(&meta)).then(|| (d.to_path_buf(), meta))
    })?;
    Some(format!(
        "{who}, but the directory {} (mode {:o}, owner uid {}, group {}) keeps them from \
         reaching {}: they get EACCES. Put the socket where they may enter (the default \
         /run/tcps/tcps.sock is such a place) or open that directory to them",
        blocking.display(),
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid(),
        path.display()
    ))
}

/// The control socket systemd passed (socket activation: `LISTEN_PID` is
/// this process, `LISTEN_FDS` >= 1, the socket is fd 3) with its path; None
/// when not socket-activated. An error if the passed fd is not a listening
/// AF_UNIX SOCK_SEQPACKET socket (`ListenSequentialPacket=` in the unit).
pub fn activated_listener() -> io::Result<Option<(OwnedFd, std::path::PathBuf)>> {
    const SD_LISTEN_FDS_START: RawFd = 3;
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    if !ours || count == 0 {
        return Ok(None);
    }
    // Not for any program this server might start.
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    let fd = SD_LISTEN_FDS_START;
    let wrong = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the socket systemd passed (fd 3) {what}; use ListenSequentialPacket= in tcps.socket"),
        )
    };
    let sockopt_int =
        |opt| sys::getsockopt_int(fd, libc::SOL_SOCKET, opt).map_err(io::Error::from_raw_os_error);
    if sockopt_int(libc::SO_TYPE)? != libc::SOCK_SEQPACKET
        || sockopt_int(libc::SO_DOMAIN)? != libc::AF_UNIX
    {
        return Err(wrong("is not a Unix SOCK_SEQPACKET socket"));
    }
    if sockopt_int(libc::SO_ACCEPTCONN)? == 0 {
        return Err(wrong("is not listening"));
    }
    // SAFETY: fd 3 was handed to this process to own (sd_listen_fds(3)).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: setting FD_CLOEXEC on our own descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(Some((owned, local_path(fd))))
}

/// The path a Unix socket is bound to ("" if none or abstract).
fn local_path(fd: RawFd) -> std::path::PathBuf {
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: sa is writable with its size in len.
    let r = unsafe { libc::getsockname(fd, &mut sa as *mut _ as *mut libc::sockaddr, &mut len) };
    if r < 0 {
        return std::path::PathBuf::new();
    }
    let bytes: Vec<u8> = sa
        .sun_path
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&bytes))
}

/// `path.new` next to `path` (the same directory, so a rename moves it),
/// or `path` itself if the longer name does not fit a socket address.
fn staging_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".new");
    let staging = std::path::PathBuf::from(name);
    if sockaddr_un(&staging).is_ok() {
        staging
    } else {
        path.to_path_buf()
    }
}

/// Binds a socket at `path` (errors name `shown`, the path operators know).
fn bind_and_listen(
    path: &Path,
    shown: &Path,
    mode: u32,
    group: Option<u32>,
) -> io::Result<OwnedFd> {
    let (sa, len) = sockaddr_un(path)?;
    let fd = seqpacket()?;
    // SAFETY: sa/len describe a valid sockaddr_un.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            len,
        )
    } < 0
    {
        return Err(about_path(
            shown,
            "cannot create the control socket",
            io::Error::last_os_error(),
        ));
    }
    let ready = set_owner_and_mode(path, shown, mode, group).and_then(|()| {
        // SAFETY: plain syscall.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    });
    if let Err(e) = ready {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(fd)
}

/// Creates the socket's directory if missing, mode 0755: anyone may look
/// up the socket in it; the socket's own mode and group decide who attaches.
fn create_parent_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| about_path(dir, "cannot create the control socket's directory", e))
}

/// Whether `path` holds a socket file (which the caller may replace if no
/// server answers on it); an error if it holds anything else.
fn refuse_to_replace(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(about_path(path, "cannot check the control socket path", e)),
    };
    let kind = meta.file_type();
    if kind.is_socket() {
        return Ok(true);
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a socket"
    };
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "refusing to use {} as the control socket: it exists and is {what}, not a socket \
             (remove it, or choose another path with --socket)",
            path.display()
        ),
    ))
}

/// Whether a server answers at `sa` (a stale socket file refuses).
fn probe_connect(sa: &libc::sockaddr_un, len: libc::socklen_t) -> io::Result<bool> {
    let probe = seqpacket()?;
    // SAFETY: sa/len describe a valid sockaddr_un.
    let r = unsafe {
        libc::connect(
            probe.as_raw_fd(),
            sa as *const _ as *const libc::sockaddr,
            len,
        )
    };
    Ok(r == 0)
}

fn set_owner_and_mode(path: &Path, shown: &Path, mode: u32, group: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(gid) = group {
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|e| {
            about_path(
                shown,
                &format!("cannot give the control socket to group {gid}"),
                e,
            )
        })?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| about_path(shown, "cannot set the control socket's mode", e))
}

/// `e` with the path it is about and, where the path is the problem, how
/// to choose another one.
fn about_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(
            libc::EACCES | libc::EPERM | libc::EROFS | libc::EISDIR | libc::ENOTDIR | libc::EEXIST,
        ) => {
            "; choose a path you may write with --socket PATH or TCPS_SOCKET (a server of your \
             own: --socket $XDG_RUNTIME_DIR/tcps.sock)"
        }
        _ => "",
    };
    io::Error::new(e.kind(), format!("{what} {}: {e}{hint}", path.display()))
}
