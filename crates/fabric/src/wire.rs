//! The tcps messages over the fabric: active-message ids, the attach
//! exchange and span batches (`docs/ARCHITECTURE.md`, "The channel over a
//! fabric"). Little endian. Decoding checks every length; a malformed
//! message is an error, never a panic.
//!
//! Every message a host sends is sent with the reply flag
//! (`Endpoint::am_send(.., reply = true)`): the server knows which host
//! it came from only by the endpoint it names (`AmMessage::from`), and
//! drops messages that name none.

/// host → server: `Hello` (magic u64 | version u32 | pid u32), as on the
/// control socket (PROTOCOL §1).
pub const AM_HELLO: u32 = 1;
/// server → host: a nonce (`auth::NONCE_LEN` bytes) to answer.
pub const AM_CHALLENGE: u32 = 2;
/// host → server: HMAC-SHA256(secret, nonce ‖ `auth_context(pid)`).
pub const AM_AUTH: u32 = 3;
/// server → host: [`Welcome`].
pub const AM_WELCOME: u32 = 4;
/// either way: a batch of spans of the sender's writes (header: the
/// number of spans, u32; data: the records).
pub const AM_SPANS: u32 = 5;
/// either way, every 250 ms of silence: the link is alive.
pub const AM_KEEPALIVE: u32 = 6;
/// host → server: a control message (`ControlMsg`, 24 B) the host library
/// sent its helper (fork snapshots, registrations); server → host: the
/// `Reply` to it, in order. Memory registrations come without a memfd: the
/// server makes its own copy of `len` bytes, filled by registration spans.
pub const AM_CONTROL: u32 = 7;

/// The offset of a *registration span* in a batch ([`Spans::push_reg`]):
/// its bytes are `handle u32 | offset u64 | data`, to be written at that
/// offset of the receiver's copy of registration `handle` (no region is
/// this large, so no region span has this offset).
pub const REG_SPAN: u32 = u32::MAX;

/// A registration span's `(handle, offset, data)`; `None` if it is shorter
/// than its 12-byte head or carries no data.
pub fn reg_span(bytes: &[u8]) -> Option<(u32, u64, &[u8])> {
    let head = bytes.get(..12)?;
    let data = &bytes[12..];
    if data.is_empty() {
        return None;
    }
    let handle = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let mut off = [0u8; 8];
    off.copy_from_slice(&head[4..12]);
    Some((handle, u64::from_le_bytes(off), data))
}

/// What the host's answer is bound to besides the nonce.
pub fn auth_context(version: u32, pid: u32) -> Vec<u8> {
    format!("tcps-fabric-attach v{version} pid {pid}").into_bytes()
}

/// The server's answer to an attach: 0 or an errno, the region geometry
/// (eight words, `proto::layout::Layout` in field order, zero-padded), a
/// message for a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub status: i32,
    pub geometry: [u32; 8],
    pub message: String,
}

const WELCOME_FIXED: usize = 4 + 8 * 4;

impl Welcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(WELCOME_FIXED + self.message.len());
        out.extend_from_slice(&self.status.to_le_bytes());
        for w in self.geometry {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(self.message.as_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Option<Welcome> {
        if b.len() < WELCOME_FIXED || b.len() > WELCOME_FIXED + 1024 {
            return None;
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut geometry = [0u32; 8];
        for (k, g) in geometry.iter_mut().enumerate() {
            *g = word(4 + 4 * k);
        }
        Some(Welcome {
            status: word(0) as i32,
            geometry,
            message: String::from_utf8_lossy(&b[WELCOME_FIXED..]).into_owned(),
        })
    }
}

/// A batch of spans being gathered: `(offset u32, len u32, bytes)`
/// records, applied by the receiver in order (so an index pushed after
/// its entries is never visible before them).
#[derive(Default)]
pub struct Spans {
    buf: Vec<u8>,
    count: u32,
}

impl Spans {
    pub fn new() -> Spans {
        Spans::default()
    }

    /// Appends a span; an empty one is skipped.
    pub fn push(&mut self, off: u32, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.buf.extend_from_slice(&off.to_le_bytes());
        self.buf
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(bytes);
        self.count += 1;
    }

    /// Appends a registration span ([`REG_SPAN`]): `bytes` at offset
    /// `off` of registration `handle`; an empty one is skipped.
    pub fn push_reg(&mut self, handle: u32, off: u64, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.buf.extend_from_slice(&REG_SPAN.to_le_bytes());
        self.buf
            .extend_from_slice(&(12 + bytes.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&handle.to_le_bytes());
        self.buf.extend_from_slice(&off.to_le_bytes());
        self.buf.extend_from_slice(bytes);
        self.count += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Moves `other`'s spans after this batch's (it is empty again).
    pub fn append(&mut self, other: &mut Spans) {
        self.buf.append(&mut other.buf);
        self.count += std::mem::take(&mut other.count);
    }

    /// Bytes gathered so far (to cut a batch that grows too large).
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// The message: its header (the span count) and data; the batch is
    /// empty again.
    pub fn take(&mut self) -> ([u8; 4], Vec<u8>) {
        let count = std::mem::take(&mut self.count);
        (count.to_le_bytes(), std::mem::take(&mut self.buf))
    }
}

/// Why a span batch was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanError {
    /// The header is not one u32, or the records do not match it.
    Malformed,
}

/// The spans of a received batch, in order. Yields `Err` once (and then
/// stops) if the message is malformed: the receiver must then drop the
/// whole peer, since spans before the error may already be applied.
pub fn spans<'a>(header: &[u8], data: &'a [u8]) -> SpanIter<'a> {
    let count = <[u8; 4]>::try_from(header).map(u32::from_le_bytes).ok();
    SpanIter {
        data,
        left: count,
        failed: false,
    }
}

pub struct SpanIter<'a> {
    data: &'a [u8],
    left: Option<u32>,
    failed: bool,
}

impl<'a> Iterator for SpanIter<'a> {
    type Item = Result<(u32, &'a [u8]), SpanError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let Some(left) = self.left else {
            self.failed = true;
            return Some(Err(SpanError::Malformed));
        };
        if left == 0 {
            if self.data.is_empty() {
                return None;
            }
            self.failed = true;
            return Some(Err(SpanError::Malformed));
        }
        let rec = self.data.get(..8).map(|h| {
            let off = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            (off, len)
        });
        match rec {
            Some((off, len)) if len > 0 && self.data.len() - 8 >= len => {
                let bytes = &self.data[8..8 + len];
                self.data = &self.data[8 + len..];
                self.left = Some(left - 1);
                Some(Ok((off, bytes)))
            }
            _ => {
                self.failed = true;
                Some(Err(SpanError::Malformed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_round_trip_in_order() {
        let mut s = Spans::new();
        s.push(4096, b"entries");
        s.push(0, b"");
        s.push(64, &7u32.to_le_bytes());
        assert_eq!(s.bytes(), 8 + 7 + 8 + 4);
        let (h, d) = s.take();
        assert!(s.is_empty());
        let got: Vec<_> = spans(&h, &d).collect();
        assert_eq!(
            got,
            vec![
                Ok((4096, &b"entries"[..])),
                Ok((64, &7u32.to_le_bytes()[..]))
            ]
        );
    }

    #[test]
    fn malformed_batches_are_refused() {
        let mut s = Spans::new();
        s.push(8, b"abcd");
        let (h, d) = s.take();
        let bad = |h: &[u8], d: &[u8]| spans(h, d).any(|r| r.is_err());
        assert!(bad(&h, &d[..d.len() - 1]), "truncated bytes");
        assert!(bad(&h, &d[..5]), "truncated record header");
        assert!(
            bad(&2u32.to_le_bytes(), &d),
            "more spans announced than sent"
        );
        assert!(bad(&0u32.to_le_bytes(), &d), "trailing bytes");
        assert!(bad(&h[..3], &d), "short header");
        let mut zero = d.clone();
        zero[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(bad(&h, &zero[..8]), "empty span");
        let mut huge = d.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(bad(&h, &huge), "length past the end");
        // After an error nothing more is yielded.
        assert_eq!(spans(&h[..3], &d).count(), 1);
    }

    #[test]
    fn registration_spans_round_trip() {
        let mut s = Spans::new();
        s.push(64, &1u32.to_le_bytes());
        s.push_reg(3, 1 << 33, b"staged");
        s.push_reg(3, 0, b"");
        let (h, d) = s.take();
        let got: Vec<_> = spans(&h, &d).map(Result::unwrap).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].0, REG_SPAN);
        assert_eq!(reg_span(got[1].1), Some((3, 1 << 33, &b"staged"[..])));
        assert_eq!(reg_span(&got[1].1[..12]), None, "no data");
        assert_eq!(reg_span(&got[1].1[..5]), None, "short head");
    }

    #[test]
    fn welcome_round_trip() {
        let w = Welcome {
            status: 13,
            geometry: [256, 64, 262144, 1024, 64, 1024, 32768, 0],
            message: "no".into(),
        };
        assert_eq!(Welcome::decode(&w.encode()), Some(w));
        assert_eq!(Welcome::decode(&[0; 10]), None);
    }
}
