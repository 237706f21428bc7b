//! Remote hosts over a fabric (UCX, `crates/fabric`; `docs/ARCHITECTURE.md`,
//! "The channel over a fabric"). Built so far: `attach`, the authenticated
//! attach of one endpoint, `pump`, the server's half of a remote host's
//! channel, and `serve`, the thread (`--fabric-listen`) that drives them
//! (a socketpair stands in for the host's control socket: its hang-up
//! frees the host, as for a local one), and `calls`: `Socket` and `Bind`
//! of a remote host, run here; `rings`: the receive/accept rings', send
//! queues' and ready log's spans; `control`: a remote host's fork and
//! registration messages, forwarded to the worker.

pub mod attach;
pub mod calls;
pub mod control;
pub mod pump;
pub mod rings;
pub mod serve;

/// A small region for the pumps' tests (`n_channels` channels, two rings
/// and two send queues), mapped from a fresh memfd and initialised.
#[cfg(test)]
pub(crate) mod test_region {
    use std::os::fd::AsFd;
    use tcps_proto::layout::Layout;
    use tcps_proto::region::Region;

    pub fn layout(n_channels: u32) -> Layout {
        Layout {
            n_channels,
            ring_entries: 8,
            arena_size: 4096,
            send_queues: 2,
            sq_entries: 8,
            recv_rings: 2,
            rq_bytes: 4096,
        }
    }

    pub fn region(l: Layout) -> Region {
        let fd = crate::sys::memfd(c"fabric-test", l.region_size()).unwrap();
        let r = Region::map(fd.as_fd(), l).unwrap();
        r.init_header();
        r
    }
}
