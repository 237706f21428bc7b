//! `Op::FileOpen`: a remote host's sendfile of a file the server node sees
//! too (`tcps server --shared-files DIR`; the thesis' direct path to the
//! file server). A host on another node cannot pass a descriptor, so it
//! names the file by its absolute path, and the server opens it itself —
//! then every `SendFile` of it is read here and no file byte crosses the
//! fabric.
//!
//! The kernel decides, under the host's credentials: the path must lie
//! inside DIR (a prefix, then `openat2(RESOLVE_BENEATH)` from DIR, so no
//! `..` or symlink leads out), and the open runs with the file-system uid
//! and gid of the uid the host is mapped to (`--fabric-uid` or its auth
//! file; supplementary groups: none, so at most what that user may read).
//! The host's `fstat` size and modification time must match this node's
//! file: a file that differs here is not the one the host means (ESTALE),
//! and the host then sends the bytes itself. The file then goes through
//! the same checks as a passed one (`sendfile::keep`: a regular file on a
//! local file system).

use crate::calls::common::{arena_bytes, Res};
use crate::host::Host;
use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use tcps_proto::msg::ArenaRange;

/// The file's identity as the host sees it (`Call::FileOpen`).
pub struct Wanted {
    pub handle: u32,
    pub path: ArenaRange,
    pub size: u64,
    pub mtime_ns: u64,
}

/// `Op::FileOpen` of host `host` on channel `ch`, with `dir` the
/// `--shared-files` tree (None: not offered).
pub fn open(dir: Option<&Path>, host: &mut Host, ch: u32, w: Wanted) -> Res {
    let dir = match dir {
        Some(d) if host.remote => d,
        // A local host passes its descriptor (`ControlMsg::FileOpen`).
        _ => return Err(libc::EOPNOTSUPP),
    };
    let path = arena_bytes(host, ch, w.path);
    let rel = inside(dir, &path).ok_or(libc::EACCES)?;
    let file = as_user(host.uid, || open_beneath(dir, rel))?;
    crate::sendfile::keep(host, w.handle, file, Some((w.size, w.mtime_ns)))?;
    Ok((0, 0))
}

/// The part of absolute `path` below `dir` (not empty, no NUL), if it
/// names something inside it.
fn inside<'a>(dir: &Path, path: &'a [u8]) -> Option<&'a [u8]> {
    let d = dir.as_os_str().as_bytes();
    let d = d.strip_suffix(b"/").unwrap_or(d);
    let rel = path.strip_prefix(d)?.strip_prefix(b"/")?;
    (!rel.is_empty() && !rel.contains(&0)).then_some(rel)
}

/// Opens `rel` beneath `dir` for reading, never leaving it and never
/// blocking (O_NONBLOCK: a FIFO does not wait; `keep` refuses it).
fn open_beneath(dir: &Path, rel: &[u8]) -> Result<OwnedFd, i32> {
    let d = CString::new(dir.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    let rel = CString::new(rel).map_err(|_| libc::EINVAL)?;
    // SAFETY: open(2) of a NUL-terminated path; the result is checked.
    let dfd = unsafe {
        libc::open(
            d.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dfd < 0 {
        return Err(crate::sys::errno());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    let dfd = unsafe { OwnedFd::from_raw_fd(dfd) };
    // SAFETY: open_how is plain data; zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 with a directory descriptor we own, a NUL-terminated
    // path and an open_how of the size passed; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            std::os::fd::AsRawFd::as_raw_fd(&dfd),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    crate::sys::count(2);
    if fd < 0 {
        return Err(crate::sys::errno());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The primary group of `uid` (nogroup if it has no passwd entry).
fn primary_gid(uid: u32) -> u32 {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: passwd is plain data; zero is a valid value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into `pw` and `buf`, both ours and of the
    // sizes given; `out` says whether it found an entry.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r == 0 && !out.is_null() {
        pw.pw_gid
    } else {
        65534
    }
}

/// Runs `f` with this thread's file-system uid and gid set to `uid` and
/// its primary group and no supplementary groups, then restores them.
/// These credentials are per thread in the kernel, and set here with raw
/// system calls (glibc's `setgroups` would change every thread's). A
/// server that may not take them (no CAP_SETUID/CAP_SETGID) opens as
/// itself only for its own uid, else refuses (EACCES).
fn as_user<T>(uid: u32, f: impl FnOnce() -> Result<T, i32>) -> Result<T, i32> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if me != 0 {
        return if uid == me { f() } else { Err(libc::EACCES) };
    }
    let gid = primary_gid(uid);
    let mut groups = vec![0 as libc::gid_t; 256];
    // SAFETY: getgroups fills at most `groups.len()` entries of our vector.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(libc::EACCES);
    }
    groups.truncate(n as usize);
    // SAFETY: raw setgroups(0, NULL) for this thread only (see above).
    if unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) } != 0 {
        return Err(libc::EACCES);
    }
    // SAFETY: setfsgid/setfsuid change this thread's file-system ids only;
    // they return the previous ids, restored below.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(gid), libc::setfsuid(uid)) };
    let r = f();
    // SAFETY: restoring the ids and groups saved above, this thread only.
    unsafe {
        libc::setfsuid(old_uid as u32);
        libc::setfsgid(old_gid as u32);
        libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
    }
    crate::sys::count(5);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_below_the_tree_are_inside() {
        let d = Path::new("/srv/www");
        assert_eq!(inside(d, b"/srv/www/a/b.html"), Some(&b"a/b.html"[..]));
        assert_eq!(
            inside(Path::new("/srv/www/"), b"/srv/www/x"),
            Some(&b"x"[..])
        );
        assert_eq!(inside(d, b"/srv/www"), None);
        assert_eq!(inside(d, b"/srv/www/"), None);
        assert_eq!(inside(d, b"/srv/wwwx/y"), None);
        assert_eq!(inside(d, b"/etc/passwd"), None);
        assert_eq!(inside(d, b"/srv/www/a\0b"), None);
    }

    #[test]
    fn the_kernel_keeps_the_open_inside_the_tree() {
        let t = std::env::temp_dir().join(format!("tcps-shared-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(t.join("www")).unwrap();
        std::fs::write(t.join("www/ok"), b"inside").unwrap();
        std::fs::write(t.join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink("../secret", t.join("www/link")).unwrap();
        let dir = t.join("www");
        assert!(open_beneath(&dir, b"ok").is_ok());
        assert_eq!(open_beneath(&dir, b"../secret").err(), Some(libc::EXDEV));
        assert_eq!(open_beneath(&dir, b"link").err(), Some(libc::EXDEV));
        assert_eq!(open_beneath(&dir, b"none").err(), Some(libc::ENOENT));
        std::fs::remove_dir_all(&t).unwrap();
    }
}
