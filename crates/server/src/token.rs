//! Engine tokens: what an armed descriptor is, packed into the 64-bit
//! user data the kernel hands back with its readiness event.
//!
//! ```text
//! bits 63..60 kind | 59..44 host slot | 43..20 socket slot | 19..8 socket generation | 7..0 arm sequence
//! ```
//! The generation rejects events for a closed socket whose slot was reused;
//! the arm sequence makes every arming unique, so an event from a replaced
//! arming is recognised as stale.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    Socket {
        host: usize,
        sock: usize,
        gen: u16,
        seq: u8,
    },
    Control {
        host: usize,
    },
    /// The worker's own adoption bell (no host holds it): new hosts wait
    /// in its inbox.
    Doorbell,
    Shutdown,
    /// A host's own doorbell eventfd (handed over in its Welcome).
    HostBell {
        host: usize,
    },
    /// The completion of a send the engine executed (`calls::sendq::uring`):
    /// socket `sock` of generation `gen`, its send number `seq`.
    Sent {
        host: usize,
        sock: usize,
        gen: u16,
        seq: u8,
    },
    /// The completion of a receive into a socket's receive ring
    /// (`calls::eager::received`): as `Sent`.
    Received {
        host: usize,
        sock: usize,
        gen: u16,
        seq: u8,
    },
}

const KIND_SOCKET: u64 = 1;
const KIND_CONTROL: u64 = 2;
const KIND_DOORBELL: u64 = 3;
const KIND_SHUTDOWN: u64 = 4;
const KIND_HOST_BELL: u64 = 5;
const KIND_SENT: u64 = 6;
const KIND_RECEIVED: u64 = 7;

pub const MAX_HOSTS_PER_WORKER: usize = 1 << 16;
pub const MAX_SOCKETS_PER_HOST: usize = 1 << 24;
pub const GEN_MASK: u16 = 0xfff;

impl Token {
    pub fn encode(self) -> u64 {
        match self {
            Token::Socket {
                host,
                sock,
                gen,
                seq,
            } => socket_bits(KIND_SOCKET, host, sock, gen, seq),
            Token::Sent {
                host,
                sock,
                gen,
                seq,
            } => socket_bits(KIND_SENT, host, sock, gen, seq),
            Token::Received {
                host,
                sock,
                gen,
                seq,
            } => socket_bits(KIND_RECEIVED, host, sock, gen, seq),
            Token::Control { host } => KIND_CONTROL << 60 | (host as u64 & 0xffff) << 44,
            Token::Doorbell => KIND_DOORBELL << 60,
            Token::Shutdown => KIND_SHUTDOWN << 60,
            Token::HostBell { host } => KIND_HOST_BELL << 60 | (host as u64 & 0xffff) << 44,
        }
    }

    pub fn decode(v: u64) -> Option<Token> {
        let host = ((v >> 44) & 0xffff) as usize;
        Some(match v >> 60 {
            KIND_SOCKET => Token::Socket {
                host,
                sock: ((v >> 20) & 0xff_ffff) as usize,
                gen: ((v >> 8) & GEN_MASK as u64) as u16,
                seq: v as u8,
            },
            KIND_SENT => Token::Sent {
                host,
                sock: ((v >> 20) & 0xff_ffff) as usize,
                gen: ((v >> 8) & GEN_MASK as u64) as u16,
                seq: v as u8,
            },
            KIND_RECEIVED => Token::Received {
                host,
                sock: ((v >> 20) & 0xff_ffff) as usize,
                gen: ((v >> 8) & GEN_MASK as u64) as u16,
                seq: v as u8,
            },
            KIND_CONTROL => Token::Control { host },
            KIND_DOORBELL => Token::Doorbell,
            KIND_SHUTDOWN => Token::Shutdown,
            KIND_HOST_BELL => Token::HostBell { host },
            _ => return None,
        })
    }
}

/// The bits of a token that names one socket of one host.
fn socket_bits(kind: u64, host: usize, sock: usize, gen: u16, seq: u8) -> u64 {
    kind << 60
        | (host as u64 & 0xffff) << 44
        | (sock as u64 & 0xff_ffff) << 20
        | ((gen & GEN_MASK) as u64) << 8
        | seq as u64
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token::Socket {
                host: 65535,
                sock: (1 << 24) - 1,
                gen: 0xfff,
                seq: 255,
            },
            Token::Socket {
                host: 0,
                sock: 0,
                gen: 0,
                seq: 0,
            },
            Token::Control { host: 7 },
            Token::Received {
                host: 4,
                sock: 6,
                gen: 1,
                seq: 255,
            },
            Token::Sent {
                host: 3,
                sock: 5,
                gen: 0xabc,
                seq: 9,
            },
            Token::HostBell { host: 9 },
            Token::Doorbell,
            Token::Shutdown,
        ] {
            assert_eq!(Token::decode(t.encode()), Some(t));
        }
        assert_eq!(Token::decode(0), None);
    }
}
