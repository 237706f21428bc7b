//! Remote hosts over a fabric (UCX, `crates/fabric`; `docs/ARCHITECTURE.md`,
//! "The channel over a fabric"). Built so far: `attach`, the authenticated
//! attach of one endpoint, and `pump`, the server's half of a remote
//! host's channel. To come: the listener thread (`--fabric-listen`)
//! driving them, a socketpair standing in for the host's control socket
//! (its hang-up frees the host, as for a local one), keepalives.

// Used by their tests only until the listener thread lands.
#[allow(dead_code)]
pub mod attach;
#[allow(dead_code)]
pub mod pump;
