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
            /// `Nop`, `Socket` and `Poll`).
            pub fn names_socket(self) -> bool {
                !matches!(self, Op::Nop | Op::Socket | Op::Poll)
            }
        }
    };
}

ops! {
    Nop = 1, Socket = 2, Bind = 3, Listen = 4, Accept = 5, Connect = 6, Send = 7,
    Recv = 8, Shutdown = 9, Close = 10, SetSockOpt = 11, GetSockOpt = 12,
    GetSockName = 13, GetPeerName = 14, Poll = 15, Fcntl = 16,
    SendReg = 17, RecvReg = 18, AsyncBind = 19, AsyncKick = 20, SendFile = 21,
    RecvKick = 22, RecvBind = 23, Cancel = 24,
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
            _ => None,
        }
    }
}
