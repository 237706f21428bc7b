//! The state record a hot upgrade hands to the new binary: versioned JSON
//! in a sealed memfd, descriptors named by number (they survive the exec:
//! their FD_CLOEXEC is cleared just before it).
//!
//! Only what cannot be rebuilt is recorded: per host its descriptors, its
//! channels' server cursors, its registrations, files and host doorbells,
//! and per socket the kernel socket, its flags and the server's private
//! state of its receive ring, accept ring, pull buffer and send queue.
//! Nothing in flight is: the old server answered every parked call first
//! (`quiesce`) and let the sends at the engine finish.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The record's format; bump it on any change below.
pub const RECORD_FORMAT: u32 = 1;

/// The record's version: its format and the channel protocol's version
/// (`tcps_proto::VERSION`: the hosts' regions and messages, which the new
/// binary must speak as the old one did). A binary loads only its own
/// (`tcps server --upgrade-check N`).
pub const RECORD_VERSION: u32 = (RECORD_FORMAT << 16) | tcps_proto::VERSION;

/// The environment variable naming the record's memfd in the new binary.
pub const STATE_ENV: &str = "TCPS_UPGRADE_STATE";

/// The whole server.
#[derive(Serialize, Deserialize, Debug, Default)]
pub struct Record {
    pub version: u32,
    /// The control socket's listener.
    pub listener: RawFd,
    /// Whether this server made the socket file (it removes it at stop).
    pub made_socket_path: bool,
    /// The metrics listener (`--metrics-listen`), if any.
    pub metrics: Option<RawFd>,
    /// The last host id given out: the new control thread goes on after it.
    pub last_host_id: u64,
    pub refused_hosts: u64,
    /// Upgrades done before this one.
    pub upgrades: u64,
    /// Each worker's hosts, by worker index.
    pub workers: Vec<Vec<HostRecord>>,
}

/// One attached host.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct HostRecord {
    pub id: u64,
    pub pid: u32,
    pub uid: u32,
    pub memfd: RawFd,
    pub control: RawFd,
    pub doorbell: RawFd,
    /// The server's cursor of each channel (`ServerCursor::to_words`).
    pub cursors: Vec<[u32; 4]>,
    /// Host doorbells: (slot, write end, read end).
    pub bells: Vec<(u32, RawFd, RawFd)>,
    /// Registrations: (handle, memfd, length).
    pub registrations: Vec<(u32, RawFd, u64)>,
    /// Files for `SendFile`: (id, descriptor).
    pub files: Vec<(u32, RawFd)>,
    pub sockets: Vec<SockRecord>,
    /// Send queues ever bound (index and the server's state).
    pub queues: Vec<QueueRecord>,
    pub next_gen: u16,
    pub arrivals: u32,
    /// It said it takes direct connections (balancing).
    pub takes_direct: bool,
}

/// One socket of a host.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct SockRecord {
    pub id: u32,
    pub gen: u16,
    pub fd: RawFd,
    pub nonblocking: bool,
    pub rcv_timeout_ns: Option<u64>,
    pub snd_timeout_ns: Option<u64>,
    pub recv_error: Option<i32>,
    pub queue: Option<u32>,
    pub closing: bool,
    pub live_accepted: u32,
    pub may_linger: bool,
    pub listener_lingers: Option<bool>,
    pub admitted_listener: Option<(u32, u16)>,
    pub admitted_addr: Option<std::net::IpAddr>,
    pub policy: PolicyRecord,
    pub eager: EagerRecord,
    /// `HostHeld::owner`, when the host holds the description too.
    pub host_held: Option<u32>,
}

/// `config::EagerPolicy`.
#[derive(Serialize, Deserialize, Debug, Default, Clone, Copy)]
pub struct PolicyRecord {
    pub accept: bool,
    pub accept_size: u32,
    /// 0 off, 1 push, 2 pull (`config::EagerRecv`).
    pub recv: u8,
    pub recv_size: u32,
    pub setup_with_accept: bool,
    pub balance: bool,
}

/// The end of a stream read ahead: 0 EOF, else an errno.
pub type EndRecord = Option<i32>;

/// `calls::eager::ring::Eager`, without what is in flight.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub enum EagerRecord {
    #[default]
    None,
    Recv {
        consumed: u32,
        tail: u32,
        paused: bool,
        ended: bool,
        end: EndRecord,
        kicks: u32,
    },
    Accept {
        consumed: u32,
        tail: u32,
        paused: bool,
        demanded: bool,
        kicks: u32,
        /// (position, socket id, generation) of the connections published.
        published: Vec<(u32, u32, u16)>,
    },
    Pull {
        /// The bytes read ahead and not yet taken.
        bytes: Vec<u8>,
        cap: usize,
        end: EndRecord,
        throttled: bool,
    },
}

/// `host::QueueState` of one send queue.
#[derive(Serialize, Deserialize, Debug, Default, Clone, Copy)]
pub struct QueueRecord {
    pub index: u32,
    pub owner: Option<u32>,
    pub ingested: u32,
    pub done: u32,
    pub error: i32,
    pub overrun: bool,
    pub kicks: u32,
}

impl Record {
    /// Every descriptor the record names (they must survive the exec).
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v = vec![self.listener];
        v.extend(self.metrics);
        for h in self.workers.iter().flatten() {
            v.extend([h.memfd, h.control, h.doorbell]);
            v.extend(h.bells.iter().flat_map(|&(_, tx, rx)| [tx, rx]));
            v.extend(h.registrations.iter().map(|r| r.1));
            v.extend(h.files.iter().map(|f| f.1));
            v.extend(h.sockets.iter().map(|s| s.fd));
        }
        v
    }

    /// The record in a sealed memfd (without FD_CLOEXEC: for the exec).
    pub fn to_memfd(&self) -> io::Result<OwnedFd> {
        let bytes = serde_json::to_vec(self).map_err(io::Error::other)?;
        // SAFETY: memfd_create with a valid C string; the result is checked.
        let fd = unsafe { libc::memfd_create(c"tcps-upgrade".as_ptr(), libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        std::fs::File::from(fd.try_clone()?).write_all(&bytes)?;
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        // SAFETY: fcntl on our own memfd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    /// Reads the record the old binary left in memfd `fd` (taken and
    /// closed). An error for a version this binary does not know.
    pub fn from_memfd(fd: RawFd) -> io::Result<Record> {
        // SAFETY: the descriptor the old binary named for us; nobody else
        // in this process owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut file = std::fs::File::from(fd);
        let mut bytes = Vec::new();
        io::Seek::seek(&mut file, io::SeekFrom::Start(0))?;
        file.read_to_end(&mut bytes)?;
        let version: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(io::Error::other)?;
        let v = version.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if !can_load(v as u32) {
            return Err(io::Error::other(format!(
                "state record version {v}: this binary loads version {RECORD_VERSION}"
            )));
        }
        serde_json::from_value(version).map_err(io::Error::other)
    }
}

/// Whether this binary loads records of `version`.
pub fn can_load(version: u32) -> bool {
    version == RECORD_VERSION
}

/// Sets or clears FD_CLOEXEC on `fd`.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor of this process.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let want = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, want) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes descriptor `fd` a record named (FD_CLOEXEC set again: nothing
/// the new server starts inherits it).
pub fn own(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    set_cloexec(fd, true)?;
    // SAFETY: a descriptor the old binary kept open for us, named once in
    // the record; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_memfd() {
        let mut r = Record {
            version: RECORD_VERSION,
            listener: 7,
            last_host_id: 3,
            ..Default::default()
        };
        r.workers.push(vec![HostRecord {
            id: 3,
            sockets: vec![SockRecord {
                id: 5,
                eager: EagerRecord::Pull {
                    bytes: b"abc".to_vec(),
                    cap: 16,
                    end: Some(0),
                    throttled: false,
                },
                ..Default::default()
            }],
            ..Default::default()
        }]);
        let fd = r.to_memfd().unwrap();
        let back = Record::from_memfd(std::os::fd::IntoRawFd::into_raw_fd(fd.try_clone().unwrap()))
            .unwrap();
        assert_eq!(back.listener, 7);
        assert_eq!(back.workers[0][0].sockets[0].id, 5);
        assert!(
            matches!(&back.workers[0][0].sockets[0].eager, EagerRecord::Pull { bytes, .. } if bytes == b"abc")
        );
        assert_eq!(r.fds().len(), 1 + 3 + 1);
    }

    #[test]
    fn another_version_is_refused() {
        assert!(can_load(RECORD_VERSION));
        assert!(!can_load(RECORD_VERSION + 1));
        let r = Record {
            version: RECORD_VERSION + 1,
            ..Default::default()
        };
        let fd = r.to_memfd().unwrap();
        assert!(
            Record::from_memfd(std::os::fd::IntoRawFd::into_raw_fd(fd.try_clone().unwrap()))
                .is_err()
        );
    }
}
