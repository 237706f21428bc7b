//! The attach of a remote host, one fabric endpoint at a time (a state
//! machine the listener thread drives with the endpoint's messages):
//! `Hello` (magic, version, pid) → a fresh nonce → the host's
//! HMAC-SHA256 answer (`tcps_fabric::auth`), checked in constant time →
//! admitted (then admission control, the region, the `Welcome`) or
//! refused. Nothing else is read from the endpoint before, and nothing
//! about the server (geometry, region) is sent before the answer checks.

use std::time::{Duration, Instant};
use tcps_fabric::auth::{nonce, Secret, NONCE_LEN};
use tcps_fabric::wire::{auth_context, AM_AUTH, AM_HELLO};
use tcps_proto::handshake::Hello;
use tcps_proto::layout::{MAGIC, VERSION};

/// How long a connection may take to authenticate.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(2);

/// What the listener does next for this endpoint.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this nonce (`AM_CHALLENGE`) and wait for the answer.
    Challenge([u8; NONCE_LEN]),
    /// Authenticated: admit the host (admission control still applies).
    Admit { pid: u32 },
    /// Send a refusing `Welcome` with this errno and close the endpoint.
    Refuse { errno: i32, message: String },
}

pub struct Attach {
    nonce: Option<[u8; NONCE_LEN]>,
    pid: u32,
    deadline: Instant,
    done: bool,
}

fn refuse(errno: i32, message: impl Into<String>) -> Step {
    Step::Refuse {
        errno,
        message: message.into(),
    }
}

impl Attach {
    pub fn new(now: Instant) -> Attach {
        Attach {
            nonce: None,
            pid: 0,
            deadline: now + ATTACH_TIMEOUT,
            done: false,
        }
    }

    /// Whether the endpoint took too long (refuse it with ETIMEDOUT).
    pub fn expired(&self, now: Instant) -> bool {
        !self.done && now >= self.deadline
    }

    /// The next step after a message on the endpoint. Any message out of
    /// order, or a second attach, is refused.
    pub fn on_message(&mut self, secret: &Secret, id: u32, header: &[u8]) -> Step {
        if self.done {
            return refuse(libc::EPROTO, "tcps: attach messages after the attach");
        }
        match (id, self.nonce) {
            (AM_HELLO, None) => {
                let Some(h) = Hello::decode(header).filter(|h| h.magic == MAGIC) else {
                    self.done = true;
                    return refuse(libc::EPROTO, "tcps: no valid hello; is it a tcps host?");
                };
                if h.version != VERSION {
                    self.done = true;
                    let m = format!(
                        "tcps: protocol version mismatch: server v{VERSION}, host library v{}",
                        h.version
                    );
                    return refuse(libc::EPROTO, m);
                }
                match nonce() {
                    Ok(n) => {
                        self.nonce = Some(n);
                        self.pid = h.pid;
                        Step::Challenge(n)
                    }
                    Err(e) => {
                        self.done = true;
                        refuse(libc::EIO, format!("tcps: no random nonce: {e}"))
                    }
                }
            }
            (AM_AUTH, Some(n)) => {
                self.done = true;
                if secret.verify(&n, &auth_context(VERSION, self.pid), header) {
                    Step::Admit { pid: self.pid }
                } else {
                    refuse(
                        libc::EACCES,
                        "tcps: fabric authentication failed (wrong secret?)",
                    )
                }
            }
            _ => {
                self.done = true;
                refuse(libc::EPROTO, "tcps: unexpected message during attach")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcps_fabric::wire::{Welcome, AM_CHALLENGE, AM_WELCOME};
    use tcps_fabric::{Context, ContextOptions, Endpoint, Worker};

    const SECRET: &str = "0123456789abcdef-the-secret\nuid=1000\n";

    #[test]
    fn right_answer_admits_wrong_ones_are_refused() {
        let s = Secret::parse(SECRET).unwrap();
        let mut a = Attach::new(Instant::now());
        let Step::Challenge(n) = a.on_message(&s, AM_HELLO, &Hello::new(77).encode()) else {
            panic!("no challenge")
        };
        let mac = s.answer(&n, &auth_context(VERSION, 77));
        assert_eq!(a.on_message(&s, AM_AUTH, &mac), Step::Admit { pid: 77 });
        assert!(matches!(
            a.on_message(&s, AM_HELLO, &[]),
            Step::Refuse { .. }
        ));

        // The answer for another pid (a replayed answer) fails.
        let mut b = Attach::new(Instant::now());
        let Step::Challenge(n) = b.on_message(&s, AM_HELLO, &Hello::new(78).encode()) else {
            panic!()
        };
        let mac = s.answer(&n, &auth_context(VERSION, 77));
        assert!(matches!(
            b.on_message(&s, AM_AUTH, &mac),
            Step::Refuse {
                errno: libc::EACCES,
                ..
            }
        ));

        // An answer before the hello, a bad hello, an old version.
        let mut c = Attach::new(Instant::now());
        assert!(matches!(
            c.on_message(&s, AM_AUTH, &[0; 32]),
            Step::Refuse {
                errno: libc::EPROTO,
                ..
            }
        ));
        let mut d = Attach::new(Instant::now());
        assert!(matches!(
            d.on_message(&s, AM_HELLO, b"junk"),
            Step::Refuse {
                errno: libc::EPROTO,
                ..
            }
        ));
        let mut old = Hello::new(1);
        old.version = VERSION - 1;
        let mut e = Attach::new(Instant::now());
        let Step::Refuse { message, .. } = e.on_message(&s, AM_HELLO, &old.encode()) else {
            panic!()
        };
        assert!(message.contains("version mismatch"), "{message}");
        let t = Instant::now();
        assert!(!Attach::new(t).expired(t) && Attach::new(t).expired(t + ATTACH_TIMEOUT));
    }

    /// The exchange over a real UCX connection (tcp, one process): the
    /// right secret gets the geometry, a wrong one a refusal and nothing.
    fn attach_over_ucx(host_secret: &str) -> Welcome {
        let server_secret = Secret::parse(SECRET).unwrap();
        let ctx = Context::new(&ContextOptions {
            transports: Some("tcp".into()),
            rma: false,
            reuse_addr: false,
        })
        .unwrap();
        let (server, host) = (Worker::new(&ctx).unwrap(), Worker::new(&ctx).unwrap());
        for id in [AM_HELLO, AM_AUTH] {
            server.set_am_handler(id).unwrap();
        }
        for id in [AM_CHALLENGE, AM_WELCOME] {
            host.set_am_handler(id).unwrap();
        }
        let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let ep = host.connect(listener.local_addr().unwrap()).unwrap();
        ep.am_send(AM_HELLO, &Hello::new(4242).encode(), Vec::new(), true)
            .unwrap();
        let mut peer: Option<Endpoint> = None;
        let mut attach = Attach::new(Instant::now());
        let deadline = Instant::now() + Duration::from_secs(10);
        let reply = |peer: &Endpoint, step: Step| match step {
            Step::Challenge(n) => peer.am_send(AM_CHALLENGE, &n, Vec::new(), false).unwrap(),
            Step::Admit { .. } => {
                let w = Welcome {
                    status: 0,
                    geometry: [2, 8, 4096, 2, 8, 2, 4096, 0],
                    message: String::new(),
                };
                peer.am_send(AM_WELCOME, &w.encode(), Vec::new(), false)
                    .unwrap()
            }
            Step::Refuse { errno, message } => {
                let w = Welcome {
                    status: errno,
                    geometry: [0; 8],
                    message,
                };
                peer.am_send(AM_WELCOME, &w.encode(), Vec::new(), false)
                    .unwrap()
            }
        };
        let host_secret = Secret::parse(host_secret).unwrap();
        loop {
            assert!(Instant::now() < deadline, "attach did not finish");
            server.progress();
            host.progress();
            if let Some(r) = listener.take_request() {
                peer = Some(r.accept().unwrap());
            }
            if let (Some(p), Some(m)) = (peer.as_ref(), server.take_am()) {
                assert_eq!(m.from, Some(p.tag()), "the message names its endpoint");
                let step = attach.on_message(&server_secret, m.id, &m.header);
                reply(p, step);
            }
            if let Some(m) = host.take_am() {
                if m.id == AM_WELCOME {
                    return Welcome::decode(&m.header).unwrap();
                }
                assert_eq!(m.id, AM_CHALLENGE);
                let n: [u8; NONCE_LEN] = m.header.as_slice().try_into().unwrap();
                let mac = host_secret.answer(&n, &auth_context(VERSION, 4242));
                ep.am_send(AM_AUTH, &mac, Vec::new(), true).unwrap();
            }
        }
    }

    #[test]
    fn attach_over_ucx_with_the_right_and_a_wrong_secret() {
        let ok = attach_over_ucx(SECRET);
        assert_eq!((ok.status, ok.geometry[0]), (0, 2));
        let bad = attach_over_ucx("0123456789abcdef-a-wrong-secret");
        assert_eq!(bad.status, libc::EACCES);
        assert_eq!(
            bad.geometry, [0; 8],
            "a refused host learns nothing of the server"
        );
        assert!(
            bad.message.contains("authentication failed"),
            "{}",
            bad.message
        );
    }
}
