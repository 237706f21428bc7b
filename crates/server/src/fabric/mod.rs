//! Remote hosts over a fabric (UCX, `crates/fabric`; `docs/ARCHITECTURE.md`,
//! "The channel over a fabric"). Built so far: `attach`, the authenticated
//! attach of one endpoint, `pump`, the server's half of a remote host's
//! channel, and `serve`, the thread (`--fabric-listen`) that drives them
//! (a socketpair stands in for the host's control socket: its hang-up
//! frees the host, as for a local one), and `calls`: `Socket` and `Bind`
//! of a remote host, run here; `rings`: the receive/accept rings', send
//! queues' and ready log's spans.

pub mod attach;
pub mod calls;
pub mod pump;
pub mod rings;
pub mod serve;
