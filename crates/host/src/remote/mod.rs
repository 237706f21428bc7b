//! Attaching to a TCP server on another node over a fabric (UCX,
//! `crates/fabric`; `docs/ARCHITECTURE.md`, "The channel over a fabric").
//! Built so far: `pump`, the host's half of the channels. To come: the
//! attach over UCX (`TCPS_REMOTE`, `TCPS_FABRIC_AUTH`), a local memfd of
//! the announced geometry and a socketpair standing in for the control
//! socket, so the rest of the library runs unchanged on the host's copy.

// Used by its tests only until remote attach lands.
#[allow(dead_code)]
pub mod pump;

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
