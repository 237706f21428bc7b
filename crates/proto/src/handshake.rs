//! The attach handshake on the Unix control socket (SOCK_SEQPACKET).
//!
//! ```text
//! host   → server  Hello   { magic, version, pid }
//! server → host    Welcome { magic, version, status, region_size, message }
//!                  + SCM_RIGHTS [region memfd, doorbell eventfd] when status == 0
//! ```
//!
//! A refused attach (admission control, version mismatch) has a non-zero
//! `status` (an errno) and a human-readable `message`. After a successful
//! attach the control socket stays open; its hang-up is how each side learns
//! that the other died. It then carries only memory registration
//! ([`ControlMsg`]), which needs to pass a descriptor:
//!
//! ```text
//! host   → server  Register   { handle, len } + SCM_RIGHTS [memfd]
//! host   → server  Deregister { handle }
//! host   → server  Fork       { handle }  snapshot my sockets for a child
//! host   → server  Forked     { handle, child }  after fork(2): snapshot
//!                  `handle` is for process `child` (0: fork failed, drop it)
//! host   → server  Inherit    { handle }  (a forked child) adopt that snapshot
//! host   → server  Export     { handle: sock }  hand the kernel socket back (exec)
//! host   → server  FileOpen   { handle } + SCM_RIGHTS [file]  for `Op::SendFile`
//! host   → server  FileClose  { handle }
//! host   → server  SocketAdopt { handle, nonblocking } + SCM_RIGHTS [socket]
//!                  adopt a TCP socket the host created (and maybe bound) itself
//! host   → server  SocketDup  { handle: sock }  a dup of one of my sockets
//! host   → server  HostDoorbell { handle }  the pipe the server rings when
//!                  it woke one of my ring sleepers (poll on rings + kernel fds)
//! host   → server  Direct     { handle }  handle 0: I take direct connections;
//!                  else: the kernel socket of direct connection `handle`
//! server → host    Reply      { handle, errno }      (one per message above)
//! server → host    Adopted    { handle, sock }       (SocketAdopt's success)
//! ```
//!
//! A local host creates, binds and listens on its kernel sockets itself, so
//! the kernel checks its own credentials (`docs/PROTOCOL.md` §6); the server
//! only runs the data path on the sockets it is handed.
//!
//! The memfd must be sealed against shrinking (`F_SEAL_SHRINK`), so the
//! server's mapping can never lose its pages (SIGBUS) under it.
//!
//! A statistics client (`tcps stat`) sends a [`StatQuery`] instead of a
//! `Hello` (same length, told apart by its magic). It is not an attach: the
//! server answers with JSON text in SEQPACKET messages of at most
//! [`STAT_CHUNK`] bytes, then one empty message, and closes:
//!
//! ```text
//! client → server  StatQuery { magic "TCPSSTAT", version, flags }
//! server → client  JSON chunk … | empty message
//! ```

use crate::layout::{MAGIC, VERSION};

pub const HELLO_LEN: usize = 16;
pub const MESSAGE_LEN: usize = 200;
pub const WELCOME_LEN: usize = 24 + MESSAGE_LEN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub magic: u64,
    pub version: u32,
    pub pid: u32,
}

impl Hello {
    pub fn new(pid: u32) -> Hello {
        Hello {
            magic: MAGIC,
            version: VERSION,
            pid,
        }
    }

    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.pid.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Hello> {
        if b.len() != HELLO_LEN {
            return None;
        }
        Some(Hello {
            magic: u64::from_le_bytes(b[0..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            pid: u32::from_le_bytes(b[12..16].try_into().ok()?),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub magic: u64,
    pub version: u32,
    /// 0: attached; otherwise the errno of the refusal.
    pub status: i32,
    pub region_size: u64,
    pub message: String,
}

impl Welcome {
    pub fn accepted(region_size: u64) -> Welcome {
        Welcome {
            magic: MAGIC,
            version: VERSION,
            status: 0,
            region_size,
            message: String::new(),
        }
    }

    pub fn refused(errno: i32, message: impl Into<String>) -> Welcome {
        Welcome {
            magic: MAGIC,
            version: VERSION,
            status: errno,
            region_size: 0,
            message: message.into(),
        }
    }

    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..24].copy_from_slice(&self.region_size.to_le_bytes());
        let m = self.message.as_bytes();
        let n = m.len().min(MESSAGE_LEN);
        b[24..24 + n].copy_from_slice(&m[..n]);
        b
    }

    pub fn decode(b: &[u8]) -> Option<Welcome> {
        if b.len() != WELCOME_LEN {
            return None;
        }
        let msg = &b[24..];
        let end = msg.iter().position(|&c| c == 0).unwrap_or(msg.len());
        Some(Welcome {
            magic: u64::from_le_bytes(b[0..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            status: i32::from_le_bytes(b[12..16].try_into().ok()?),
            region_size: u64::from_le_bytes(b[16..24].try_into().ok()?),
            message: String::from_utf8_lossy(&msg[..end]).into_owned(),
        })
    }
}

/// Length of an encoded [`ControlMsg`].
pub const CONTROL_MSG_LEN: usize = 24;

/// A memory-registration message on an attached control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMsg {
    /// Map the memfd that comes with this message (`len` bytes from offset 0)
    /// as registration `handle` (< [`crate::sendq::MAX_REGISTRATIONS`]).
    Register { handle: u32, len: u64 },
    /// Unmap registration `handle`; refused with EBUSY while sends use it.
    Deregister { handle: u32 },
    /// fork(): duplicate every socket of this host into a snapshot named by
    /// `handle` (a random nonce) for a child to inherit.
    Fork { handle: u32 },
    /// Sent by the parent right after fork(2): snapshot `handle` is for
    /// process `child`, or (`child` 0) the fork failed and nobody will
    /// claim it. The server then drops the snapshot as soon as that child
    /// is gone, and lets it claim even after the parent died.
    Forked { handle: u32, child: u32 },
    /// Sent by a forked child right after it attached: adopt snapshot
    /// `handle` of the parent, under the same socket ids.
    Inherit { handle: u32 },
    /// Take socket `handle` out of the server and hand its kernel socket to
    /// the host (before exec(2)): answered by a `Reply` carrying the socket
    /// (SCM_RIGHTS) when `errno` is 0.
    Export { handle: u32 },
    /// Keep the regular file that comes with this message as file `handle`
    /// of this host, for `Op::SendFile` (the server sends from it itself).
    FileOpen { handle: u32 },
    /// Close file `handle`.
    FileClose { handle: u32 },
    /// Adopt the TCP socket that comes with this message (SCM_RIGHTS), which
    /// the host created itself: answered by `Adopted` with its new socket id,
    /// or a `Reply` with the errno. `handle` is a nonce matching the answer.
    SocketAdopt { handle: u32, nonblocking: bool },
    /// Hand the host a duplicate of its socket `handle`'s kernel socket (the
    /// socket stays at the server): a `Reply` carrying it (SCM_RIGHTS) when
    /// `errno` is 0. For what only the host's own credentials may do on a
    /// socket the server accepted (privileged options).
    SocketDup { handle: u32 },
    /// Give this host a *host doorbell*: a pipe the server writes a byte
    /// to at the end of a worker pass in which it published to a ring or
    /// send queue a doorbell sleeper of this host registered on. Answered
    /// by a `Reply` carrying the read end (SCM_RIGHTS) when `errno` is 0
    /// (the write end stays the server's alone); asking again hands out the
    /// same pipe. With it a host blocks in one poll(2) on its kernel fds
    /// and its rings at once.
    HostDoorbell { handle: u32 },
    /// Balancing (`SETUP_DIRECT`). `handle == 0`: this host takes direct
    /// connections from now on (answered by a `Reply`, errno 0). Otherwise
    /// the kernel socket of the direct connection `handle` (from an accept
    /// record or an `Accept` completion): a `Reply` carrying it (SCM_RIGHTS)
    /// when `errno` is 0, `ENOENT` for a handle the server does not hold.
    Direct { handle: u32 },
    /// The server's answer to any of the above: 0 or an errno.
    Reply { handle: u32, errno: i32 },
    /// `SocketAdopt`'s success: the socket is now tcps socket `sock`.
    Adopted { handle: u32, sock: u32 },
}

const CTL_REGISTER: u32 = 1;
const CTL_DEREGISTER: u32 = 2;
const CTL_REPLY: u32 = 3;
const CTL_FORK: u32 = 4;
const CTL_INHERIT: u32 = 5;
const CTL_EXPORT: u32 = 6;
const CTL_FILE_OPEN: u32 = 7;
const CTL_FILE_CLOSE: u32 = 8;
const CTL_SOCKET_ADOPT: u32 = 9;
const CTL_SOCKET_DUP: u32 = 10;
const CTL_ADOPTED: u32 = 11;
const CTL_HOST_DOORBELL: u32 = 12;
const CTL_DIRECT: u32 = 13;
const CTL_FORKED: u32 = 14;

impl ControlMsg {
    /// The handle the message names; an answer (`Reply`, `Adopted`) names
    /// the handle of the message it answers.
    pub fn handle(&self) -> u32 {
        self.parts().1
    }

    pub fn encode(&self) -> [u8; CONTROL_MSG_LEN] {
        let (kind, handle, arg) = self.parts();
        let mut b = [0u8; CONTROL_MSG_LEN];
        b[0..4].copy_from_slice(&(MAGIC as u32).to_le_bytes());
        b[4..8].copy_from_slice(&kind.to_le_bytes());
        b[8..12].copy_from_slice(&handle.to_le_bytes());
        b[16..24].copy_from_slice(&arg.to_le_bytes());
        b
    }

    /// (kind, handle, argument): the fields of the wire form.
    fn parts(&self) -> (u32, u32, u64) {
        match *self {
            ControlMsg::Register { handle, len } => (CTL_REGISTER, handle, len),
            ControlMsg::Deregister { handle } => (CTL_DEREGISTER, handle, 0),
            ControlMsg::Reply { handle, errno } => (CTL_REPLY, handle, errno as u32 as u64),
            ControlMsg::Fork { handle } => (CTL_FORK, handle, 0),
            ControlMsg::Forked { handle, child } => (CTL_FORKED, handle, u64::from(child)),
            ControlMsg::Inherit { handle } => (CTL_INHERIT, handle, 0),
            ControlMsg::Export { handle } => (CTL_EXPORT, handle, 0),
            ControlMsg::FileOpen { handle } => (CTL_FILE_OPEN, handle, 0),
            ControlMsg::FileClose { handle } => (CTL_FILE_CLOSE, handle, 0),
            ControlMsg::SocketAdopt {
                handle,
                nonblocking,
            } => (CTL_SOCKET_ADOPT, handle, u64::from(nonblocking)),
            ControlMsg::SocketDup { handle } => (CTL_SOCKET_DUP, handle, 0),
            ControlMsg::Adopted { handle, sock } => (CTL_ADOPTED, handle, u64::from(sock)),
            ControlMsg::HostDoorbell { handle } => (CTL_HOST_DOORBELL, handle, 0),
            ControlMsg::Direct { handle } => (CTL_DIRECT, handle, 0),
        }
    }

    pub fn decode(b: &[u8]) -> Option<ControlMsg> {
        if b.len() != CONTROL_MSG_LEN
            || u32::from_le_bytes(b[0..4].try_into().ok()?) != MAGIC as u32
        {
            return None;
        }
        let handle = u32::from_le_bytes(b[8..12].try_into().ok()?);
        let arg = u64::from_le_bytes(b[16..24].try_into().ok()?);
        match u32::from_le_bytes(b[4..8].try_into().ok()?) {
            CTL_REGISTER => Some(ControlMsg::Register { handle, len: arg }),
            CTL_DEREGISTER => Some(ControlMsg::Deregister { handle }),
            CTL_FORK => Some(ControlMsg::Fork { handle }),
            CTL_INHERIT => Some(ControlMsg::Inherit { handle }),
            CTL_FORKED => Some(ControlMsg::Forked {
                handle,
                child: u32::try_from(arg).ok()?,
            }),
            CTL_EXPORT => Some(ControlMsg::Export { handle }),
            CTL_FILE_OPEN => Some(ControlMsg::FileOpen { handle }),
            CTL_FILE_CLOSE => Some(ControlMsg::FileClose { handle }),
            CTL_SOCKET_ADOPT => Some(ControlMsg::SocketAdopt {
                handle,
                nonblocking: arg & 1 != 0,
            }),
            CTL_SOCKET_DUP => Some(ControlMsg::SocketDup { handle }),
            CTL_HOST_DOORBELL => Some(ControlMsg::HostDoorbell { handle }),
            CTL_DIRECT => Some(ControlMsg::Direct { handle }),
            CTL_ADOPTED => Some(ControlMsg::Adopted {
                handle,
                sock: u32::try_from(arg).ok()?,
            }),
            CTL_REPLY => Some(ControlMsg::Reply {
                handle,
                errno: arg as u32 as i32,
            }),
            _ => None,
        }
    }
}

/// Identifies a [`StatQuery`] ("TCPSSTAT").
pub const STAT_MAGIC: u64 = u64::from_le_bytes(*b"TCPSSTAT");
/// Bytes of an encoded [`StatQuery`] (the same as a `Hello`).
pub const STAT_QUERY_LEN: usize = 16;
/// Largest message of a stat reply; the reply ends with an empty message.
pub const STAT_CHUNK: usize = 60 * 1024;

/// `tcps stat`'s request on the control socket, sent instead of a `Hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatQuery {
    pub magic: u64,
    pub version: u32,
    /// Reserved for options; 0.
    pub flags: u32,
}

impl StatQuery {
    pub fn new(flags: u32) -> StatQuery {
        StatQuery {
            magic: STAT_MAGIC,
            version: VERSION,
            flags,
        }
    }

    pub fn encode(&self) -> [u8; STAT_QUERY_LEN] {
        let mut b = [0u8; STAT_QUERY_LEN];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// A stat query (any version), or `None` for anything else — a
    /// `Hello` included, its magic being different.
    pub fn decode(b: &[u8]) -> Option<StatQuery> {
        if b.len() != STAT_QUERY_LEN {
            return None;
        }
        let q = StatQuery {
            magic: u64::from_le_bytes(b[0..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            flags: u32::from_le_bytes(b[12..16].try_into().ok()?),
        };
        (q.magic == STAT_MAGIC).then_some(q)
    }
}

/// Where a server listens and a host looks when no path is given: one
/// system-wide path, whoever asks. Not under `$XDG_RUNTIME_DIR`, which each
/// login session (root's too) sets to its own mode-0700 directory: a server
/// started from a login shell would hide there from everyone else, and each
/// user's programs would look in their own. A per-user server says
/// `--socket` (and its programs `TCPS_SOCKET`).
pub const DEFAULT_SOCKET_PATH: &str = "/run/tcps/tcps.sock";

/// [`DEFAULT_SOCKET_PATH`] as a path.
pub fn default_socket_path() -> std::path::PathBuf {
    std::path::PathBuf::from(DEFAULT_SOCKET_PATH)
}

/// The environment variable a host library reads for the control socket path.
pub const SOCKET_ENV: &str = "TCPS_SOCKET";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_welcome_round_trip() {
        let h = Hello::new(42);
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        let w = Welcome::refused(libc::EAGAIN, "too many hosts");
        assert_eq!(Welcome::decode(&w.encode()), Some(w));
        assert_eq!(Hello::decode(&[0u8; 3]), None);
    }

    #[test]
    fn stat_query_round_trip() {
        let q = StatQuery::new(5);
        let b = q.encode();
        assert_eq!(&b[0..8], b"TCPSSTAT");
        assert_eq!(StatQuery::decode(&b), Some(q));
        assert_eq!(q.version, VERSION);
        // A Hello is not a stat query (nor the other way round), though both are 16 bytes.
        assert_eq!(StatQuery::decode(&Hello::new(1).encode()), None);
        assert_ne!(Hello::decode(&b).map(|h| h.magic), Some(MAGIC));
        assert_eq!(StatQuery::decode(&b[..15]), None);
        assert_eq!(StatQuery::decode(&[0u8; STAT_QUERY_LEN]), None);
        assert_eq!(STAT_QUERY_LEN, HELLO_LEN);
    }

    #[test]
    fn control_messages_round_trip() {
        for m in [
            ControlMsg::Register {
                handle: 3,
                len: 1 << 40,
            },
            ControlMsg::Deregister { handle: 1023 },
            ControlMsg::Fork {
                handle: 0xdead_beef,
            },
            ControlMsg::Inherit { handle: 1 },
            ControlMsg::Forked {
                handle: 9,
                child: 4242,
            },
            ControlMsg::Export { handle: 9 },
            ControlMsg::FileOpen { handle: 10 },
            ControlMsg::FileClose { handle: 11 },
            ControlMsg::SocketAdopt {
                handle: 12,
                nonblocking: true,
            },
            ControlMsg::SocketDup { handle: 13 },
            ControlMsg::HostDoorbell { handle: 16 },
            ControlMsg::Direct { handle: 17 },
            ControlMsg::Adopted {
                handle: 14,
                sock: 15,
            },
            ControlMsg::Reply {
                handle: 7,
                errno: libc::EBUSY,
            },
        ] {
            assert_eq!(ControlMsg::decode(&m.encode()), Some(m));
        }
        assert_eq!(ControlMsg::decode(&[0u8; CONTROL_MSG_LEN]), None);
    }
}
