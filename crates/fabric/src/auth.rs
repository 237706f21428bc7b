//! Authentication of a remote host: a shared secret file
//! (`--fabric-auth FILE`, `TCPS_FABRIC_AUTH=FILE`), a challenge from the
//! server and the host's HMAC-SHA256 answer, compared in constant time.
//! The secret itself never crosses the fabric.
//!
//! The file: the secret is its first line (at least 16 bytes, surrounding
//! white space ignored); an optional later line `uid=N` names the uid the
//! server runs that host's privileged calls as (`docs/ARCHITECTURE.md`,
//! "The channel over a fabric"). The file must not be readable by other
//! users (mode & 0o077 == 0).

use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub const NONCE_LEN: usize = 32;
pub const MAC_LEN: usize = 32;
const MIN_SECRET: usize = 16;

/// A secret read from an auth file, and the uid it maps to (if named).
pub struct Secret {
    key: Vec<u8>,
    pub uid: Option<u32>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes, uid {:?})", self.key.len(), self.uid)
    }
}

impl Secret {
    pub fn read(path: &Path) -> Result<Secret, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{}: readable or writable by others (mode {:o}); chmod 600 it",
                path.display(),
                meta.mode() & 0o777
            ));
        }
        let mut text = String::new();
        file.take(64 * 1024)
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Secret, String> {
        let mut lines = text.lines();
        let key = lines.next().unwrap_or("").trim().as_bytes().to_vec();
        if key.len() < MIN_SECRET {
            return Err(format!(
                "the secret (first line) must have at least {MIN_SECRET} bytes"
            ));
        }
        let mut uid = None;
        for line in lines.map(str::trim).filter(|l| !l.is_empty()) {
            match line.strip_prefix("uid=").map(str::parse::<u32>) {
                Some(Ok(n)) => uid = Some(n),
                _ => return Err(format!("unknown line {line:?} (only uid=N)")),
            }
        }
        Ok(Secret { key, uid })
    }

    /// The answer to a challenge: HMAC-SHA256(secret, nonce ‖ context),
    /// where the context binds the answer to this attach (the host's pid).
    pub fn answer(&self, nonce: &[u8; NONCE_LEN], context: &[u8]) -> [u8; MAC_LEN] {
        hmac_sha256(&self.key, &[nonce, context])
    }

    /// Checks an answer in constant time.
    pub fn verify(&self, nonce: &[u8; NONCE_LEN], context: &[u8], mac: &[u8]) -> bool {
        let want = self.answer(nonce, context);
        mac.len() == MAC_LEN && want.iter().zip(mac).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// A fresh random nonce (the kernel's random source).
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// HMAC (RFC 2104) over SHA-256 of the concatenated parts.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc4231() {
        // RFC 4231 test cases 1 and 2 (and 6: a key longer than a block).
        let mac = hmac_sha256(&[0x0b; 20], &[b"Hi There"]);
        assert_eq!(
            hex(&mac),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let mac = hmac_sha256(
            &[0xaa; 131],
            &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
        );
        assert_eq!(
            hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn answers_verify_only_with_the_same_secret_nonce_and_context() {
        let s = Secret::parse("0123456789abcdef-secret\nuid=1000\n").unwrap();
        assert_eq!(s.uid, Some(1000));
        let other = Secret::parse("0123456789abcdef-other").unwrap();
        let n = nonce().unwrap();
        assert_ne!(n, nonce().unwrap(), "nonces repeat");
        let mac = s.answer(&n, b"pid 42");
        assert!(s.verify(&n, b"pid 42", &mac));
        assert!(
            !other.verify(&n, b"pid 42", &mac),
            "another secret accepted"
        );
        assert!(!s.verify(&n, b"pid 43", &mac), "another context accepted");
        let mut n2 = n;
        n2[0] ^= 1;
        assert!(
            !s.verify(&n2, b"pid 42", &mac),
            "a replayed answer accepted"
        );
        assert!(
            !s.verify(&n, b"pid 42", &mac[..31]),
            "a short answer accepted"
        );
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(Secret::parse("short").is_err());
        assert!(Secret::parse("0123456789abcdef\nroot=1").is_err());
        assert!(Secret::parse("0123456789abcdef\nuid=x").is_err());
        let dir = std::env::temp_dir().join(format!("tcps-auth-{}", std::process::id()));
        std::fs::write(&dir, "0123456789abcdef-secret\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Secret::read(&dir).unwrap_err();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Secret::read(&dir).unwrap().uid, None);
        std::fs::remove_file(&dir).unwrap();
    }
}
