//! Eager receive and eager accept at the server (`docs/PROTOCOL.md` §10):
//! receiving ahead into a socket's receive ring (*push*) or into a pull
//! buffer of the server's own (*pull*), and accepting ahead into a
//! listener's accept ring.
//!
//! Everything is driven by readiness: a socket that receives (accepts)
//! eagerly stays armed for POLLIN in the engine; when it is readable the
//! worker `recv(2)`s straight into the free span of the ring (no
//! intermediate buffer; with io_uring a receive ring instead always has a
//! receive into its free span in flight, `ringop`) or `accept4`s (with
//! io_uring: accepts in flight, `acceptop`) and writes one `AcceptRecord` per
//! connection, then publishes `tail` once. A full ring pauses (`paused = 1`,
//! disarmed) until the host kicks (`Op::RecvKick`) or the periodic sweep
//! sees room.
//!
//! Everything the host writes (`head`, `host_waiting`) is untrusted: `head`
//! is clamped to `[consumed, tail]` (`tcps_proto::eager::look`) before use;
//! every control-block access and handshake is `tcps_proto::eager`'s
//! `RecvRingProducer` / `AcceptRingProducer`.
//!
//! Files, bottom up (each imports only files listed before it):
//! `pullbuf` (the pull buffer type and its budget), `ring` (the per-socket
//! state: what a socket does eagerly, the server's ring cursors),
//! `acceptwake` (a sleeping acceptor woken when its connection has data), `recv`
//! (receive rings), `ringop` (receive rings filled by io_uring receives,
//! settled before they stop), `pull` (pull sockets), `setup` (setup-with-accept and
//! the `SOL_TCPS` policy), `accept` (accept rings), `acceptop` (accept
//! rings filled by io_uring accepts, settled before they stop), this file ([`fill`]),
//! `handover` (unbinding for close, exec and fork), `sweep` (kicks,
//! resumes, the periodic sweep: above `blocking` and `poll`, which it
//! drives).

pub(crate) mod accept;
pub(crate) mod acceptop;
pub(crate) mod acceptwake;
pub(crate) mod handover;
pub(crate) mod pull;
pub(crate) mod pullbuf;
pub(crate) mod recv;
pub(crate) mod ring;
pub(crate) mod ringop;
pub(crate) mod setup;
pub(crate) mod sweep;

use super::common::Ctx;
use crate::host::Host;
use accept::fill_accept;
use pull::fill_pull;
use ring::Eager;
use ringop::fill_ring;

/// Reads (accepts) ahead as far as the ring / buffer allows. Returns
/// whether anything was published (parked polls should look again).
pub(crate) fn fill(cx: &mut Ctx<'_>, host: &mut Host, sid: u32) -> bool {
    let Some(s) = host.sockets.get(sid as usize) else {
        return false;
    };
    match s.eager {
        Eager::None => false,
        Eager::Recv(_) => fill_ring(cx, host, sid),
        Eager::Pull(_) => fill_pull(host, sid),
        Eager::Accept(_) => {
            acceptop::fill(cx, host, sid).unwrap_or_else(|| fill_accept(cx, host, sid))
        }
    }
}
