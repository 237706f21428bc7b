//! Attaching to a TCP server on another node over a fabric (UCX,
//! `crates/fabric`; `docs/ARCHITECTURE.md`, "The channel over a fabric").
//!
//! With `TCPS_REMOTE=ADDR:PORT` (and `TCPS_FABRIC_AUTH=FILE`) an attach
//! starts a helper process, `tcps fabric-pump`, with one end of a
//! socketpair that stands in for the control socket. The helper attaches
//! to the server over UCX, makes the host's private copy of the region (a
//! memfd of the announced geometry) and a doorbell eventfd, and answers
//! the ordinary handshake (`Hello` → `Welcome` + [memfd, doorbell]) on the
//! socketpair: the rest of the library runs unchanged on that copy. From
//! then on the helper runs the host's half of the channel (`pump`) and
//! answers `HostDoorbell` with pipes it rings itself.
//!
//! The helper keeps UCX out of this library: programs that only use a
//! local server never load libucp (`readelf -d libtcps.so` shows none);
//! a remote host pays one process and its copies instead of a library
//! loaded by `dlopen` into every program.
//!
//! What a remote host cannot do: hand sockets over (socket adoption,
//! `SocketDup`, `Export`). Registering memory and forking with its
//! sockets go through the helper (its control messages are forwarded to
//! the server; registered bytes are shipped by `pump`). Its `socket` and
//! `bind` are requests the server executes (`Client::socket`).

pub mod pump;

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// The server's fabric address when this process attaches remotely
/// (`TCPS_REMOTE`, non-empty).
pub fn address() -> Option<String> {
    match crate::settings::setting_str("TCPS_REMOTE") {
        Some(Ok(a)) if !a.trim().is_empty() => Some(a.trim().to_string()),
        _ => None,
    }
}

/// The servers' fabric addresses when this process attaches remotely:
/// `TCPS_REMOTE` split at commas (`a,b`: a host that uses several servers;
/// empty: none).
pub fn addresses() -> Vec<String> {
    address()
        .map(|a| {
            a.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The descriptor number the helper finds its end of the socketpair at.
pub const PUMP_FD: i32 = 3;

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Starts `tcps fabric-pump` for `remote` (the `tcps` of `TCPS_BIN`, else
/// the one on PATH) and returns this side's end of its socketpair, over
/// which the ordinary attach handshake follows. The helper detaches (it is
/// not left as this program's child); it ends when this end closes.
pub fn start_pump(remote: &str) -> io::Result<OwnedFd> {
    let bin = crate::settings::setting("TCPS_BIN").unwrap_or_else(|| OsString::from("tcps"));
    let auth = crate::settings::setting("TCPS_FABRIC_AUTH")
        .filter(|a| !a.is_empty())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "TCPS_REMOTE needs TCPS_FABRIC_AUTH=FILE (the fabric secret)",
            )
        })?;
    let mut sv = [0i32; 2];
    // SAFETY: socketpair writes two descriptors into `sv`.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors owned from here on.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    let args: Vec<CString> = [
        bin.as_bytes(),
        b"fabric-pump",
        b"--detach",
        b"--remote",
        remote.as_bytes(),
        b"--fabric-auth",
        auth.as_bytes(),
    ]
    .iter()
    .map(|a| cstr(a))
    .collect::<io::Result<_>>()?;
    // The helper must not load the preload library (it would attach
    // again), nor attach remotely itself.
    let env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "LD_PRELOAD" && k != "TCPS_REMOTE")
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            cstr(&kv)
        })
        .collect::<io::Result<_>>()?;
    spawn_detached(&args, &env, theirs.as_raw_fd())?;
    Ok(ours)
}

/// posix_spawnp of `args` with `env`, `fd` as the child's [`PUMP_FD`];
/// waits for the child, which forks the helper and exits at once.
fn spawn_detached(args: &[CString], env: &[CString], fd: i32) -> io::Result<()> {
    let mut argv: Vec<*mut libc::c_char> = args.iter().map(|a| a.as_ptr() as *mut _).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> = env.iter().map(|a| a.as_ptr() as *mut _).collect();
    envp.push(std::ptr::null_mut());
    // SAFETY: file actions initialised, used and destroyed here; argv and
    // envp are NULL-terminated arrays of C strings that outlive the call.
    unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        libc::posix_spawn_file_actions_init(&mut fa);
        // dup2 clears close-on-exec on the copy.
        libc::posix_spawn_file_actions_adddup2(&mut fa, fd, PUMP_FD);
        let mut pid: libc::pid_t = 0;
        let rc = libc::posix_spawnp(
            &mut pid,
            argv[0],
            &fa,
            std::ptr::null(),
            argv.as_ptr(),
            envp.as_ptr(),
        );
        libc::posix_spawn_file_actions_destroy(&mut fa);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // The intermediate process exits as soon as the helper is forked
        // (ECHILD if the program ignores SIGCHLD or reaped it: fine).
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
    }
    Ok(())
}

/// A fresh memfd of `len` bytes (tests).
#[cfg(test)]
pub(crate) fn tests_memfd(len: usize) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a valid C string; the result is checked.
    let fd = unsafe { libc::memfd_create(c"tcps-remote-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor owned by the File from here on.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len as u64).unwrap();
    f
}
