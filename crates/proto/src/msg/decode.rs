//! [`Call::decode`]: a host-written [`Request`] to a checked [`Call`], one
//! function per family of calls, each field read through [`Fields`], which
//! does the checking.

use super::{
    ArenaRange, Call, Invalid, MemRange, Op, PollEntry, Request, CLOSE_NO_REPLY, MAX_ADDR_LEN,
    MAX_OPT_LEN, MAX_PATH_LEN, MAX_POLL_ENTRIES, SHUTDOWN_NO_REPLY,
};
use crate::sendq::ctl::MAX_REGISTRATIONS;

/// The fields of a request copied out of shared memory, read with checks.
struct Fields<'a> {
    r: &'a Request,
    arena_size: u32,
}

impl Fields<'_> {
    /// `buf_off..buf_off+buf_len`, at most `max` bytes, inside the arena.
    fn range(&self, max: u32) -> Result<ArenaRange, Invalid> {
        let r = self.r;
        if r.buf_len > max {
            return Err(Invalid::TooLong);
        }
        let end = r.buf_off as u64 + r.buf_len as u64;
        if end > self.arena_size as u64 {
            return Err(Invalid::RangeOutsideArena);
        }
        Ok(ArenaRange {
            off: r.buf_off,
            len: r.buf_len,
        })
    }

    /// `args[i]` as a C `int` (sign-extended on the wire).
    fn int(&self, i: usize) -> Result<i32, Invalid> {
        i32::try_from(self.r.args[i] as i64)
            .map_err(|_| Invalid::BadArgument("integer argument out of range"))
    }

    /// `args[i]` as an unsigned 32-bit value.
    fn u32(&self, i: usize, what: &'static str) -> Result<u32, Invalid> {
        u32::try_from(self.r.args[i]).map_err(|_| Invalid::BadArgument(what))
    }

    /// A call's "answer me" flag in `args[i]`: 0 answers, `no_reply` does not.
    fn reply(&self, i: usize, no_reply: u64, what: &'static str) -> Result<bool, Invalid> {
        match self.r.args[i] {
            0 => Ok(true),
            f if f == no_reply => Ok(false),
            _ => Err(Invalid::BadArgument(what)),
        }
    }

    /// A registered range: handle `args[0]`, offset `args[1]`, length `args[2]`.
    fn mem(&self) -> Result<MemRange, Invalid> {
        let a = &self.r.args;
        if a[0] >= u64::from(MAX_REGISTRATIONS) {
            return Err(Invalid::BadArgument("registration handle out of range"));
        }
        let len = u32::try_from(a[2]).map_err(|_| Invalid::TooLong)?;
        a[1].checked_add(u64::from(len))
            .ok_or(Invalid::BadArgument("registered range overflows"))?;
        Ok(MemRange {
            mem: a[0] as u16,
            off: a[1],
            len,
        })
    }

    /// `Poll`'s array: `args[0]` entries of [`PollEntry`], 8-aligned.
    fn poll(&self) -> Result<Call, Invalid> {
        let n = u32::try_from(self.r.args[0]).map_err(|_| Invalid::BadArgument("poll count"))?;
        if n > MAX_POLL_ENTRIES {
            return Err(Invalid::TooLong);
        }
        let entries = self.range(u32::MAX)?;
        if entries.len as u64 != n as u64 * std::mem::size_of::<PollEntry>() as u64 {
            return Err(Invalid::BadArgument(
                "poll array length does not match count",
            ));
        }
        if entries.off % 8 != 0 {
            return Err(Invalid::BadArgument("poll array misaligned"));
        }
        Ok(Call::Poll {
            entries,
            n,
            timeout_ms: self.r.args[1] as i64,
        })
    }
}

impl Call {
    /// Checks a request copied out of shared memory against an arena of
    /// `arena_size` bytes. Total: never panics, whatever the input.
    pub fn decode(r: &Request, arena_size: u32) -> Result<Call, Invalid> {
        let op = Op::from_u16(r.op).ok_or(Invalid::UnknownOp(r.op))?;
        let f = Fields { r, arena_size };
        match op {
            Op::Nop | Op::Socket | Op::Listen | Op::Shutdown | Op::Close | Op::Fcntl => {
                decode_lifecycle(op, &f)
            }
            Op::Bind | Op::Accept | Op::Connect | Op::GetSockName | Op::GetPeerName => {
                decode_address(op, &f)
            }
            Op::Send | Op::Recv | Op::SendReg | Op::RecvReg | Op::SendFile => decode_data(op, &f),
            Op::FileOpen => Ok(Call::FileOpen {
                handle: f.u32(0, "file handle")?,
                path: f.range(MAX_PATH_LEN)?,
                size: f.r.args[1],
                mtime_ns: f.r.args[2],
            }),
            Op::FileClose => Ok(Call::FileClose {
                handle: f.u32(0, "file handle")?,
            }),
            Op::SetSockOpt | Op::GetSockOpt | Op::Poll => decode_option_poll(op, &f),
            Op::AsyncBind | Op::AsyncKick | Op::RecvKick | Op::RecvBind | Op::Cancel => {
                decode_rings(op, &f)
            }
        }
    }
}

/// Calls on a socket's life: create, listen, shut down, close, fcntl.
fn decode_lifecycle(op: Op, f: &Fields<'_>) -> Result<Call, Invalid> {
    let sock = f.r.sock;
    Ok(match op {
        Op::Nop => Call::Nop,
        Op::Socket => Call::Socket {
            domain: f.int(0)?,
            ty: f.int(1)?,
            protocol: f.int(2)?,
        },
        Op::Listen => Call::Listen {
            sock,
            backlog: f.int(0)?,
        },
        Op::Shutdown => Call::Shutdown {
            sock,
            how: f.int(0)?,
            reply: f.reply(1, SHUTDOWN_NO_REPLY, "shutdown flags")?,
        },
        Op::Close => Call::Close {
            sock,
            reply: f.reply(0, CLOSE_NO_REPLY, "close flags")?,
        },
        Op::Fcntl => Call::Fcntl {
            sock,
            cmd: f.int(0)?,
            arg: f.r.args[1] as i64,
        },
        // Not this family (decode never sends it here): no panic path.
        _ => return Err(Invalid::UnknownOp(op as u16)),
    })
}

/// Calls carrying a `sockaddr` in the arena.
fn decode_address(op: Op, f: &Fields<'_>) -> Result<Call, Invalid> {
    let sock = f.r.sock;
    let addr = f.range(MAX_ADDR_LEN)?;
    Ok(match op {
        Op::Bind => Call::Bind { sock, addr },
        Op::Accept => Call::Accept {
            sock,
            addr,
            flags: f.int(0)?,
        },
        Op::Connect => Call::Connect { sock, addr },
        Op::GetSockName => Call::GetSockName { sock, addr },
        Op::GetPeerName => Call::GetPeerName { sock, addr },
        // Not this family (decode never sends it here): no panic path.
        _ => return Err(Invalid::UnknownOp(op as u16)),
    })
}

/// Calls moving data: through the arena, registered memory or a file.
fn decode_data(op: Op, f: &Fields<'_>) -> Result<Call, Invalid> {
    let sock = f.r.sock;
    Ok(match op {
        Op::Send => Call::Send {
            sock,
            data: f.range(u32::MAX)?,
            flags: f.int(0)?,
        },
        Op::Recv => Call::Recv {
            sock,
            data: f.range(u32::MAX)?,
            flags: f.int(0)?,
        },
        Op::SendReg => Call::SendReg {
            sock,
            data: f.mem()?,
            flags: f.int(3)?,
        },
        Op::RecvReg => Call::RecvReg {
            sock,
            data: f.mem()?,
            flags: f.int(3)?,
        },
        Op::SendFile => Call::SendFile {
            sock,
            file: f.u32(0, "file handle")?,
            offset: f.r.args[1],
            count: f.u32(2, "sendfile count")?,
        },
        // Not this family (decode never sends it here): no panic path.
        _ => return Err(Invalid::UnknownOp(op as u16)),
    })
}

/// Socket options (a value in the arena) and poll (an array in the arena).
fn decode_option_poll(op: Op, f: &Fields<'_>) -> Result<Call, Invalid> {
    let sock = f.r.sock;
    Ok(match op {
        Op::SetSockOpt => Call::SetSockOpt {
            sock,
            level: f.int(0)?,
            name: f.int(1)?,
            value: f.range(MAX_OPT_LEN)?,
        },
        Op::GetSockOpt => Call::GetSockOpt {
            sock,
            level: f.int(0)?,
            name: f.int(1)?,
            value: f.range(MAX_OPT_LEN)?,
        },
        Op::Poll => f.poll()?,
        // Not this family (decode never sends it here): no panic path.
        _ => return Err(Invalid::UnknownOp(op as u16)),
    })
}

/// The send queue and receive ring calls.
fn decode_rings(op: Op, f: &Fields<'_>) -> Result<Call, Invalid> {
    let sock = f.r.sock;
    Ok(match op {
        Op::AsyncBind => Call::AsyncBind {
            sock,
            queue: f.u32(0, "send queue index")?,
            start: f.u32(1, "send queue start")?,
        },
        Op::AsyncKick => Call::AsyncKick { sock },
        Op::RecvKick => Call::RecvKick { sock },
        Op::RecvBind => Call::RecvBind { sock },
        Op::Cancel => Call::Cancel {
            sock,
            target: f.r.args[0],
        },
        // Not this family (decode never sends it here): no panic path.
        _ => return Err(Invalid::UnknownOp(op as u16)),
    })
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
        assert!(!Op::FileOpen.names_socket() && !Op::FileClose.names_socket());
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
            args: [u64::from(MAX_REGISTRATIONS), 0, 1, 0, 0],
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
