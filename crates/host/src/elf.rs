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
    let mut h = [0u8; 64];
    if !pread_exact(fd, &mut h, 0) || &h[..4] != b"\x7fELF" || h[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u64::from(u16::from_le_bytes([h[o], h[o + 1]]));
    let u32_at = |o: usize| u64::from(u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]));
    let (phoff, phentsize, phnum) = match h[4] {
        2 => (
            u64::from_le_bytes(h[0x20..0x28].try_into().ok()?),
            u16_at(0x36),
            u16_at(0x38),
        ),
        1 => (u32_at(0x1c), u16_at(0x2a), u16_at(0x2c)),
        _ => return None,
    };
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
