//! [`Call::encode`]: the request a host publishes for a call, the inverse
//! of [`Call::decode`] (in the style of io-uring's `opcode` builders: build
//! the typed call, get the 64-byte record).
//!
//! ```
//! use tcps_proto::msg::{ArenaRange, Call, Op};
//! let call = Call::Send { sock: 3, data: ArenaRange { off: 0, len: 100 }, flags: 0 };
//! let req = tcps_proto::Request { user_data: 7, ..call.encode() };
//! assert_eq!(req.op, Op::Send as u16);
//! assert_eq!(tcps_proto::Call::decode(&req, 4096), Ok(call));
//! ```
//!
//! Arena ranges are channel-relative offsets as the server will see them;
//! a host that stages bytes at a lease offset adds it to `buf_off` when it
//! copies the request into the ring, as before. `user_data` is left 0 for
//! the caller's tag and `stamp` 0 for the ring.

use super::{ArenaRange, Call, MemRange, Op, Request, CLOSE_NO_REPLY, SHUTDOWN_NO_REPLY};

/// A C `int` as the wire carries it (sign-extended to 64 bits).
fn int(v: i32) -> u64 {
    v as i64 as u64
}

/// A call's "answer me" flag: 0 answers, `no_reply` does not.
fn reply(reply: bool, no_reply: u64) -> u64 {
    if reply {
        0
    } else {
        no_reply
    }
}

impl Call {
    /// The call's op code.
    pub fn op(&self) -> Op {
        match self {
            Call::Nop => Op::Nop,
            Call::Socket { .. } => Op::Socket,
            Call::Bind { .. } => Op::Bind,
            Call::Listen { .. } => Op::Listen,
            Call::Accept { .. } => Op::Accept,
            Call::Connect { .. } => Op::Connect,
            Call::Send { .. } => Op::Send,
            Call::Recv { .. } => Op::Recv,
            Call::Shutdown { .. } => Op::Shutdown,
            Call::Close { .. } => Op::Close,
            Call::SetSockOpt { .. } => Op::SetSockOpt,
            Call::GetSockOpt { .. } => Op::GetSockOpt,
            Call::GetSockName { .. } => Op::GetSockName,
            Call::GetPeerName { .. } => Op::GetPeerName,
            Call::Poll { .. } => Op::Poll,
            Call::Fcntl { .. } => Op::Fcntl,
            Call::SendReg { .. } => Op::SendReg,
            Call::RecvReg { .. } => Op::RecvReg,
            Call::SendFile { .. } => Op::SendFile,
            Call::FileOpen { .. } => Op::FileOpen,
            Call::FileClose { .. } => Op::FileClose,
            Call::AsyncBind { .. } => Op::AsyncBind,
            Call::AsyncKick { .. } => Op::AsyncKick,
            Call::RecvKick { .. } => Op::RecvKick,
            Call::RecvBind { .. } => Op::RecvBind,
            Call::Cancel { .. } => Op::Cancel,
        }
    }

    /// The socket the call names (0 for `Nop`, `Socket`, `Poll`).
    pub fn sock(&self) -> u32 {
        match *self {
            Call::Nop
            | Call::Socket { .. }
            | Call::Poll { .. }
            | Call::FileOpen { .. }
            | Call::FileClose { .. } => 0,
            Call::Bind { sock, .. }
            | Call::Listen { sock, .. }
            | Call::Accept { sock, .. }
            | Call::Connect { sock, .. }
            | Call::Send { sock, .. }
            | Call::Recv { sock, .. }
            | Call::Shutdown { sock, .. }
            | Call::Close { sock, .. }
            | Call::SetSockOpt { sock, .. }
            | Call::GetSockOpt { sock, .. }
            | Call::GetSockName { sock, .. }
            | Call::GetPeerName { sock, .. }
            | Call::Fcntl { sock, .. }
            | Call::SendReg { sock, .. }
            | Call::RecvReg { sock, .. }
            | Call::SendFile { sock, .. }
            | Call::AsyncBind { sock, .. }
            | Call::AsyncKick { sock }
            | Call::RecvKick { sock }
            | Call::RecvBind { sock }
            | Call::Cancel { sock, .. } => sock,
        }
    }

    /// The request record for this call: `op`, `sock`, the arena range and
    /// `args` as [`decode`](Call::decode) reads them.
    pub fn encode(&self) -> Request {
        let mut r = Request {
            op: self.op() as u16,
            sock: self.sock(),
            ..Request::default()
        };
        if let Some(ArenaRange { off, len }) = self.arena_range() {
            (r.buf_off, r.buf_len) = (off, len);
        }
        r.args = self.args();
        r
    }

    /// The scalar arguments (`Request::args`).
    fn args(&self) -> [u64; 5] {
        let mem =
            |d: MemRange, flags: i32| [u64::from(d.mem), d.off, u64::from(d.len), int(flags), 0];
        match *self {
            Call::Socket {
                domain,
                ty,
                protocol,
            } => [int(domain), int(ty), int(protocol), 0, 0],
            Call::Listen { backlog, .. } => [int(backlog), 0, 0, 0, 0],
            Call::Accept { flags, .. } | Call::Send { flags, .. } | Call::Recv { flags, .. } => {
                [int(flags), 0, 0, 0, 0]
            }
            Call::Shutdown { how, reply: r, .. } => {
                [int(how), reply(r, SHUTDOWN_NO_REPLY), 0, 0, 0]
            }
            Call::Close { reply: r, .. } => [reply(r, CLOSE_NO_REPLY), 0, 0, 0, 0],
            Call::SetSockOpt { level, name, .. } | Call::GetSockOpt { level, name, .. } => {
                [int(level), int(name), 0, 0, 0]
            }
            Call::Poll { n, timeout_ms, .. } => [u64::from(n), timeout_ms as u64, 0, 0, 0],
            Call::Fcntl { cmd, arg, .. } => [int(cmd), arg as u64, 0, 0, 0],
            Call::SendReg { data, flags, .. } | Call::RecvReg { data, flags, .. } => {
                mem(data, flags)
            }
            Call::SendFile {
                file,
                offset,
                count,
                ..
            } => [u64::from(file), offset, u64::from(count), 0, 0],
            Call::FileOpen {
                handle,
                size,
                mtime_ns,
                ..
            } => [u64::from(handle), size, mtime_ns, 0, 0],
            Call::FileClose { handle } => [u64::from(handle), 0, 0, 0, 0],
            Call::AsyncBind { queue, start, .. } => [u64::from(queue), u64::from(start), 0, 0, 0],
            Call::Cancel { target, .. } => [target, 0, 0, 0, 0],
            Call::Nop
            | Call::Bind { .. }
            | Call::Connect { .. }
            | Call::GetSockName { .. }
            | Call::GetPeerName { .. }
            | Call::AsyncKick { .. }
            | Call::RecvKick { .. }
            | Call::RecvBind { .. } => [0; 5],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        Invalid, PollEntry, MAX_ADDR_LEN, MAX_OPT_LEN, MAX_PATH_LEN, MAX_POLL_ENTRIES,
    };
    use super::*;
    use crate::sendq::ctl::MAX_REGISTRATIONS;
    use proptest::prelude::*;

    const ARENA: u32 = 64 * 1024;

    /// A range of at most `max` bytes inside the arena.
    fn range(max: u32) -> impl Strategy<Value = ArenaRange> {
        (0..=max.min(ARENA))
            .prop_flat_map(|len| (0..=ARENA - len).prop_map(move |off| ArenaRange { off, len }))
    }

    fn mem() -> impl Strategy<Value = MemRange> {
        (0..MAX_REGISTRATIONS as u16, any::<u64>(), any::<u32>()).prop_map(|(mem, off, len)| {
            MemRange {
                mem,
                off: off.min(u64::MAX - u64::from(len)),
                len,
            }
        })
    }

    fn poll() -> impl Strategy<Value = Call> {
        let size = std::mem::size_of::<PollEntry>() as u32;
        (0..=MAX_POLL_ENTRIES.min(ARENA / size), any::<i64>()).prop_flat_map(
            move |(n, timeout_ms)| {
                (0..=(ARENA - n * size) / 8).prop_map(move |slot| Call::Poll {
                    entries: ArenaRange {
                        off: slot * 8,
                        len: n * size,
                    },
                    n,
                    timeout_ms,
                })
            },
        )
    }

    /// Every valid call of every op.
    fn any_call() -> impl Strategy<Value = Call> {
        let s = any::<u32>;
        let i = any::<i32>;
        prop_oneof![
            Just(Call::Nop),
            (i(), i(), i()).prop_map(|(domain, ty, protocol)| Call::Socket {
                domain,
                ty,
                protocol
            }),
            (s(), range(MAX_ADDR_LEN)).prop_map(|(sock, addr)| Call::Bind { sock, addr }),
            (s(), i()).prop_map(|(sock, backlog)| Call::Listen { sock, backlog }),
            (s(), range(MAX_ADDR_LEN), i()).prop_map(|(sock, addr, flags)| Call::Accept {
                sock,
                addr,
                flags
            }),
            (s(), range(MAX_ADDR_LEN)).prop_map(|(sock, addr)| Call::Connect { sock, addr }),
            (s(), range(u32::MAX), i()).prop_map(|(sock, data, flags)| Call::Send {
                sock,
                data,
                flags
            }),
            (s(), range(u32::MAX), i()).prop_map(|(sock, data, flags)| Call::Recv {
                sock,
                data,
                flags
            }),
            (s(), i(), any::<bool>()).prop_map(|(sock, how, reply)| Call::Shutdown {
                sock,
                how,
                reply
            }),
            (s(), any::<bool>()).prop_map(|(sock, reply)| Call::Close { sock, reply }),
            (s(), i(), i(), range(MAX_OPT_LEN)).prop_map(|(sock, level, name, value)| {
                Call::SetSockOpt {
                    sock,
                    level,
                    name,
                    value,
                }
            }),
            (s(), i(), i(), range(MAX_OPT_LEN)).prop_map(|(sock, level, name, value)| {
                Call::GetSockOpt {
                    sock,
                    level,
                    name,
                    value,
                }
            }),
            (s(), range(MAX_ADDR_LEN)).prop_map(|(sock, addr)| Call::GetSockName { sock, addr }),
            (s(), range(MAX_ADDR_LEN)).prop_map(|(sock, addr)| Call::GetPeerName { sock, addr }),
            poll(),
            (s(), i(), any::<i64>()).prop_map(|(sock, cmd, arg)| Call::Fcntl { sock, cmd, arg }),
            (s(), mem(), i()).prop_map(|(sock, data, flags)| Call::SendReg { sock, data, flags }),
            (s(), mem(), i()).prop_map(|(sock, data, flags)| Call::RecvReg { sock, data, flags }),
            (s(), s(), any::<u64>(), s()).prop_map(|(sock, file, offset, count)| {
                Call::SendFile {
                    sock,
                    file,
                    offset,
                    count,
                }
            }),
            (s(), range(MAX_PATH_LEN), any::<u64>(), any::<u64>()).prop_map(
                |(handle, path, size, mtime_ns)| Call::FileOpen {
                    handle,
                    path,
                    size,
                    mtime_ns
                }
            ),
            s().prop_map(|handle| Call::FileClose { handle }),
            (s(), s(), s()).prop_map(|(sock, queue, start)| Call::AsyncBind { sock, queue, start }),
            s().prop_map(|sock| Call::AsyncKick { sock }),
            s().prop_map(|sock| Call::RecvKick { sock }),
            s().prop_map(|sock| Call::RecvBind { sock }),
            (s(), any::<u64>()).prop_map(|(sock, target)| Call::Cancel { sock, target }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// What the host encodes is what the server decodes.
        #[test]
        fn decode_inverts_encode(call in any_call()) {
            let r = call.encode();
            prop_assert_eq!(r.op, call.op() as u16);
            prop_assert_eq!((r.user_data, r.stamp), (0, 0));
            prop_assert_eq!(Call::decode(&r, ARENA), Ok(call));
        }
    }

    #[test]
    fn the_strategy_covers_every_op() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut seen = std::collections::HashSet::new();
        let mut runner = TestRunner::deterministic();
        let strategy = any_call();
        for _ in 0..20_000 {
            seen.insert(strategy.new_tree(&mut runner).unwrap().current().op());
            if seen.len() == Op::ALL.len() {
                return;
            }
        }
        panic!(
            "ops never generated: {:?}",
            Op::ALL
                .iter()
                .filter(|o| !seen.contains(o))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_wire_form_of_each_family() {
        let send = Call::Send {
            sock: 4,
            data: ArenaRange { off: 64, len: 10 },
            flags: libc::MSG_MORE,
        }
        .encode();
        assert_eq!(
            (send.sock, send.buf_off, send.buf_len, send.args[0]),
            (4, 64, 10, libc::MSG_MORE as u64)
        );
        let fcntl = Call::Fcntl {
            sock: 1,
            cmd: libc::F_SETFL,
            arg: -1,
        }
        .encode();
        assert_eq!(fcntl.args[1], u64::MAX, "i64 as its two's complement");
        let listen = Call::Listen {
            sock: 1,
            backlog: -1,
        }
        .encode();
        assert_eq!(listen.args[0], u64::MAX, "a C int sign-extended");
        let close = Call::Close {
            sock: 2,
            reply: false,
        }
        .encode();
        assert_eq!(close.args[0], CLOSE_NO_REPLY);
        let reg = Call::SendReg {
            sock: 2,
            data: MemRange {
                mem: 5,
                off: 4096,
                len: 8,
            },
            flags: 0,
        }
        .encode();
        assert_eq!(reg.args[..3], [5, 4096, 8]);
        // Encoding does not validate: an out-of-arena range is refused by
        // decode, as from any host.
        let far = Call::Bind {
            sock: 1,
            addr: ArenaRange {
                off: ARENA,
                len: 16,
            },
        }
        .encode();
        assert_eq!(Call::decode(&far, ARENA), Err(Invalid::RangeOutsideArena));
    }
}
