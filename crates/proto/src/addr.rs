//! Socket addresses as they travel in the arena: raw `sockaddr_in` /
//! `sockaddr_in6` bytes, exactly what the C API passes in. Conversion to and
//! from [`std::net::SocketAddr`] checks family and length.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The bytes are not a usable IPv4/IPv6 socket address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrError {
    TooShort,
    UnsupportedFamily(u16),
}

const IN_LEN: usize = std::mem::size_of::<libc::sockaddr_in>();
const IN6_LEN: usize = std::mem::size_of::<libc::sockaddr_in6>();

/// Parses `sockaddr` bytes (as given to bind/connect).
pub fn parse(b: &[u8]) -> Result<SocketAddr, AddrError> {
    if b.len() < 2 {
        return Err(AddrError::TooShort);
    }
    let family = u16::from_ne_bytes([b[0], b[1]]);
    match family as i32 {
        libc::AF_INET => {
            if b.len() < IN_LEN {
                return Err(AddrError::TooShort);
            }
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        libc::AF_INET6 => {
            if b.len() < IN6_LEN {
                return Err(AddrError::TooShort);
            }
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flowinfo = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flowinfo,
                scope,
            )))
        }
        _ => Err(AddrError::UnsupportedFamily(family)),
    }
}

/// Encodes an address as `sockaddr` bytes (16 for IPv4, 28 for IPv6).
pub fn encode(a: &SocketAddr) -> Vec<u8> {
    match a {
        SocketAddr::V4(v4) => {
            let mut b = vec![0u8; IN_LEN];
            b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v4.port().to_be_bytes());
            b[4..8].copy_from_slice(&v4.ip().octets());
            b
        }
        SocketAddr::V6(v6) => {
            let mut b = vec![0u8; IN6_LEN];
            b[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v6.port().to_be_bytes());
            b[4..8].copy_from_slice(&v6.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&v6.ip().octets());
            b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn v4_and_v6_round_trip() {
        for s in ["127.0.0.1:8080", "[::1]:443", "[fe80::1%2]:9"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(parse(&encode(&a)).unwrap(), a);
        }
    }

    #[test]
    fn short_and_foreign_addresses_are_refused() {
        assert_eq!(parse(&[]), Err(AddrError::TooShort));
        let mut b = encode(&"127.0.0.1:1".parse().unwrap());
        b.truncate(8);
        assert_eq!(parse(&b), Err(AddrError::TooShort));
        let unix = (libc::AF_UNIX as u16).to_ne_bytes();
        assert_eq!(
            parse(&[unix[0], unix[1], 0, 0]),
            Err(AddrError::UnsupportedFamily(libc::AF_UNIX as u16))
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = parse(&b);
        }
    }
}
