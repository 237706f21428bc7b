//! Geometry of the shared region: a header page, `n_channels` channels,
//! each a control block, a request ring, a completion ring and a data arena,
//! then `send_queues` asynchronous send queues (see [`crate::sendq`]), then
//! `recv_rings` receive/accept rings (see [`crate::eager`]).
//!
//! ```text
//! offset 0            RegionHeader (one page)
//! header_size + i*stride:
//!   +0                ChannelCtl   (three cache lines)
//!   +CTL_SIZE         Request   [ring_entries]   (64 B each)
//!   +...              Completion[ring_entries]   (32 B each)
//!   +arena_offset     arena [arena_size]         (page aligned)
//! send_queues_offset + q*sq_stride:
//!   +0                SendQueueCtl (three cache lines)
//!   +SQ_CTL_SIZE      SendDesc[sq_entries]       (32 B each)
//! recv_rings_offset + r*rq_stride:
//!   +0                RecvRingCtl (three cache lines)
//!   +RQ_CTL_SIZE      bytes [rq_bytes]
//! ```
//!
//! The server creates the region and writes the header; the host reads the
//! geometry from it. The server never trusts the header afterwards: it keeps
//! its own [`Layout`], because the host can write anywhere in the region.

use crate::msg::{Completion, Request};
use std::sync::atomic::AtomicU32;

/// Identifies a tcps channel region and control message ("TCPSCHN1").
pub const MAGIC: u64 = u64::from_le_bytes(*b"TCPSCHN1");
/// Protocol version; bumped on any change to the shared layout or messages.
pub const VERSION: u32 = 10;

pub const PAGE: usize = 4096;
pub const HEADER_SIZE: usize = PAGE;
/// Bytes of a channel's control block.
pub const CTL_SIZE: usize = 192;

/// Default number of channels per host region (one per concurrently calling host thread).
pub const DEFAULT_CHANNELS: u32 = 256;
/// Default entries per ring (a power of two).
pub const DEFAULT_RING_ENTRIES: u32 = 64;
/// Default bytes of data arena per channel; the largest single transfer.
pub const DEFAULT_ARENA_SIZE: u32 = 256 * 1024;
/// Default number of asynchronous send queues per host: how many sockets
/// can have asynchronous sends at once.
pub const DEFAULT_SEND_QUEUES: u32 = 1024;
/// Default descriptors per send queue (a power of two): the most
/// asynchronous sends one socket may have in flight (the thesis' `maxPipeline`).
pub const DEFAULT_SQ_ENTRIES: u32 = 64;
/// Default number of receive rings per host: sockets with a smaller id can
/// receive eagerly into host-visible memory (the others fall back to pull).
pub const DEFAULT_RECV_RINGS: u32 = 1024;
/// Default bytes per receive ring: the thesis' `EAGER_RECV_SIZE` (32 KiB).
pub const DEFAULT_RQ_BYTES: u32 = 32 * 1024;

/// Largest values [`Layout::validate`] takes (the options that set them
/// are checked against the same numbers).
pub const MAX_CHANNELS: u32 = 4096;
pub const MAX_ARENA_SIZE: u32 = 64 << 20;
pub const MAX_SEND_QUEUES: u32 = 65536;
pub const MAX_SQ_ENTRIES: u32 = 4096;
pub const MAX_RECV_RINGS: u32 = 1 << 20;

/// The first page of the region. Fields a host may write are atomics; the
/// geometry is written once by the server before the region is handed out.
#[repr(C, align(64))]
pub struct RegionHeader {
    pub magic: u64,
    pub version: u32,
    pub header_size: u32,
    pub n_channels: u32,
    pub ring_entries: u32,
    pub arena_size: u32,
    pub channel_stride: u32,
    pub region_size: u64,
    pub send_queues: u32,
    pub sq_entries: u32,
    pub recv_rings: u32,
    pub rq_bytes: u32,
    _pad0: [u8; 8],
    /// Server-written: non-zero while the server may be asleep; a host that
    /// publishes a request must then ring the doorbell eventfd.
    pub server_sleeping: AtomicU32,
    /// Server-written: 1 while the server runs, 0 once it shut down cleanly.
    pub server_alive: AtomicU32,
    /// Server-written once at attach: `SERVER_*` flags.
    pub server_flags: AtomicU32,
    _pad1: [u8; 52],
    /// Host-written: one past the highest channel index the host has used, so
    /// the server need not scan the whole pool. Clamped by the server.
    pub channels_used: AtomicU32,
}

/// `server_flags`: the server's workers poll on cores of their own
/// (`tcps server --cpus`), so a host thread waiting a moment for a
/// completion by spinning does not take the CPU the server needs.
pub const SERVER_DEDICATED_CORES: u32 = 1;

/// A channel's indices, on three cache lines so that neither side's common
/// path writes a line the other side reads on its common path:
///
/// * line 0, host-written, read by the server only when a ring looks full;
/// * line 1, `host_waiting`: written by the host only around a sleep, read by
///   the server after every completion;
/// * line 2, server-written.
#[repr(C, align(64))]
pub struct ChannelCtl {
    /// Host-written: requests published (free-running).
    pub req_tail: AtomicU32,
    /// Host-written: completions consumed (free-running).
    pub cq_head: AtomicU32,
    _pad0: [u8; 56],
    /// Host-written: non-zero while a host thread sleeps on `cq_tail` (futex).
    pub host_waiting: AtomicU32,
    /// Host-written: how many host threads sleep on `req_head` (futex)
    /// waiting for room in a full request ring; the server wakes them after
    /// taking requests (`ring::ServerCursor::room_wanted`).
    pub room_waiters: AtomicU32,
    _pad1: [u8; 56],
    /// Server-written: requests consumed (free-running).
    pub req_head: AtomicU32,
    /// Server-written: completions published (free-running); the host's futex word.
    pub cq_tail: AtomicU32,
    /// Server-written: low 32 bits of the `user_data` of the last request the
    /// server parked (it will complete only when its socket is ready). A host
    /// waiting for that request stops spinning and sleeps at once.
    pub parked_tag: AtomicU32,
    _pad2: [u8; 52],
}

const _: () = assert!(std::mem::size_of::<ChannelCtl>() == CTL_SIZE);

/// Why a geometry is unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError(pub &'static str);

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Offsets of everything in a region, derived from three numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub n_channels: u32,
    pub ring_entries: u32,
    pub arena_size: u32,
    /// Asynchronous send queues (0: no asynchronous sends).
    pub send_queues: u32,
    /// Descriptors per send queue (a power of two).
    pub sq_entries: u32,
    /// Receive rings (0: no eager receive push, no accept rings).
    pub recv_rings: u32,
    /// Bytes per receive ring (a power of two, 4 KiB..=16 MiB).
    pub rq_bytes: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            n_channels: DEFAULT_CHANNELS,
            ring_entries: DEFAULT_RING_ENTRIES,
            arena_size: DEFAULT_ARENA_SIZE,
            send_queues: DEFAULT_SEND_QUEUES,
            sq_entries: DEFAULT_SQ_ENTRIES,
            recv_rings: DEFAULT_RECV_RINGS,
            rq_bytes: DEFAULT_RQ_BYTES,
        }
    }
}

impl Layout {
    /// The geometry as eight words (the seven numbers, then 0), as the
    /// fabric attach's `Welcome` carries it.
    pub fn to_words(&self) -> [u32; 8] {
        [
            self.n_channels,
            self.ring_entries,
            self.arena_size,
            self.send_queues,
            self.sq_entries,
            self.recv_rings,
            self.rq_bytes,
            0,
        ]
    }

    /// The geometry [`to_words`](Self::to_words) wrote, validated.
    pub fn from_words(g: &[u32; 8]) -> Result<Layout, LayoutError> {
        let l = Layout {
            n_channels: g[0],
            ring_entries: g[1],
            arena_size: g[2],
            send_queues: g[3],
            sq_entries: g[4],
            recv_rings: g[5],
            rq_bytes: g[6],
        };
        l.validate().map(|()| l)
    }

    /// Checks that the geometry is sane and small enough to map.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.n_channels == 0 || self.n_channels > MAX_CHANNELS {
            return Err(LayoutError("n_channels must be 1..=4096"));
        }
        if !self.ring_entries.is_power_of_two() || !(2..=65536).contains(&self.ring_entries) {
            return Err(LayoutError(
                "ring_entries must be a power of two in 2..=65536",
            ));
        }
        if self.arena_size < PAGE as u32 || self.arena_size & (PAGE as u32 - 1) != 0 {
            return Err(LayoutError(
                "arena_size must be a non-zero multiple of 4096",
            ));
        }
        if self.arena_size > MAX_ARENA_SIZE {
            return Err(LayoutError("arena_size must be at most 64 MiB"));
        }
        if self.send_queues > MAX_SEND_QUEUES {
            return Err(LayoutError("send_queues must be at most 65536"));
        }
        if !self.sq_entries.is_power_of_two() || !(2..=MAX_SQ_ENTRIES).contains(&self.sq_entries) {
            return Err(LayoutError("sq_entries must be a power of two in 2..=4096"));
        }
        if self.recv_rings > MAX_RECV_RINGS {
            return Err(LayoutError("recv_rings must be at most 1048576"));
        }
        if !self.rq_bytes.is_power_of_two() || !(4096..=16 << 20).contains(&self.rq_bytes) {
            return Err(LayoutError(
                "rq_bytes must be a power of two in 4096..=16777216",
            ));
        }
        if self.region_size() > 1 << 36 {
            return Err(LayoutError("region larger than 64 GiB"));
        }
        Ok(())
    }

    pub fn requests_offset(&self) -> usize {
        CTL_SIZE
    }

    pub fn completions_offset(&self) -> usize {
        self.requests_offset() + self.ring_entries as usize * std::mem::size_of::<Request>()
    }

    /// Offset of the arena inside a channel (page aligned).
    pub fn arena_offset(&self) -> usize {
        let end = self.completions_offset()
            + self.ring_entries as usize * std::mem::size_of::<Completion>();
        end.next_multiple_of(PAGE)
    }

    pub fn channel_stride(&self) -> usize {
        self.arena_offset() + self.arena_size as usize
    }

    pub fn channel_offset(&self, index: u32) -> usize {
        HEADER_SIZE + index as usize * self.channel_stride()
    }

    /// Where the send queues start (page aligned: after the last channel).
    pub fn send_queues_offset(&self) -> usize {
        HEADER_SIZE + self.n_channels as usize * self.channel_stride()
    }

    pub fn sq_stride(&self) -> usize {
        crate::sendq::ctl::SQ_CTL_SIZE
            + self.sq_entries as usize * std::mem::size_of::<crate::sendq::ctl::SendDesc>()
    }

    pub fn send_queue_offset(&self, q: u32) -> usize {
        self.send_queues_offset() + q as usize * self.sq_stride()
    }

    /// Where the receive rings start (page aligned: after the send queues).
    pub fn recv_rings_offset(&self) -> usize {
        (self.send_queues_offset() + self.send_queues as usize * self.sq_stride())
            .next_multiple_of(PAGE)
    }

    pub fn rq_stride(&self) -> usize {
        crate::eager::ctl::RQ_CTL_SIZE + self.rq_bytes as usize
    }

    pub fn recv_ring_offset(&self, r: u32) -> usize {
        self.recv_rings_offset() + r as usize * self.rq_stride()
    }

    pub fn region_size(&self) -> usize {
        (self.recv_rings_offset() + self.recv_rings as usize * self.rq_stride())
            .next_multiple_of(PAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_valid_and_page_aligned() {
        let l = Layout::default();
        l.validate().unwrap();
        assert_eq!(l.arena_offset() % PAGE, 0);
        assert_eq!(l.channel_stride() % PAGE, 0);
        assert!(l.completions_offset() >= l.requests_offset() + 64 * 64);
        assert_eq!(
            l.send_queues_offset(),
            HEADER_SIZE + DEFAULT_CHANNELS as usize * l.channel_stride()
        );
        assert_eq!(l.region_size() % PAGE, 0);
        assert!(l.recv_rings_offset() >= l.send_queue_offset(l.send_queues));
        assert!(l.region_size() >= l.recv_ring_offset(l.recv_rings));
        assert_eq!(l.sq_stride() % 64, 0);
        assert_eq!(l.rq_stride() % 64, 0);
        assert_eq!(l.recv_rings_offset() % PAGE, 0);
    }

    #[test]
    fn geometry_words_round_trip_and_are_validated() {
        let l = Layout::default();
        assert_eq!(Layout::from_words(&l.to_words()), Ok(l));
        let mut bad = l.to_words();
        bad[0] = 0;
        assert!(Layout::from_words(&bad).is_err());
    }

    #[test]
    fn bad_geometry_is_refused() {
        let d = Layout::default();
        assert!(Layout {
            ring_entries: 3,
            ..d
        }
        .validate()
        .is_err());
        assert!(Layout {
            arena_size: 100,
            ..d
        }
        .validate()
        .is_err());
        assert!(Layout { n_channels: 0, ..d }.validate().is_err());
        assert!(Layout {
            sq_entries: 48,
            ..d
        }
        .validate()
        .is_err());
        assert!(Layout {
            send_queues: 0,
            ..d
        }
        .validate()
        .is_ok());
        assert!(Layout {
            rq_bytes: 5000,
            ..d
        }
        .validate()
        .is_err());
        assert!(Layout { recv_rings: 0, ..d }.validate().is_ok());
    }
}
