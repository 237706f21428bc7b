//! The demo's site: a few deterministic static files, and a check that a
//! server answers GET /index.html with exactly the file's bytes.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::context::Error;

/// Deterministic static files; returns the bytes of index.html.
pub(super) fn make_site(root: &Path) -> Result<Vec<u8>, Error> {
    let mut index = String::with_capacity(16 * 1024);
    index.push_str("<!DOCTYPE html>\n<html><head><title>tcps demo</title></head><body>\n");
    let mut i = 0u32;
    while index.len() < 16 * 1024 - 64 {
        let _ = writeln!(
            index,
            "<p>line {i:05}: the host runs the application; the TCP server runs TCP/IP.</p>"
        );
        i += 1;
    }
    index.push_str("</body></html>\n");
    let mut index = index.into_bytes();
    index.resize(16 * 1024, b'\n');
    fs::write(root.join("index.html"), &index)?;
    let small: Vec<u8> = (0..1024u32).map(|i| b'a' + (i % 26) as u8).collect();
    fs::write(root.join("small.txt"), small)?;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let big: Vec<u8> = (0..1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    fs::write(root.join("big.bin"), big)?;
    Ok(index)
}

/// GET /index.html over HTTP/1.0 and compare the body with the file.
pub(super) fn check_response(port: u16, expect: &[u8]) -> Result<(), Error> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: demo\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)
        .map_err(|e| format!("reading the response: {e}"))?;
    let _ = s.shutdown(Shutdown::Both);
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the response has no header/body separator")?;
    let status = resp[..split]
        .split(|&b| b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim().to_string())
        .unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") && !status.starts_with("HTTP/1.0 200") {
        return Err(format!("GET /index.html answered {status:?}").into());
    }
    if &resp[split + 4..] != expect {
        return Err(format!(
            "GET /index.html returned {} body bytes that differ from the file ({} bytes)",
            resp.len() - split - 4,
            expect.len()
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::TempDir;

    #[test]
    fn site_is_deterministic() {
        let t = TempDir::new().unwrap();
        let a = make_site(&t.0).unwrap();
        let b = make_site(&t.0).unwrap();
        assert_eq!(a.len(), 16 * 1024);
        assert_eq!(a, b);
    }
}
