//! Arrival numbers: the order in which the server observed its hosts'
//! sockets become readable (`docs/PROTOCOL.md` §10, readiness in arrival
//! order).

/// When the server observed a socket become readable (data or a
/// connection where it held none): this host's arrival number, in the
/// order the server observed them, and the wall clock (to merge with the
/// kernel's arrival times of sockets that do not read ahead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arrival {
    pub seq: u32,
    pub ns: u64,
}

impl Arrival {
    /// Numbers an arrival the server just observed, from the host's
    /// counter (`Host::arrivals`).
    pub fn next(counter: &mut u32) -> Arrival {
        *counter = counter.wrapping_add(1);
        Arrival {
            seq: *counter,
            ns: crate::sys::realtime_ns(),
        }
    }
}
