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
//! answered with `EINVAL` and affects nobody else.

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
    RecvKick = 22, RecvBind = 23,
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
}

impl Call {
    /// Whether the request gets a completion (kicks do not).
    pub fn completes(&self) -> bool {
        !matches!(
            self,
            Call::AsyncKick { .. }
                | Call::RecvKick { .. }
                | Call::Close { reply: false, .. }
                | Call::Shutdown { reply: false, .. }
        )
    }
}

/// Why a request was refused before execution (answered with `EINVAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    UnknownOp(u16),
    RangeOutsideArena,
    TooLong,
    BadArgument(&'static str),
}

impl Call {
    /// Checks a request copied out of shared memory against an arena of
    /// `arena_size` bytes. Total: never panics, whatever the input.
    pub fn decode(r: &Request, arena_size: u32) -> Result<Call, Invalid> {
        let op = Op::from_u16(r.op).ok_or(Invalid::UnknownOp(r.op))?;
        let range = |max: u32| -> Result<ArenaRange, Invalid> {
            if r.buf_len > max {
                return Err(Invalid::TooLong);
            }
            let end = r.buf_off as u64 + r.buf_len as u64;
            if end > arena_size as u64 {
                return Err(Invalid::RangeOutsideArena);
            }
            Ok(ArenaRange {
                off: r.buf_off,
                len: r.buf_len,
            })
        };
        let int = |i: usize| -> Result<i32, Invalid> {
            i32::try_from(r.args[i] as i64)
                .map_err(|_| Invalid::BadArgument("integer argument out of range"))
        };
        // A call's "answer me" flag: 0 answers, `no_reply` does not.
        let reply = |i: usize, no_reply: u64, what: &'static str| match r.args[i] {
            0 => Ok(true),
            f if f == no_reply => Ok(false),
            _ => Err(Invalid::BadArgument(what)),
        };
        let sock = r.sock;
        let mem = || -> Result<MemRange, Invalid> {
            let handle = r.args[0];
            if handle >= u64::from(crate::sendq::ctl::MAX_REGISTRATIONS) {
                return Err(Invalid::BadArgument("registration handle out of range"));
            }
            let len = u32::try_from(r.args[2]).map_err(|_| Invalid::TooLong)?;
            r.args[1]
                .checked_add(u64::from(len))
                .ok_or(Invalid::BadArgument("registered range overflows"))?;
            Ok(MemRange {
                mem: handle as u16,
                off: r.args[1],
                len,
            })
        };
        let u32_arg = |i: usize, what: &'static str| -> Result<u32, Invalid> {
            u32::try_from(r.args[i]).map_err(|_| Invalid::BadArgument(what))
        };
        Ok(match op {
            Op::Nop => Call::Nop,
            Op::Socket => Call::Socket {
                domain: int(0)?,
                ty: int(1)?,
                protocol: int(2)?,
            },
            Op::Bind => Call::Bind {
                sock,
                addr: range(MAX_ADDR_LEN)?,
            },
            Op::Listen => Call::Listen {
                sock,
                backlog: int(0)?,
            },
            Op::Accept => Call::Accept {
                sock,
                addr: range(MAX_ADDR_LEN)?,
                flags: int(0)?,
            },
            Op::Connect => Call::Connect {
                sock,
                addr: range(MAX_ADDR_LEN)?,
            },
            Op::Send => Call::Send {
                sock,
                data: range(u32::MAX)?,
                flags: int(0)?,
            },
            Op::Recv => Call::Recv {
                sock,
                data: range(u32::MAX)?,
                flags: int(0)?,
            },
            Op::Shutdown => Call::Shutdown {
                sock,
                how: int(0)?,
                reply: reply(1, SHUTDOWN_NO_REPLY, "shutdown flags")?,
            },
            Op::Close => Call::Close {
                sock,
                reply: reply(0, CLOSE_NO_REPLY, "close flags")?,
            },
            Op::SetSockOpt => Call::SetSockOpt {
                sock,
                level: int(0)?,
                name: int(1)?,
                value: range(MAX_OPT_LEN)?,
            },
            Op::GetSockOpt => Call::GetSockOpt {
                sock,
                level: int(0)?,
                name: int(1)?,
                value: range(MAX_OPT_LEN)?,
            },
            Op::GetSockName => Call::GetSockName {
                sock,
                addr: range(MAX_ADDR_LEN)?,
            },
            Op::GetPeerName => Call::GetPeerName {
                sock,
                addr: range(MAX_ADDR_LEN)?,
            },
            Op::Poll => {
                let n = u32::try_from(r.args[0]).map_err(|_| Invalid::BadArgument("poll count"))?;
                if n > MAX_POLL_ENTRIES {
                    return Err(Invalid::TooLong);
                }
                let entries = range(u32::MAX)?;
                if entries.len as u64 != n as u64 * std::mem::size_of::<PollEntry>() as u64 {
                    return Err(Invalid::BadArgument(
                        "poll array length does not match count",
                    ));
                }
                if entries.off % 8 != 0 {
                    return Err(Invalid::BadArgument("poll array misaligned"));
                }
                Call::Poll {
                    entries,
                    n,
                    timeout_ms: r.args[1] as i64,
                }
            }
            Op::Fcntl => Call::Fcntl {
                sock,
                cmd: int(0)?,
                arg: r.args[1] as i64,
            },
            Op::SendReg => Call::SendReg {
                sock,
                data: mem()?,
                flags: int(3)?,
            },
            Op::RecvReg => Call::RecvReg {
                sock,
                data: mem()?,
                flags: int(3)?,
            },
            Op::AsyncBind => Call::AsyncBind {
                sock,
                queue: u32_arg(0, "send queue index")?,
                start: u32_arg(1, "send queue start")?,
            },
            Op::AsyncKick => Call::AsyncKick { sock },
            Op::RecvKick => Call::RecvKick { sock },
            Op::RecvBind => Call::RecvBind { sock },
            Op::SendFile => Call::SendFile {
                sock,
                file: u32_arg(0, "file handle")?,
                offset: r.args[1],
                count: u32_arg(2, "sendfile count")?,
            },
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ARENA: u32 = 64 * 1024;

    #[test]
    fn zeroed_slot_is_invalid() {
        assert_eq!(
            Call::decode(&Request::default(), ARENA),
            Err(Invalid::UnknownOp(0))
        );
    }

    #[test]
    fn close_and_shutdown_answer_unless_told_not_to() {
        let close = |flags: u64| {
            Call::decode(
                &Request {
                    op: Op::Close as u16,
                    sock: 5,
                    args: [flags, 0, 0, 0, 0],
                    ..Default::default()
                },
                ARENA,
            )
        };
        let answered = close(0).unwrap();
        assert_eq!(
            answered,
            Call::Close {
                sock: 5,
                reply: true
            }
        );
        assert!(answered.completes());
        let silent = close(CLOSE_NO_REPLY).unwrap();
        assert_eq!(
            silent,
            Call::Close {
                sock: 5,
                reply: false
            }
        );
        assert!(!silent.completes());
        assert_eq!(close(2), Err(Invalid::BadArgument("close flags")));
        let shutdown = |flags: u64| {
            Call::decode(
                &Request {
                    op: Op::Shutdown as u16,
                    sock: 5,
                    args: [libc::SHUT_WR as u64, flags, 0, 0, 0],
                    ..Default::default()
                },
                ARENA,
            )
        };
        assert!(shutdown(0).unwrap().completes());
        let silent = shutdown(SHUTDOWN_NO_REPLY).unwrap();
        assert_eq!(
            silent,
            Call::Shutdown {
                sock: 5,
                how: libc::SHUT_WR,
                reply: false
            }
        );
        assert!(!silent.completes());
        assert_eq!(shutdown(2), Err(Invalid::BadArgument("shutdown flags")));
        assert!(Op::Close.names_socket());
        assert!(!Op::Socket.names_socket() && !Op::Poll.names_socket());
    }

    #[test]
    fn every_op_round_trips_its_code() {
        for &op in Op::ALL {
            assert_eq!(Op::from_u16(op as u16), Some(op));
        }
        assert_eq!(Op::from_u16(999), None);
    }

    #[test]
    fn ranges_outside_the_arena_are_refused() {
        let r = Request {
            op: Op::Send as u16,
            buf_off: ARENA - 10,
            buf_len: 11,
            ..Default::default()
        };
        assert_eq!(Call::decode(&r, ARENA), Err(Invalid::RangeOutsideArena));
        let r = Request {
            op: Op::Send as u16,
            buf_off: u32::MAX,
            buf_len: u32::MAX,
            ..Default::default()
        };
        assert!(Call::decode(&r, ARENA).is_err());
        let r = Request {
            op: Op::Send as u16,
            buf_off: ARENA - 10,
            buf_len: 10,
            ..Default::default()
        };
        assert!(matches!(Call::decode(&r, ARENA), Ok(Call::Send { .. })));
    }

    #[test]
    fn registered_ranges_are_checked_for_handle_and_overflow() {
        let r = Request {
            op: Op::SendReg as u16,
            args: [3, 4096, 100, 0, 0],
            ..Default::default()
        };
        assert_eq!(
            Call::decode(&r, ARENA),
            Ok(Call::SendReg {
                sock: 0,
                data: MemRange {
                    mem: 3,
                    off: 4096,
                    len: 100
                },
                flags: 0
            })
        );
        let bad_handle = Request {
            args: [u64::from(crate::sendq::ctl::MAX_REGISTRATIONS), 0, 1, 0, 0],
            ..r
        };
        assert!(Call::decode(&bad_handle, ARENA).is_err());
        let overflow = Request {
            args: [0, u64::MAX, 1, 0, 0],
            ..r
        };
        assert!(Call::decode(&overflow, ARENA).is_err());
        let too_long = Request {
            args: [0, 0, 1 << 32, 0, 0],
            ..r
        };
        assert_eq!(Call::decode(&too_long, ARENA), Err(Invalid::TooLong));
        let kick = Request {
            op: Op::AsyncKick as u16,
            sock: 9,
            ..Default::default()
        };
        let k = Call::decode(&kick, ARENA).unwrap();
        assert!(!k.completes());
    }

    #[test]
    fn address_longer_than_sockaddr_storage_is_refused() {
        let r = Request {
            op: Op::Bind as u16,
            buf_len: MAX_ADDR_LEN + 1,
            ..Default::default()
        };
        assert_eq!(Call::decode(&r, ARENA), Err(Invalid::TooLong));
    }

    #[test]
    fn poll_count_must_match_array() {
        let r = Request {
            op: Op::Poll as u16,
            buf_len: 16,
            args: [3, 0, 0, 0, 0],
            ..Default::default()
        };
        assert!(matches!(
            Call::decode(&r, ARENA),
            Err(Invalid::BadArgument(_))
        ));
        let r = Request {
            op: Op::Poll as u16,
            buf_len: 24,
            args: [3, 5, 0, 0, 0],
            ..Default::default()
        };
        assert!(matches!(
            Call::decode(&r, ARENA),
            Ok(Call::Poll {
                n: 3,
                timeout_ms: 5,
                ..
            })
        ));
    }

    #[test]
    fn out_of_range_integers_are_refused() {
        let r = Request {
            op: Op::Listen as u16,
            args: [1 << 40, 0, 0, 0, 0],
            ..Default::default()
        };
        assert!(matches!(
            Call::decode(&r, ARENA),
            Err(Invalid::BadArgument(_))
        ));
    }

    fn any_request() -> impl Strategy<Value = Request> {
        (
            any::<u64>(),
            0u16..24,
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<[u64; 5]>(),
        )
            .prop_map(
                |(user_data, op, stamp, sock, buf_off, buf_len, args)| Request {
                    user_data,
                    op,
                    stamp,
                    sock,
                    buf_off: buf_off % (ARENA * 2),
                    buf_len: buf_len % (ARENA * 2),
                    args,
                },
            )
    }

    proptest! {
        /// Any host-written record decodes to an error or to a call whose
        /// arena range lies inside the arena: the server can then index the
        /// arena without further checks.
        #[test]
        fn decode_is_total_and_ranges_are_in_bounds(r in any_request()) {
            if let Ok(call) = Call::decode(&r, ARENA) {
                if let Some(range) = call.arena_range() {
                    prop_assert!(range.end() <= ARENA as usize);
                }
            }
        }
    }
}
