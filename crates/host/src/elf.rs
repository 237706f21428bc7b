//! Whether an executable is statically linked: the dynamic loader never
//! runs for it, so `LD_PRELOAD` (the preload library) cannot reach its
//! sockets. `tcps run` checks the program it starts; the preload library
//! checks what a program execs, possibly in a vfork child, so this
//! allocates nothing and reads with plain system calls.

use std::os::fd::RawFd;

const PT_INTERP: u32 = 3;

/// Reads `buf.len()` bytes of `fd` at `off`; false if fewer came.
fn pread_exact(fd: RawFd, buf: &mut [u8], off: u64) -> bool {
    let Ok(off) = libc::off_t::try_from(off) else {
        return false;
    };
    // SAFETY: buf is writable for its length; fd is the caller's.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off) };
    usize::try_from(n) == Ok(buf.len())
}

/// Whether the file open at `fd` is an ELF executable without a program
/// interpreter (statically linked, static-pie included). None: not ELF (a
/// script, say), big-endian, or unreadable.
pub fn statically_linked_fd(fd: RawFd) -> Option<bool> {
    let (_, phoff, phentsize, phnum) = program_headers(fd)?;
    if phentsize < 4 {
        return None;
    }
    for i in 0..phnum {
        let mut p_type = [0u8; 4];
        if !pread_exact(fd, &mut p_type, phoff.checked_add(i * phentsize)?) {
            return None;
        }
        if u32::from_le_bytes(p_type) == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

const PT_NOTE: u32 = 4;

/// The ELF class, program header offset, entry size and count of the file
/// open at `fd` (little-endian only); None if not such an ELF file.
fn program_headers(fd: RawFd) -> Option<(u8, u64, u64, u64)> {
    let mut h = [0u8; 64];
    if !pread_exact(fd, &mut h, 0) || &h[..4] != b"\x7fELF" || h[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u64::from(u16::from_le_bytes([h[o], h[o + 1]]));
    let u32_at = |o: usize| u64::from(u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]));
    match h[4] {
        2 => Some((
            2,
            u64::from_le_bytes(h[0x20..0x28].try_into().ok()?),
            u16_at(0x36),
            u16_at(0x38),
        )),
        1 => Some((1, u32_at(0x1c), u16_at(0x2a), u16_at(0x2c))),
        _ => None,
    }
}

/// Whether the file open at `fd` is a program built by Go's toolchain: it
/// carries a `Go` note (the build id, `.note.go.buildid`). Go's runtime
/// makes its socket system calls itself, never through libc, so the
/// preload library, loaded or not, never sees them.
pub fn go_program_fd(fd: RawFd) -> bool {
    let Some((class, phoff, phentsize, phnum)) = program_headers(fd) else {
        return false;
    };
    // p_offset and p_filesz of a program header of this class.
    let (off_at, size_at, width) = if class == 2 { (8, 32, 8) } else { (4, 16, 4) };
    for i in 0..phnum.min(64) {
        let at = phoff + i * phentsize;
        let mut ph = [0u8; 56];
        if phentsize < 40 || !pread_exact(fd, &mut ph[..phentsize.min(56) as usize], at) {
            return false;
        }
        if u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) != PT_NOTE {
            continue;
        }
        let word = |o: usize| -> u64 {
            let mut b = [0u8; 8];
            b[..width].copy_from_slice(&ph[o..o + width]);
            u64::from_le_bytes(b)
        };
        if note_named_go(fd, word(off_at), word(size_at).min(4096)) {
            return true;
        }
    }
    false
}

/// Whether the notes at `off` (`len` bytes) include one named "Go".
fn note_named_go(fd: RawFd, mut off: u64, len: u64) -> bool {
    let end = off + len;
    while off + 12 <= end {
        let mut n = [0u8; 16];
        if !pread_exact(fd, &mut n, off) {
            return false;
        }
        let namesz = u64::from(u32::from_le_bytes([n[0], n[1], n[2], n[3]]));
        let descsz = u64::from(u32::from_le_bytes([n[4], n[5], n[6], n[7]]));
        if (namesz == 3 || namesz == 4) && &n[12..15] == b"Go\0" {
            return true;
        }
        off += 12 + namesz.div_ceil(4) * 4 + descsz.div_ceil(4) * 4;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn of(path: &str) -> Option<bool> {
        let f = std::fs::File::open(path).ok()?;
        statically_linked_fd(f.as_raw_fd())
    }

    #[test]
    fn static_dynamic_and_scripts() {
        // Debian's ldconfig is static-pie; sh is dynamic.
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .into_iter()
            .find(|p| std::path::Path::new(p).is_file())
            .expect("ldconfig");
        assert_eq!(of(ldconfig), Some(true));
        assert_eq!(of("/bin/sh"), Some(false));
        let script = std::env::temp_dir().join(format!("tcps-elf-{}", std::process::id()));
        std::fs::write(&script, b"#!/bin/sh\n").unwrap();
        assert_eq!(of(script.to_str().unwrap()), None);
        std::fs::remove_file(&script).unwrap();
    }
}
