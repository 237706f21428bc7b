//! Hot upgrade (`tcps server --upgrade`, SIGUSR2): the server execs a new
//! binary in place (same pid) and carries its hosts, their channels,
//! registrations and sockets — listeners, connections, receive and accept
//! rings, pull buffers, send queues — across the exec. Hosts see a pause.
//!
//! Files, bottom up: `record` (the versioned state record in a sealed
//! memfd), `quiesce` (a worker's hosts: answer parked calls with
//! `ERETRY`, settle what is in flight, write them down), `restore` (the
//! new binary: records back into hosts), `exec` (the upgrading thread:
//! check the new binary, pause, gather, exec). The worker drives
//! `quiesce` and `restore` (`worker::pause`).

pub mod exec;
pub mod quiesce;
pub mod record;
pub mod restore;

pub use record::{can_load, RECORD_VERSION};
