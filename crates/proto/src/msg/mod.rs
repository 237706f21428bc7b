//! Requests (host → server) and completions (server → host).
//!
//! A request names a call ([`Op`], the thesis' `CallType`), the socket it is
//! for and its arguments; bulk arguments (data, addresses, option values,
//! poll sets) live in the channel's arena at `buf_off..buf_off+buf_len`. A
//! completion carries the call, its result and the server-side errno (the
//! thesis' `CallReturn {call, error, errno}`).
//!
//! Everything in a [`Request`] is host-written and untrusted. The server
//! copies the record out of shared memory and turns it into a [`Call`] with
//! [`Call::decode`], which checks every field; a request that fails is
//! answered with `EINVAL` and affects nobody else. The host builds requests
//! from calls with [`Call::encode`] (`msg/encode.rs`), so `decode(encode(c))
//! == c` for every valid call (a property test says so).

/// `Close` flag (`args[0]`): execute the close without a completion.
pub const CLOSE_NO_REPLY: u64 = 1;
/// `Shutdown` flag (`args[1]`): execute the shutdown without a completion.
pub const SHUTDOWN_NO_REPLY: u64 = 1;
/// A completion's errno meaning "issue this call again": the server
/// (a hot upgrade, `tcps server --upgrade`) answered a parked call before
/// it finished and moved no byte for it. The host library re-issues the
/// same request; applications never see it. 512 is Linux's internal
/// ERESTARTSYS, which user space never gets from the kernel.
pub const ERETRY: i32 = 512;

/// A request record: 64 bytes, one ring slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Opaque host tag, echoed in the completion.
    pub user_data: u64,
    /// An [`Op`] code.
    pub op: u16,
    /// Publication stamp of the slot, written last by the producer (see
    /// [`crate::ring`]); not part of the call and not validated here.
    pub stamp: u16,
    /// The socket id the call is for (ignored by `Socket`, `Poll`, `Nop`).
    pub sock: u32,
    /// Arena range holding in- or out-arguments.
    pub buf_off: u32,
    pub buf_len: u32,
    /// Op-specific scalar arguments (see [`Call`]).
    pub args: [u64; 5],
}

/// A completion record: 32 bytes, one ring slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub user_data: u64,
    /// The [`Op`] code of the request this answers.
    pub op: u16,
    /// Publication stamp of the slot (see [`crate::ring`]).
    pub stamp: u16,
    /// 0 on success, else the errno the call got at the server.
    pub errno: i32,
    /// The call's return value (bytes, a socket id, a count); -1 on error.
    pub result: i64,
    /// Op-specific second result (an address or option length).
    pub aux: u64,
}

const _: () = assert!(std::mem::size_of::<Request>() == 64);
const _: () = assert!(std::mem::size_of::<Completion>() == 32);

impl Request {
    /// A request from a copy of its ring slot's 64 bytes (`repr(C)` field
    /// order, little-endian): what a fabric pump reads out of a span.
    pub fn from_slot(b: &[u8; 64]) -> Request {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Request {
            user_data: u64_at(0),
            op: u16::from_le_bytes([b[8], b[9]]),
            stamp: u16::from_le_bytes([b[10], b[11]]),
            sock: u32_at(12),
            buf_off: u32_at(16),
            buf_len: u32_at(20),
            args: std::array::from_fn(|k| u64_at(24 + 8 * k)),
        }
    }
}

impl Completion {
    /// A completion from a copy of its ring slot's 32 bytes (as
    /// [`Request::from_slot`]).
    pub fn from_slot(b: &[u8; 32]) -> Completion {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Completion {
            user_data: u64_at(0),
            op: u16::from_le_bytes([b[8], b[9]]),
            stamp: u16::from_le_bytes([b[10], b[11]]),
            errno: i32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            result: u64_at(16) as i64,
            aux: u64_at(24),
        }
    }
}

macro_rules! ops {
    ($($name:ident = $val:literal),* $(,)?) => {
        /// Call types. Zero is deliberately not a valid op, so a zeroed slot is an error.
        #[repr(u16)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Op { $($name = $val),* }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$name),*];

            pub fn from_u16(v: u16) -> Option<Op> {
                match v { $($val => Some(Op::$name),)* _ => None }
            }

            pub fn name(self) -> &'static str {
                match self { $(Op::$name => stringify!($name)),* }
            }

            /// Whether the request's `sock` names a socket (all but
            /// `Nop`, `Socket`, `Poll` and the file calls).
            pub fn names_socket(self) -> bool {
                !matches!(
                    self,
                    Op::Nop | Op::Socket | Op::Poll | Op::FileOpen | Op::FileClose
                )
            }
        }
    };
}

ops! {
    Nop = 1, Socket = 2, Bind = 3, Listen = 4, Accept = 5, Connect = 6, Send = 7,
    Recv = 8, Shutdown = 9, Close = 10, SetSockOpt = 11, GetSockOpt = 12,
    GetSockName = 13, GetPeerName = 14, Poll = 15, Fcntl = 16,
    SendReg = 17, RecvReg = 18, AsyncBind = 19, AsyncKick = 20, SendFile = 21,
    RecvKick = 22, RecvBind = 23, Cancel = 24, FileOpen = 25, FileClose = 26,
}

/// A byte range of the channel arena, checked to lie inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaRange {
    pub off: u32,
    pub len: u32,
}

impl ArenaRange {
    pub fn end(&self) -> usize {
        self.off as usize + self.len as usize
    }
}

/// A byte range of a host's registered memory (see [`crate::sendq`]):
/// `len` bytes at `off` in registration `mem`. Checked against the
/// server's own table of registrations before use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRange {
    pub mem: u16,
    pub off: u64,
    pub len: u32,
}

/// One entry of a `Poll` request's arena array (like `struct pollfd`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollEntry {
    pub sock: u32,
    pub events: i16,
    pub revents: i16,
}

/// Largest number of entries one `Poll` call may carry.
pub const MAX_POLL_ENTRIES: u32 = 4096;
/// Largest `sockaddr` accepted in an arena (`sockaddr_storage`).
pub const MAX_ADDR_LEN: u32 = 128;
/// Largest socket option value accepted.
pub const MAX_OPT_LEN: u32 = 256;
/// Largest path a `FileOpen` may name (`PATH_MAX`, with its NUL).
pub const MAX_PATH_LEN: u32 = 4096;

/// A request after validation. Ranges are inside the arena, enums are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Nop,
    Socket {
        domain: i32,
        ty: i32,
        protocol: i32,
    },
    Bind {
        sock: u32,
        addr: ArenaRange,
    },
    Listen {
        sock: u32,
        backlog: i32,
    },
    /// `addr` receives the peer address (len 0: not wanted); `flags` may hold SOCK_NONBLOCK.
    Accept {
        sock: u32,
        addr: ArenaRange,
        flags: i32,
    },
    Connect {
        sock: u32,
        addr: ArenaRange,
    },
    Send {
        sock: u32,
        data: ArenaRange,
        flags: i32,
    },
    Recv {
        sock: u32,
        data: ArenaRange,
        flags: i32,
    },
    /// `args[1]`: 0, or [`SHUTDOWN_NO_REPLY`]: answered by no completion
    /// (the host does not wait; see `docs/PROTOCOL.md` §3).
    Shutdown {
        sock: u32,
        how: i32,
        reply: bool,
    },
    /// `args[0]`: 0, or [`CLOSE_NO_REPLY`]: answered by no completion (the
    /// host does not wait; a close of a socket it knows is open cannot fail).
    Close {
        sock: u32,
        reply: bool,
    },
    SetSockOpt {
        sock: u32,
        level: i32,
        name: i32,
        value: ArenaRange,
    },
    GetSockOpt {
        sock: u32,
        level: i32,
        name: i32,
        value: ArenaRange,
    },
    GetSockName {
        sock: u32,
        addr: ArenaRange,
    },
    GetPeerName {
        sock: u32,
        addr: ArenaRange,
    },
    /// `entries` is an array of `n` [`PollEntry`]; `timeout_ms < 0` waits forever.
    Poll {
        entries: ArenaRange,
        n: u32,
        timeout_ms: i64,
    },
    Fcntl {
        sock: u32,
        cmd: i32,
        arg: i64,
    },
    /// A synchronous send straight from registered memory.
    SendReg {
        sock: u32,
        data: MemRange,
        flags: i32,
    },
    /// A synchronous receive straight into registered memory.
    RecvReg {
        sock: u32,
        data: MemRange,
        flags: i32,
    },
    /// sendfile(2) from file `file` (registered with `ControlMsg::FileOpen`)
    /// at `offset`, at most `count` bytes: the server reads the file itself.
    SendFile {
        sock: u32,
        file: u32,
        offset: u64,
        count: u32,
    },
    /// Open the file at the absolute path in `path` (no NUL) as file
    /// `handle` of this host, for `SendFile`: the server opens it itself,
    /// a remote host's way to `ControlMsg::FileOpen` (it cannot pass a
    /// descriptor). Only under `tcps server --shared-files DIR`, for a
    /// path inside DIR, with the host's credentials; `size` and
    /// `mtime_ns` are what the host's own fstat says, and a file that
    /// differs is refused (ESTALE: not the same file on this node).
    FileOpen {
        handle: u32,
        path: ArenaRange,
        size: u64,
        mtime_ns: u64,
    },
    /// Close file `handle` (`ControlMsg::FileClose` as a request).
    FileClose {
        handle: u32,
    },
    /// Binds send queue `queue` to the socket; its first descriptor is `start`.
    AsyncBind {
        sock: u32,
        queue: u32,
        start: u32,
    },
    /// "Look at this socket's send queue": new descriptors while the server
    /// was not watching. Answered by no completion.
    AsyncKick {
        sock: u32,
    },
    /// "I consumed from this socket's paused receive/accept ring": the
    /// server may read (accept) ahead again. Answered by no completion.
    RecvKick {
        sock: u32,
    },
    /// Sets up eager receive for a socket that was not set up at accept
    /// (a connected socket's first `recv`): binds its receive ring or
    /// starts pull. Result: an `eager::RECV_MODE_*`.
    RecvBind {
        sock: u32,
    },
    /// "A signal interrupted my wait": the call with tag `target` on this
    /// channel, if it is still parked at the server (on socket `sock`'s
    /// queues, or a `Poll`), is completed now: with the bytes it already
    /// moved, else `EINTR`. Answered by no completion (the cancelled call's
    /// own completion is the answer).
    Cancel {
        sock: u32,
        target: u64,
    },
}

impl Call {
    /// Whether the request gets a completion (kicks do not).
    pub fn completes(&self) -> bool {
        !matches!(
            self,
            Call::AsyncKick { .. }
                | Call::RecvKick { .. }
                | Call::Cancel { .. }
                | Call::Close { reply: false, .. }
                | Call::Shutdown { reply: false, .. }
        )
    }
}

mod decode;
mod encode;

/// Why a request was refused before execution (answered with `EINVAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    UnknownOp(u16),
    RangeOutsideArena,
    TooLong,
    BadArgument(&'static str),
}

impl Call {
    /// The arena range the call reads or writes, if any.
    pub fn arena_range(&self) -> Option<ArenaRange> {
        match *self {
            Call::Bind { addr, .. }
            | Call::Accept { addr, .. }
            | Call::Connect { addr, .. }
            | Call::GetSockName { addr, .. }
            | Call::GetPeerName { addr, .. } => Some(addr),
            Call::Send { data, .. } | Call::Recv { data, .. } => Some(data),
            Call::SetSockOpt { value, .. } | Call::GetSockOpt { value, .. } => Some(value),
            Call::Poll { entries, .. } => Some(entries),
            Call::FileOpen { path, .. } => Some(path),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_decode_field_by_field() {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        b[8..10].copy_from_slice(&(Op::Send as u16).to_le_bytes());
        b[10..12].copy_from_slice(&9u16.to_le_bytes());
        b[12..16].copy_from_slice(&3u32.to_le_bytes());
        b[16..20].copy_from_slice(&128u32.to_le_bytes());
        b[20..24].copy_from_slice(&14u32.to_le_bytes());
        for k in 0..5 {
            b[24 + 8 * k..32 + 8 * k].copy_from_slice(&(100 + k as u64).to_le_bytes());
        }
        let r = Request::from_slot(&b);
        assert_eq!(
            r,
            Request {
                user_data: 0x1122_3344_5566_7788,
                op: Op::Send as u16,
                stamp: 9,
                sock: 3,
                buf_off: 128,
                buf_len: 14,
                args: [100, 101, 102, 103, 104],
            }
        );
        let mut c = [0u8; 32];
        c[0..8].copy_from_slice(&7u64.to_le_bytes());
        c[8..10].copy_from_slice(&(Op::Recv as u16).to_le_bytes());
        c[10..12].copy_from_slice(&2u16.to_le_bytes());
        c[12..16].copy_from_slice(&(-11i32).to_le_bytes());
        c[16..24].copy_from_slice(&(-1i64).to_le_bytes());
        c[24..32].copy_from_slice(&16u64.to_le_bytes());
        assert_eq!(
            Completion::from_slot(&c),
            Completion {
                user_data: 7,
                op: Op::Recv as u16,
                stamp: 2,
                errno: -11,
                result: -1,
                aux: 16,
            }
        );
    }
}
