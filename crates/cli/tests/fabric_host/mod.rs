//! A remote host as the tests drive it, before the host library can
//! attach remotely: UCX client, the HMAC attach, a copy of the region, and
//! one call posted and shipped the way the host library and its pump do.
#![allow(dead_code)]

use std::os::fd::{AsFd, FromRawFd};
use std::time::{Duration, Instant};
use tcps_fabric::auth::{Secret, NONCE_LEN};
use tcps_fabric::wire::{self, auth_context, Spans, Welcome};
use tcps_fabric::{Context, ContextOptions, Endpoint, Worker};
use tcps_proto::handshake::Hello;
use tcps_proto::layout::{Layout, VERSION};
use tcps_proto::mirror::Writer;
use tcps_proto::msg::{Completion, Op, Request};
use tcps_proto::ring::HostCursor;
use tcps_proto::Region;

pub const SECRET: &str = "0123456789abcdef-fabric-test-secret\n";

/// A TCP port on loopback that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A secret file of mode 600.
pub fn key_file(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

pub struct Remote {
    pub worker: Worker,
    pub ep: Endpoint,
    sent: std::cell::Cell<Instant>,
}

impl Remote {
    /// A keepalive if nothing was sent for 250 ms (the server drops a host
    /// silent for a second).
    pub fn keepalive(&self) {
        if self.sent.get().elapsed() >= Duration::from_millis(250) {
            self.sent.set(Instant::now());
            let _ = self.ep.am_send(wire::AM_KEEPALIVE, &[], Vec::new(), true);
        }
    }

    pub fn next(&self, deadline: Instant) -> tcps_fabric::AmMessage {
        loop {
            assert!(Instant::now() < deadline, "no message from the server");
            self.keepalive();
            self.worker.wait(Some(Duration::from_millis(20)));
            if let Some(m) = self.worker.take_am() {
                return m;
            }
            self.ep.status().expect("the server endpoint failed");
        }
    }
}

/// Connects to `addr` and authenticates with `secret`: the server's `Welcome`.
pub fn attach(addr: std::net::SocketAddr, secret: &str) -> (Remote, Welcome) {
    attach_as(addr, secret, std::process::id())
}

/// As [`attach`], saying it is process `pid` (of the host's node).
pub fn attach_as(addr: std::net::SocketAddr, secret: &str, pid: u32) -> (Remote, Welcome) {
    let ctx = Context::new(&ContextOptions {
        transports: Some("tcp".into()),
        rma: false,
        reuse_addr: false,
    })
    .expect("UCX (libucx-dev) is needed: the setup installs it");
    let worker = Worker::new(&ctx).unwrap();
    for id in [
        wire::AM_CHALLENGE,
        wire::AM_WELCOME,
        wire::AM_SPANS,
        wire::AM_KEEPALIVE,
        wire::AM_CONTROL,
    ] {
        worker.set_am_handler(id).unwrap();
    }
    let ep = worker.connect(addr).unwrap();
    ep.am_send(wire::AM_HELLO, &Hello::new(pid).encode(), Vec::new(), true)
        .unwrap();
    let r = Remote {
        worker,
        ep,
        sent: std::cell::Cell::new(Instant::now()),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let secret = Secret::parse(secret).unwrap();
    loop {
        let m = r.next(deadline);
        match m.id {
            wire::AM_CHALLENGE => {
                let n: [u8; NONCE_LEN] = m.header.as_slice().try_into().unwrap();
                let mac = secret.answer(&n, &auth_context(VERSION, pid));
                r.ep.am_send(wire::AM_AUTH, &mac, Vec::new(), true).unwrap();
            }
            wire::AM_WELCOME => {
                let w = Welcome::decode(&m.header).expect("a Welcome");
                return (r, w);
            }
            wire::AM_KEEPALIVE => {}
            other => panic!("unexpected message {other} during attach"),
        }
    }
}

/// Sends a control message as a host's helper does (`AM_CONTROL`) and
/// returns the errno of the server's reply.
pub fn control(r: &Remote, msg: tcps_proto::handshake::ControlMsg) -> i32 {
    use tcps_proto::handshake::ControlMsg;
    r.ep.am_send(wire::AM_CONTROL, &msg.encode(), Vec::new(), true)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = r.next(deadline);
        if m.id != wire::AM_CONTROL {
            continue;
        }
        match ControlMsg::decode(&m.header) {
            Some(ControlMsg::Reply { errno, .. }) => return errno,
            other => panic!("not a reply: {other:?}"),
        }
    }
}

/// The geometry of a `Welcome`.
pub fn layout_of(w: &Welcome) -> Layout {
    Layout::from_words(&w.geometry).expect("a valid geometry")
}

/// The host's own copy of the region (a memfd of the announced geometry).
pub fn host_region(layout: Layout) -> (std::fs::File, Region) {
    // SAFETY: memfd_create with a valid name; checked, then owned.
    let fd = unsafe { libc::memfd_create(c"fabric-host".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor, owned by the File.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(layout.region_size() as u64).unwrap();
    let region = Region::map(file.as_fd(), layout).unwrap();
    (file, region)
}

/// Posts a `Nop` on channel 0 as the host library does, ships it as its
/// pump does (channels_used, the slot, line 0; one message), and applies
/// the server's batches until the completion is there.
pub fn nop_round_trip(r: &Remote, layout: &Layout, host: &Region, tag: u64) -> Completion {
    host.apply_span(Writer::Host, 128, &1u32.to_le_bytes())
        .unwrap();
    let mut hc = HostCursor::default();
    let req = Request {
        user_data: tag,
        op: Op::Nop as u16,
        ..Default::default()
    };
    hc.submit(&host.channel(0).unwrap(), &req).unwrap();
    let mut spans = Spans::new();
    let slot = layout.channel_offset(0) + layout.requests_offset();
    for (off, len) in [(128, 4), (slot, 64), (layout.channel_offset(0), 8)] {
        let mut b = vec![0u8; len];
        host.read_span(off, &mut b).unwrap();
        spans.push(off as u32, &b);
    }
    let (h, d) = spans.take();
    r.ep.am_send(wire::AM_SPANS, &h, d, true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = r.next(deadline);
        if m.id == wire::AM_KEEPALIVE {
            continue;
        }
        assert_eq!(m.id, wire::AM_SPANS);
        for s in wire::spans(&m.header, &m.data) {
            let (off, b) = s.expect("well-formed spans");
            host.apply_span(Writer::Server, off as usize, b)
                .expect("only server-written zones");
        }
        if let Some(c) = hc.reap(&host.channel(0).unwrap()) {
            return c;
        }
    }
}

/// A remote host's channel 0, driven as the host library and its pump
/// drive a channel: one call at a time.
pub struct Chan<'a> {
    pub r: &'a Remote,
    pub layout: Layout,
    pub host: &'a Region,
    pub hc: HostCursor,
    next_tag: u64,
}

impl<'a> Chan<'a> {
    pub fn new(r: &'a Remote, layout: Layout, host: &'a Region) -> Chan<'a> {
        host.apply_span(Writer::Host, 128, &1u32.to_le_bytes())
            .unwrap();
        Chan {
            r,
            layout,
            host,
            hc: HostCursor::default(),
            next_tag: 1,
        }
    }

    /// One call: `input` in the arena at 0 (the request's range is
    /// `0..max(input, room)`), shipped with the slot and line 0; returns
    /// the completion and the arena bytes it wrote (`room` of them).
    pub fn call(
        &mut self,
        op: Op,
        sock: u32,
        args: [u64; 5],
        input: &[u8],
        room: usize,
    ) -> (Completion, Vec<u8>) {
        let l = self.layout;
        let arena = l.channel_offset(0) + l.arena_offset();
        if !input.is_empty() {
            self.host.apply_span(Writer::Host, arena, input).unwrap();
        }
        self.next_tag += 1;
        let tag = self.next_tag;
        let len = input.len().max(room) as u32;
        let req = Request {
            user_data: tag,
            op: op as u16,
            sock,
            buf_off: 0,
            buf_len: len,
            args,
            ..Default::default()
        };
        let slot = (self.hc.next_request() & (l.ring_entries - 1)) as usize;
        self.hc
            .submit(&self.host.channel(0).unwrap(), &req)
            .unwrap();
        let mut spans = Spans::new();
        let at = l.channel_offset(0) + l.requests_offset() + 64 * slot;
        let mut ship = vec![(128, 4), (at, 64), (l.channel_offset(0), 8)];
        if !input.is_empty() {
            ship.insert(0, (arena, input.len()));
        }
        for (off, len) in ship {
            let mut b = vec![0u8; len];
            self.host.read_span(off, &mut b).unwrap();
            spans.push(off as u32, &b);
        }
        let (h, d) = spans.take();
        self.r.ep.am_send(wire::AM_SPANS, &h, d, true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let done = loop {
            if let Some(c) = self.hc.reap(&self.host.channel(0).unwrap()) {
                break c;
            }
            let m = self.r.next(deadline);
            if m.id != wire::AM_SPANS {
                continue;
            }
            for s in wire::spans(&m.header, &m.data) {
                let (off, b) = s.expect("well-formed spans");
                self.host
                    .apply_span(Writer::Server, off as usize, b)
                    .expect("only server-written zones");
            }
        };
        assert_eq!(done.user_data, tag, "completions in order on one channel");
        let mut out = vec![0u8; room];
        self.host.read_span(arena, &mut out).unwrap();
        (done, out)
    }
}
